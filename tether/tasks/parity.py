"""``parity``: a smoke task whose reward varies across samples of any model, random weights included.

A random model never solves a real task, so every reward is 0, every group has zero advantage, and
DAPO's filter, ARMOR's acceptance test and EAPO's gate never see a decision. Scoring the parity of the
response's length gives about half the samples reward 1 whatever the weights: ``scripts/gpu_smoke.py``
and the trainer tests use it to drive every path of a method. It measures nothing about a model.
"""

from __future__ import annotations

from tether.tasks.base import Score, TaskItem
from tether.tasks.registry import register_task


@register_task("parity")
class ParityTask:
    """Reward 1 (and ``correct``) when the response has an even number of characters, else 0."""

    name = "parity"
    system_prompt = None

    def __init__(self, train_size: int = 12, val_size: int = 4) -> None:
        self.train = [TaskItem(prompt=f"Say something {i}.", answer=None, id=f"parity/train/{i}")
                      for i in range(train_size)]
        self.val = [TaskItem(prompt=f"Say nothing {i}.", answer=None, id=f"parity/val/{i}") for i in range(val_size)]

    def score(self, item: TaskItem, response_text: str) -> Score:
        even = len(response_text) % 2 == 0
        # the scorer reads the whole response: that is the "answer" (never missing, for the reward audit)
        return Score(reward=float(even), correct=even, extracted=response_text)
