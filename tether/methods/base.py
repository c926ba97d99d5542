"""Method plug-ins: how ARMOR, EAPO and SEED reach into a training step without the trainer naming them.

A method is a class with a pydantic settings model and a few optional hooks, registered by name.
The trainer calls every hook of every configured method at fixed points of the step, through the run's
:class:`~tether.methods.hooks.MethodSet` (which also enforces the rules below), with a
:class:`~tether.methods.context.StepContext` (step, seeds, config, device, run directory, tokenizer, policy,
reference, engines, log-prob and sampling helpers), never the trainer itself:

=====================  ======================================================================
hook                   called
=====================  ======================================================================
``check_config``       (class method) by ``tether validate`` and before any model loads
``named_models``       (class method) the models it loads, checked to be on the machine then
``setup(ctx)``         once, after the policy, engine, task and optimiser exist
``intervention(ctx)``  before each generation batch; may return a per-step sampling hook
``on_generation``      ``(batch, ctx)`` on each fresh generation batch (rewards known): add rows, drop groups
``on_score``           ``(batch, ctx)`` after old/ref log-probs: add per-token tensors (teacher log-probs...)
``on_advantages``      ``(batch, ctx)`` after the trainer made the advantages: read them (metrics); never write them
``extra_loss``         ``(inputs, micro, ctx)`` per micro-batch: an extra term added to the policy loss;
                       ``ctx.mini_batch`` holds the whole mini-batch's totals (its normalisers)
``after_update(ctx)``  after the optimiser steps of an RL step (reference resets: ``ctx.reference.reset_to``)
``state_dict``         extra state to checkpoint; ``load_state_dict`` restores it
=====================  ======================================================================

Hooks return metrics (or the object plus metrics), which the trainer logs as given: a method names
its keys under its own namespace (``armor/``, ``eapo/``, ``seed/``). ``on_generation``'s describe the one generation
batch it was given; a step with several (DAPO's refills) logs them folded over all of them
(:class:`~tether.methods.hooks.GenerationFold`): a mean weighted by the rows each batch generated, or by the units
named in ``generation_units``; the sum for a total (``generation_totals``); the largest / smallest for a ``*_max`` /
``*_min``. Several methods may run together;
at most one may intervene in sampling. The one write a hook makes to the run is
:meth:`~tether.methods.context.Reference.reset_to`; everything else it changes is its own state or the batch.

A per-token tensor a method adds to the batch for a loss (``batch.token[name]``) is declared in ``loss_tokens``:
the trainer passes exactly those to the loss, in ``LossInputs.tokens``, and a loss missing one is told which method
adds it (``LossInputs.require``).

Advantages are made in one place, by the trainer, with the estimator the config names (``algorithm.advantage``).
A method that an estimator depends on produces per-row tags instead, and declares them in ``advantage_tags``
(EAPO: ``injected``), so a config choosing an estimator whose tags nothing produces is refused when it is read
(:mod:`tether.advantage_inputs`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from tether.algos import record_token_producer
from tether.config import ConfigError, validation_lines
from tether.registry import Registry, UnknownNameError

if TYPE_CHECKING:
    from tether.algos import LossInputs, LossOutput
    from tether.config import Config
    from tether.engine.base import Intervention
    from tether.methods.context import StepContext
    from tether.rollout.batch import RolloutBatch


class MethodSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Method:
    """Base class: every hook is a no-op. Subclasses set ``name`` and ``Settings``."""

    name: ClassVar[str]
    Settings: ClassVar[type[MethodSettings]] = MethodSettings
    needs_ref: ClassVar[bool] = False
    # True when ``intervention`` returns a per-step hook: then rollout.engine must support interventions
    # (checked when the config is read).
    needs_intervention: ClassVar[bool] = False
    # Fields of tether.algos.AdvantageInputs this method's rows carry (tether.advantage_inputs reads them).
    advantage_tags: ClassVar[frozenset[str]] = frozenset()
    # Per-token tensors this method adds to the batch (batch.token) for the loss: they reach LossInputs.tokens.
    loss_tokens: ClassVar[frozenset[str]] = frozenset()
    # on_generation metrics that count something in their generation batch: the step logs their sum.
    generation_totals: ClassVar[frozenset[str]] = frozenset()
    # on_generation metrics that are means over other units than the batch's generated rows -> the total (one of
    # generation_totals) that counts those units, by which the step weights each batch's value.
    generation_units: ClassVar[Mapping[str, str]] = MappingProxyType({})

    def __init__(self, settings: MethodSettings) -> None:
        self.settings = settings

    @classmethod
    def check_config(cls, settings: MethodSettings, cfg: Config) -> list[str]:
        """Check the method's settings against the rest of the config, before any model loads.

        Returns:
            Warning lines, for legal settings that are most likely a mistake.

        Raises:
            ConfigError: one line naming the key, its value and what is allowed.
        """
        return []

    @classmethod
    def named_models(cls, settings: MethodSettings) -> dict[str, str]:
        """Config key -> model name or path that the method loads, so it is found on the machine before any
        model loads (``tether.checks.machine.check_model``)."""
        return {}

    @classmethod
    def policy_tokenizer_models(cls, settings: MethodSettings) -> dict[str, str]:
        """Config key -> why, for each model of :meth:`named_models` whose outputs are read at the policy's token
        ids, so that it must use the policy's tokenizer: ``tether validate`` compares the tokenizers before any model
        loads (``tether.checks.machine.check_tokenizers``); the method checks the loaded model again."""
        return {}

    @property
    def moves_reference(self) -> bool:
        """Whether :meth:`after_update` may reset the reference (``ctx.reference.reset_to``); a LoRA run then keeps
        the reference in an adapter of its own (docs/lora.md)."""
        return False

    def setup(self, ctx: StepContext) -> None:
        """Called once; keep a reference to what the hooks need."""

    def intervention(self, ctx: StepContext) -> Intervention | None:
        return None

    def on_generation(self, batch: RolloutBatch, ctx: StepContext) -> tuple[RolloutBatch, dict[str, Any]]:
        """One fresh generation batch, rewards known: the batch to keep (rows added, groups dropped) and metrics of
        this batch alone; the step folds them over its generation batches (see ``generation_totals``)."""
        return batch, {}

    def on_score(self, batch: RolloutBatch, ctx: StepContext) -> dict[str, Any]:
        return {}

    def on_advantages(self, batch: RolloutBatch, ctx: StepContext) -> dict[str, Any]:
        return {}

    def extra_loss(self, inputs: LossInputs, micro: RolloutBatch, ctx: StepContext) -> LossOutput | None:
        """An extra loss term for ``micro``; ``ctx.mini_batch`` is the mini-batch it belongs to."""
        return None

    def after_update(self, ctx: StepContext) -> dict[str, Any]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


def _resolve_method(key: str) -> type[Method]:
    """The :class:`Method` subclass a ``methods`` key of the form ``module:Name`` names.

    Raises:
        ConfigError: the module does not import, has no such name, or it is not a :class:`Method` subclass.
    """
    from tether.user_code import resolve_target

    cls = resolve_target(f"methods.{key}", key)
    if not (isinstance(cls, type) and issubclass(cls, Method)) or not getattr(cls, "name", None):
        raise ConfigError(f"methods.{key}: {key!r} is {cls!r}, not a subclass of tether.methods.base.Method "
                          "with a name")
    return cls


#: Method names (a class's ``name``, and the ``module:Name`` keys a config resolved) and their classes.
METHODS: Registry[type[Method]] = Registry("method", resolve=_resolve_method)


def register_method(cls: type[Method]) -> type[Method]:
    """Class decorator registering ``cls`` under ``cls.name``; registering the same class again is harmless (two
    ``module:Name`` keys may name one class), another class under a taken name raises ValueError."""
    if METHODS.get(cls.name) is not cls:
        METHODS.add(cls.name, cls)
    for token in sorted(cls.loss_tokens):
        record_token_producer(token, f"methods.{cls.name}")
    return cls


def resolve_method_targets(names: Iterable[str]) -> None:
    """Register each ``methods`` key of the form ``module:Name`` under that key (and under the class's own
    ``name``), so every lookup of ``METHODS[key]`` and every ``key in METHODS`` finds the user's class, as
    ``module:Name`` works for tasks, environments and losses (``tether.user_code``).

    Raises:
        ConfigError: the module does not import, has no such name, or it is not a :class:`Method` subclass.
    """
    from tether.user_code import is_target

    for key in names:
        if not is_target(key) or key in METHODS:
            continue
        cls = METHODS[key]
        try:
            METHODS.add(key, register_method(cls))
        except ValueError as err:  # its name is taken by another method
            raise ConfigError(f"methods.{key}: {err}") from None


def method_config(name: str, settings: dict[str, Any]) -> MethodSettings:
    """Validate one ``methods.<name>`` section; errors name the key path."""
    try:
        cls = METHODS[name]
    except UnknownNameError as err:
        raise ConfigError(f"methods.{name}: {err}") from None
    try:
        return cls.Settings.model_validate(settings or {})
    except ValidationError as err:
        lines = validation_lines(err, cls.Settings, f"methods.{name}")
        raise ConfigError("invalid configuration:\n" + "\n".join(lines)) from None


def build_methods(sections: dict[str, dict[str, Any]]) -> list[Method]:
    return [METHODS[name](method_config(name, settings)) for name, settings in sections.items()]
