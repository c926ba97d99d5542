#!/usr/bin/env bash
# ARMOR on SmolLM2 (issue #44), the KL baseline's coefficient: DAPO continued with a k3 KL loss to the frozen
# reference (the warm start), at several coefficients, on a seed outside the comparison's (100), each run exactly
# as the comparison's DAPO arm otherwise (configs/lab/armor_smollm2/protocol.yaml). The rule that picks the
# coefficient from these runs' drift is in docs/methods/armor_evidence.md ("The KL arm"), committed before them.
#
#   scripts/lab/armor_kl_sweep.sh [COEF ...]        # default 0.01 0.1 1.0; two runs at once, one thread each
#
# Runs land in runs/lab/armor_smollm2/kl_sweep/c<COEF>; an interrupted run resumes from its checkpoint.
set -eu
mkdir -p runs/lab/armor_smollm2/kl_sweep
TETHER=${TETHER:-tether}
coefs=("$@")
[[ ${#coefs[@]} -gt 0 ]] || coefs=(0.01 0.1 1.0)
printf '%s\n' "${coefs[@]}" | OMP_NUM_THREADS=1 xargs -P 2 -I{} sh -c "$TETHER"' train \
    configs/armor/smollm2/premise_worked.yaml seed=100 run_dir=runs/lab/armor_smollm2/kl_sweep/c{} \
    train.steps=40 val.every=20 train.save_every=10 train.keep_last=1 train.threads=1 \
    "algorithm.kl={coef: {}, estimator: k3, in_reward: false}" > runs/lab/armor_smollm2/kl_sweep/c{}.log 2>&1 \
    && echo "c{} done" || echo "c{} FAILED (runs/lab/armor_smollm2/kl_sweep/c{}.log)"'
