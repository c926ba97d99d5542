"""What a run shows while it works, on stderr (stdout keeps the command's JSON result for scripts):

* :func:`status`: one line per phase before the first step (loading the policy, the reference, the engine, each
  validation), with the seconds since the command started, so the minutes before a bar are not silent;
* :class:`Progress`: per step, a live bar on a terminal, or one plain line per step with its ETA when stderr is a
  file or a pipe (a log, ``2>&1 | tee``, nohup), where a bar would print nothing until the end;
* :class:`CountProgress`: through one phase counted in units (a validation's samples or episodes, in training and in
  ``tether eval``): a bar of its own on a terminal (a row under the training bar while that is live), else a plain
  line with the count, the rate and the ETA, at most every ``every_s`` seconds and at the end.
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
_LIVE: list[RichProgress] = []  # the training bar while it is live on a terminal: a validation bar joins it


def _is_main_rank() -> bool:
    return os.environ.get("RANK", "0") == "0"


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1 (by adding an s): ``1 sample``, ``4 samples``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


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
    steps, so a resumed run's ETA is not skewed by the steps it skipped). ``counts`` follows the count
    (``validation 64/256 samples``) and ``per`` names the rate's unit (default: the label)."""

    def __init__(self, total: int, *, start: int = 0, label: str = "step", counts: str = "", per: str | None = None,
                 stream: TextIO | None = None) -> None:
        self.total, self.start, self.label, self.per = total, start, label, per or label
        self.counts = f" {counts}" if counts else ""
        self.stream = stream
        self._began = time.monotonic()

    def line(self, step: int, info: str = "") -> str:
        done = step - self.start
        per_step = (time.monotonic() - self._began) / done if done > 0 else float("nan")
        eta = format_eta(per_step * (self.total - step)) if done > 0 else "?"
        rate = f"{per_step:.1f} s/{self.per}" if done > 0 else ""
        count = f"{self.label} {step}/{self.total}{self.counts}"
        return "  ".join(part for part in (count, info, rate, f"eta {eta}") if part)

    def update(self, step: int, info: str = "") -> None:
        print(self.line(step, info), file=self.stream or sys.stderr, flush=True)


class Progress:
    """The per-step display of training: a rich bar on a terminal, :class:`StepLines` elsewhere."""

    def __init__(self, total: int, *, start: int = 0, enabled: bool = True, plain: bool | None = None,
                 console: Console | None = None) -> None:
        self.enabled = enabled
        self.val = "-"
        self.plain = (not sys.stderr.isatty()) if plain is None else plain
        self._lines = StepLines(total, start=start)
        self._bar = rich_bar(console, disable=not enabled or self.plain)
        self._task = self._bar.add_task("step", total=total, completed=start, info="")

    def __enter__(self) -> Progress:
        self._bar.start()
        if not self._bar.disable:
            _LIVE.append(self._bar)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._bar in _LIVE:
            _LIVE.remove(self._bar)
        self._bar.stop()

    def update(self, step: int, metrics: dict[str, float]) -> None:
        if "val/avg@k" in metrics:
            self.val = f"{metrics['val/avg@k']:.3f}"
        reward = metrics.get("train/reward_mean", float("nan"))
        info = f"reward {reward:.3f}  val {self.val}"
        if self.enabled and self.plain:
            self._lines.update(step, info)
        self._bar.update(self._task, completed=step, info=info)


def rich_bar(console: Console | None, *, disable: bool = False) -> RichProgress:
    """A bar whose rows read ``<description> <done>/<total>  [bar]  <info>  elapsed  eta``."""
    return RichProgress(TextColumn("{task.description} {task.completed}/{task.total}"), BarColumn(),
                        TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("eta"),
                        TimeRemainingColumn(), console=console or Console(stderr=True), disable=disable)


class CountProgress:
    """Progress through ``total`` ``unit`` of one phase, e.g. ``CountProgress("validation", 256, "samples")``.

    On a terminal, a bar: a row of the training bar while that is live (rich shows one live display at a time), else a
    bar of its own. Elsewhere, plain lines ``validation 64/256 samples  0.4 s/sample  eta 1:17``: the first update, then
    at most one every ``every_s`` seconds, and the last, so a log gets a few lines per validation, not one per call.
    Use it as a context manager and call :meth:`update` (``update(done, total)`` fits the collectors' callbacks).
    """

    def __init__(self, label: str, total: int, unit: str, *, enabled: bool = True, plain: bool | None = None,
                 every_s: float = 10.0, console: Console | None = None, stream: TextIO | None = None) -> None:
        self.label, self.total, self.unit, self.every_s = label, total, unit, every_s
        self.enabled = enabled and _is_main_rank()
        self.plain = (not sys.stderr.isatty()) if plain is None else plain
        self._lines = StepLines(total, label=label, counts=unit, per=unit.removesuffix("s"), stream=stream)
        self._console = console
        self._bar: RichProgress | None = None
        self._own_bar = False
        self._task: int | None = None
        self._printed_at: float | None = None
        self._printed_done: int | None = None

    def __enter__(self) -> CountProgress:
        if self.enabled and not self.plain:
            self._own_bar = not _LIVE
            self._bar = rich_bar(self._console) if self._own_bar else _LIVE[-1]
            self._task = self._bar.add_task(self.label, total=self.total, info=self.unit)
            if self._own_bar:
                self._bar.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._bar is None or self._task is None:
            return
        if self._own_bar:
            self._bar.stop()
        else:
            self._bar.remove_task(self._task)

    def update(self, done: int, total: int | None = None) -> None:
        if not self.enabled:
            return
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=done)
            return
        now = time.monotonic()
        if done == self._printed_done:  # a caller may report the same count twice (the agent loop's end)
            return
        if done >= self.total or self._printed_at is None or now - self._printed_at >= self.every_s:
            self._printed_at, self._printed_done = now, done
            self._lines.update(done)
