"""A tiny-config builder shared by the trainer tests, on the built-in ``parity`` task, and an update of a fixed batch
with anchors."""

from __future__ import annotations

import contextlib
import copy
import multiprocessing
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from tether.checks import load_checked_config
from tether.config import Config

TOY_TASK = "parity"  # the built-in smoke task (tether/tasks/parity.py): reward varies on random weights


def tiny_config(tmp_path: Any, *overrides: str, **data: Any) -> Config:
    base = {
        "seed": 0, "run_dir": str(tmp_path / "run"),
        "task": {"name": TOY_TASK, "kwargs": {}},
        "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 6},
        "optim": {"lr": 1e-3, "micro_batch_size": 4},
        "val": {"every": 0, "samples": 2},
        "train": {"steps": 2},
        "logging": {"tensorboard": False, "progress": False},
    }
    for key, value in data.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return load_checked_config(data=base, overrides=list(overrides))


def _hold_lock(run_dir: Path, locked: Any) -> None:
    from tether.start import lock_run_dir

    lock_run_dir(run_dir)
    locked.set()
    time.sleep(60)


@contextlib.contextmanager
def lock_held_elsewhere(run_dir: Path) -> Iterator[int]:
    """Another process holds ``run_dir``'s lock while the block runs; yields its pid. Forked, not spawned (no second
    interpreter start: the tests stay fast); killed after the block, which releases the lock with it."""
    fork = multiprocessing.get_context("fork")
    locked = fork.Event()
    holder = fork.Process(target=_hold_lock, args=(run_dir, locked), daemon=True)
    holder.start()
    try:
        assert locked.wait(10)
        yield holder.pid
    finally:
        holder.kill()
        holder.join()


ANCHORS = [1, 3, 7]  # rows of tests.distributed.helpers.fixed_batch marked as ARMOR's anchors (source 1)


def update_with_anchors(policy: Any, run_dir: Path, micro_batch_size: int, *overrides: str,
                        sample_log_probs: torch.Tensor | None = None, truncated: tuple[int, ...] = (),
                        **tokens: torch.Tensor) -> dict[str, float]:
    """The metrics of one update (two mini-batches of 5 rows) of the fixed batch with :data:`ANCHORS` as anchors,
    in micro-batches of ``micro_batch_size`` rows: ``tokens`` (e.g. ``old_log_probs``, ``ref_log_probs``, float64
    ``[10, 6]``) and ``sample_log_probs`` replace what scoring and the engine gave, so every metric follows from
    them; the rows ``truncated`` hit the length limit (``info["truncated"]``)."""
    from tests.distributed.helpers import UPDATE, fixed_batch
    from tether.trainer import Trainer

    model, tok = policy
    trainer = Trainer(tiny_config(run_dir, *UPDATE, f"optim.micro_batch_size={micro_batch_size}", *overrides),
                      policy=copy.deepcopy(model), tokenizer=tok)
    batch = fixed_batch()
    batch.source[ANCHORS] = 1
    batch.info["truncated"] = [row in truncated for row in range(len(batch))]
    trainer.score(batch)
    for name, value in tokens.items():
        batch.token[name] = value.float() * batch.response_mask
    if sample_log_probs is not None:
        batch.sample_log_probs = sample_log_probs.float() * batch.response_mask
    trainer.compute_advantages(batch)
    return trainer.update(batch)


class RecordingSink:
    """A sink like W&B's (WandbSink): records the config it is handed and the steps it logs."""

    def __init__(self) -> None:
        self.configs: list[dict[str, Any]] = []
        self.steps: list[int] = []

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.steps.append(step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.configs.append(dict(config))

    def close(self) -> None:
        pass
