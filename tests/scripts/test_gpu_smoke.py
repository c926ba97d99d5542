"""scripts/gpu_smoke.py, on the CPU with a tiny random architecture: every method runs and shows its own path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def smoke(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/gpu_smoke.py", "--model", "random:tiny", "--device", "cpu",
                           "--steps", "1", "--tokens", "6", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def test_every_method_runs_and_its_own_path_ran(tmp_path):
    done = smoke(tmp_path, "--methods", "dapo,armor,eapo", "--json", str(tmp_path / "rows.json"))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {r["method"]: r for r in json.loads((tmp_path / "rows.json").read_text())}
    assert set(rows) == {"dapo", "armor", "eapo"} and all(r["device"] == "cpu" for r in rows.values())
    assert rows["armor"]["armor/anchor_rows"] > 0 and rows["eapo"]["eapo/injected_token_frac"] > 0
    assert all(r["step_s"] > 0 and r["train_tok_s"] > 0 for r in rows.values())


def test_unknown_method_or_architecture_stops_before_any_work(tmp_path):
    done = smoke(tmp_path, "--methods", "grpo,ppo2")
    assert done.returncode != 0 and "--methods: unknown ppo2; known: grpo" in done.stderr
    done = smoke(tmp_path, "--model", "random:gpt9")
    assert done.returncode != 0 and "--model random:gpt9: unknown architecture; known: tiny" in done.stderr
