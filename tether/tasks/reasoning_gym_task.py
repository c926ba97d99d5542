"""Any reasoning-gym procedural dataset as a :class:`~tether.tasks.base.Task`.

reasoning-gym builds item ``i`` of a dataset with seed ``s`` from ``Random(s + i)``, so two splits
drawn with seeds 0 and 1 would share almost every item. The val split therefore uses a seed
``2**30`` away (far apart, and still below the ``2**32`` numpy seeds some generators use), and
train drops any item whose question text appears in val. An optional ``report`` split (``report_size``: the
lab's endpoint split, read by nothing during training) is drawn next, ``2**30`` further on, without val's
questions; train then drops those too.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Any

from tether.tasks.base import RewardMap, Score, TaskItem, fault_score
from tether.tasks.extract import (
    DEFAULT_PROMPT_TEMPLATE,
    check_extract_mode,
    check_template,
    extract_answer,
    format_prompt,
)
from tether.tasks.registry import register_task

VAL_SEED_OFFSET = 2**30
# Draw budget per split, as growing multiples of the size asked for; past it the question space
# of the config is too small for the split and we say so instead of looping.
_DRAW_ROUNDS = (1, 4, 16, 64)
_RESERVED_KWARGS = {"seed": "seed / val_seed", "size": "train_size / val_size"}


def _create(dataset: str, kwargs: dict[str, Any], seed: int, size: int) -> Any:
    """``reasoning_gym.create_dataset`` with errors that name the bad setting."""
    import reasoning_gym

    _check_dataset(dataset, kwargs)
    return reasoning_gym.create_dataset(dataset, seed=seed, size=size, **kwargs)


def _check_dataset(dataset: str, kwargs: dict[str, Any]) -> None:
    """The dataset is registered in reasoning-gym and ``kwargs`` make a valid config of it, checked the way
    ``create_dataset`` checks them but without generating anything.

    Raises:
        ValueError: unknown dataset (with close names), or a value its config's ``validate`` refuses.
        TypeError: a setting that is not a field of its config (with the allowed ones).
    """
    from reasoning_gym.factory import DATASETS

    if dataset not in DATASETS:
        close = difflib.get_close_matches(dataset, DATASETS, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown reasoning-gym dataset {dataset!r}.{hint} "
                         f"Known: {', '.join(sorted(DATASETS))}")
    config_cls = DATASETS[dataset][1]
    try:
        config = config_cls(**kwargs)
    except TypeError as error:
        fields = [f.name for f in dataclasses.fields(config_cls) if f.name not in _RESERVED_KWARGS]
        raise TypeError(f"bad dataset_kwargs for reasoning-gym {dataset!r}: {error}. "
                        f"Allowed: {', '.join(fields)}") from error
    try:
        if hasattr(config, "validate"):
            config.validate()
    except AssertionError as error:  # reasoning-gym validates configs with assert
        raise ValueError(f"invalid dataset_kwargs for reasoning-gym {dataset!r}: {error}") from error


def _draw(dataset: str, kwargs: dict[str, Any], seed: int, n: int, exclude: set[str],
          unique: bool) -> tuple[list[dict[str, Any]], Any]:
    """Draw ``n`` entries in index order, skipping questions in ``exclude`` (and repeats if ``unique``).

    Returns:
        The entries and the generator instance (its ``score_answer`` scores them).

    Raises:
        ValueError: the config cannot produce ``n`` acceptable questions within the draw budget.
    """
    for factor in _DRAW_ROUNDS:
        size = n * factor + 16
        generator = _create(dataset, kwargs, seed, size)
        picked: list[dict[str, Any]] = []
        seen: set[str] = set()
        for index in range(size):
            entry = generator[index]
            question = entry["question"]
            if question in exclude or (unique and question in seen):
                continue
            seen.add(question)
            picked.append(entry)
            if len(picked) == n:
                return picked, generator
    raise ValueError(f"reasoning-gym {dataset!r} with dataset_kwargs={kwargs} gave only {len(picked)} usable "
                     f"questions out of {size} draws (need {n}); its question space is too small. "
                     "Lower train_size/val_size/report_size or widen dataset_kwargs.")


@register_task("reasoning_gym")
class ReasoningGymTask:
    """A reasoning-gym dataset with seeded, disjoint train/val splits, scored by its own ``score_answer``.

    ``correct`` is ``score >= 1.0``: some datasets give partial credit (the default scorer gives
    ``len(gold) / len(answer)`` when the gold answer is a substring), which counts as wrong.

    Args:
        dataset: reasoning-gym dataset name, e.g. ``"basic_arithmetic"``, ``"chain_sum"``.
        dataset_kwargs: config fields passed to ``reasoning_gym.create_dataset`` (not seed/size).
        train_size: number of training items (may repeat a question when the space is small).
        val_size: number of held-out items (unique questions, none in train).
        seed: seed of the train split.
        val_seed: seed of the val split; default ``seed + 2**30``. Fix it to keep one val set
            across runs with different ``seed``.
        extract: answer extraction rule (``auto``, ``answer_tag``, ``boxed``, ``last_number``).
        prompt_template: user message; ``{question}`` is replaced by the dataset's question.
        system_prompt: system message, or ``None``.
        reward: ``"score"`` (the dataset's score, linearly mapped) or ``"binary"``.
        reward_correct: reward of a correct answer.
        reward_wrong: reward of a wrong answer, a missing answer, and a scorer fault.
        features: response features for validation metrics, name -> regular expression; a response has the
            feature when the expression matches anywhere in it (``{working: "="}`` logs
            ``val/working/share`` and ``val/working/accuracy``: how often answers show their working, and
            how often those are right).
        report_size: number of items of a third split, ``report`` (unique questions, none in val or train):
            a held-out split no validation reads, for a study's endpoint (``tether eval ... val.split=report``,
            the lab's ``endpoint.split``). 0: no such split, and train is drawn exactly as without it.
        report_seed: seed of the report split; default ``val_seed + 2**30``.
    """

    def __init__(self, *, dataset: str, dataset_kwargs: dict[str, Any] | None = None, train_size: int = 1000,
                 val_size: int = 100, seed: int = 0, val_seed: int | None = None, extract: str = "auto",
                 prompt_template: str = DEFAULT_PROMPT_TEMPLATE, system_prompt: str | None = None,
                 reward: str = "score", reward_correct: float = 1.0, reward_wrong: float = 0.0,
                 features: dict[str, str] | None = None, report_size: int = 0,
                 report_seed: int | None = None) -> None:
        self.check_config(dataset=dataset, dataset_kwargs=dataset_kwargs, train_size=train_size,
                          val_size=val_size, extract=extract, prompt_template=prompt_template, features=features,
                          report_size=report_size)
        self.features = {name: re.compile(pattern) for name, pattern in (features or {}).items()}
        kwargs = dict(dataset_kwargs or {})
        self.name = f"reasoning_gym/{dataset}"
        self.dataset = dataset
        self.extract = extract
        self.prompt_template = prompt_template
        self.system_prompt = system_prompt
        self.reward_map = RewardMap(reward, reward_correct, reward_wrong)
        val_seed = seed + VAL_SEED_OFFSET if val_seed is None else val_seed
        # Val first, so the held-out set does not depend on train_size.
        val_entries, _ = _draw(dataset, kwargs, val_seed, val_size, exclude=set(), unique=True)
        held_out = {e["question"] for e in val_entries}
        report_entries: list[dict[str, Any]] = []
        if report_size:
            report_seed = val_seed + VAL_SEED_OFFSET if report_seed is None else report_seed
            report_entries, _ = _draw(dataset, kwargs, report_seed, report_size, exclude=held_out, unique=True)
            held_out |= {e["question"] for e in report_entries}
        train_entries, self._generator = _draw(dataset, kwargs, seed, train_size, exclude=held_out,
                                               unique=False)
        self.val = [self._item(e, "val", i) for i, e in enumerate(val_entries)]
        self.train = [self._item(e, "train", i) for i, e in enumerate(train_entries)]
        self.splits = {"train": self.train, "val": self.val}
        if report_size:
            self.splits["report"] = [self._item(e, "report", i) for i, e in enumerate(report_entries)]

    @staticmethod
    def check_config(*, dataset: str, dataset_kwargs: dict[str, Any] | None = None, train_size: int = 1000,
                     val_size: int = 100, extract: str = "auto", prompt_template: str = DEFAULT_PROMPT_TEMPLATE,
                     features: dict[str, str] | None = None, report_size: int = 0, **_: Any) -> None:
        """The settings, checked without generating a question (``tether validate`` calls this too).

        Raises:
            ValueError: an unknown dataset, a reserved or invalid ``dataset_kwargs`` value, a size below 1, an
                unknown extraction rule, a template without ``{question}``.
            TypeError: a ``dataset_kwargs`` key that is not a field of the dataset's config.
        """
        kwargs = dict(dataset_kwargs or {})
        for key, use in _RESERVED_KWARGS.items():
            if key in kwargs:
                raise ValueError(f"dataset_kwargs must not set {key!r}; use the task's {use} instead")
        if train_size < 1 or val_size < 1:
            raise ValueError(f"train_size and val_size must be >= 1, got {train_size} and {val_size}")
        if report_size < 0:
            raise ValueError(f"report_size must be >= 0 (0: no report split), got {report_size}")
        check_extract_mode(extract)
        check_template(prompt_template)
        for name, pattern in (features or {}).items():
            try:
                re.compile(pattern)
            except re.error as error:
                raise ValueError(f"features.{name}: {pattern!r} is not a regular expression ({error})") from error
        _check_dataset(dataset, kwargs)

    def _item(self, entry: dict[str, Any], split: str, index: int) -> TaskItem:
        answer = entry.get("answer")
        return TaskItem(prompt=format_prompt(self.prompt_template, entry["question"]),
                        answer=None if answer is None else str(answer),
                        meta={"entry": entry, "question": entry["question"]},
                        id=f"{self.dataset}/{split}/{index}")

    def response_features(self, item: TaskItem, response_text: str) -> dict[str, bool]:
        """Which of the configured ``features`` a response has (none configured: ``{}``, no metrics)."""
        return {name: pattern.search(response_text) is not None for name, pattern in self.features.items()}

    def score(self, item: TaskItem, response_text: str) -> Score:
        """Extract the answer and score it with the dataset's ``score_answer``; never raises."""
        extracted = extract_answer(response_text, self.extract)
        if extracted is None:
            return Score(self.reward_map(0.0, False), False, None)
        try:
            value = float(self._generator.score_answer(extracted, item.meta["entry"]))
        except Exception as error:  # a scorer bug costs this row only
            return fault_score(error, extracted, reward=self.reward_map.wrong)
        correct = value >= 1.0
        return Score(self.reward_map(value, correct), correct, extracted)
