"""Atomic checkpoints: a crash while saving never leaves a half-written 'latest' or 'best'.

Layout of ``run_dir/checkpoints``::

    step_000040/           weights and optimiser state (format of the distributed strategy), tokenizer,
                           trainer_state.pt
    best/                  a plain Hugging Face model directory (from_pretrained), tokenizer, trainer_state.pt
    latest                 a text file holding the name of the newest complete step directory

Each directory is written under a temporary name and renamed into place; ``latest`` is replaced
with ``os.replace`` only after its directory is complete. Under ``torchrun`` every rank takes part
(a sharded model writes one file per rank): rank 0 creates the temporary directory, every rank
writes, and rank 0 renames it once all have finished.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tether.distributed import DataParallel
from tether.track import write_text_atomic


def rng_state() -> dict[str, Any]:
    """The global RNGs. Sampling draws from its own seeded generator; these cover the rest (dropout, shuffles)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    # A checkpoint written on a GPU machine may be resumed on a CPU one, and the reverse.
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def publish_dir(target: Path, write: Callable[[Path], None], dp: DataParallel) -> None:
    """Build ``target`` in a temporary sibling with ``write(tmp)`` on every rank, then rename it into place.

    Collective: every rank must call it. The barriers make sure the directory exists before anyone writes
    and that every rank has finished before rank 0 renames.
    """
    tmp = target.with_name(target.name + ".tmp")
    if dp.is_main:
        if tmp.exists():
            shutil.rmtree(tmp)  # left by a crash during an earlier save
        tmp.mkdir(parents=True)
    dp.barrier()
    write(tmp)
    dp.barrier()
    if dp.is_main:
        old = target.with_name(target.name + ".old")
        if target.exists():
            os.replace(target, old)
        os.replace(tmp, target)
        if old.exists():
            shutil.rmtree(old)
    dp.barrier()


class CheckpointManager:
    """Step checkpoints, the pruned history of them, and ``best/``; every rank calls the same methods."""

    def __init__(self, run_dir: Path, keep_last: int, dp: DataParallel | None = None) -> None:
        self.root = Path(run_dir) / "checkpoints"
        self.keep_last = keep_last
        self.dp = dp or DataParallel()

    def save(self, step: int, write: Callable[[Path], None]) -> Path:
        """``step_<step>/`` filled by ``write(directory)``; then ``latest`` points at it and old steps go."""
        target = self.root / f"step_{step:06d}"
        publish_dir(target, write, self.dp)
        if self.dp.is_main:
            write_text_atomic(self.root / "latest", target.name)
            self._prune()
        self.dp.barrier()
        return target

    def save_best(self, write: Callable[[Path], None]) -> Path:
        target = self.root / "best"
        publish_dir(target, write, self.dp)
        return target

    def latest(self) -> Path | None:
        pointer = self.root / "latest"
        if not pointer.is_file():
            return None
        path = self.root / pointer.read_text().strip()
        return path if (path / "trainer_state.pt").is_file() else None

    def _prune(self) -> None:
        steps = sorted(p for p in self.root.glob("step_*") if p.is_dir() and not p.name.endswith((".tmp", ".old")))
        for old in steps[: -self.keep_last]:
            shutil.rmtree(old)


def load_state(path: Path) -> dict[str, Any]:
    """``trainer_state.pt`` on the CPU: a state written from GPU tensors loads on any machine and rank, and
    ``load_state_dict`` puts optimiser state and a saved reference on their parameters' devices."""
    return torch.load(Path(path) / "trainer_state.pt", map_location="cpu", weights_only=False)
