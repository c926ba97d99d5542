#!/usr/bin/env bash
# One prepared check on a GPU machine: the CUDA tests, the in-process engine's decoding speed (docs/engine.md,
# "Speed"), the smoke table (docs/scaling.md, "Checked on a GPU"), then visual rollouts on vLLM where vLLM is
# installed (docs/vision.md).
#   scripts/gpu_check.sh            # from the repo root; logs and JSON rows under $OUT (default runs/gpu_check)
# Offline machines: put missing wheels in .whl/ and the SmolLM2 tokenizer cache in .gpu/cache (TETHER_CACHE).
set -uo pipefail
OUT=${OUT:-runs/gpu_check}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
[ -d .gpu/cache ] && export TETHER_CACHE="$PWD/.gpu/cache"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
status=0
timeout 200 python3 -m pytest -q -p no:cacheprovider -rs -k cuda tests/trainer/test_device_mixing.py \
  tests/trainer/test_cuda.py 2>&1 | tee "$OUT/pytest.log" || status=1
# decoding tokens/s, batch 32, exactly 128 new tokens: the dynamic cache (decoding as before the static cache),
# the static cache, and the static cache with the step captured as CUDA graphs (its compilation is the warm-up)
timeout 240 python3 benchmarks/bench_decode.py --model random:smollm2-135m --device cuda --batch 32 \
  --new-tokens 128 --rounds 3 --variant dynamic=decode=dynamic --variant static=decode=static \
  --variant compiled=decode=compiled --out "$OUT/decode.json" 2>&1 | tee "$OUT/decode.log" || status=1
# 2 steps of 128 tokens per method: the whole script fits in about 6 minutes of a lent GPU
timeout 240 python3 scripts/gpu_smoke.py --model random:smollm2-135m --steps 2 --tokens 128 \
  --json "$OUT/smoke_smollm2_fp32.json" 2>&1 | grep -v "Loading weights\|Writing model" | tee "$OUT/smoke.log" || status=1
# Visual rollouts on vLLM (docs/vision.md), where the machine has vLLM (the lent H200 had none so far): the vLLM
# engine tests (text and images), then 2 steps of the visual Sokoban GPU preset with its rollouts on vLLM.
# VISION_MODEL: a Qwen2.5-VL checkpoint (default the 3B from the local Hugging Face cache).
VISION_MODEL=${VISION_MODEL:-Qwen/Qwen2.5-VL-3B-Instruct}
if ! python3 -c "import vllm" 2>/dev/null; then
  echo "skipped: no vLLM on this machine, so no visual rollouts on vLLM" | tee "$OUT/vision_vllm.log"
else
  timeout 240 python3 -m pytest -q -p no:cacheprovider -rs tests/integrations/test_vllm_engine.py 2>&1 \
    | tee "$OUT/vllm_pytest.log" || status=1
  if [ -d "$VISION_MODEL" ] || python3 -c "from huggingface_hub import snapshot_download as s; \
s('$VISION_MODEL', local_files_only=True)" 2>/dev/null; then
    timeout 420 python3 -m tether.cli train configs/gpu/grpo_qwen2.5-vl-3b_sokoban.yaml model.name="$VISION_MODEL" \
      train.steps=2 rollout.prompts_per_step=4 rollout.group_size=4 rollout.max_new_tokens=128 env.max_turns=3 \
      val.every=0 logging.tensorboard=false run_dir=/tmp/vision_vllm 2>&1 | tee "$OUT/vision_vllm.log" || status=1
    cp /tmp/vision_vllm/metrics.jsonl "$OUT/vision_vllm_metrics.jsonl" 2>/dev/null
  else
    echo "skipped: $VISION_MODEL is neither a directory nor in the local Hugging Face cache" | tee "$OUT/vision_vllm.log"
  fi
fi
exit $status
