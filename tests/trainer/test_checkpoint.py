"""Checkpoint directories appear whole or not at all, and a checkpoint resumes only under the strategy that wrote it."""

from __future__ import annotations

import pytest
import torch

from tests.trainer.helpers import tiny_config
from tether.config import ConfigError
from tether.models import tiny_model
from tether.trainer import Trainer
from tether.trainer.checkpoint import CheckpointManager, CheckpointWriteError, load_state, write_manifest


def write_marker(text: str):
    def write(directory):
        (directory / "trainer_state.pt").write_text(text)

    return write


def test_a_save_that_fails_midway_leaves_latest_and_the_old_directory_alone(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    manager.save(1, write_marker("one"))

    def crash(directory):
        (directory / "half_written").write_text("x")
        raise OSError("disk full")

    with pytest.raises(CheckpointWriteError, match=r"^cannot write checkpoint .*step_000002: disk full; the "
                                                   r"checkpoints written before are intact"):
        manager.save(2, crash)
    assert manager.latest() == manager.root / "step_000001"
    assert not (manager.root / "step_000002").exists()
    with pytest.raises(CheckpointWriteError, match="disk full"):
        manager.save_best(crash)
    assert not (manager.root / "best").exists()
    manager.save(2, write_marker("two"))  # the next saves clear what the crashes left
    manager.save_best(write_marker("best"))
    assert manager.latest() == manager.root / "step_000002"
    assert sorted(p.name for p in manager.root.iterdir()) == ["best", "latest", "step_000001", "step_000002"]


def test_a_full_disk_or_a_refused_write_is_one_line_naming_path_and_cause(tmp_path, monkeypatch):
    manager = CheckpointManager(tmp_path, keep_last=2)

    def refused(directory):
        raise PermissionError(13, "Permission denied", str(directory / "model.safetensors"))

    with pytest.raises(CheckpointWriteError, match=r"^cannot write checkpoint .*step_000001\.tmp/model\.safetensors: "
                                                   r"Permission denied;"):
        manager.save(1, refused)
    assert not (manager.root / "step_000001.tmp").exists()

    def torch_save_on_a_full_disk(directory):  # what torch.save raises when the disk fills mid-file
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 18944 vs 18836")

    monkeypatch.setattr("tether.trainer.checkpoint.shutil.disk_usage", lambda path: type("U", (), {"free": 2**20}))
    with pytest.raises(CheckpointWriteError, match=r"^cannot write checkpoint .*best: no space left on the device "
                                                   r"\(1 MiB free\)"):
        manager.save_best(torch_save_on_a_full_disk)
    monkeypatch.setattr("tether.trainer.checkpoint.shutil.disk_usage", lambda path: type("U", (), {"free": 2**40}))
    with pytest.raises(RuntimeError, match="unexpected pos"):  # with room on the disk it is a bug: its traceback
        manager.save_best(torch_save_on_a_full_disk)

    # the disk is full while the partial checkpoint exists; removing it frees the space: still a full disk
    partial = manager.root / "step_000002.tmp"

    def full_while_the_partial_exists(path):
        return type("U", (), {"free": 2**20 if partial.exists() else 2**30})

    def fill_the_disk(directory):
        (directory / "model.safetensors").write_bytes(b"x" * 100)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 785968576 vs 785968468")

    monkeypatch.setattr("tether.trainer.checkpoint.shutil.disk_usage", full_while_the_partial_exists)
    with pytest.raises(CheckpointWriteError, match=r"step_000002: no space left on the device \(1 MiB free\); the "
                                                   r"checkpoints written before are intact"):
        manager.save(2, fill_the_disk)
    assert not partial.exists()


def test_resume_refuses_a_checkpoint_written_by_another_strategy(tmp_path):
    model, tok = tiny_model(seed=0)
    path = Trainer(tiny_config(tmp_path, "train.steps=0"), policy=model, tokenizer=tok).save()
    state = load_state(path)
    assert state["strategy"] == "replicate"
    torch.save({**state, "strategy": "fsdp2"}, path / "trainer_state.pt")
    write_manifest(path)  # a deliberate edit, not damage
    model, tok = tiny_model(seed=0)
    with pytest.raises(ConfigError, match=r"written with distributed\.strategy=fsdp2"):
        Trainer(tiny_config(tmp_path), policy=model, tokenizer=tok)


def test_a_resumed_trainer_tells_its_metric_sinks_the_step_it_continues_from(tmp_path, monkeypatch):
    import tether.track

    model, tok = tiny_model(seed=0)
    trainer = Trainer(tiny_config(tmp_path, "train.steps=0"), policy=model, tokenizer=tok)
    trainer.step = 2
    trainer.save()
    seen = []
    build = tether.track.build_tracker
    monkeypatch.setattr(tether.track, "build_tracker", lambda *a, **k: seen.append(k["resumed_at"]) or build(*a, **k))
    Trainer(tiny_config(tmp_path), policy=tiny_model(seed=0)[0], tokenizer=tok)
    assert seen == [2]  # TensorBoard hides what a killed process logged after step 2


def test_the_cuda_rng_is_saved_and_restored_where_there_is_one(monkeypatch):
    """On CPU the CUDA calls are stood in for: the state must travel, and a CPU-only resume must skip it."""
    from tether.trainer import checkpoint

    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: ["gpu0-state"])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    state = checkpoint.rng_state()
    assert state["cuda"] == ["gpu0-state"]
    checkpoint.set_rng_state(state)
    assert restored == [["gpu0-state"]]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    checkpoint.set_rng_state(state)
    assert restored == [["gpu0-state"]]
