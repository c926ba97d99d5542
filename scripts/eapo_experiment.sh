#!/usr/bin/env bash
# The planned EAPO comparison (docs/methods/eapo.md, "Evidence"), on CPU, in the background.
#
#   scripts/eapo_experiment.sh            # start; prints the log path and returns at once
#   tail -f runs/eapo/experiment.log      # follow it
#
# 1. the prior: the quickstart GRPO run (configs/quickstart.yaml), unless runs/quickstart/checkpoints/best exists;
# 2. from the base model, with the same seed, task and budget: GRPO, EAPO seq_gated, EAPO none
#    (add token / split with RUNS="grpo_baseline eapo_seq_gated eapo_none eapo_token eapo_split");
# 3. runs/eapo/comparison.png (validation avg@k per step and per generated token) and comparison.md (table).
#
# BASELINE=runs/quickstart uses the prior's own run as the GRPO baseline instead of training grpo_baseline
# (configs/eapo/grpo_baseline.yaml is configs/quickstart.yaml with another run_dir and step count; same seed),
# e.g. `BASELINE=runs/quickstart MAX_STEP=30 RUNS="eapo_seq_gated eapo_none" scripts/eapo_experiment.sh \
#        train.steps=30` (MAX_STEP cuts every curve and the table at that step).
#
# Runs go one after another (the machine's cores are shared); each logs to its own run dir
# (runs/eapo/<name>/train.log) and resumes from its latest checkpoint if restarted. Extra arguments are
# dotted overrides passed to every EAPO-folder run, e.g. `scripts/eapo_experiment.sh train.threads=2`.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-.venv/bin}
RUNS=${RUNS:-"grpo_baseline eapo_seq_gated eapo_none"}
OUT=runs/eapo
mkdir -p "$OUT"

if [[ "${EAPO_EXPERIMENT_CHILD:-}" != 1 ]]; then
    EAPO_EXPERIMENT_CHILD=1 nohup "$0" "$@" > "$OUT/experiment.log" 2>&1 &
    echo "started (pid $!); log: $OUT/experiment.log"
    exit 0
fi

export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
echo "[$(date -Is)] EAPO experiment: $RUNS"

if [[ ! -d runs/quickstart/checkpoints/best ]]; then
    echo "[$(date -Is)] prior: training configs/quickstart.yaml -> runs/quickstart"
    mkdir -p runs/quickstart
    "$BIN/tether" train configs/quickstart.yaml logging.progress=false > runs/quickstart/train.log 2>&1
fi
cat runs/quickstart/best.txt 2>/dev/null || true

for name in $RUNS; do
    echo "[$(date -Is)] $name"
    mkdir -p "$OUT/$name"
    "$BIN/tether" train "configs/eapo/$name.yaml" logging.progress=false "$@" > "$OUT/$name/train.log" 2>&1
    tail -n 20 "$OUT/$name/train.log"
done

labels=()
[[ -n "${BASELINE:-}" ]] && labels+=("grpo_baseline (${BASELINE})=$BASELINE")
for name in $RUNS; do labels+=("$name=$OUT/$name"); done
"$BIN/python" scripts/eapo_compare.py --out "$OUT/comparison" ${MAX_STEP:+--max-step "$MAX_STEP"} "${labels[@]}"
echo "[$(date -Is)] done: $OUT/comparison.png, $OUT/comparison.md"
