"""A task whose reward is its own score plus weighted reward functions (``task.rewards``), scored a batch at a time.

The reward of a row is ``[task score] + sum_i weight_i * value_i``; each term is a component of the reward audit
(``reward/component/<name>``). A row that any term faults on is a fault (``reward/faults``): it is judged wrong and
gets the fault reward, the lowest reward of the rows scored with it that did not fault (0.0 when none), so a
policy never gains by crashing a reward function. The first fault of each term (and of each
``kind`` of its process's faults: ``timeout``, ``process ended``) is one row of ``run_dir/health/reward_faults.jsonl``
(``term``; ``kind``, None for the function's own faults; ``error``, the message; ``traceback``, None when the
function raised nothing but returned a bad value), with a warning.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tether.config import Config, TaskConfig
from tether.faults import FaultLog
from tether.rewards.terms import RewardTerm, TermResult
from tether.tasks.base import Score, Task, TaskItem, score_batch

FAULT_LOG = Path("health") / "reward_faults.jsonl"


def item_columns(items: Sequence[TaskItem]) -> dict[str, list]:
    """The dataset columns of a batch as keyword lists (TRL's ``**kwargs``): each item's ``meta["columns"]`` (what a
    data-backed task keeps of its row), and always ``answer``: the gold answer where the item has one, as the data
    holds it (``meta["gold"]``: a list or a number stays one, as verl passes ``ground_truth``) or else as its text;
    else the row's own ``answer`` column, else ``None``."""
    rows = [dict(item.meta.get("columns") or {}) for item in items]
    for row, item in zip(rows, items, strict=True):
        # the gold wins over a column of that name: with answer_field: final, GSM8K's "answer" column holds the
        # worked solution, and verl's ground_truth and the docs' `answer` are the gold
        if item.answer is not None or "answer" not in row:
            row["answer"] = item.meta.get("gold", item.answer)
    names = list(dict.fromkeys(name for row in rows for name in row))
    return {name: [row.get(name) for row in rows] for name in names}


def completion_of(item: TaskItem, text: str) -> str | list[dict[str, str]]:
    """The completion as TRL passes it: the text, or one assistant message when the prompt is a conversation."""
    return [{"role": "assistant", "content": text}] if isinstance(item.prompt, list) else text


class RewardedTask:
    """``task`` with ``terms`` added to (or, ``keep_score=False``, replacing) its score. Every other attribute is the
    task's own (its splits, features, demonstrations).

    Args:
        task: the wrapped task.
        terms: the reward functions.
        keep_score: add the task's reward; False: only the terms count (``correct`` is still the task's verdict where
            an item has a gold answer, else "the reward is positive").
        fault_log: the JSONL file of each term's first fault (:data:`FAULT_LOG` of the run); None: nowhere. Held as
            a :class:`~tether.faults.FaultLog`, the reporting env faults share.
    """

    def __init__(self, task: Task, terms: list[RewardTerm], *, keep_score: bool = True,
                 fault_log: Path | None = None) -> None:
        self.task, self.terms, self.keep_score = task, terms, keep_score
        self.fault_log = FaultLog(fault_log)

    def __getattr__(self, name: str) -> Any:  # name, train, val, system_prompt, splits, features...
        if name == "task":  # not set yet (copy, pickle): never recurse
            raise AttributeError(name)
        return getattr(self.task, name)

    def score(self, item: TaskItem, response_text: str) -> Score:
        return self.score_batch([item], [response_text])[0]

    def score_batch(self, items: Sequence[TaskItem], texts: Sequence[str]) -> list[Score]:
        """Every row's score: the task's, then each term called once on the whole batch."""
        base = score_batch(self.task, items, texts)
        prompts = [item.prompt for item in items]
        completions = [completion_of(item, text) for item, text in zip(items, texts, strict=True)]
        columns = item_columns(items)
        results = [(term, term(prompts, completions, columns)) for term in self.terms]
        for term, result in results:
            self._report(term, result)
        rows = [self._row(i, items[i], texts[i], base[i], results) for i in range(len(items))]
        floor = min((score.reward for score in rows if not score.fault), default=0.0)
        return [self._faulted(score, floor) if score.fault and score.components is None else score for score in rows]

    def _row(self, i: int, item: TaskItem, text: str, base: Score,
             results: list[tuple[RewardTerm, TermResult]]) -> Score:
        errors = [f"{term.name}: {result.faults[i]}" for term, result in results if result.faults[i] is not None]
        if errors:  # components None marks a term fault, given the floor reward in score_batch
            return Score(0.0, False, base.extracted, fault=True, error="; ".join(errors))
        components = dict(base.components or {"task": base.reward}) if self.keep_score else {}
        components.update({term.name: term.weight * result.values[i] for term, result in results})
        reward = sum(components.values())
        correct, extracted = base.correct, base.extracted
        if not self.keep_score and item.answer is None:  # no verifier: a positive reward is the success
            correct, extracted = reward > 0, text
        return Score(reward, correct, extracted, fault=base.fault, error=base.error, components=components)

    @staticmethod
    def _faulted(score: Score, floor: float) -> Score:
        return Score(floor, False, score.extracted, fault=True, error=score.error, components={"fault": floor})

    def _report(self, term: RewardTerm, result: TermResult) -> None:
        """The first fault of each term: a warning, and a row of its message and traceback in the run's health
        folder."""
        first = next((fault for fault in result.faults if fault is not None), None)
        if first is not None:  # a timeout or an ended process is told apart from the function's own faults
            self.fault_log.first((term.name, result.kind), {"term": term.name, "kind": result.kind, "error": first,
                                                            "traceback": result.trace},
                                 f"reward function {term.name!r} faulted ({first}): its rows get the fault reward "
                                 "and count in reward/faults; the run goes on", stacklevel=3)


def build_task(task_cfg: TaskConfig, run_dir: str | Path | None = None) -> Task:
    """The task ``task_cfg`` names, with its ``rewards`` and ``score`` applied.

    Args:
        task_cfg: the config's ``task`` section.
        run_dir: the run directory, for the reward functions' fault log (None: no log).
    """
    from tether.tasks import make_task

    task = make_task(task_cfg.name, **task_cfg.kwargs)
    if not task_cfg.rewards and task_cfg.score:
        return task
    terms = [RewardTerm(spec, f"task.rewards[{i}]") for i, spec in enumerate(task_cfg.rewards)]
    return RewardedTask(task, terms, keep_score=task_cfg.score,
                        fault_log=None if run_dir is None else Path(run_dir) / FAULT_LOG)


def build_config_task(cfg: Config) -> Task:
    """:func:`build_task` of a whole config (its ``task`` section and run directory)."""
    return build_task(cfg.task, cfg.run_dir)
