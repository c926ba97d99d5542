"""Name -> function registries for advantage estimators and policy losses.

One :class:`Registry` per family, filled by a decorator at import time. The trainer looks functions up
by the name in the config and binds the config's keyword arguments to the function's signature, so
every entry must have the family's signature (checked when it is registered, and again in the tests):

* advantage: ``fn(inputs, *, <hparam>=<default>, ...) -> AdvantageOutput`` (``inputs`` an :class:`AdvantageInputs`)
* policy loss: ``fn(inputs, *, agg="token-mean", <hparam>=<default>, ...) -> LossOutput``

An advantage estimator also declares the optional per-row tags of :class:`AdvantageInputs` it needs
(``needs=("injected",)``), so a config that chooses it where nothing produces them is refused when it is read.

Unlike verl's ``register_policy_loss``, a second registration under a taken name raises instead of
silently replacing the first.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from tether.algos.types import ADVANTAGE_TAGS, AdvantageInputs, AdvantageOutput, LossInputs, LossOutput


class AdvantageFn(Protocol):
    """Per-row advantages, plus metrics, from per-row rewards, group ids and tags."""

    def __call__(self, inputs: AdvantageInputs, **hparams: Any) -> AdvantageOutput: ...


class PolicyLossFn(Protocol):
    """A scalar loss to minimise, plus metrics, from one micro-batch."""

    def __call__(self, inputs: LossInputs, *, agg: str = "token-mean", **hparams: Any) -> LossOutput: ...


class UnknownNameError(KeyError, ValueError):
    """A name that is not registered. ``str(err)`` is the message (KeyError would print its repr)."""

    def __str__(self) -> str:
        return str(self.args[0])


def _check_keyword_defaults(fn: Callable, params: list[inspect.Parameter], kind: str) -> None:
    for p in params:
        if p.kind is not p.KEYWORD_ONLY or p.default is p.empty:
            raise TypeError(f"{kind} '{fn.__name__}': hyperparameter '{p.name}' must be keyword-only with a "
                            "default (write it after '*')")


def check_advantage_signature(fn: Callable) -> None:
    """Raise TypeError unless ``fn`` is ``fn(inputs, *, k=default, ...)``."""
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].name != "inputs" or params[0].kind is not params[0].POSITIONAL_OR_KEYWORD:
        raise TypeError(f"advantage '{fn.__name__}' must take (inputs, *, ...), inputs an AdvantageInputs")
    _check_keyword_defaults(fn, params[1:], "advantage")


def check_policy_loss_signature(fn: Callable) -> None:
    """Raise TypeError unless ``fn`` is ``fn(inputs, *, agg="token-mean", k=default, ...)``."""
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].name != "inputs" or params[0].kind is not params[0].POSITIONAL_OR_KEYWORD:
        raise TypeError(f"policy loss '{fn.__name__}' must take (inputs, *, agg=..., ...)")
    if len(params) < 2 or params[1].name != "agg" or params[1].default != "token-mean":
        raise TypeError(f"policy loss '{fn.__name__}': second parameter must be agg: str = 'token-mean'")
    _check_keyword_defaults(fn, params[1:], "policy loss")


class Registry(Mapping[str, Callable]):
    """A read-only mapping of names to functions, plus ``register`` / ``unregister``.

    Args:
        kind: what the entries are, for error messages ("advantage", "policy loss").
        check: called on every function at registration; raises TypeError on a bad signature.
        tags: the optional inputs an entry may declare it needs (``register(name, needs=...)``).
    """

    def __init__(self, kind: str, check: Callable[[Callable], None], tags: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self._check = check
        self._tags = tags
        self._entries: dict[str, Callable] = {}
        self._needs: dict[str, frozenset[str]] = {}

    def register(self, name: str, *, needs: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
        """Decorator: ``@REGISTRY.register("name")``. Raises ValueError if the name is taken, TypeError on a bad
        signature or a need that is not one of the registry's tags."""

        def decorator(fn: Callable) -> Callable:
            if name in self._entries:
                raise ValueError(f"{self.kind} '{name}' is already registered "
                                 f"(by {self._entries[name].__module__}.{self._entries[name].__qualname__})")
            self._check(fn)
            unknown = sorted(set(needs) - set(self._tags))
            if unknown:
                raise TypeError(f"{self.kind} '{name}' needs {unknown}; an entry may need: "
                                f"{', '.join(self._tags) or '(nothing)'}")
            self._entries[name] = fn
            self._needs[name] = frozenset(needs)
            return fn

        return decorator

    def unregister(self, name: str) -> Callable:
        """Remove and return an entry (for plug-ins that replace one, and for tests)."""
        self._needs.pop(name, None)
        return self._entries.pop(name)

    def needs(self, name: str) -> frozenset[str]:
        """The optional inputs the entry ``name`` needs (UnknownNameError for an unknown name); a ``module:function``
        declares them as its ``needs`` attribute (a tuple of tags), if any."""
        fn = self[name]  # an unknown name raises here, listing the known ones
        return self._needs[name] if name in self._needs else frozenset(getattr(fn, "needs", ()))

    def _import(self, target: str) -> Callable:
        """The function ``"module:function"`` names, checked like a registered one (the config checks resolve it
        first, with a did-you-mean; this is the trainer's lookup)."""
        module, _, attr = target.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as err:
            raise UnknownNameError(f"{self.kind} '{target}' cannot be imported ({err})") from None
        self._check(fn)
        return fn

    def __getitem__(self, name: str) -> Callable:
        if ":" in name:
            return self._import(name)
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries))
            raise UnknownNameError(f"unknown {self.kind} '{name}'; known: {known}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {sorted(self._entries)})"


ADVANTAGES = Registry("advantage", check_advantage_signature, tags=ADVANTAGE_TAGS)
POLICY_LOSSES = Registry("policy loss", check_policy_loss_signature)


def register_advantage(name: str, *, needs: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Decorator registering an advantage estimator under ``name``; ``needs`` names the optional fields of
    :class:`AdvantageInputs` it reads."""
    return ADVANTAGES.register(name, needs=needs)


def register_policy_loss(name: str) -> Callable[[Callable], Callable]:
    """Decorator registering a policy loss under ``name``."""
    return POLICY_LOSSES.register(name)


def get_advantage(name: str) -> AdvantageFn:
    """The advantage estimator registered as ``name``; UnknownNameError (a KeyError) lists the known ones."""
    return ADVANTAGES[name]


def get_policy_loss(name: str) -> PolicyLossFn:
    """The policy loss registered as ``name``; UnknownNameError (a KeyError) lists the known ones."""
    return POLICY_LOSSES[name]
