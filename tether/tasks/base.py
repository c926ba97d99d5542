"""What every task speaks: :class:`TaskItem` in, :class:`Score` out, and the :class:`Task` Protocol."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass
class TaskItem:
    """One prompt of a task.

    Attributes:
        prompt: the user message text, answer-format instruction included; or, for conversational data, the
            conversation so far as ``{"role", "content"}`` messages (the system message included, if any).
        answer: the gold answer as text, or ``None`` when the scorer needs no gold answer.
        meta: anything the scorer needs (for reasoning-gym: the generator's ``entry``).
        id: stable identifier, ``"<source>/<split>/<index>"`` for the built-in tasks.
        images: the prompt's images (a vision-language policy's), in the order of its image parts (a prompt without
            any gets them before its first user message's text): sources of :mod:`tether.tasks.images` (a PIL image,
            bytes, an absolute file path).
    """

    prompt: str | list[dict[str, str]]
    answer: str | None
    meta: dict[str, Any] = field(default_factory=dict)
    id: str = ""
    images: tuple[Any, ...] = ()


def prompt_text(prompt: str | list[dict[str, str]]) -> str:
    """A prompt as one hashable string, equal for equal prompts: a text as it is, a conversation as its JSON."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)


@dataclass(frozen=True)
class Score:
    """The verdict on one response.

    Attributes:
        reward: the scalar the trainer optimises, shaping included.
        correct: the verifier's judgement, independent of reward shaping (ARMOR and the
            accuracy metrics use this, never ``reward``).
        extracted: the answer text pulled out of the response, or ``None`` if none was found.
        fault: ``True`` when the scorer itself failed (raised or timed out); the row is then scored
            as wrong. The trainer counts these as ``reward/faults``.
        error: the failure's ``"ExceptionType: message"`` when ``fault``, else ``None``.
        components: for a composite reward, its terms by name, summing to ``reward`` (e.g.
            ``{"accuracy": 1.0, "format": 0.1}``); the reward audit logs each one's share
            (``reward/component/<name>``, docs/health.md). ``None``: the reward is one term.
    """

    reward: float
    correct: bool
    extracted: str | None
    fault: bool = False
    error: str | None = None
    components: Mapping[str, float] | None = None


@runtime_checkable
class Task(Protocol):
    """A single-turn verifiable task: fixed train/val splits and a scorer.

    Attributes:
        name: short name used in logs, e.g. ``"reasoning_gym/basic_arithmetic"``.
        train: training items, fixed for a given seed.
        val: held-out items, fixed for a given seed, never sharing a prompt with ``train``.
        system_prompt: system message to put before every prompt, or ``None`` for none.
    """

    name: str
    train: list[TaskItem]
    val: list[TaskItem]
    system_prompt: str | None

    def score(self, item: TaskItem, response_text: str) -> Score:
        """Score one response to ``item``. Built-in tasks never raise here (see :func:`safe_score`)."""
        ...


def fault_score(error: BaseException, extracted: str | None = None, reward: float = 0.0) -> Score:
    """The score of a row whose scorer failed: wrong, with the error recorded."""
    return Score(reward=reward, correct=False, extracted=extracted, fault=True,
                 error=f"{type(error).__name__}: {error}")


def safe_score(task: Task, item: TaskItem, response_text: str, *, fault_reward: float = 0.0) -> Score:
    """Call ``task.score`` so that a scorer bug costs one row, not the run.

    Built-in tasks already contain their own faults (and give them their configured wrong-answer
    reward); this wrapper is the last line of defence for user tasks.

    Args:
        task: any object following :class:`Task`.
        item: the item the response answers.
        response_text: the decoded response.
        fault_reward: reward of a row whose scorer raised. Keep it at or below the wrong-answer
            reward, or the policy learns to crash the scorer.

    Returns:
        The task's score, or a wrong score with ``fault=True``.
    """
    try:
        return task.score(item, response_text)
    except Exception as error:  # containing arbitrary scorer bugs is the point
        return fault_score(error, reward=fault_reward)


def score_batch(task: Task, items: Sequence[TaskItem], texts: Sequence[str]) -> list[Score]:
    """Scores of a batch of responses: the task's ``score_batch(items, texts)`` where it has one (reward functions,
    reward models and judges score a batch at once, :mod:`tether.rewards`), else ``score`` row by row."""
    batch = getattr(task, "score_batch", None)
    if batch is not None:
        return batch(items, texts)
    return [task.score(item, text) for item, text in zip(items, texts, strict=True)]


REWARD_MODES: tuple[str, ...] = ("binary", "score")


@dataclass(frozen=True)
class RewardMap:
    """Turns a verifier's score in [0, 1] into the training reward.

    ``binary``: ``correct_reward`` if correct else ``wrong_reward``.
    ``score``: the linear map ``wrong + score * (correct - wrong)``, so partial credit survives and
    the defaults (1, 0) give the raw score. DAPO's ±1 reward is ``correct=1.0, wrong=-1.0``.

    Attributes:
        mode: ``"binary"`` or ``"score"``.
        correct: reward of a fully correct answer (score 1).
        wrong: reward of a wrong answer (score 0), also given to faults.
    """

    mode: str = "score"
    correct: float = 1.0
    wrong: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in REWARD_MODES:
            raise ValueError(f"reward={self.mode!r} is not supported; "
                             f"expected one of {', '.join(REWARD_MODES)}")
        for name, value in (("reward_correct", self.correct), ("reward_wrong", self.wrong)):
            if not math.isfinite(value):  # every row's reward would be a fault
                raise ValueError(f"{name}={value} is not a finite number")

    def __call__(self, score: float, correct: bool) -> float:
        if self.mode == "binary":
            return self.correct if correct else self.wrong
        return self.wrong + score * (self.correct - self.wrong)


def task_split(task: Task, split: str) -> list[TaskItem]:
    """Items of split ``split``: ``train`` and ``val`` for every task, more (``report``, ``sft``) where a task
    has a ``splits`` mapping (e.g. :class:`~tether.tasks.addition.AdditionTask`).

    Raises:
        ValueError: the task has no such split (the message lists the ones it has).
    """
    splits = getattr(task, "splits", None) or {"train": task.train, "val": task.val}
    if split not in splits:
        from tether.config import did_you_mean

        guess = did_you_mean(split, splits).rstrip()
        raise ValueError(f"task {task.name!r} has no split {split!r}; it has: {', '.join(splits)}"
                         + (f"; {guess}" if guess else ""))
    return splits[split]
