"""A task of one's own (``task.name: tests.rewards.user_tasks:Stalling``) whose score stalls on demand, for the tests
of ``task.timeout_s``."""

from __future__ import annotations

import math
import os
import threading
import time

from tether.tasks import Score, TaskItem


def stall(how: str) -> None:
    """Hang, busy-loop or end the process, as ``how`` says; anything else returns."""
    if how == "hang":
        time.sleep(600)
    elif how == "spin":
        while True:
            pass
    elif how == "exit":
        os._exit(7)
    elif how == "raise":
        raise RuntimeError("verifier down")


def waves(text: str) -> float:
    """A reward whose every bit depends on the text (for the tests that compare values on and off)."""
    return math.sin(len(text)) / 3 + math.sqrt(len(text) + 0.1)


class Stalling:
    """Reward :func:`waves` of the response; a response that names a stall (``hang``, ``spin``, ``exit``,
    ``raise``) stalls so, as does every response to an item of split ``stall_split`` (as ``stall``).

    ``lock=True`` holds a lock, which does not pickle: the task then reaches its process by name.
    """

    name, system_prompt = "stalling", None

    def __init__(self, stall_split: str | None = None, stall: str = "hang", lock: bool = False,
                 train_size: int = 12, val_size: int = 4) -> None:
        self.train = [TaskItem(f"Say something {i}.", None, id=f"stalling/train/{i}") for i in range(train_size)]
        self.val = [TaskItem(f"Say nothing {i}.", None, id=f"stalling/val/{i}") for i in range(val_size)]
        self.stall_split, self.stall = stall_split, stall
        self.lock = threading.Lock() if lock else None

    def score(self, item: TaskItem, text: str) -> Score:
        stall(self.stall if item.id.split("/")[1] == self.stall_split else text)
        return Score(waves(text), len(text) % 2 == 0, text)


class CountedPickles(Stalling):
    """:class:`Stalling` that counts how often this process pickles it."""

    pickles = 0

    def __getstate__(self) -> dict:
        type(self).pickles += 1
        return self.__dict__


class BareReward(Stalling):
    """:class:`Stalling` whose score is the bare number, not a :class:`Score`."""

    def score(self, item: TaskItem, text: str) -> float:
        return waves(text)


class WithPath(Stalling):
    """A task of one's own that takes a ``path`` of its own kind (not a Hub id)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path


class NoSystemPrompt:
    """A task of one's own without the ``system_prompt`` the run reads."""

    name = "no_system_prompt"

    def __init__(self) -> None:
        self.train = [TaskItem("Say something.", None, id="nsp/train/0")]
        self.val = [TaskItem("Say nothing.", None, id="nsp/val/0")]

    def score(self, item: TaskItem, text: str) -> Score:
        return Score(waves(text), True, text)


class NumberPrompts(Stalling):
    """:class:`Stalling` whose fourth held-out prompt is a number, not a text."""

    def __init__(self) -> None:
        super().__init__()
        self.val[3] = TaskItem(103, None, id="stalling/val/3")
