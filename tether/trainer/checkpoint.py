"""Atomic checkpoints: a crash while saving never leaves a half-written 'latest' or 'best'.

Layout of ``run_dir/checkpoints``::

    step_000040/           weights and optimiser state (format of the distributed strategy), tokenizer,
                           trainer_state.pt
    best/                  a plain Hugging Face model directory (from_pretrained), tokenizer, trainer_state.pt
    latest                 a text file holding the name of the newest complete step directory

Each directory is written under a temporary name, given a ``manifest.json`` (size and SHA-256 of every
file), and renamed into place; ``latest`` is replaced with ``os.replace`` only after its directory is
complete. Under ``torchrun`` every rank takes part (a sharded model writes one file per rank): rank 0
creates the temporary directory, every rank writes, and rank 0 hashes and renames it once all have finished.

A resume takes the newest step directory whose manifest verifies, passing over damaged ones with a
warning (:meth:`CheckpointManager.resumable`); :meth:`CheckpointManager.recover` undoes what a crash in
the middle of a save left behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tether.config import ConfigError
from tether.distributed import DataParallel
from tether.track import write_text_atomic

MANIFEST = "manifest.json"
STEP_DIR = re.compile(r"step_(\d+)")
# torch.save on a full disk raises RuntimeError ("unexpected pos ..."), not OSError: with less free space than this
# left, such an error is taken for a full disk.
FULL_DISK_BYTES = 64 * 2**20


class CheckpointWriteError(ConfigError):
    """A checkpoint could not be written (a full disk, no permission): one line naming the path and the cause."""


def dir_step(directory: Path) -> int:
    """The step of a ``step_<step>`` directory."""
    return int(STEP_DIR.fullmatch(directory.name).group(1))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(directory: Path) -> None:
    """Record the size and SHA-256 of every file under ``directory`` in ``directory/manifest.json``."""
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries = {str(p.relative_to(directory)): {"size": p.stat().st_size, "sha256": _sha256(p)} for p in files}
    write_text_atomic(directory / MANIFEST, json.dumps({"files": entries}, indent=1))


def checkpoint_problem(directory: Path) -> str | None:
    """Why ``directory`` cannot be resumed (a missing, truncated or altered file), or None when it can.

    A directory without a manifest (written before manifests existed) is accepted when it has its
    ``trainer_state.pt``.
    """
    if not (directory / "trainer_state.pt").is_file():
        return "trainer_state.pt is missing"
    manifest = directory / MANIFEST
    if not manifest.is_file():
        return None
    try:
        entries = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        return f"{MANIFEST} is unreadable"
    for name, entry in entries.items():
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != entry["size"]:
            return f"{name} has {path.stat().st_size} bytes, {entry['size']} were written"
        if _sha256(path) != entry["sha256"]:
            return f"{name} does not match its checksum"
    return None


def rng_state() -> dict[str, Any]:
    """The global RNGs, as :func:`tether.seeding.seed_everything` seeded them when the run started and the steps
    since left them. Sampling draws from its own seeded generator; these cover the rest (dropout, user code)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> list[str]:
    """Restore the global RNGs :func:`rng_state` saved.

    Returns:
        The names of those ``state`` lacks (python, numpy, torch), which go on as they are: a checkpoint of an older
        tether, or a part of ours that another wrote. The caller says so.
    """
    setters = {"python": random.setstate, "numpy": np.random.set_state, "torch": torch.set_rng_state}
    for name, setter in setters.items():
        if name in state:
            setter(state[name])
    # A checkpoint written on a GPU machine may be resumed on a CPU one, and the reverse.
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    return [name for name in setters if name not in state]


def restore_rng_state(state: dict[str, Any]) -> list[str]:
    """:func:`set_rng_state`, and what it could not restore in the words of a warning line: one phrase per generator
    a checkpoint of an older tether lacks."""
    return [f"the global {name} generator (it goes on from this start's seeding: user code that draws from it "
            "differs from the uninterrupted run; tether's sampling has its own seeded generators)"
            for name in set_rng_state(state)]


def say_not_restored(path: Path, lost: list[str]) -> None:
    """One warning line for what a checkpoint (or SFT state) of an older tether lacks and the run goes on without."""
    if lost:
        warnings.warn(f"{path} (an older tether's) does not restore " + "; nor ".join(lost), stacklevel=3)


def publish_dir(target: Path, write: Callable[[Path], None], dp: DataParallel) -> None:
    """Build ``target`` in a temporary sibling with ``write(tmp)`` on every rank, then rename it into place.

    Collective: every rank must call it. After each phase (rank 0 makes the directory, every rank writes, rank 0
    hashes and renames) the ranks agree on whether it went well (:func:`in_step`), so the directory exists before
    anyone writes, every rank has finished before rank 0 renames, and a failure anywhere stops every rank.

    Raises:
        CheckpointWriteError: on every rank, when any rank could not write (one line: the path and the cause).
    """
    tmp = target.with_name(target.name + ".tmp")
    in_step(dp, target, lambda: _fresh_dir(tmp) if dp.is_main else None, discard=tmp)
    in_step(dp, target, lambda: write(tmp), discard=tmp)
    in_step(dp, target, lambda: _swap_in(tmp, target) if dp.is_main else None, discard=tmp)


def _fresh_dir(tmp: Path) -> None:
    if tmp.exists():
        shutil.rmtree(tmp)  # left by a crash during an earlier save
    tmp.mkdir(parents=True)


def _swap_in(tmp: Path, target: Path) -> None:
    write_manifest(tmp)
    old = target.with_name(target.name + ".old")
    settle_old(target, old)  # a crash inside an earlier swap must not block this one
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


def in_step(dp: DataParallel, target: Path, action: Callable[[], None], *, discard: Path | None = None) -> None:
    """Run ``action`` on every rank, then agree on how it went: one rank's failure stops them all.

    Under ``torchrun`` a rank that raised alone would leave the others waiting at the next collective until the
    process group's timeout (30 minutes by default), so every rank reports, and all raise the same line.

    Args:
        discard: a partial directory to remove on failure (what fits of a partial checkpoint is never read;
            freeing its space is what a full disk needs).

    Raises:
        CheckpointWriteError: on every rank when any rank failed to write (naming the path, the cause, and under
            ``torchrun`` the rank). The failing rank re-raises its own error instead when it is not a write error
            (a bug, whose traceback is wanted).
    """
    error: Exception | None = None
    try:
        action()
    except Exception as err:  # any failure must reach the other ranks before anyone raises
        error = err
    # judged once, before the partial directory goes: removing it frees the space a full disk lacked
    known = write_error(target, error) if isinstance(error, OSError | RuntimeError) else None
    failed = dp.first_failure(None if error is None else _failure_line(target, error, known))
    if failed is None:
        return
    if discard is not None and dp.is_main:
        shutil.rmtree(discard, ignore_errors=True)
    if error is not None and known is None:
        raise error
    rank, line = failed
    raise CheckpointWriteError(f"{line} (rank {rank} of {dp.world_size})" if dp.enabled else line) from None


def _failure_line(target: Path, err: Exception, known: CheckpointWriteError | None) -> str:
    if known is not None:
        return str(known)
    first = (str(err).splitlines() or [""])[0]
    return f"cannot write checkpoint {target}: {type(err).__name__}: {first}"


def write_error(target: Path, err: OSError | RuntimeError) -> CheckpointWriteError | None:
    """One line for a failed write of ``target``: the path and the cause; None for a RuntimeError that is not a
    full disk (a bug, whose traceback is wanted)."""
    if isinstance(err, OSError):
        where, cause = err.filename or target, err.strerror or str(err)
    else:
        free = shutil.disk_usage(target.parent if target.parent.exists() else Path.cwd()).free
        if free >= FULL_DISK_BYTES:
            return None
        where, cause = target, f"no space left on the device ({free // 2**20} MiB free)"
    return CheckpointWriteError(f"cannot write checkpoint {where}: {cause}; the checkpoints written before are "
                                "intact (free space or fix permissions, then run again to resume)")


def settle_old(target: Path, old: Path) -> None:
    """After a crash between ``target -> old`` and the removal of ``old``: keep ``target`` if the new one made
    it into place, else put the old one back."""
    if not old.exists():
        return
    if target.exists():
        shutil.rmtree(old)
    else:
        os.replace(old, target)


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
        in_step(self.dp, self.root / "latest", lambda: self._point_latest(target) if self.dp.is_main else None)
        return target

    def _point_latest(self, target: Path) -> None:
        write_text_atomic(self.root / "latest", target.name)
        self._prune()

    def save_best(self, write: Callable[[Path], None]) -> Path:
        target = self.root / "best"
        publish_dir(target, write, self.dp)
        return target

    def latest(self) -> Path | None:
        """The newest step directory that verifies (see :meth:`resumable`), or None."""
        return self.resumable(warn=False)

    def step_dirs(self) -> list[Path]:
        """Complete-by-name step directories, newest first (``latest`` may lag behind a crash after a rename)."""
        found = [p for p in self.root.glob("step_*") if p.is_dir() and STEP_DIR.fullmatch(p.name)]
        return sorted(found, key=dir_step, reverse=True)

    def resumable(self, warn: bool = True) -> Path | None:
        """The newest step directory whose files match their manifest; each damaged newer one is named in a
        warning (``warn``) and passed over."""
        for path in self.step_dirs():
            problem = checkpoint_problem(path)
            if problem is None:
                return path
            if warn:
                warnings.warn(f"checkpoint {path} is damaged ({problem}); trying an older one",
                              stacklevel=2)
        return None

    def recover(self) -> None:
        """Rank 0, before anything is read: finish or undo a swap a crash interrupted, and drop temporaries."""
        if not self.root.is_dir():
            return
        for old in self.root.glob("*.old"):
            settle_old(old.with_name(old.name[: -len(".old")]), old)
        for tmp in self.root.glob("*.tmp"):
            shutil.rmtree(tmp, ignore_errors=True)
        for tmp in self.root.glob(".*.tmp.*"):  # write_text_atomic's, left by a kill between write and rename
            tmp.unlink(missing_ok=True)

    def _prune(self) -> None:
        for old in self.step_dirs()[self.keep_last:]:
            shutil.rmtree(old)


def load_state(path: Path) -> dict[str, Any]:
    """``trainer_state.pt`` on the CPU: a state written from GPU tensors loads on any machine and rank, and
    ``load_state_dict`` puts optimiser state and a saved reference on their parameters' devices."""
    return torch.load(Path(path) / "trainer_state.pt", map_location="cpu", weights_only=False)
