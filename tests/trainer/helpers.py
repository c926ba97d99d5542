"""A tiny-config builder shared by the trainer tests, on the built-in ``parity`` task."""

from __future__ import annotations

from typing import Any

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
