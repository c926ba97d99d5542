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

import functools
import inspect
import math
import pickle
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tether.config import Config, ConfigError, RewardTermConfig, TaskConfig
from tether.faults import FaultLog
from tether.rewards.terms import RewardTerm, TermResult
from tether.tasks.base import Score, Task, TaskItem, score_batch
from tether.user_code import resolve_target

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


def check_reward_calls(specs: list[RewardTermConfig], item: TaskItem) -> list[str]:
    """Each reward *function* of ``specs`` called once, as the run calls it (a :class:`RewardTerm`: in its process
    under its ``timeout_s`` where it has one), on ``item`` (a training row) with the row's gold answer as the
    completion (``""`` where it has none). A class (a reward model, a judge, ``VerlScore``, a class of your own) is
    neither built nor called: building one may load a model or reach a server.

    Returns:
        A warning line per function that faulted on this row (a raise, a value that is not a finite number or None,
        a timeout): the run would fault such rows, and this row may be the only one.

    Raises:
        ConfigError: one line per function whose return is not one value per completion (a string, None, a list of
            another length): every call of the run would fault its rows.
    """
    text = "" if item.answer is None else str(item.answer)
    prompts, completions, columns = [item.prompt], [completion_of(item, text)], item_columns([item])
    errors, cautions = [], []
    for index, spec in enumerate(specs):
        key = f"task.rewards[{index}]"
        if inspect.isclass(resolve_target(f"{key}.fn", spec.fn)):
            continue
        called = f"{key}.fn: {spec.fn!r}, called on training row {item.id!r} with the completion {text!r},"
        # in this thread, as the run calls it: math-verify's own limit (signal.alarm) works in the main thread only
        result = RewardTerm(spec, key)(prompts, completions, columns)
        fault = result.faults[0]
        if fault is None:
            continue
        # the message is the run's own (RewardTerm's); a raise, in or out of a process, carries its traceback
        raised = result.trace is not None and result.kind is None
        line = (f"{called} {'raised ' if raised else ''}{fault.splitlines()[0]}; a reward function returns one finite "
                "number (or None) per completion")
        if result.unusable:
            errors.append(f"{line}, a list as long as completions: every call of the run would fault all its rows")
        else:
            cautions.append(f"{line}: the run counts each row it faults on in reward/faults")
    if errors:
        raise ConfigError("\n".join(errors))
    return cautions


class TaskWrapper:
    """A task whose scoring is changed and whose every other attribute (name, train, val, system_prompt, splits,
    features...) is the wrapped ``task``'s own; subclasses give ``score_batch``."""

    task: Task

    def __getattr__(self, name: str) -> Any:
        if name == "task":  # not set yet (copy, pickle): never recurse
            raise AttributeError(name)
        return getattr(self.task, name)

    def score(self, item: TaskItem, response_text: str) -> Score:
        return self.score_batch([item], [response_text])[0]

    def score_batch(self, items: Sequence[TaskItem], texts: Sequence[str]) -> list[Score]:
        raise NotImplementedError


class RewardedTask(TaskWrapper):
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
        terms = {term.name: term.weight * result.values[i] for term, result in results}
        components = {**(base.components or {"task": base.reward}), **terms} if self.keep_score else terms
        # the task's reward itself, not its components: a component a term shares the name of is overwritten above
        reward = (base.reward if self.keep_score else 0.0) + sum(terms.values())
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


TASK_SCORE = "task"  # the task's own score: its component's name, and its "term" in the fault log


def _scorer(task: Task) -> Callable[[Sequence[TaskItem], Sequence[str]], list[Score]]:
    """What a task's scoring process calls: the task's :func:`~tether.tasks.base.score_batch`."""
    return functools.partial(score_batch, task)


def _named_scorer(name: str, kwargs: dict[str, Any]) -> Callable[[Sequence[TaskItem], Sequence[str]], list[Score]]:
    """:func:`_scorer` of the task built in the process from its name (a task that does not pickle)."""
    from tether.tasks import make_task

    return _scorer(make_task(name, **kwargs))


def _unpickled_scorer_factory(blob: bytes) -> Callable[[], Any]:
    """What :class:`PickledScorerFactory` unpickles to: the factory of the task in ``blob``."""
    return functools.partial(_scorer, pickle.loads(blob))


class PickledScorerFactory:
    """``functools.partial(_scorer, task)`` that pickles as ``blob``, the task's pickle that :func:`scorer_factory`
    made to learn whether it pickles: the process pool pickles its factory again (and again for a fresh pool
    process), which then costs a copy of the bytes, not a second pickle of the task."""

    def __init__(self, task: Task, blob: bytes) -> None:
        self.task, self.blob = task, blob

    def __call__(self) -> Callable[[Sequence[TaskItem], Sequence[str]], list[Score]]:
        return _scorer(self.task)

    def __reduce__(self) -> tuple[Callable[[bytes], Callable[[], Any]], tuple[bytes]]:
        return _unpickled_scorer_factory, (self.blob,)


def scorer_factory(task: Task, task_cfg: TaskConfig) -> Callable[[], Any]:
    """How a scoring process gets its task: the built task itself, pickled once here (the process that forks the
    scoring processes unpickles it once, and each process starts with it), else the task built there from its name
    and kwargs (a task holding a lock, a lambda, a loaded model), which costs a build per process.

    Why both: a built-in task pickles in about 10 ms (``reasoning_gym`` with 2,200 items, ``jsonl`` with 5,000 rows:
    0.8 MB each) where building it reads or generates its data again (about 1.5 s each); a process killed at the limit
    is replaced by a fresh one, which then costs nothing more than a fork."""
    try:
        blob = pickle.dumps(task)
    except Exception:  # whatever the task holds that does not pickle: it is built again in the process
        return functools.partial(_named_scorer, task_cfg.name, dict(task_cfg.kwargs))
    return PickledScorerFactory(task, blob)


class ProcessScoredTask(TaskWrapper):
    """``task`` scored a batch at a time in a process of its own (``task.timeout_s``); every other attribute is the
    task's own. A batch past the limit (a hang, a busy loop), one whose scoring raises, or one that ends its process
    faults every row: judged wrong, reward 0.0 (the fault reward of a row nothing else scored), counted as a reward
    function's faults are, and told once per kind in the reward fault log (``term``: ``task``).

    Args:
        task: the task, built in this process too (its splits, features, demonstrations are read here).
        factory: builds the scorer in the process (:func:`scorer_factory`).
        timeout_s: the limit of one batch, in seconds.
        fault_log: as :class:`RewardedTask`'s.
    """

    def __init__(self, task: Task, factory: Callable[[], Any], timeout_s: float, *,
                 fault_log: Path | None = None) -> None:
        from tether.rewards.process import TASK_SCORER, ProcessCalls

        self.task = task
        self.process = ProcessCalls(factory, timeout_s, TASK_SCORER)
        self.fault_log = FaultLog(fault_log)

    def score_batch(self, items: Sequence[TaskItem], texts: Sequence[str]) -> list[Score]:
        try:
            return self.process(list(items), list(texts))
        except Exception as error:  # a timeout, an ended process, a raise, a batch that did not pickle
            message, kind, trace = self.process.fault(error)
        self.fault_log.first((TASK_SCORE, kind), {"term": TASK_SCORE, "kind": kind, "error": message,
                                                  "traceback": trace},
                             f"the task's score faulted ({message}): its rows are judged wrong with reward 0.0 and "
                             "count in reward/faults; the run goes on", stacklevel=2)
        return [Score(0.0, False, None, fault=True, error=message) for _ in items]


def timed_task(task: Task, task_cfg: TaskConfig, fault_log: Path | None = None) -> Task:
    """``task`` scored in a process of its own under ``task.timeout_s`` (:class:`ProcessScoredTask`) when it is set,
    else ``task`` itself."""
    if task_cfg.timeout_s is None:
        return task
    return ProcessScoredTask(task, scorer_factory(task, task_cfg), task_cfg.timeout_s, fault_log=fault_log)


def check_task_score(task: Task, task_cfg: TaskConfig) -> list[str]:
    """A task of the user's own (its class outside tether) scored once, as the run scores it (:func:`timed_task`),
    on its first training row with the row's gold answer as the response (``""`` where it has none). The run reads
    each :class:`~tether.tasks.base.Score`'s ``reward`` into a tensor, and contains a scorer's raise only under
    ``task.timeout_s``. tether's own tasks are not called: their scoring is tested.

    Returns:
        A warning line when the score is a fault (a raise or a timeout under ``task.timeout_s``, contained by the
        run): it may be that row's alone.

    Raises:
        ConfigError: the score raised without ``task.timeout_s`` (the run would stop at its first batch, after the
            model loads), or is not one :class:`~tether.tasks.base.Score` with a real-number ``reward``.
    """
    if type(task).__module__.partition(".")[0] == "tether":
        return []
    from tether.rewards.terms import as_real

    item = task.train[0]
    text = "" if item.answer is None else str(item.answer)
    where = f"task.name={task_cfg.name}: scoring training row {item.id!r} with the response {text!r}"
    try:
        with warnings.catch_warnings():  # a contained fault is told once by the line below, not twice
            warnings.simplefilter("ignore")
            scores = list(score_batch(timed_task(task, task_cfg), [item], [text]))
    except Exception as error:  # the user's scorer, outside a process: the run's first batch would stop here
        first = f"{type(error).__name__}: {error}".splitlines()[0]
        raise ConfigError(f"{where} raised {first}; the run would stop at its first batch (set task.timeout_s to "
                          "count such rows as faults instead)") from None
    score = scores[0] if len(scores) == 1 else None
    if score is None or as_real(getattr(score, "reward", None)) is None:
        got = f"{len(scores)} scores" if score is None else repr(getattr(score, "reward", score))
        raise ConfigError(f"{where} gave {got}; a task's score returns one tether.tasks.Score(reward, correct, "
                          "extracted) per response, reward a number")
    if getattr(score, "fault", False):
        return [f"{where} faulted ({score.error}); the run counts each row it faults on in reward/faults"]
    check_score_components(score, task_cfg, where)
    return []


def check_score_components(score: Score, task_cfg: TaskConfig, where: str) -> None:
    """A task's ``Score.components`` are its reward's terms by name (the reward audit's shares): they sum to the
    reward, and no reward function of ``task.rewards`` shares a name with one, whose audit would overwrite it.

    Raises:
        ConfigError: naming the components and the reward, or the name both use.
    """
    components = score.components or {}
    if components and not math.isclose(sum(components.values()), score.reward, rel_tol=1e-6, abs_tol=1e-9):
        raise ConfigError(f"{where} gave components {components} that sum to {sum(components.values())!r}, not its "
                          f"reward {score.reward!r}; a Score's components are its reward's terms by name")
    for index, spec in enumerate(task_cfg.rewards or []):
        name = RewardTerm(spec, f"task.rewards[{index}]", build=False, settings=False).name
        if name in components:
            raise ConfigError(f"task.rewards[{index}]: its name {name!r} is also a component of the task's score "
                              f"({', '.join(components)}); give it another name (name: ...)")


def build_task(task_cfg: TaskConfig, run_dir: str | Path | None = None) -> Task:
    """The task ``task_cfg`` names, with its ``rewards`` and ``score`` applied.

    Args:
        task_cfg: the config's ``task`` section.
        run_dir: the run directory, for the reward functions' fault log (None: no log).
    """
    from tether.tasks import make_task

    fault_log = None if run_dir is None else Path(run_dir) / FAULT_LOG
    task = timed_task(make_task(task_cfg.name, **task_cfg.kwargs), task_cfg, fault_log)
    if not task_cfg.rewards and task_cfg.score:
        return task
    terms = [RewardTerm(spec, f"task.rewards[{i}]") for i, spec in enumerate(task_cfg.rewards)]
    return RewardedTask(task, terms, keep_score=task_cfg.score, fault_log=fault_log)


def build_config_task(cfg: Config) -> Task:
    """:func:`build_task` of a whole config (its ``task`` section and run directory)."""
    return build_task(cfg.task, cfg.run_dir)
