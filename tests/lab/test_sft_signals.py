"""``tether sft`` stopped by a signal: the step under way finishes and is logged, the resumable ``run_dir/sft_state``
is saved (never ``run_dir/checkpoint``), the run directory's lock goes with the process, the command ends with
128 + N and one line, and the same command resumes (tests/lab/test_sft_resume.py: bit for bit).

``tether seed-sft`` trains through the same loop (``tether.recipes.sft.train_sft``), so it stops the same way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tether.config import dump_config, load_command_config
from tether.errors import TrainingStopped
from tether.recipes.sft import run_sft
from tether.start import claim_run_dir

ROOT = Path(__file__).resolve().parents[2]
STEPS = 5  # sft.max_steps: fewer than the 2 epochs of 3 batches

# ``tether sft CONFIG`` that sends itself SIGTERM once the metrics of optimiser step 1 are logged: a real signal,
# at a known step
SIGNALLED_SFT = """
import os, runpy, signal, sys

from tether.track.tracker import Tracker

log = Tracker.log


def log_then_signal(self, metrics, step):
    logged = log(self, metrics, step)
    if "sft/loss" in metrics and step == 1:
        os.kill(os.getpid(), signal.SIGTERM)
    return logged


Tracker.log = log_then_signal
sys.argv = ["tether", "sft", *sys.argv[1:]]
runpy.run_module("tether.cli", run_name="__main__")
"""


def sft_config(tmp_path: Path):
    data = {"run_dir": str(tmp_path / "sft"), "model": {"name": "char-64x1"},
            "task": {"name": "addition", "kwargs": {"digits": 2, "train_size": 8, "val_size": 8, "report_size": 8,
                                                    "sft_size": 64}},
            "logging": {"tensorboard": False, "progress": False}, "train": {"device": "cpu"},
            "sft": {"data": "task", "batch_size": 16, "micro_batch_size": 8, "epochs": 2, "val_fraction": 0.25,
                    "max_steps": STEPS}}
    return load_command_config("sft", data=data)


def metric_steps(run_dir: Path) -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["step"] for row in rows if "sft/loss" in row]


def test_sigterm_stops_tether_sft_after_the_step_with_its_state_saved(tmp_path):
    cfg = sft_config(tmp_path)
    config = tmp_path / "sft.yaml"
    config.write_text(dump_config(cfg))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "TETHER_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", SIGNALLED_SFT, str(config)], env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=300)
    assert done.returncode == 128 + signal.SIGTERM == 143, done.stderr
    run_dir = Path(cfg.run_dir)
    line = (f"sft stopped by SIGTERM after step 1 of {STEPS}; its state is in {run_dir / 'sft_state'}: run the same "
            "command again to resume")
    assert done.stderr.strip().splitlines()[-1] == line
    assert "Traceback" not in done.stderr
    assert metric_steps(run_dir) == [1]  # the step under way was finished and logged, no other began
    assert json.loads((run_dir / "sft_state" / "sft_state.json").read_text())["progress"]["step"] == 1
    assert not (run_dir / "checkpoint").exists() and not (run_dir / "sft_summary.json").exists()
    claim_run_dir(run_dir)  # the lock went with the process
    assert run_sft(load_command_config("sft", config))["steps"] == STEPS  # the same command resumes
    assert metric_steps(run_dir) == list(range(1, STEPS + 1)) and not (run_dir / "sft_state").exists()


def test_sigint_in_process_raises_the_stop_and_restores_the_handler(tmp_path, monkeypatch):
    monkeypatch.setenv("TETHER_CACHE", str(tmp_path / "cache"))
    from tether.track.tracker import Tracker

    log = Tracker.log

    def log_then_interrupt(self, metrics, step):
        logged = log(self, metrics, step)
        if "sft/loss" in metrics and step == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return logged

    monkeypatch.setattr(Tracker, "log", log_then_interrupt)
    before = signal.getsignal(signal.SIGINT)
    cfg = sft_config(tmp_path)
    with pytest.raises(TrainingStopped, match=rf"^sft stopped by SIGINT after step 2 of {STEPS}; its state is in "
                                              ".*sft_state: run the same command again to resume$") as stop:
        run_sft(cfg)
    assert stop.value.exit_code == 130
    assert signal.getsignal(signal.SIGINT) is before
    assert metric_steps(Path(cfg.run_dir)) == [1, 2]
    assert not (Path(cfg.run_dir) / "checkpoint").exists()
