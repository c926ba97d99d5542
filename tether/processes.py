"""A ``tether`` command that ends when the process that started it ends: the runs ``tether experiment`` starts.

The runner names itself in :data:`PARENT_ENV` (:func:`starter_env`); every ``tether`` command reads it at its start
(:func:`end_with_starter`) and, once the runner is gone however it went (``kill -9`` included), sends itself one
SIGTERM, so ``tether train`` saves its step and stops (exit 143) instead of training on as an orphan that holds its
run directory's lock against the runner started again. The kernel's parent-death signal (``PR_SET_PDEATHSIG``) is
not used: it fires once per thread of the dying runner (the child is handed to its next thread each time), and the
second SIGTERM ends a run at once, in the middle of its save. This module imports nothing of tether's.
"""

from __future__ import annotations

import os
import signal
import threading
import time

#: The pid of the process that started this ``tether`` command and whose end should end it too.
PARENT_ENV = "TETHER_PARENT_PID"
POLL_S = 1.0  # how late, at most, a run hears that its runner is gone


def starter_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a ``tether`` command that should stop (SIGTERM) when this process ends."""
    return {**env, PARENT_ENV: str(os.getpid())}


def end_with_starter() -> None:
    """In a ``tether`` command started with :func:`starter_env`, watch the starter from a daemon thread. The variable
    goes, so this command's own children do not inherit it."""
    starter = os.environ.pop(PARENT_ENV, None)
    if starter is not None and starter.isdigit():
        threading.Thread(target=_stop_when_orphaned, args=(int(starter),), name="tether-starter-watch",
                         daemon=True).start()


def _stop_when_orphaned(starter: int) -> None:
    """One SIGTERM to this process once its parent is no longer ``starter`` (it ended, and the process was
    reparented)."""
    while os.getppid() == starter:
        time.sleep(POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)
