"""The start every command shares (``train``, ``eval``, ``sft``, ``seed-sft``): the device, the checks, the threads,
the seed; the run directory's lock; the metric sinks; the signals.

:func:`start_run` resolves the device against the machine first, so a missing GPU stops a command before it checks
anything else, loads a model or writes a file; then it runs every check that needs no model (:mod:`tether.checks`),
and sets ``train.threads`` and seeds Python's, NumPy's and torch's global generators from ``seed``
(:func:`tether.seeding.seed_everything`), before any model exists (a LoRA adapter's initialisation draws from that
seed). Sampling seeds are not global: :mod:`tether.seeding`.

One process writes a run directory at a time (:func:`lock_run_dir`): ``tether train`` takes the lock when it settles
what the directory holds (:mod:`tether.trainer.rundir`: resume, an earlier run in the way); ``tether sft`` and
``tether seed-sft`` take it in :func:`claim_run_dir`, then settle theirs (:mod:`tether.recipes.sft_state`).

While a command's steps run, SIGTERM and SIGINT are remembered (:class:`StopSignals`) and the loop stops after the
step under way: ``tether train`` saves a checkpoint first, ``tether sft`` and ``tether seed-sft`` their resumable
``run_dir/sft_state`` (never ``run_dir/checkpoint``: a partial warm start would pass for a finished one); each ends
with :class:`~tether.errors.TrainingStopped`, exit code 128 + the signal's number.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import threading
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING

import torch

from tether.config import ConfigError, LoggingConfig, RunConfig
from tether.distributed import resolve_device
from tether.seeding import seed_everything

if TYPE_CHECKING:
    from tether.track import Tracker

LOCK = ".lock"
_HELD: dict[Path, int] = {}  # lock files this process holds -> their descriptors (held until the process ends)


class RunDirError(ConfigError):
    """The run directory cannot be used as configured (in use, unwritable, or an earlier run in the way)."""


def start_run(cfg: RunConfig, *, policy: bool = True, training: bool = True) -> torch.device:
    """Resolve ``train.device`` on this machine (raises ``ConfigError`` naming the key), run the checks of
    :func:`tether.checks.run_checks` (``policy=False`` when the caller brings the policy, ``training=False`` for a
    command that trains nothing), set ``train.threads`` and seed Python's, NumPy's and torch's global generators
    with ``seed``. Returns the device."""
    from tether.checks import run_checks  # the checks import the registries: every layer below this one

    device = resolve_device(cfg.train.device)
    run_checks(cfg, policy=policy, training=training)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    seed_everything(cfg.seed)
    return device


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


def claim_run_dir(run_dir: str | Path) -> Path:
    """The run directory of ``tether sft`` or ``tether seed-sft``, created and locked (:func:`lock_run_dir`);
    nothing in it is touched (what an earlier run left is the caller's to settle).

    Raises:
        RunDirError: ``run_dir`` is a file, or another process writes it.
    """
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"run_dir {run_dir} is a file, not a directory; set another run_dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    lock_run_dir(run_dir)
    return run_dir


def run_tracker(logging: LoggingConfig, run_dir: Path, resumed_at: int = 0) -> Tracker:
    """The metric sinks ``logging`` names, writing into ``run_dir``, for a run that continues from step
    ``resumed_at`` (0: a fresh one; :func:`tether.track.build_tracker`)."""
    from tether.track import build_tracker

    return build_tracker(run_dir, tensorboard=logging.tensorboard, wandb=logging.wandb, mlflow=logging.mlflow,
                         resumed_at=resumed_at)


class StopSignals:
    """While active, SIGTERM and SIGINT are remembered in :attr:`signal` instead of ending the process, so a loop can
    finish its step (and ``tether train`` save it). The first one prints one line on stderr (:func:`stop_notice`)
    and restores the previous handlers: a second Ctrl-C acts at once.

    Only the main thread may install handlers; elsewhere this does nothing.
    """

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._remember)
        return self

    def _remember(self, signum: int, frame: FrameType | None) -> None:
        self.signal = signum
        self._restore()
        if os.environ.get("RANK", "0") == "0":  # under torchrun every rank gets the signal; one line says it
            os.write(2, stop_notice(signum).encode())  # not print: a print under way in the main thread would raise

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._restore()


def stop_notice(signum: int) -> str:
    """The line a first stop signal prints at once: a step can take minutes (or hang, in a user's reward function),
    and a run that said nothing read as one that ignored the signal (seen: a SIGTERM from `timeout`, 10 minutes of
    silence)."""
    name = "Ctrl-C (SIGINT)" if signum == signal.SIGINT else signal.Signals(signum).name
    return (f"{name}: stopping once the step under way is finished and saved; {name} again stops at once, without "
            "saving it\n")
