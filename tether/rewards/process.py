"""``task.rewards[i].timeout_s``: a reward function called in a process of its own, so that its limit holds.

A call made in a thread can be abandoned at a limit but not stopped: Python cannot kill a thread, so a reward
function that busy-loops would keep a core (and, in C code holding the GIL, the whole trainer) after its limit, and one
that calls ``os._exit`` would end the run. With a limit set, the term is built and called in a child process, by the
env processes' machinery (:mod:`tether.envs.isolated`: a small process that has imported only
:mod:`tether.rewards.terms` forks the child, which is reused by later calls; POSIX only): a call past the limit kills
the child, whatever it was doing, and a child that ends is replaced by a fresh one at the next call. The caller
(:class:`~tether.rewards.terms.RewardTerm`) turns either into a fault of every row of the batch, counted as any
reward fault.

A class (a reward model, a judge, :class:`~tether.rewards.VerlScore`) is built in the child, once per child, with at
least :data:`~tether.envs.isolated.START_LIMIT_S` for it, since loading a model may take longer than scoring a batch.

``task.timeout_s`` scores a task's batches the same way (:class:`~tether.rewards.task.ProcessScoredTask`,
:data:`TASK_SCORER`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tether.envs.isolated import START_LIMIT_S, ChildPool, Subject
from tether.envs.safe import EnvFault


def _no_facts(_: Any) -> None:
    """A reward child's ``make`` answers nothing: the trainer reads nothing of the built term."""


REWARD = Subject("reward function", "the reward function (or class) and its kwargs", "unset its timeout_s",
                 _no_facts)
TASK_SCORER = Subject("task scorer", "the task (or its class and task.kwargs)", "unset task.timeout_s",
                      _no_facts)


class ProcessCalls:
    """Calls of one callable built by ``factory`` (an in-process term: ``factory()(prompts, completions, columns)``;
    a task's scorer, :mod:`tether.rewards.task`: ``factory()(items, texts)``), each in a child process under
    ``timeout_s``.

    Args:
        factory: builds the callable in the child; it must pickle (a class or function by reference).
        timeout_s: the limit of one call, in seconds.
        subject: what the processes serve, for the messages of their faults.

    Raises (from ``__call__``):
        EnvFault: the call timed out or its process ended (``timed_out=True``), or it raised outside the term's own
            containment (``SystemExit``: ``timed_out=False``).
    """

    def __init__(self, factory: Callable[[], Any], timeout_s: float, subject: Subject = REWARD) -> None:
        self.children = ChildPool(factory, subject)
        self.timeout_s = timeout_s

    def __call__(self, *args: Any) -> Any:
        child = self.children.take(self.children.subject.noun)
        try:
            if not child.made:
                child.request("make", None, timeout_s=max(self.timeout_s, START_LIMIT_S), what="building it")
                child.made = True
            return child.request("call", ("__call__", args), timeout_s=self.timeout_s, what="the call")
        except EnvFault:  # answered, or killed at the limit, or gone: the child is in a known state
            raise
        except BaseException:  # interrupted (Ctrl-C) mid-call, or the batch did not pickle: a late reply of this
            child.end()       # call must not answer the next one, so the child goes
            raise
        finally:
            self.children.give(child)  # a live child serves the next call; an ended one is dropped

    @staticmethod
    def fault(error: Exception) -> tuple[str, str, str | None]:
        """(message, kind, traceback) of what :meth:`__call__` raised: an :class:`EnvFault` of the call, or the
        batch's arguments that did not pickle."""
        if isinstance(error, EnvFault):
            return str(error), error.kind, error.traceback
        return f"its arguments could not be sent to its process ({type(error).__name__}: {error})", "bad batch", None

