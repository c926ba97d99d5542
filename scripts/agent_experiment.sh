#!/usr/bin/env bash
# Evidence for docs/agents.md: a supervised warm start on FrozenLake's solver demonstrations, then GRPO
# (episode advantage, one row per turn) from it; held-out success rate before and after, and a curve.
#
#   nohup scripts/agent_experiment.sh > runs/agents/frozenlake_tiny.log 2>&1 &
#
# MODEL=tiny-64x2 (default) is a 2-layer, hidden-64 Llama with the SmolLM2 tokenizer, initialised at random:
# what fits a shared 2-core CPU. MODEL=smollm2-135m-instruct runs the same pipeline on SmolLM2 (give it
# smaller learning rates, e.g. SFT_LR=5e-5 GRPO_LR=1e-5, and far more compute). CFG picks the environment's
# config (default configs/agents/frozenlake_grpo.yaml; configs/agents/sokoban_grpo.yaml works the same), SFT_CFG
# the warm start's (default: CFG's name with _sft for _grpo, tether sft's own config, the same env), OUT the
# output directory, THREADS the CPU threads per process (default 2), GRPO_STEPS the GRPO steps (default 20).
# Arguments are dotted overrides for the GRPO run, e.g. val.greedy=false val.every=10.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-runs/agents/frozenlake_tiny}
model=${MODEL:-tiny-64x2}
cfg=${CFG:-configs/agents/frozenlake_grpo.yaml}
sft_cfg=${SFT_CFG:-${cfg/_grpo.yaml/_sft.yaml}}
# FrozenLake's and Sokoban's observations are the whole board, so the history adds tokens but no information.
common=(env.history=0 env.val_tasks=64 "train.threads=${THREADS:-2}")
mkdir -p "$out"
start=$(date +%s)

echo "== 1. SFT on solver demonstrations"
.venv/bin/tether sft "$sft_cfg" "${common[@]}" "run_dir=$out/sft" "model.name=$model" sft.data=solver sft.examples=600 \
  sft.explore=0.3 sft.epochs=2 sft.batch_size=16 sft.micro_batch_size=16 "sft.lr=${SFT_LR:-2e-3}" logging.tensorboard=false
echo "sft done after $(( $(date +%s) - start ))s"

echo "== 2. GRPO from the SFT checkpoint (validation at step 0 = the SFT model)"
.venv/bin/tether train "$cfg" "${common[@]}" "model.name=$out/sft/checkpoint" "run_dir=$out/grpo" \
  "train.steps=${GRPO_STEPS:-20}" val.every=5 "optim.lr=${GRPO_LR:-3e-4}" logging.tensorboard=false logging.progress=false \
  "$@"
echo "grpo done after $(( $(date +%s) - start ))s"

echo "== 3. curves"
.venv/bin/python - "$out" <<'PY'
import sys
from pathlib import Path
from tether.track import plot_compare, plot_run
out = Path(sys.argv[1])
print(plot_compare({"GRPO from SFT": out / "grpo"}, "val/success_rate", out / "val_success_rate.png"))
print(plot_compare({"GRPO from SFT": out / "grpo"}, "env/success_rate", out / "train_success_rate.png"))
print(plot_run(out / "grpo"))
PY
echo "all done after $(( $(date +%s) - start ))s"
