"""What a run shows while it works, on stderr (stdout keeps the command's JSON result for scripts):

* :func:`status`: one line per phase before the first step (loading the policy, the reference, the engine, each
  validation), with the seconds since the command started, so the minutes before a bar are not silent;
* :class:`Progress`: per step, a live bar on a terminal, or one plain line per step with its ETA when stderr is a
  file or a pipe (a log, ``2>&1 | tee``, nohup), where a bar would print nothing until the end.
"""

from __future__ import annotations

import os
import sys
import time
from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress

_STARTED = time.monotonic()


def _is_main_rank() -> bool:
    return os.environ.get("RANK", "0") == "0"


def status(message: str, *, stream: TextIO | None = None) -> None:
    """``[tether 12.3s] message`` on stderr (rank 0 only): what the run is doing before its progress starts."""
    if _is_main_rank():
        print(f"[tether {time.monotonic() - _STARTED:.1f}s] {message}", file=stream or sys.stderr, flush=True)


def format_eta(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class StepLines:
    """One plain line per step: ``label step 3/50  info  1.2 s/step  eta 0:58`` (the rate of this session's
    steps, so a resumed run's ETA is not skewed by the steps it skipped)."""

    def __init__(self, total: int, *, start: int = 0, label: str = "step", stream: TextIO | None = None) -> None:
        self.total, self.start, self.label = total, start, label
        self.stream = stream
        self._began = time.monotonic()

    def line(self, step: int, info: str = "") -> str:
        done = step - self.start
        per_step = (time.monotonic() - self._began) / done if done > 0 else float("nan")
        eta = format_eta(per_step * (self.total - step)) if done > 0 else "?"
        rate = f"{per_step:.1f} s/{self.label}" if done > 0 else ""
        return "  ".join(part for part in (f"{self.label} {step}/{self.total}", info, rate, f"eta {eta}") if part)

    def update(self, step: int, info: str = "") -> None:
        print(self.line(step, info), file=self.stream or sys.stderr, flush=True)


class Progress:
    """The per-step display of training: a rich bar on a terminal, :class:`StepLines` elsewhere."""

    def __init__(self, total: int, *, start: int = 0, enabled: bool = True, plain: bool | None = None) -> None:
        self.enabled = enabled
        self.val = "-"
        self.plain = (not sys.stderr.isatty()) if plain is None else plain
        self._lines = StepLines(total, start=start)
        self._bar = RichProgress(TextColumn("step {task.completed}/{task.total}"), BarColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("eta"),
                                 TimeRemainingColumn(), console=Console(stderr=True),
                                 disable=not enabled or self.plain)
        self._task = self._bar.add_task("train", total=total, completed=start, info="")

    def __enter__(self) -> Progress:
        self._bar.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._bar.stop()

    def update(self, step: int, metrics: dict[str, float]) -> None:
        if "val/avg@k" in metrics:
            self.val = f"{metrics['val/avg@k']:.3f}"
        reward = metrics.get("train/reward_mean", float("nan"))
        info = f"reward {reward:.3f}  val {self.val}"
        if self.enabled and self.plain:
            self._lines.update(step, info)
        self._bar.update(self._task, completed=step, info=info)
