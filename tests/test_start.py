"""tether.start: the one start of train, eval, sft and seed-sft (device, checks, threads, seed; the run directory's
lock; the metric sinks)."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.rollout.helpers import seed_sft_config
from tests.trainer.helpers import lock_held_elsewhere
from tether.config import ConfigError, load_command_config
from tether.start import RunDirError, StopSignals, claim_run_dir, run_tracker, start_run


def sft_config(tmp_path: Path, *overrides: str):
    data = {"run_dir": str(tmp_path / "run"), "task": {"name": "addition"}, "model": {"name": "char-64x1"},
            "logging": {"tensorboard": False}, "sft": {"data": "task"}}
    return load_command_config("sft", data=data, overrides=list(overrides))


def test_start_sets_threads_and_the_seed_after_the_checks(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr("tether.checks.run_checks", lambda cfg, policy, training: calls.append(("checks", policy)))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(("threads", n)))
    monkeypatch.setattr("tether.start.seed_everything", lambda s: calls.append(("seed", s)))
    assert start_run(sft_config(tmp_path, "seed=5", "train.threads=3", "train.device=cpu"), policy=False) == \
        torch.device("cpu")
    assert calls == [("checks", False), ("threads", 3), ("seed", 5)]


def eval_config(tmp_path: Path, *overrides: str):
    """``tether eval`` reads a training config."""
    data = {"run_dir": str(tmp_path / "run"), "task": {"name": "parity"}, "model": {"name": "char-64x1"},
            "logging": {"tensorboard": False}}
    return load_command_config("train", data=data, overrides=list(overrides))


def draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def seeded_by_hand(seed: int) -> tuple[float, float, float]:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return draws()


@pytest.mark.parametrize("config", [eval_config, sft_config])
def test_start_seeds_pythons_numpys_and_torchs_generators_from_the_run_seed(tmp_path, config):
    got = {}
    for seed in (3, 4):
        random.seed(99)  # whatever ran before
        np.random.seed(99)
        torch.manual_seed(99)
        start_run(config(tmp_path, f"seed={seed}", "train.device=cpu"), policy=False)
        got[seed] = draws()
    assert got[3] == seeded_by_hand(3) and got[4] == seeded_by_hand(4)
    assert all(a != b for a, b in zip(got[3], got[4], strict=True))  # each generator follows the seed


def test_start_runs_the_checks_of_the_commands_schema(tmp_path):
    with pytest.raises(ConfigError, match=r"sft\.path: no file"):
        start_run(sft_config(tmp_path, "sft.data=jsonl", f"sft.path={tmp_path / 'none.jsonl'}"), policy=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error a machine without CUDA gives")
def test_a_missing_gpu_is_reported_before_a_bad_config(tmp_path):
    cfg = sft_config(tmp_path, "train.device=cuda", "sft.data=jsonl", f"sft.path={tmp_path / 'none.jsonl'}")
    with pytest.raises(ConfigError, match=r"train\.device=cuda"):
        start_run(cfg)


def test_claim_creates_and_locks_the_run_directory_and_deletes_nothing(tmp_path):
    run_dir = tmp_path / "a" / "run"
    assert claim_run_dir(run_dir) == run_dir and (run_dir / ".lock").is_file()
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    (run_dir / "data.jsonl").write_text("{}\n")
    claim_run_dir(run_dir)  # the same process again: its own lock
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock", "data.jsonl", "metrics.jsonl"]
    assert (run_dir / "metrics.jsonl").read_text() == '{"step": 1}\n'  # an earlier run is the command's to settle
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunDirError, match="is a file, not a directory"):
        claim_run_dir(tmp_path / "file")


def test_sft_refuses_a_run_directory_another_process_writes(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with lock_held_elsewhere(run_dir) as pid, \
            pytest.raises(RunDirError, match=rf"is in use by process {pid} on .*; wait for it"):
        claim_run_dir(run_dir)
    claim_run_dir(run_dir)  # the kernel released the dead holder's lock


@pytest.mark.parametrize("command", ["sft", "seed-sft"])
def test_both_sft_commands_lock_their_run_directory_before_any_model_loads(tmp_path, monkeypatch, command):
    from tether.recipes.seed_sft import run_skill_sft
    from tether.recipes.sft import run_sft

    def refused(run_dir: Path) -> None:
        raise RunDirError(f"run_dir {run_dir} is in use")

    def no_model(name: str) -> None:
        pytest.fail(f"{name} loaded")

    monkeypatch.setattr("tether.start.lock_run_dir", refused)
    monkeypatch.setattr("tether.models.load_policy", no_model)  # what both load through (SFTSession.load_policy)
    if command == "sft":
        (tmp_path / "pairs.jsonl").write_text('{"prompt": "1+1?", "response": "2"}\n' * 4)
        cfg = sft_config(tmp_path, "sft.data=jsonl", f"sft.path={tmp_path / 'pairs.jsonl'}")
        with pytest.raises(RunDirError, match="is in use"):
            run_sft(cfg)
    else:
        cfg = seed_sft_config(tmp_path, "model.name=char-64x1", methods={"seed": {}})
        with pytest.raises(RunDirError, match="is in use"):
            run_skill_sft(cfg)
    assert not (Path(cfg.run_dir) / "metrics.jsonl").exists()


def test_the_tracker_follows_the_logging_section(tmp_path):
    cfg = sft_config(tmp_path)
    with run_tracker(cfg.logging, tmp_path / "run") as tracker:
        tracker.log({"sft/loss": 1.5}, 1)
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == '{"step": 1, "sft/loss": 1.5}\n'
    assert not (tmp_path / "run" / "tensorboard").exists()  # logging.tensorboard=false


@pytest.mark.parametrize(("signum", "name"), [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "Ctrl-C (SIGINT)")])
def test_a_first_stop_signal_says_at_once_what_happens_and_how_to_stop_now(capfd, signum, name):
    """A step can take minutes, or hang in a user's reward function: the run said nothing until the step ended, and
    a SIGTERM from `timeout` read as ignored (10 minutes of silence, measured)."""
    before = signal.getsignal(signum)
    with StopSignals() as signals:
        os.kill(os.getpid(), signum)
        assert signals.signal == signum
        assert signal.getsignal(signum) is before  # the second one acts at once
        assert capfd.readouterr().err == (f"{name}: stopping once the step under way is finished and saved; {name} "
                                          "again stops at once, without saving it\n")
