"""What a training start finds in its run directory, settled before any model loads.

One process writes a run directory at a time (:func:`lock_run_dir`). A start with ``train.resume=true``
continues from the newest checkpoint that verifies, or stops with one line when the directory holds an
earlier run it cannot continue; it never restarts from step 0 over an earlier run without being told to
(``train.resume=false``). Settings that change what the run means must match the run being resumed
(:data:`MEANING_KEYS`). Metric rows logged after the resumed step are dropped, so a resumed run's
``metrics.jsonl`` reads as if it had never stopped.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

import yaml

from tether.config import Config, ConfigError, dump_config
from tether.distributed import DataParallel
from tether.track import write_text_atomic
from tether.trainer.checkpoint import CheckpointManager, checkpoint_problem

LOCK = ".lock"
# Settings whose change would make a resumed run a different experiment than the one its checkpoint belongs to
# (the optimiser's restored state would also silently keep the old learning rate). A key covers its sub-keys.
MEANING_KEYS = (
    "seed", "model.name", "model.ref_name", "task", "env", "rollout.prompts_per_step", "rollout.group_size",
    "rollout.max_new_tokens", "rollout.temperature", "rollout.top_p", "rollout.top_k", "rollout.dynamic_sampling",
    "rollout.overlong", "algorithm", "optim.lr", "optim.betas", "optim.weight_decay", "optim.warmup_steps",
    "optim.grad_clip", "optim.mini_batches", "optim.ppo_epochs", "methods", "distributed.strategy",
)

_HELD: dict[Path, int] = {}  # lock files this process holds -> their descriptors (held until the process ends)


class RunDirError(ConfigError):
    """The run directory cannot be used as configured (in use, unwritable, or an earlier run in the way)."""


def lock_run_dir(run_dir: Path) -> None:
    """Make this process the one writer of ``run_dir``.

    An advisory ``flock`` on ``run_dir/.lock``: the kernel releases it when its process dies however it dies,
    so a lock left by a killed run is never stale. The file holds the holder's pid and host for the message.
    Taking it again in the same process is a no-op (a recipe's stages, tests).

    Raises:
        RunDirError: another live process holds the lock (the message names it).
    """
    path = run_dir.resolve() / LOCK
    if path in _HELD:
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = path.read_text().strip() or "another process"
        os.close(fd)
        raise RunDirError(f"run_dir {run_dir} is in use by {holder}; wait for it to end or stop it, or set "
                          "another run_dir") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"process {os.getpid()} on {socket.gethostname()}\n".encode())
    _HELD[path] = fd


def flat(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists stay leaves."""
    if not isinstance(data, dict) or (prefix and not data):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def check_resume_settings(cfg: Config, saved_config: Path) -> None:
    """Refuse to resume with a setting of :data:`MEANING_KEYS` changed from the run's ``config.yaml``.

    Raises:
        RunDirError: the first changed setting, its two values and the ways out.
    """
    if not saved_config.is_file():
        return
    old = flat(yaml.safe_load(saved_config.read_text()) or {})
    new = flat(cfg.model_dump(mode="json"))
    for key in sorted(set(old) | set(new)):
        if not any(key == k or key.startswith(k + ".") for k in MEANING_KEYS):
            continue
        if old.get(key) != new.get(key):
            raise RunDirError(f"{key}: {new.get(key)!r} differs from {old.get(key)!r} in the run being resumed "
                              f"({saved_config}); set it back, or start afresh with train.resume=false or "
                              "another run_dir")


def truncate_metrics(path: Path, through_step: int) -> None:
    """Keep the rows of ``metrics.jsonl`` up to ``through_step``: the later ones are logged again after a resume.
    A torn line (a kill mid-write) goes too."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= through_step:
            kept.append(line + "\n")
    write_text_atomic(path, "".join(kept))


def _earlier_run(run_dir: Path, checkpoints: CheckpointManager) -> str | None:
    """What in ``run_dir`` shows an earlier run (when no checkpoint of it can be resumed), or None."""
    damaged = [f"{p.name}: {checkpoint_problem(p)}" for p in checkpoints.step_dirs()]
    if damaged:
        return "only damaged checkpoints (" + "; ".join(damaged) + ")"
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size:
        return "metrics.jsonl but no checkpoint"
    return None


def _start_afresh(run_dir: Path, checkpoints: CheckpointManager) -> None:
    """``train.resume=false``: the earlier run's checkpoints and metric rows go, so nothing of it is resumed,
    evaluated or plotted as this run's later."""
    for path in [*checkpoints.step_dirs(), checkpoints.root / "best"]:
        if path.is_dir():
            shutil.rmtree(path)
    (checkpoints.root / "latest").unlink(missing_ok=True)
    (run_dir / "best.txt").unlink(missing_ok=True)
    truncate_metrics(run_dir / "metrics.jsonl", -1)


def prepare_run_dir(cfg: Config, checkpoints: CheckpointManager, dp: DataParallel) -> Path | None:
    """Lock and tidy ``cfg.run_dir``, choose where the run starts and write its ``config.yaml``.

    Collective under ``torchrun`` (rank 0 writes, every rank reads the same choice).

    Returns:
        The checkpoint to resume from, or None to start at step 0.

    Raises:
        RunDirError: the directory is unwritable or used by another process, or holds an earlier run that cannot
            be resumed, or the run being resumed had other settings.
    """
    run_dir = Path(cfg.run_dir)
    if dp.is_main:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            lock_run_dir(run_dir)
            for tmp in run_dir.glob(".*.tmp.*"):  # write_text_atomic's temporaries, left by a kill
                tmp.unlink()
            checkpoints.recover()
        except OSError as err:
            raise RunDirError(f"run_dir {run_dir}: {err.strerror or err} ({err.filename or run_dir})") from None
    dp.barrier()
    start = checkpoints.resumable() if cfg.train.resume else None
    if dp.is_main:
        if start is not None:
            check_resume_settings(cfg, run_dir / "config.yaml")
            truncate_metrics(run_dir / "metrics.jsonl", int(start.name[5:]))
            print(f"resuming {run_dir} from {start.name}", file=sys.stderr)
        elif not cfg.train.resume:
            _start_afresh(run_dir, checkpoints)
        elif (found := _earlier_run(run_dir, checkpoints)) is not None:
            raise RunDirError(f"run_dir {run_dir} holds an earlier run with {found}: nothing to resume; start "
                              "afresh with train.resume=false (its checkpoints and metrics are removed), or set "
                              "another run_dir")
        write_text_atomic(run_dir / "config.yaml", dump_config(cfg))
    dp.barrier()
    return start
