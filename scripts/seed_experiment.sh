#!/usr/bin/env bash
# The SEED comparison on a CPU (docs/methods/seed.md, "Evidence"): stage-1 skill SFT from the action warm start,
# then GRPO, SEED and GRPO + OPSD-style self-distillation, all from the same SFT checkpoint with the same budget.
# Ends with one PNG (held-out success rate per step), one table, and the skills the policy wrote early and late.
#
#   scripts/seed_experiment.sh                 # starts itself in the background; prints the PID and the log
#   scripts/seed_experiment.sh --foreground    # the same, attached
#   scripts/seed_experiment.sh train.threads=2 # extra arguments: dotted overrides for every RL run
#
# Environment: ROOT (default runs/seed); BASE, the stage-1 starting model (default the FrozenLake action warm start
# runs/agents/sft_frozenlake/checkpoint of docs/agents.md; smollm2-135m-instruct works too but rarely acts);
# STEPS (RL updates, default the configs' 30); RUNS (default "grpo seed grpo_opsd"); SEEDS (default "0"); SFT_OVERRIDES, dotted overrides
# for stage 1 only (space-separated); TETHER, PY.
# Layout: $ROOT/experiment.log; $ROOT/sft (sft_summary.json, data/, checkpoint/); one run dir per RL run with
# train.log, config.yaml, metrics.jsonl, transcripts.jsonl, skills.jsonl (seed) and summary.json; at the end
# $ROOT/val_success.png, $ROOT/table.md, $ROOT/skills.md. Rerunning skips finished stages (their summary files)
# and resumes unfinished RL runs from checkpoints/latest.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${ROOT:-runs/seed}
BASE=${BASE:-runs/agents/sft_frozenlake/checkpoint}
RUNS=${RUNS:-grpo seed grpo_opsd}
TETHER=${TETHER:-.venv/bin/tether}
PY=${PY:-.venv/bin/python}

if [ "${1:-}" != "--foreground" ]; then
  mkdir -p "$ROOT"
  nohup "$0" --foreground "$@" >> "$ROOT/experiment.log" 2>&1 < /dev/null &
  echo "SEED experiment running in the background: pid $!, log $ROOT/experiment.log"
  exit 0
fi
shift
extra=("$@")

export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "$BASE" != "smollm2-135m-instruct" ] && [ ! -d "$BASE" ]; then
  echo "BASE=$BASE does not exist: make the action warm start first (docs/agents.md) or set BASE" >&2
  exit 1
fi

# Stage 1: rollouts of BASE, rule-analyzer labels, response-only SFT -> $ROOT/sft/checkpoint.
SFT="$ROOT/sft"
if [ -f "$SFT/sft_summary.json" ]; then
  echo "[$(date '+%F %T')] sft: finished earlier, skipped"
else
  mkdir -p "$SFT"
  read -r -a sft_overrides <<< "${SFT_OVERRIDES:-}"
  echo "[$(date '+%F %T')] sft: $TETHER seed-sft configs/seed/sft.yaml run_dir=$SFT model.name=$BASE ${sft_overrides[*]}"
  "$TETHER" seed-sft configs/seed/sft.yaml "run_dir=$SFT" "model.name=$BASE" "${sft_overrides[@]}" >> "$SFT/sft.log" 2>&1
  echo "[$(date '+%F %T')] sft: done ($(tr -d '\n' < "$SFT/sft_summary.json" | head -c 400))"
fi

steps=()
[ -n "${STEPS:-}" ] && steps+=("train.steps=$STEPS")

# Stage 2: every run starts from the same SFT checkpoint; its KL reference is a frozen copy of it. Seed 0 runs in
# $ROOT/NAME, other seeds (SEEDS, default "0") in $ROOT/NAME_sSEED.
names=()
for seed in ${SEEDS:-0}; do
  for name in $RUNS; do
    run=$name; [ "$seed" != 0 ] && run=${name}_s$seed
    names+=("$run")
    dir="$ROOT/$run"
    if [ -f "$dir/summary.json" ]; then
      echo "[$(date '+%F %T')] $run: finished earlier, skipped"
      continue
    fi
    mkdir -p "$dir"
    echo "[$(date '+%F %T')] $run: $TETHER train configs/seed/$name.yaml run_dir=$dir model.name=$SFT/checkpoint seed=$seed"
    "$TETHER" train "configs/seed/$name.yaml" "run_dir=$dir" "model.name=$SFT/checkpoint" "seed=$seed" \
      "logging.progress=false" "${steps[@]}" "${extra[@]}" >> "$dir/train.log" 2>&1
    echo "[$(date '+%F %T')] $run: done ($(tr -d '\n' < "$dir/summary.json" | head -c 300))"
  done
done

"$PY" scripts/seed_report.py --root "$ROOT" "${names[@]}"
echo "[$(date '+%F %T')] all done: $ROOT/val_success.png, $ROOT/table.md, $ROOT/skills.md"
