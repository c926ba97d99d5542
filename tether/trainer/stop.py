"""Ending a run early without losing it: SIGTERM/SIGINT become a checkpoint, too many bad updates a clear stop."""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType

from tether.errors import EXIT_STOPPED, TetherError


class TrainingStopped(TetherError, RuntimeError):
    """The run ended before ``train.steps`` and can be resumed: a signal (after a checkpoint; exit code 128 + N),
    updates that stayed non-finite or a DAPO refill shortfall (exit code 4)."""

    def __init__(self, message: str, exit_code: int = EXIT_STOPPED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class StopSignals:
    """While active, SIGTERM and SIGINT are remembered in :attr:`signal` instead of ending the process, so the
    loop can finish its step and save. The first one restores the previous handlers: a second Ctrl-C acts at once.

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

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._restore()
