#!/usr/bin/env bash
# ARMOR in miniature (docs/methods/armor.md, "Evidence"): DAPO with SmolLM2-135M on 64 arithmetic prompts until
# the validation peak, then, from the peak checkpoint, DAPO continued, DAPO + k3 reverse KL (two betas) and ARMOR.
# Ends with one PNG (val/avg@k of the stage-2 runs) and one table (start, peak, step of the peak, final).
#
#   scripts/armor_experiment.sh                # starts itself in the background; prints the PID and the log
#   scripts/armor_experiment.sh --foreground   # the same, attached
#   scripts/armor_experiment.sh train.threads=2   # extra arguments: dotted overrides for every run
#
# Environment: ROOT (default runs/armor), BETAS (default "0.01 1.0": the paper's "delays the collapse" and
# "stagnates" regimes, Fig. 2a), STAGE2_STEPS (default: the configs' 100), TETHER, PY;
# CONFIGS (default configs/armor) and STAGE1_RUN: a finished run dir whose checkpoints/best is the peak, which
# skips stage 1;
# RUNS (default "dapo_continued dapo_kl_k3 armor"): stage-2 configs of $CONFIGS, run in this order; a KL config
# (dapo_kl_k3, dapo_kl_k2) becomes one run per beta; any other config there works too, e.g. the ablations
# mix_only anchors_plain_ratio anchors_clip_expansion anchors_offpolicy_is;
# SEEDS (default "0"): every stage-2 run once per seed (seed=N; run names get _sN for N != 0);
# REPORT (default 1): 0 skips the figure and table, e.g. for a second driver that shares the machine.
# The short miniature from the quickstart's peak:
#   ROOT=runs/armor_qs CONFIGS=configs/armor/quickstart_peak STAGE1_RUN=runs/quickstart scripts/armor_experiment.sh
# The 6.9M-model study (docs/methods/armor.md), two drivers side by side after stage 1:
#   ROOT=runs/armor_tiny CONFIGS=configs/armor/tiny SEEDS="0 1" RUNS="dapo_continued armor" \
#       scripts/armor_experiment.sh train.threads=1
# Layout: $ROOT/experiment.log; one run dir per run ($ROOT/stage1_dapo, $ROOT/dapo_continued,
# $ROOT/dapo_kl_k3_<beta>, $ROOT/armor, $ROOT/armor_s1, ...), each with train.log, config.yaml, metrics.jsonl,
# checkpoints/ and summary.json; $ROOT/val_compare.png and $ROOT/table.md at the end. Rerunning resumes
# unfinished runs (the trainer restarts from checkpoints/latest) and skips finished ones (summary.json exists).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${ROOT:-runs/armor}
CONFIGS=${CONFIGS:-configs/armor}
BETAS=${BETAS:-0.01 1.0}
RUNS=${RUNS:-dapo_continued dapo_kl_k3 armor}
SEEDS=${SEEDS:-0}
REPORT=${REPORT:-1}
TETHER=${TETHER:-.venv/bin/tether}
PY=${PY:-.venv/bin/python}

if [ "${1:-}" != "--foreground" ]; then
  mkdir -p "$ROOT"
  nohup "$0" --foreground "$@" >> "$ROOT/experiment.log" 2>&1 < /dev/null &
  echo "ARMOR miniature experiment running in the background: pid $!, log $ROOT/experiment.log"
  exit 0
fi
shift
extra=("$@")

export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# run NAME CONFIG [OVERRIDES...]: one training run in $ROOT/NAME, logged to $ROOT/NAME/train.log.
run() {
  local name=$1 config=$2
  shift 2
  local dir="$ROOT/$name"
  if [ -f "$dir/summary.json" ]; then
    echo "[$(date '+%F %T')] $name: finished earlier, skipped"
    return
  fi
  mkdir -p "$dir"
  echo "[$(date '+%F %T')] $name: $TETHER train $config run_dir=$dir $*"
  "$TETHER" train "$config" "run_dir=$dir" "logging.progress=false" "$@" "${extra[@]}" >> "$dir/train.log" 2>&1
  echo "[$(date '+%F %T')] $name: done ($(tr -d '\n' < "$dir/summary.json" | head -c 300))"
}

stage2=()
[ -n "${STAGE2_STEPS:-}" ] && stage2+=("train.steps=$STAGE2_STEPS")

# Stage 1: DAPO, validated every 5 steps; the best val/avg@k checkpoint is the peak.
STAGE1=${STAGE1_RUN:-$ROOT/stage1_dapo}
[ -n "${STAGE1_RUN:-}" ] || run stage1_dapo "$CONFIGS/stage1_dapo.yaml"
BEST="$STAGE1/checkpoints/best"
if [ ! -f "$BEST/trainer_state.pt" ]; then
  echo "stage 1 left no best checkpoint at $BEST" >&2
  exit 1
fi
echo "[$(date '+%F %T')] peak: $(cat "$STAGE1/best.txt")"

# Stage 2: every run starts from the peak; the reference is a frozen copy of it.
runs=()
for seed in $SEEDS; do
  suffix=""
  [ "$seed" = 0 ] || suffix="_s$seed"
  for config in $RUNS; do
    if [[ "$config" == dapo_kl_* ]]; then
      for beta in $BETAS; do
        run "${config}_$beta$suffix" "$CONFIGS/$config.yaml" "model.name=$BEST" "seed=$seed" \
          "algorithm.kl.coef=$beta" "${stage2[@]}"
        runs+=("${config}_$beta$suffix")
      done
    else
      run "$config$suffix" "$CONFIGS/$config.yaml" "model.name=$BEST" "seed=$seed" "${stage2[@]}"
      runs+=("$config$suffix")
    fi
  done
done

if [ "$REPORT" = 1 ]; then
  "$PY" scripts/armor_report.py --root "$ROOT" --stage1 "$STAGE1" "${runs[@]}"
  echo "[$(date '+%F %T')] all done: $ROOT/val_compare.png, $ROOT/table.md"
fi
