"""The configured methods as one object: :class:`MethodSet` calls every method's hooks and enforces their rules.

The rules (docs in :mod:`tether.methods.base`):

* at most one method intervenes in sampling;
* a method's per-token tensors reach the loss only when it declares them (``loss_tokens``);
* advantages are the trainer's: a method reads them in ``on_advantages`` and never replaces or changes them.

The trainer holds one :class:`MethodSet` and calls it at fixed points of the step, each time with the
:class:`~tether.methods.context.StepContext` of that point. A collector gets the set bound to the step's context
(:meth:`MethodSet.generation_hooks`, a :class:`BoundHooks`), which is all it sees of the methods; the bound set,
not the collector, folds the methods' generation metrics over the step's generation batches (:class:`GenerationFold`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from tether.algos import LossOutput
from tether.distributed.data_parallel import extremum
from tether.methods.base import Method, build_methods

if TYPE_CHECKING:
    import torch

    from tether.algos import LossInputs
    from tether.engine.base import Intervention
    from tether.methods.context import StepContext
    from tether.rollout.batch import RolloutBatch


class MethodSet:
    """The run's methods (``methods:`` of the config), in the order the config lists them."""

    def __init__(self, methods: list[Method]) -> None:
        self.methods = methods
        # the per-token tensors methods add for the loss, passed to it by name (LossInputs.tokens)
        self.loss_tokens = sorted({name for m in methods for name in m.loss_tokens})

    @classmethod
    def from_config(cls, sections: dict[str, dict[str, Any]]) -> MethodSet:
        return cls(build_methods(sections))

    def __iter__(self) -> Iterator[Method]:
        return iter(self.methods)

    def __len__(self) -> int:
        return len(self.methods)

    def __getitem__(self, i: int) -> Method:
        return self.methods[i]

    @property
    def moves_reference(self) -> bool:
        """Whether a method may reset the reference (a LoRA run then gives it an adapter of its own)."""
        return any(m.moves_reference for m in self.methods)

    # -- the hooks, in the order of a step -------------------------------------------------------

    def setup(self, ctx: StepContext) -> None:
        for m in self.methods:
            m.setup(ctx)

    def generation_hooks(self, ctx: StepContext) -> BoundHooks:
        """The set bound to the collection phase's context: what a collector calls (:class:`GenerationHooks`)."""
        return BoundHooks(self, ctx)

    def intervention(self, ctx: StepContext) -> Intervention | None:
        hooks = [(m.name, h) for m in self.methods if (h := m.intervention(ctx)) is not None]
        if len(hooks) > 1:
            raise RuntimeError(f"methods {' and '.join(name for name, _ in hooks)} want to intervene in sampling; "
                               "at most one may")
        return hooks[0][1] if hooks else None

    def on_score(self, batch: RolloutBatch, ctx: StepContext) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for m in self.methods:
            metrics.update(m.on_score(batch, ctx))
        return metrics

    def on_advantages(self, batch: RolloutBatch, ctx: StepContext) -> dict[str, float]:
        """Each method reads the advantages; one that replaced them, or wrote into them, is stopped with the rule it
        broke."""
        if not self.methods:
            return {}
        advantages = batch.token["advantages"]
        # the values too, not only the tensor: an in-place write (advantages[rows] = 0) keeps the tensor's identity
        values = advantages.clone()
        metrics: dict[str, float] = {}
        for m in self.methods:
            metrics.update(m.on_advantages(batch, ctx))
            if batch.token["advantages"] is not advantages:
                raise RuntimeError(f"methods.{m.name} replaced the advantages in on_advantages; the trainer makes "
                                   "them (algorithm.advantage), a method may only read them")
            if not advantages.allclose(values, rtol=0, atol=0, equal_nan=True):  # equal, NaN where it was NaN
                raise RuntimeError(f"methods.{m.name} wrote into the advantages in on_advantages; the trainer makes "
                                   "them (algorithm.advantage), a method may only read them")
        return metrics

    def loss_token_inputs(self, micro: RolloutBatch) -> dict[str, torch.Tensor]:
        """The declared per-token tensors of ``micro`` (``LossInputs.tokens``); undeclared ones never reach a loss."""
        return {k: micro.token[k] for k in self.loss_tokens if k in micro.token}

    def extra_loss(self, loss: torch.Tensor, inputs: LossInputs, micro: RolloutBatch,
                   ctx: StepContext) -> LossOutput:
        """``loss`` plus every method's extra term for ``micro``, with their metrics and the counts of those that
        are means over other units than the response tokens (``LossOutput.counts``)."""
        out = LossOutput(loss)
        for m in self.methods:
            extra = m.extra_loss(inputs, micro, ctx)
            if extra is not None:
                out.loss = out.loss + extra.loss
                out.metrics.update(extra.metrics)
                out.counts.update(extra.counts)
                out.derived.update(extra.derived)
        return out

    def after_update(self, ctx: StepContext) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for m in self.methods:
            metrics.update(m.after_update(ctx))
        return metrics

    # -- checkpoints -------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, dict[str, Any]]:
        return {m.name: m.state_dict() for m in self.methods}

    def load_state_dict(self, state: dict[str, dict[str, Any]]) -> list[str]:
        """Restore each method's state.

        Returns:
            The keys (``methods.<name>.<key>``) a method's state now has that ``state`` lacks (a checkpoint of an
            older tether): the method's ``load_state_dict`` supplies them.
        """
        lost = []
        for m in self.methods:
            saved = state.get(m.name, {})
            lost += [f"methods.{m.name}.{key}" for key in m.state_dict() if key not in saved]
            m.load_state_dict(saved)
        return lost


class BoundHooks:
    """A :class:`MethodSet` bound to one step's context: the :class:`~tether.rollout.base.GenerationHooks` a
    collector calls."""

    def __init__(self, methods: MethodSet, ctx: StepContext) -> None:
        self.methods, self.ctx = methods, ctx
        self.fold = GenerationFold()  # one collection: the step's generation batches

    def intervention(self) -> Intervention | None:
        return self.methods.intervention(self.ctx)

    def on_generation(self, batch: RolloutBatch) -> tuple[RolloutBatch, dict[str, float]]:
        """``batch`` through every method in config order; the methods' metrics over every generation batch of the
        step so far, this one included."""
        rows = len(batch)  # what the collector generated, before any method adds or drops rows
        for m in self.methods:
            batch, metrics = m.on_generation(batch, self.ctx)
            self.fold.add(m, metrics, rows)
        return batch, self.fold.values()


class GenerationFold:
    """Methods' ``on_generation`` metrics folded over a step's generation batches (DAPO refills), each batch's value
    by its weight: a mean by the rows the batch generated (or by the units ``Method.generation_units`` names), a
    total (``Method.generation_totals``) summed, a ``*_max`` / ``*_min`` the largest / smallest. A batch filtered out
    entirely still counts: the metrics describe every generated row, not the kept ones (docs/metrics.md)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.units: dict[str, float] = {}  # of the means only

    def add(self, method: Method, metrics: dict[str, Any], rows: int) -> None:
        for key, value in metrics.items():
            value = float(value)
            pick = extremum(key)
            if pick is not None:
                self.sums[key] = pick(self.sums[key], value) if key in self.sums else value
            elif key in method.generation_totals:
                self.sums[key] = self.sums.get(key, 0.0) + value
            else:
                units = float(metrics[method.generation_units[key]]) if key in method.generation_units else rows
                self.sums[key] = self.sums.get(key, 0.0) + units * value
                self.units[key] = self.units.get(key, 0.0) + units

    def values(self) -> dict[str, float]:
        """The step's values so far; a mean whose batches had no units is 0 (as ``masked_mean``)."""
        return {k: v if k not in self.units else v / self.units[k] if self.units[k] else 0.0
                for k, v in self.sums.items()}
