"""A real ``tether train`` killed with SIGKILL mid-run resumes, with the same command, to the uninterrupted result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.trainer.helpers import tiny_config
from tests.warm import warm_python
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


# A ``tether train`` that SIGKILLs itself at the n-th time it reaches a point of the save path; a test double makes
# every validation a new best, so every step swaps ``best/`` (the same double runs in the uninterrupted run).
KILLING_TRAIN = """
import os, runpy, signal, sys
from pathlib import Path

import tether.rollout.single_turn as single_turn
import tether.trainer.checkpoint as checkpoint
import tether.trainer.trainer as trainer

PHASE, AT = sys.argv.pop(1), 2
seen = {}


def reached(phase):
    seen[phase] = seen.get(phase, 0) + 1
    if phase == PHASE and seen[phase] == AT:
        os.kill(os.getpid(), signal.SIGKILL)


validate = single_turn.SingleTurnCollector.validate
done = {"step": 0}  # the trainer's step after its last train_step: a resumed process knows it as well
# every validation is a new best: its value is the step it follows (sampling seeds are hashes, not growing)
single_turn.SingleTurnCollector.validate = lambda self, engine, seed: {**validate(self, engine, seed),
                                                                       "val/avg@k": float(done["step"])}
train_step = trainer.Trainer.train_step


def counted_step(self):
    reached("start_of_a_step")
    metrics = train_step(self)
    done["step"] = self.step
    return metrics


trainer.Trainer.train_step = counted_step
replace = os.replace


def replace_at_phases(src, dst):
    src, dst = Path(src), Path(dst)
    if dst.name.startswith("step_"):
        reached("before_step_dir_rename")
    moving_best_aside = dst.name == "best.old"
    replace(src, dst)
    if dst.name.startswith("step_"):
        reached("before_latest_pointer")
    if moving_best_aside:
        reached("inside_best_swap")
    if dst.name == "best" and dst.with_name("best.old").exists():
        reached("before_old_best_removed")


checkpoint.os.replace = replace_at_phases
sys.argv = ["tether", "train", *sys.argv[1:]]
runpy.run_module("tether.cli", run_name="__main__")
"""
PHASES = ("start_of_a_step", "before_step_dir_rename", "before_latest_pointer", "inside_best_swap",
          "before_old_best_removed")


def run_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def killing_train(tmp_path_factory) -> Iterator[Callable[[Path, str], subprocess.CompletedProcess]]:
    """``killing_train(config, phase)``: a ``tether train`` process that SIGKILLs itself at ``phase`` (``none``: it
    runs to its end). Forked from a warm interpreter (tests/warm.py): 11 processes without 11 imports of torch."""
    env = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    with warm_python(tmp_path_factory.mktemp("stderr"), env) as python:
        yield lambda config, phase: python.run(KILLING_TRAIN, phase, str(config))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, killing_train):
    """The reference run (no kill), and a function writing the same config for another run directory."""
    root = tmp_path_factory.mktemp("phases")
    model, tok = tiny_model(seed=0)
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")

    def config(name: str) -> Path:
        cfg = tiny_config(root / name, f"model.name={root / 'model'}", "train.steps=3", "train.save_every=1",
                          "train.save_every_s=0", "train.keep_last=4", "val.every=1", "val.max_prompts=4")
        path = root / f"{name}.yaml"
        path.write_text(dump_config(cfg))
        return path

    done = killing_train(config("straight"), "none")
    assert done.returncode == 0, done.stderr
    return root / "straight" / "run", config


@pytest.mark.slow
@pytest.mark.parametrize("phase", PHASES)
def test_a_sigkill_at_each_phase_of_a_save_resumes_to_the_uninterrupted_result(uninterrupted, killing_train, phase):
    straight, config = uninterrupted
    path = config(phase)
    run_dir = path.with_suffix("") / "run"
    killed = killing_train(path, phase)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = killing_train(path, "none")  # the same command again
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr

    want, got = run_rows(straight), run_rows(run_dir)
    assert [row["step"] for row in got] == [row["step"] for row in want]  # nothing lost, nothing logged twice
    for w, g in zip(want, got, strict=True):
        shared = [k for k in (*COMPARED, "val/avg@k") if k in w]
        assert {k: g.get(k) for k in shared} == pytest.approx({k: w[k] for k in shared}, abs=1e-5)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == \
        sorted(p.name for p in (straight / "checkpoints").iterdir())  # no .old, .tmp or temporaries left
    for directory in ("step_000003", "best"):
        want_weights = load_file(straight / "checkpoints" / directory / "model.safetensors")
        got_weights = load_file(run_dir / "checkpoints" / directory / "model.safetensors")
        for name, tensor in want_weights.items():
            torch.testing.assert_close(got_weights[name], tensor, rtol=0, atol=1e-6)
    assert torch.load(run_dir / "checkpoints" / "best" / "trainer_state.pt")["step"] == 3
