"""Reward functions written as for TRL's GRPOTrainer, imported by the tests as ``tests.rewards.user_rewards``."""

from __future__ import annotations

import math


def length_reward(prompts, completions, **kwargs):
    """Length of each completion in characters (TRL's signature; columns arrive in kwargs)."""
    return [float(len(c if isinstance(c, str) else c[0]["content"])) for c in completions]


def echo_answer(prompts, completions, answer, **kwargs):
    """1.0 where the completion contains the row's ``answer`` column, None where the row has none."""
    return [None if a is None else float(str(a) in c) for c, a in zip(completions, answer, strict=True)]


def scaled(prompts, completions, scale=1.0):
    """``scale`` for every row (no **kwargs: receives only what it names)."""
    return [scale] * len(completions)


def broken(prompts, completions, **kwargs):
    raise RuntimeError("reward server down")


def short_list(prompts, completions, **kwargs):
    return [1.0] * (len(completions) - 1)


def nan_on_first(prompts, completions, **kwargs):
    return [math.nan] + [1.0] * (len(completions) - 1)


def needs_ids(prompts, completions, completion_ids, **kwargs):
    return [float(len(ids)) for ids in completion_ids]


def completions_only(completions, **kwargs):
    """TRL's own examples' signature (``reward_len``): no ``prompts``, everything by keyword."""
    return [float(len(c)) for c in completions]


def solution_match(completions, solution, **kwargs):
    """TRL's ``accuracy_reward`` signature: the completions, then a dataset column, both by keyword."""
    return [float(c == s) for c, s in zip(completions, solution, strict=True)]


def no_completions(prompts, responses):
    return [0.0] * len(responses)


def positional_only(prompts, completions, /):
    return [0.0] * len(completions)


class Counter:
    """A class reward: built once with its settings, then called per batch."""

    def __init__(self, bonus: float = 1.0) -> None:
        self.bonus, self.calls = bonus, 0

    def __call__(self, prompts, completions, **kwargs):
        self.calls += 1
        return [self.bonus] * len(completions)


NOT_CALLABLE = 3


class NoCall:
    def __init__(self) -> None:
        self.ready = True


def as_array(prompts, completions, **kwargs):
    """A numpy array of lengths, as numpy-minded code returns them."""
    import numpy as np

    return np.array([len(c) for c in completions], dtype=np.float32) / 2


def as_tensor(prompts, completions, **kwargs):
    import torch

    return torch.tensor([float(len(c)) for c in completions], dtype=torch.float64)


def as_generator(prompts, completions, **kwargs):
    return (float(len(c)) for c in completions)


def scalar_array(prompts, completions, **kwargs):
    """One 0-d array for the whole batch: not one value per completion."""
    import numpy as np

    return np.array(1.0)


LOOPS: list = []


async def async_length(prompts, completions, **kwargs):
    """An async reward function (TRL awaits them); records the loop it ran on."""
    import asyncio

    await asyncio.sleep(0)
    LOOPS.append(asyncio.get_running_loop())
    return [float(len(c)) for c in completions]


async def async_broken(prompts, completions, **kwargs):
    raise ConnectionError("judge unreachable")


def waves(prompts, completions, **kwargs):
    """Values with every bit of a float64 in use, to compare two ways of calling exactly."""
    return [math.sin(len(c)) / 3 + math.sqrt(len(c) + 0.1) for c in completions]


def stalls_on(prompts, completions, **kwargs):
    """Waits (far past any test's limit) on a batch holding "hang", spins on one holding "spin" and ends its process
    on one holding "exit"; else :func:`waves`."""
    import os
    import time

    if "hang" in completions:
        time.sleep(600)
    while "spin" in completions:
        pass
    if "exit" in completions:
        os._exit(7)
    return waves(prompts, completions)


def sleeps(prompts, completions, **kwargs):
    """Never answers within a test's limit."""
    import time

    time.sleep(600)


def solution_typo(completions, soluton, scale=1.0, **kwargs):
    """``solution`` misspelt: no column gives it."""
    return [scale * float(c == s) for c, s in zip(completions, soluton, strict=True)]


def completion_typo(completion, scale=1.0, **kwargs):
    """``completions`` misspelt (a required argument nothing passes; ``completions`` lands in ``kwargs``)."""
    return [scale] * len(completion)


def returns_text(prompts, completions, **kwargs):
    """One string for the batch: not a value per completion."""
    return "1.0"


def returns_nothing(prompts, completions, **kwargs):
    """A function that forgot its ``return``."""


def math_verified(prompts, completions, answer, **kwargs):
    """TRL's accuracy reward through math-verify, whose default limit is signal.alarm (the main thread's only)."""
    from math_verify import parse, verify

    return [float(verify(parse(a), parse(c))) for c, a in zip(completions, answer, strict=True)]
