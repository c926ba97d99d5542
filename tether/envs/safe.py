"""Fault containment: an env that crashes or hangs ends its episode as failed, not the run.

:class:`SafeEnv` builds the env and runs every ``reset`` / ``step`` / ``parse_action`` of it in a fresh daemon
thread and waits at most ``timeout_s`` (``reset_timeout_s`` for building and resetting). An exception, a timeout or a
malformed result (a reset that is not an :class:`EnvReset`, a step that is not an :class:`EnvStep` or whose reward is
not a finite number, a parse that is not ``(action, valid)``) becomes a *fault*: the episode ends as failed
(``done=True``, ``info["won"]=False``, ``info["fault"]=<message>``, ``info["fault_report"]``: a :class:`FaultReport`
with the phase, the kind of error and its traceback), ``faults`` goes up by one, and the env instance is discarded;
the next ``reset`` builds a new one with the ``make`` factory. The caller never sees the exception and never waits
longer than the timeout. The report travels with the result, so the agent loop logs a fault the same way wherever
the env ran (a thread, a process, a Ray worker).

Why threads: a thread costs ~0.1 ms per call and needs no pickling, so any env works unchanged. The price: Python
cannot kill a thread, so a hung call keeps running in the background (a daemon thread, so it never blocks interpreter
exit) with whatever CPU and memory it holds, a busy loop keeps its core, a hang inside C code that holds the GIL
stalls the whole process, and ``os._exit`` ends it. :class:`~tether.envs.isolated.ProcessEnv` (``env.isolation:
process``, the agent loop's default) is this class with the env in a child process, which can be killed.

``EpisodeOverError`` (stepping a finished episode) is a caller bug and is re-raised, not contained.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import numbers
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from tether.envs.base import EnvReset, EnvStep, EpisodeOverError, TextEnv

T = TypeVar("T")


class EnvFault(Exception):
    """An env call raised or timed out (internal to :class:`SafeEnv`).

    Attributes:
        timed_out (bool): True for a timeout (the call may still be running), False for an exception.
        kind (str): what went wrong, for grouping faults: the exception's type name, ``"timeout"``, ``"bad result"``,
            ``"process ended"``.
        traceback (str | None): the env's traceback where it raised; for a thread's timeout, the stack the call
            hangs in; None where there is none (a bad result, a process killed or gone).
    """

    def __init__(self, message: str, timed_out: bool, kind: str | None = None, traceback: str | None = None) -> None:
        super().__init__(message)
        self.timed_out = timed_out
        self.kind = kind or ("timeout" if timed_out else "error")
        self.traceback = traceback


@dataclasses.dataclass(frozen=True)
class FaultReport:
    """One contained fault, as an episode's step or reset carries it (``info["fault_report"]``).

    Attributes:
        message (str): one line naming the env, the call and the error (also ``info["fault"]``).
        phase (str): the call that faulted: ``"constructor"``, ``"reset"``, ``"parse_action"``, ``"step"`` or
            ``"solution"`` (one past its limit).
        kind (str): :attr:`EnvFault.kind` (``"worker died"`` for a Ray worker that died).
        traceback (str | None): :attr:`EnvFault.traceback`.
    """

    message: str
    phase: str
    kind: str
    traceback: str | None = None

    @classmethod
    def of(cls, fault: EnvFault, phase: str) -> FaultReport:
        return cls(str(fault), phase, fault.kind, fault.traceback)


def call_with_timeout(fn: Callable[[], T], timeout_s: float, what: str) -> T:
    """Run ``fn`` in a daemon thread; raise :class:`EnvFault` if it raises or outlives ``timeout_s``.

    Args:
        fn (Callable[[], T]): the call.
        timeout_s (float): seconds to wait; the thread is abandoned (not killed) after that.
        what (str): a description for the fault message, e.g. ``"step('up')"``.

    Returns:
        T: what ``fn`` returned.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # anything the env throws is contained, KeyboardInterrupt too
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True, name=f"tether-env {what}")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        frame = sys._current_frames().get(thread.ident)  # where it hangs: the line to look at first
        stack = None if frame is None else "".join(traceback.format_stack(frame))
        raise EnvFault(f"{what} timed out after {timeout_s:g}s", timed_out=True, traceback=stack)
    if "error" in box:
        err = box["error"]
        if isinstance(err, EpisodeOverError):
            raise err
        raise EnvFault(f"{what} raised {type(err).__name__}: {err}", timed_out=False, kind=type(err).__name__,
                       traceback="".join(traceback.format_exception(err))) from err
    return box["value"]


class SafeEnv:
    """Wrap an env so that its faults end the episode instead of the caller.

    Args:
        make (Callable[[], TextEnv]): builds a fresh env; called once now and again after each fault.
        timeout_s (float): limit for ``step`` (and ``solution``).
        reset_timeout_s (float | None): limit for ``reset`` and for rebuilding the env (default
            ``timeout_s``); TextWorld's first reset of a seed compiles a game, so give it more.
        reset_retries (int): a faulted construction or reset is tried again this many times, each with a freshly
            built env, before the episode counts as faulted (every try's fault is counted in ``faults``).

    Attributes:
        faults (int): faults so far (the rollout loop reports it as a metric).
        last_fault (str | None): the latest fault message.

    A faulted ``reset`` returns an :class:`EnvReset` with ``info["fault"]`` set; the next ``step``
    then returns the failed, done step without touching the env. Check ``reset.info.get("fault")``
    to skip the episode early.
    """

    def __init__(self, make: Callable[[], TextEnv], timeout_s: float = 30.0,
                 reset_timeout_s: float | None = None, reset_retries: int = 0) -> None:
        self._make = make
        self.reset_retries = reset_retries
        self.timeout_s = timeout_s
        self.reset_timeout_s = timeout_s if reset_timeout_s is None else reset_timeout_s
        self.name: str = getattr(make, "__name__", "env")
        self.faults = 0
        self.last_fault: str | None = None
        self._pending_fault: FaultReport | None = None  # a reset or parse fault, reported by the next step
        self._construction_fault: FaultReport | None = None  # reported by the first reset
        self._episode_over = False
        self._env: TextEnv | None = None
        self._start()

    def _start(self) -> None:
        """Build the first env now; a constructor fault is reported by the first ``reset``."""
        try:
            self._build()
        except EnvFault as fault:
            self._construction_fault = self._record(fault, "constructor")

    def _build(self) -> None:
        """Build a fresh env under the reset limit (raises :class:`EnvFault`)."""
        self._adopt(call_with_timeout(self._make, self.reset_timeout_s, f"{self.name} make()"))

    def _call(self, method: str, *args: Any, timeout_s: float, what: str) -> Any:
        """``env.<method>(*args)`` of the current env under ``timeout_s`` (raises :class:`EnvFault`)."""
        return call_with_timeout(functools.partial(getattr(self._env, method), *args), timeout_s, what)

    def _adopt(self, env: Any) -> None:
        self._env = env
        self.name, self.max_turns, self.action_format = env.name, env.max_turns, env.action_format

    def __getattr__(self, attr: str) -> Any:
        # Env-specific extras (train_seeds, level, desc...) read through to the current env.
        if attr.startswith("_") or self.__dict__.get("_env") is None:
            raise AttributeError(attr)
        return getattr(self._env, attr)

    @property
    def env(self) -> TextEnv | None:
        """The wrapped env (None between a fault and the next reset)."""
        return self._env

    def reset(self, seed: int) -> EnvReset:
        """Build the env if needed and reset it; a fault of either is tried again ``reset_retries`` times with a
        fresh env. When every try faulted, the first fault is the episode's (later ones often only echo it). The
        faults of the tries that are not the episode's (all of them when a try succeeded) ride along in
        ``info[RETRIED_FAULTS]``, so that the rollout loop counts and reports every try's fault."""
        self._pending_fault, self._episode_over = None, False
        reports: list[FaultReport] = []
        for _ in range(self.reset_retries + 1):
            if self._construction_fault is not None:  # the constructor faulted in __init__: that is this try
                report, self._construction_fault = self._construction_fault, None
                reports.append(report)
                continue
            phase = "constructor"
            try:
                if self._env is None:
                    self._build()
                phase, what = "reset", f"{self.name} reset({seed})"
                reset = self._call("reset", seed, timeout_s=self.reset_timeout_s, what=what)
                if (problem := reset_problem(reset)) is not None:  # gymnasium's tuple would fail the loop later
                    raise EnvFault(f"{what} {problem}", timed_out=False, kind="bad result")
                return with_retried_faults(reset, reports)
            except EnvFault as fault:
                reports.append(self._record(fault, phase))  # every try's fault is counted
        self._pending_fault = reports[0]
        return with_retried_faults(fault_reset(reports[0]), reports[1:])

    def step(self, action: str) -> EnvStep:
        if self._pending_fault is not None:
            report, self._pending_fault = self._pending_fault, None
            self._episode_over = True
            return fault_step(report)
        if self._episode_over or self._env is None:
            raise EpisodeOverError(f"{self.name}: step() after a faulted episode; call reset(seed) first")
        what = f"{self.name} step({action[:60]!r})"
        try:
            step = self._call("step", action, timeout_s=self.timeout_s, what=what)
            if (problem := step_problem(step)) is not None:
                raise EnvFault(f"{what} {problem}", timed_out=False, kind="bad result")
            return dataclasses.replace(step, reward=float(step.reward))  # a numpy scalar (gymnasium's) as a float
        except EnvFault as fault:
            self._episode_over = True
            return fault_step(self._record(fault, "step"))

    def parse_action(self, response_text: str) -> tuple[str, bool]:
        """The env's parse; one that raises, hangs or returns something else than ``(str, bool)`` is a fault,
        reported by the next ``step``."""
        if self._env is None or self._pending_fault is not None:
            return "", False
        what = f"{self.name} parse_action()"
        try:
            parsed = self._call("parse_action", response_text, timeout_s=self.timeout_s, what=what)
            if not (isinstance(parsed, tuple) and len(parsed) == 2 and isinstance(parsed[0], str)):
                raise EnvFault(f"{what} returned {parsed!r}, not (action, valid)", timed_out=False, kind="bad result")
            return parsed[0], bool(parsed[1])
        except EnvFault as fault:
            self._pending_fault = self._record(fault, "parse_action")
            return "", False

    def solution(self) -> list[str] | None:
        """The env's solution, or None if it faults. A solver that raises leaves the episode going; one past the
        limit ends it as a counted fault, reported by the next ``step``: its env is gone (its process killed) or
        still busy in its thread, and the next call would go to another process's env, or race with the solver."""
        if self._env is None or self._pending_fault is not None:
            return None
        try:
            return self._call("solution", timeout_s=self.timeout_s, what=f"{self.name} solution()")
        except EnvFault as fault:
            if fault.timed_out:
                self._pending_fault = self._record(fault, "solution")
            return None

    def close(self) -> None:
        if self._env is not None:
            self._close_quietly()
        self._env = None

    def _close_quietly(self) -> None:
        with contextlib.suppress(EnvFault):  # best effort: the env is dropped either way
            self._call("close", timeout_s=self.timeout_s, what=f"{self.name} close()")

    def _record(self, fault: EnvFault, phase: str) -> FaultReport:
        """Count the fault and drop the env so that a fresh one serves the next episode."""
        self.faults += 1
        self.last_fault = str(fault)
        # A hung env is still busy in its thread: closing it from here could race with it.
        if self._env is not None and not fault.timed_out:
            self._close_quietly()
        self._env = None
        return FaultReport.of(fault, phase)


def reset_problem(reset: Any) -> str | None:
    """What makes ``reset`` unusable (not an :class:`EnvReset`: gymnasium's ``(observation, info)``), or None."""
    return None if isinstance(reset, EnvReset) else f"returned {type(reset).__name__}, not an EnvReset"


def step_problem(step: Any) -> str | None:
    """What makes ``step`` unusable (not an :class:`EnvStep`, or a reward that is not a finite real number: numpy's
    ``float32`` and ``int64`` are, a bool is not), or None."""
    if not isinstance(step, EnvStep):
        return f"returned {type(step).__name__}, not an EnvStep"
    reward = step.reward
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(reward):
        return f"returned the reward {reward!r}, not a finite number"
    return None


RETRIED_FAULTS = "retried_faults"  # EnvReset.info: the FaultReports of a reset's earlier tries that it outlived


def with_retried_faults(reset: EnvReset, reports: list[FaultReport]) -> EnvReset:
    """``reset`` with ``info[RETRIED_FAULTS] = reports`` where there are any (the env's own info is copied)."""
    if not reports:
        return reset
    return dataclasses.replace(reset, info={**reset.info, RETRIED_FAULTS: reports})


def fault_reset(report: FaultReport) -> EnvReset:
    """What a faulted ``reset`` returns: no task, ``info["fault"]`` (the message) and ``info["fault_report"]`` set."""
    return EnvReset(observation=f"[environment fault] {report.message}", task="", admissible_actions=None,
                    info={"fault": report.message, "fault_report": report})


def fault_step(report: FaultReport) -> EnvStep:
    """What a faulted ``step`` returns: the episode ends as failed, ``info["fault"]`` (the message) and
    ``info["fault_report"]`` set."""
    info = {"won": False, "admissible_actions": None, "invalid_action": False, "fault": report.message,
            "fault_report": report}
    return EnvStep(observation=f"[environment fault] {report.message}", reward=0.0, done=True, info=info)
