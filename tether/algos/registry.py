"""Name -> function registries for advantage estimators and policy losses.

One :class:`~tether.registry.Registry` (the one registry shape of tether) per family, filled by a decorator at
import time. The trainer looks functions up by the name in the config and binds the config's keyword arguments to
the function's signature, so every entry must have the family's signature (checked when it is registered, and
again in the tests):

* advantage: ``fn(inputs, *, <hparam>=<default>, ...) -> AdvantageOutput`` (``inputs`` an :class:`AdvantageInputs`)
* policy loss: ``fn(inputs, *, agg="token-mean", <hparam>=<default>, ...) -> LossOutput``

An advantage estimator also declares the optional per-row tags of :class:`AdvantageInputs` it needs
(``needs=("injected",)``), so a config that chooses it where nothing produces them is refused when it is read.

Unlike verl's ``register_policy_loss``, a second registration under a taken name raises instead of
silently replacing the first.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Protocol

from tether.algos.types import ADVANTAGE_TAGS, AdvantageInputs, AdvantageOutput, LossInputs, LossOutput
from tether.registry import Registry, UnknownNameError, load_target


class AdvantageFn(Protocol):
    """Per-row advantages, plus metrics, from per-row rewards, group ids and tags."""

    def __call__(self, inputs: AdvantageInputs, **hparams: Any) -> AdvantageOutput: ...


class PolicyLossFn(Protocol):
    """A scalar loss to minimise, plus metrics, from one micro-batch."""

    def __call__(self, inputs: LossInputs, *, agg: str = "token-mean", **hparams: Any) -> LossOutput: ...


def _check_keyword_defaults(params: list[inspect.Parameter]) -> None:
    for p in params:
        if p.kind is not p.KEYWORD_ONLY or p.default is p.empty:
            raise TypeError(f"hyperparameter '{p.name}' must be keyword-only with a default (write it after '*')")


def check_advantage_signature(fn: Callable) -> None:
    """Raise TypeError unless ``fn`` is ``fn(inputs, *, k=default, ...)``."""
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].name != "inputs" or params[0].kind is not params[0].POSITIONAL_OR_KEYWORD:
        raise TypeError("it must take (inputs, *, ...), inputs an AdvantageInputs")
    _check_keyword_defaults(params[1:])


def check_policy_loss_signature(fn: Callable) -> None:
    """Raise TypeError unless ``fn`` is ``fn(inputs, *, agg="token-mean", k=default, ...)``."""
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].name != "inputs" or params[0].kind is not params[0].POSITIONAL_OR_KEYWORD:
        raise TypeError("it must take (inputs, *, agg=..., ...)")
    if len(params) < 2 or params[1].name != "agg" or params[1].default != "token-mean":
        raise TypeError("its second parameter must be agg: str = 'token-mean'")
    _check_keyword_defaults(params[1:])


def _importer(kind: str) -> Callable[[str], Callable]:
    """The lookup of a ``"module:function"`` name: the function, which the registry then checks like a registered
    one (the config checks resolve it first, with a did-you-mean; this is the trainer's lookup)."""

    def resolve(target: str) -> Callable:
        try:
            return load_target(target)
        except (ImportError, AttributeError) as err:
            raise UnknownNameError(f"{kind} '{target}' cannot be imported ({err})") from None

    return resolve


def function_registry(kind: str, check: Callable[[Callable], None], tags: tuple[str, ...] = ()) -> Registry:
    """A registry of one family's functions, which also takes a ``module:function`` of the user's own."""
    return Registry(kind, check, tags, resolve=_importer(kind), own="module:function")


ADVANTAGES = function_registry("advantage", check_advantage_signature, tags=ADVANTAGE_TAGS)
POLICY_LOSSES = function_registry("policy loss", check_policy_loss_signature)


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
