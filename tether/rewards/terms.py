"""Reward functions with TRL's signature, ``fn(prompts, completions, **columns) -> list[float | None]``.

A function written for TRL's ``GRPOTrainer(reward_funcs=...)`` works unchanged: it is called once per batch of
responses, by keyword as TRL calls it (``fn(prompts=..., completions=..., **columns)``, so ``def f(completions,
**kwargs)`` and ``def f(completions, solution, **kwargs)`` work); ``prompts`` are the prompts (strings, or
``{role, content}`` message lists for conversational data), ``completions`` the responses (strings, or
``[{"role": "assistant", "content": ...}]`` for conversational data), and every dataset column arrives as a keyword
list (``answer=[...]``). A ``None`` in the returned list means "this function does not apply to this row" (TRL's
convention): the term is 0 there.

It may return any iterable of values (a list, a tuple, a numpy array, a tensor) and may be ``async def`` (its
coroutines run on one background event loop), as in TRL. What can go wrong is contained per term: a raising
function or a list of the wrong length faults every row of the batch, a value that is not a finite number faults its
row. With a ``timeout_s`` the term is called in a process of its own (:mod:`tether.rewards.process`), so a call past
the limit (a hang, a busy loop) or one that ends its process faults every row of the batch too. The caller
(:mod:`tether.rewards.task`) gives faulted rows the fault reward and counts them.
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import inspect
import math
import numbers
import threading
import traceback
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tether.config import ConfigError, RewardTermConfig, did_you_mean
from tether.user_code import resolve_target

if TYPE_CHECKING:
    from tether.rewards.process import ProcessCalls

#: What TRL passes besides the dataset columns, by keyword.
BATCH_ARGS = ("prompts", "completions")
#: Keywords TRL passes that tether has no counterpart for (token ids are the engine's, the trainer state TRL's).
NOT_PASSED = ("completion_ids", "trainer_state")


@dataclass
class TermResult:
    """One term's values for a batch.

    Attributes:
        values: each row's value, 0.0 where faulted or where the function returned ``None``.
        faults: each row's fault message, or ``None``.
        trace: the traceback of an exception the function raised, for the run's health folder.
        kind: what went wrong in the term's process (``"timeout"``, ``"process ended"``, the type of what escaped
            the term); None for a fault of the function itself, in or out of a process.
        unusable: the function returned something that is not one value per completion (a string, None, a list of
            another length): every call faults whatever its rows, so ``tether validate`` refuses it.
    """

    values: list[float]
    faults: list[str | None]
    trace: str | None = None
    kind: str | None = None
    unusable: bool = False


def _accepts(fn: Callable) -> tuple[bool, set[str]]:
    """(takes ``**kwargs``, the names it takes by keyword)."""
    params = list(inspect.signature(fn).parameters.values())
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return var_kw, names


def check_batch_signature(fn: Callable, kwargs: dict[str, Any], key: str) -> None:
    """``fn`` can be called as TRL calls it, ``fn(prompts=..., completions=..., **columns)``, plus ``kwargs``.

    Raises:
        ConfigError: it takes no ``completions`` keyword (nor ``**kwargs``), requires a positional-only argument,
            or a configured keyword it does not accept.
    """
    try:
        var_kw, names = _accepts(fn)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check
        return
    params = inspect.signature(fn).parameters
    positional_only = [n for n, p in params.items() if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    if positional_only or not (var_kw or "completions" in names):
        why = f"requires {positional_only[0]!r} positionally" if positional_only else "takes no 'completions'"
        raise ConfigError(f"{key}: {_name(fn)!r} {why}; a reward function is called by keyword, "
                          "fn(prompts=..., completions=..., **columns), and returns one float per completion "
                          "(TRL's reward_funcs signature)")
    never = [n for n in NOT_PASSED if n in params and params[n].default is inspect.Parameter.empty]
    if never:
        raise ConfigError(f"{key}: {_name(fn)!r} requires {never[0]!r}, which TRL passes and tether does not; give it "
                          "a default (or take **kwargs)")
    unknown = sorted(k for k in kwargs if k not in names and not var_kw)
    if unknown:
        takes = sorted(names - set(BATCH_ARGS))
        raise ConfigError(f"{key}: {_name(fn)!r} takes no keyword {unknown[0]!r}; "
                          f"{did_you_mean(unknown[0], takes)}it takes: {', '.join(takes) or '(none)'}")


def _built(cls: type, spec: RewardTermConfig, key: str) -> Any:
    """``cls(**spec.kwargs)``; transformers' ``OSError`` (a model that does not load: missing weights, a Hub id not
    there) as one line naming the entry, not its traceback after the policy has loaded. An error of the file system
    (it has an ``errno``) keeps its traceback."""
    try:
        return cls(**spec.kwargs)
    except OSError as err:
        if err.errno is not None:
            raise
        why = " ".join(str(err).split("\n", 1)[0].split()) or type(err).__name__
        raise ConfigError(f"{key}.kwargs: {spec.fn} could not be built (OSError: {why})") from err


def _name(fn: Callable) -> str:
    return getattr(getattr(fn, "func", fn), "__qualname__", repr(fn))


class RewardTerm:
    """One configured reward function: resolved, its signature checked, a class built once with its kwargs.

    Args:
        spec: the ``task.rewards[i]`` entry.
        key: its config key, ``task.rewards[i]``.
        build: build a class now, or with ``spec.timeout_s`` the process that builds and calls it (False: resolve
            and check only, as ``tether validate`` does).

    Raises:
        ConfigError: the reference does not resolve, or the signature cannot take a batch.
    """

    def __init__(self, spec: RewardTermConfig, key: str, *, build: bool = True, settings: bool = True) -> None:
        target = resolve_target(f"{key}.fn", spec.fn)
        self.weight = spec.weight
        self.name = spec.name or getattr(target, "__name__", spec.fn.rpartition(":")[2])
        self.process: ProcessCalls | None = None
        if inspect.isclass(target):
            if not any("__call__" in vars(base) for base in target.__mro__[:-1]):
                raise ConfigError(f"{key}.fn: {spec.fn!r} is a class without __call__; a reward class is built once "
                                  "with kwargs and called as instance(prompts=..., completions=..., **columns)")
            check_class_kwargs(target, spec.kwargs, f"{key}.kwargs")
            if settings:
                check_settings(target, spec.kwargs, f"{key}.kwargs")
            check_batch_signature(functools.partial(target.__call__, None), {}, f"{key}.fn")  # without self
            in_here = build and spec.timeout_s is None  # with a limit, the class is built in the term's process
            self.fn: Callable | None = _built(target, spec, key) if in_here else None
            self.kwargs: dict[str, Any] = {}
        else:
            check_batch_signature(target, spec.kwargs, f"{key}.fn")
            self.fn, self.kwargs = target, dict(spec.kwargs)
        if build and spec.timeout_s is not None:
            from tether.rewards.process import ProcessCalls

            # the child builds this same term without the limit (resolved there by name) and is called as it is here
            self.process = ProcessCalls(functools.partial(RewardTerm, spec.model_copy(update={"timeout_s": None}),
                                                          key), spec.timeout_s)

    def _arguments(self, prompts: Sequence[Any], completions: Sequence[Any],
                   columns: dict[str, list]) -> dict[str, Any]:
        """The call's keywords: everything for a function taking ``**kwargs`` (TRL passes it all), else what it
        names (a column named ``prompts`` or ``completions`` loses to the batch's own, as in TRL)."""
        given = {**columns, **self.kwargs, "prompts": list(prompts), "completions": list(completions)}
        if self._takes is None:  # a builtin without a signature: it gets everything
            return given
        var_kw, names = self._takes
        return given if var_kw else {k: v for k, v in given.items() if k in names}

    @functools.cached_property
    def _takes(self) -> tuple[bool, set[str]] | None:
        """What :func:`_accepts` reads of the function, once (not per batch); None when it has no signature."""
        try:
            return _accepts(self.fn)
        except (TypeError, ValueError):
            return None

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], columns: dict[str, list]) -> TermResult:
        """The function's values for one batch, faults contained (never raises)."""
        if self.process is not None:
            return _call_in_process(self.process, prompts, completions, columns)
        n = len(completions)
        try:
            out = self.fn(**self._arguments(prompts, completions, columns))
            if inspect.iscoroutine(out):  # an async reward function (TRL awaits them too)
                out = asyncio.run_coroutine_threadsafe(out, _event_loop()).result()
        except Exception as error:  # a bug in a reward function costs its rows, not the run
            message = f"{type(error).__name__}: {error}"
            return TermResult([0.0] * n, [message] * n, traceback.format_exc())
        listed = _as_list(out)
        if listed is None or len(listed) != n:
            got = type(out).__name__ if listed is None else f"{len(listed)} values"
            return TermResult([0.0] * n, [f"returned {got} for {n} completions"] * n, unusable=True)
        out = listed
        reasons = getattr(self.fn, "last_errors", None)  # a judge says why a row has no score
        reasons = reasons if isinstance(reasons, list) and len(reasons) == n else [None] * n
        values, faults = [], []
        for value, reason in zip(out, reasons, strict=True):
            number = _number(value)
            faults.append(None if number is not None else reason or f"returned {value!r}, not a finite number or None")
            values.append(number if number is not None else 0.0)
        return TermResult(values, faults)


def _call_in_process(process: ProcessCalls, prompts: Sequence[Any], completions: Sequence[Any],
                     columns: dict[str, list]) -> TermResult:
    """The term's values from its process; what befalls the call there faults every row of the batch."""
    n = len(completions)
    try:
        return process(list(prompts), list(completions), columns)
    except Exception as error:  # a timeout, a process that ended, SystemExit, a batch that did not pickle
        message, kind, trace = process.fault(error)
        return TermResult([0.0] * n, [message] * n, trace, kind=kind)


def _as_list(out: Any) -> list | None:
    """The values a function returned, as a list: any iterable but a string or a mapping (a list, a tuple, a numpy
    array, a tensor, a generator; TRL iterates whatever comes back); ``None`` for anything else."""
    if isinstance(out, (str, bytes, Mapping)) or not isinstance(out, Iterable):
        return None
    try:
        return list(out)
    except TypeError:  # a 0-d array or tensor: iterable by type, not by value
        return None


_LOOP_LOCK = threading.Lock()  # two threads scoring at once must not start two loops


def _event_loop() -> asyncio.AbstractEventLoop:
    """One event loop, in a daemon thread, that runs every async reward function's coroutines (whatever thread
    scores): a loop that outlives a call keeps the clients a function makes once (an ``aiohttp`` session) usable."""
    with _LOOP_LOCK:
        return _started_loop()


@functools.cache
def _started_loop() -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="tether-reward-loop", daemon=True).start()
    return loop


def as_real(value: Any) -> float | None:
    """``value`` as a float when it is one real number (a Python or numpy number, a bool, a 0-d array or tensor);
    ``None`` when it is not."""
    if isinstance(value, numbers.Real) or (hasattr(value, "item") and getattr(value, "ndim", 1) == 0):
        return float(value)
    return None


def _number(value: Any) -> float | None:
    """``value`` as a finite float (``None`` -> 0.0, TRL's "not applicable"); ``None`` when it is not one."""
    if value is None:
        return 0.0
    number = as_real(value)
    return number if number is not None and math.isfinite(number) else None


def check_class_kwargs(cls: type, kwargs: dict[str, Any], key: str) -> None:
    """``kwargs`` are arguments of ``cls``'s constructor, and it gets every required one."""
    params = {n: p for n, p in inspect.signature(cls).parameters.items()}
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(kwargs) - set(params))
        if unknown:
            raise ConfigError(f"{key}.{unknown[0]}: {cls.__name__} takes no such argument; "
                              f"{did_you_mean(unknown[0], params)}it takes: {', '.join(params) or '(none)'}")
    missing = [n for n, p in params.items() if p.default is p.empty and n not in kwargs
               and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    if missing:
        raise ConfigError(f"{key}: {cls.__name__} needs {missing[0]!r}")


def check_settings(cls: type, kwargs: dict[str, Any], key: str) -> None:
    """A reward class's own check of its settings, ``cls.check(**kwargs)`` where it has one (the reward model's and
    the judge's), run before anything loads."""
    check = getattr(cls, "check", None)
    if check is None:
        return
    try:
        check(**kwargs)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"{key}: {err}") from None


def check_reward_terms(specs: list[RewardTermConfig], *, settings: bool = True) -> None:
    """Each ``task.rewards`` entry resolves and can take a batch, and the terms' names differ (without building
    a class: that may load a model).

    Args:
        specs: the entries.
        settings: also run each reward class's own ``check`` of its settings (what it names is here: a reward
            model's directory, a judge's URL); the machine checks do, the config checks do not.

    Raises:
        ConfigError: the first problem.
    """
    seen: dict[str, int] = {}
    for index, spec in enumerate(specs):
        key = f"task.rewards[{index}]"
        term = RewardTerm(spec, key, build=False, settings=settings)
        if term.name in seen or term.name in ("task", "overlong", "fault"):
            raise ConfigError(f"{key}.name: {term.name!r} is taken (by task.rewards[{seen.get(term.name, '-')}] or "
                              "by tether's own terms task, overlong, fault); set a distinct name")
        seen[term.name] = index


def check_reward_columns(specs: list[RewardTermConfig], columns: Collection[str]) -> None:
    """Each ``task.rewards`` entry gets every argument it requires: a required parameter that is neither a batch
    argument, a configured keyword nor one of ``columns`` (a misspelt column) would raise on every call of the run,
    each a contained fault. Run where the task is built, on its rows' columns (:func:`tether.rewards.item_columns`).

    Raises:
        ConfigError: the first argument no call gives, with the columns there are and the nearest name.
    """
    for index, spec in enumerate(specs):
        key = f"task.rewards[{index}].fn"
        target = resolve_target(key, spec.fn)
        # a class's kwargs are its constructor's; its __call__ (without self) gets the batch
        fn, given = ((functools.partial(target.__call__, None), set()) if inspect.isclass(target)
                     else (target, set(spec.kwargs)))
        for name in sorted(given & {*BATCH_ARGS, *columns}):  # the call's keywords are one mapping: one name wins
            what = "the batch's own argument" if name in BATCH_ARGS else "a column of the task's rows"
            raise ConfigError(f"task.rewards[{index}].kwargs: {name!r} is also {what}, which a keyword of that name "
                              "would hide (or be hidden by) in every call; name the keyword otherwise")
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):  # a builtin without a signature: nothing to check
            continue
        passed = {*BATCH_ARGS, *given, *columns}
        missing = [p.name for p in params if p.default is p.empty and p.name not in passed
                   and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if missing:
            # never a name the function already takes: `def f(completions, solution)` on rows without `solution`
            # was told "did you mean 'completions'?"
            candidates = sorted(passed - {p.name for p in params})
            close = difflib.get_close_matches(missing[0], candidates, n=1, cutoff=0.6)
            raise ConfigError(f"{key}: {_name(fn)!r} requires {missing[0]!r}, which neither the call nor a column of "
                              f"the task's rows gives (columns: {', '.join(sorted(columns))})"
                              + (f"; did you mean {close[0]!r}?" if close else ""))


def probe_reward_terms(specs: list[RewardTermConfig]) -> list[str]:
    """Warning lines of the reward classes that can look at what they reach over the network
    (``cls.probe_endpoint(**kwargs)``, the judge's server): for ``tether validate`` only, since a probe waits on the
    network. Entries that do not resolve are left to :func:`check_reward_terms`."""
    lines = []
    for index, spec in enumerate(specs):
        try:
            target = resolve_target(f"task.rewards[{index}].fn", spec.fn)
        except ConfigError:
            continue
        probe = getattr(target, "probe_endpoint", None) if inspect.isclass(target) else None
        line = probe(**spec.kwargs) if callable(probe) else None
        if line:
            lines.append(f"task.rewards[{index}].kwargs.{line}")
    return lines
