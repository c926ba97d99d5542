"""A real ``tether train`` killed with SIGKILL mid-run resumes, with the same command, to the uninterrupted result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.trainer.helpers import tiny_config
from tether.config import dump_config
from tether.models import tiny_model
from tether.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
COMPARED = ("train/reward_mean", "actor/pg_loss", "actor/grad_norm")


def train_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if "actor/pg_loss" in row]


def tether_train(config: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "tether.cli", "train", str(config)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_a_run_killed_with_sigkill_resumes_to_the_uninterrupted_result(tmp_path):
    model, tok = tiny_model(seed=0)
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    settings = (f"model.name={tmp_path / 'model'}", "train.steps=4", "train.save_every=1", "train.save_every_s=0",
                "train.keep_last=4")
    straight = Trainer(tiny_config(tmp_path / "straight", *settings))
    straight.fit()

    cfg = tiny_config(tmp_path / "killed", *settings)
    config = tmp_path / "killed.yaml"
    config.write_text(dump_config(cfg))
    run_dir = Path(cfg.run_dir)
    first = tether_train(config)
    deadline = time.monotonic() + 120
    while not (run_dir / "metrics.jsonl").is_file() or len(train_rows(run_dir)) < 2:
        assert first.poll() is None and time.monotonic() < deadline, first.stderr and first.stderr.read()
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)  # during step 2's save or step 3: a checkpoint of step 1 or 2 is complete
    first.wait()

    second = tether_train(config)
    _, err = second.communicate(timeout=180)
    assert second.returncode == 0, err
    assert "resuming" in err

    want, got = train_rows(Path(straight.cfg.run_dir)), train_rows(run_dir)
    assert [row["step"] for row in got] == [1, 2, 3, 4]  # nothing lost, nothing logged twice
    for w, g in zip(want, got, strict=True):
        assert {k: g[k] for k in COMPARED} == pytest.approx({k: w[k] for k in COMPARED}, abs=1e-5)
    final = "checkpoints/step_000004/model.safetensors"
    want_weights, got_weights = load_file(Path(straight.cfg.run_dir) / final), load_file(run_dir / final)
    for name, tensor in want_weights.items():
        torch.testing.assert_close(got_weights[name], tensor, rtol=0, atol=1e-6)
