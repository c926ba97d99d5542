"""Task registry: ``make_task("reasoning_gym", dataset="chain_sum")`` builds a task by name."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from tether.config import did_you_mean
from tether.registry import Registry
from tether.tasks.base import Task
from tether.user_code import resolve_target

F = TypeVar("F", bound=Callable[..., Task])

#: Registered task names and the factory (a Task class or a function returning one) each builds.
TASKS: Registry[Callable[..., Task]] = Registry(
    "task", resolve=lambda target: resolve_target("task.name", target), own="module:Name")


def register_task(name: str) -> Callable[[F], F]:
    """Class decorator that registers a task factory under ``name``.

    Raises:
        ValueError: ``name`` is already registered (a silent overwrite would hide a typo).
    """
    return TASKS.register(name)


def unregister_task(name: str) -> None:
    """Remove ``name`` from the registry if it is there (for tests that register throwaway tasks)."""
    if name in TASKS:
        TASKS.unregister(name)


def task_names() -> list[str]:
    """Sorted names of all registered tasks."""
    return sorted(TASKS)


def task_factory(name: str) -> Callable[..., Task]:
    """The factory registered as ``name``, or the class or function a ``"module:Name"`` name points at.

    Raises:
        ValueError: an unknown registered name (:class:`~tether.registry.UnknownNameError`, listing the known ones);
            for ``module:Name``, a :class:`~tether.config.ConfigError` (a ValueError) naming what is wrong with it.
    """
    return TASKS[name]


def check_task_kwargs(name: str, factory: Callable[..., Task], kwargs: dict[str, Any]) -> None:
    """Fail with the offending and the allowed keyword names, before any data is generated."""
    params = inspect.signature(factory).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    allowed = [p for p in params if params[p].kind is not inspect.Parameter.VAR_POSITIONAL]
    unknown = [k for k in kwargs if k not in allowed]
    if unknown:
        raise TypeError(f"task {name!r} got unknown argument(s) {', '.join(unknown)}; "
                        f"{did_you_mean(unknown[0], allowed)}allowed: {', '.join(allowed)}")
    missing = [p for p in allowed if params[p].default is inspect.Parameter.empty and p not in kwargs]
    if missing:
        raise TypeError(f"task {name!r} is missing required argument(s) {', '.join(missing)}")


def make_task(name: str, **kwargs: Any) -> Task:
    """Build the task registered as ``name`` with keyword arguments ``kwargs``.

    Args:
        name: a registered task name (see :func:`task_names`), or ``"module:Name"`` of a task class or factory.
        **kwargs: the task's own arguments, e.g. ``dataset``, ``train_size``, ``seed``.

    Returns:
        The task, with its train and val splits generated.

    Raises:
        ValueError: unknown ``name`` (the message lists the known ones).
        TypeError: unknown or missing argument (the message names it and the allowed ones).
    """
    factory = task_factory(name)
    check_task_kwargs(name, factory, kwargs)
    return factory(**kwargs)
