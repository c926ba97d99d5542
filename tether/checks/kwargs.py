"""Keyword arguments a config passes to a registered function or class: names, then types from its annotations."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

from pydantic import TypeAdapter, ValidationError

from tether.config import ConfigError, did_you_mean


def check_kwargs(fn: Any, kwargs: dict[str, Any], where: str, skip: tuple[str, ...] = ()) -> None:
    """Fail if ``kwargs`` are not keyword arguments ``fn`` accepts (names the key and the allowed ones)."""
    params = inspect.signature(fn).parameters
    allowed = [n for n, p in params.items() if p.kind == p.KEYWORD_ONLY and n not in skip]
    for key in kwargs:
        if key not in allowed:
            raise ConfigError(f"{where}.{key}: unknown setting; {did_you_mean(key, allowed)}allowed: "
                              f"{', '.join(allowed) or '(none)'}")


def _hints(fn: Callable) -> dict[str, Any]:
    """``fn``'s resolved annotations (a class: its ``__init__``'s). A name imported for type checkers only (an engine
    builder's ``ModelConfig``) reads as ``Any``, so the other parameters' types are still checked; none when the
    annotations cannot be resolved at all."""
    target = fn.__init__ if inspect.isclass(fn) else fn
    unknown: dict[str, Any] = {}
    while True:
        try:
            return typing.get_type_hints(target, localns=unknown)
        except NameError as err:
            if err.name is None or err.name in unknown:
                return {}
            unknown[err.name] = Any
        except TypeError:
            return {}


def check_kwarg_types(fn: Callable, kwargs: dict[str, Any], where: str) -> None:
    """Fail if a value does not have the type ``fn`` annotates for it: a string where a number is meant, a float
    where an int is. Strict, so ``"0.2"`` is not taken for 0.2 (the function would receive the string); a YAML list
    stands for a tuple."""
    hints = _hints(fn)
    for key, value in kwargs.items():
        hint = hints.get(key)
        if hint is None or hint is Any:
            continue
        adapter = TypeAdapter(hint)
        candidates = [value, tuple(value)] if isinstance(value, list) else [value]
        errors = []
        for candidate in candidates:
            try:
                adapter.validate_python(candidate, strict=True)
                break
            except ValidationError as err:
                errors.append(err.errors()[0]["msg"])
        else:
            raise ConfigError(f"{where}.{key}: {value!r} is not a valid {_type_name(hint)} ({errors[0]})")


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
