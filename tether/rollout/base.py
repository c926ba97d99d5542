"""What a collector is: the :class:`Collector` protocol, and the :class:`GenerationHooks` it calls.

The trainer calls a collector; the collector never calls the trainer back. It receives what one step needs:

* the engine to sample with (the health checks' recorder around the policy's engine, when they record);
* the step's seeds (:class:`~tether.seeding.StepSeeds`: ``seeds("rollout", k)`` for generation batch ``k``);
* the methods' generation hooks (:class:`GenerationHooks`, :class:`tether.methods.hooks.MethodSet` bound to the step):
  the sampling intervention of each batch, and the hook that sees each fresh generation batch.

Validation takes the engine and one seed (``seeds("val")``), so the trainer's validation and ``tether eval`` are the
same call.

A collector may also be a :class:`GroupSampler`: it samples and scores groups of task items on demand, with any
engine (the single-turn collector's ``generate``). Methods reach that through ``StepContext.sample_groups`` (ARMOR's
anchors, sampled from the reference); it is None for a collector that is not one (the agent loop).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    from tether.config import Config
    from tether.engine.base import Intervention, RolloutEngine, SamplingParams
    from tether.rollout.batch import RolloutBatch
    from tether.seeding import StepSeeds
    from tether.tasks import TaskItem


class GenerationHooks(Protocol):
    """The methods' hooks a collector calls while it generates a step's batch."""

    def intervention(self) -> Intervention | None:
        """The sampling intervention of the next generation batch (at most one method gives one)."""

    def on_generation(self, batch: RolloutBatch) -> tuple[RolloutBatch, dict[str, float]]:
        """A fresh generation batch, rewards known, through every method: rows added, groups dropped; metrics."""


class NoHooks:
    """No method: no intervention, every batch as generated."""

    def intervention(self) -> None:
        return None

    def on_generation(self, batch: RolloutBatch) -> tuple[RolloutBatch, dict[str, float]]:
        return batch, {}


class Collector(Protocol):
    """Makes a step's :class:`~tether.rollout.batch.RolloutBatch`, and the validation metrics."""

    # Fields of tether.algos.AdvantageInputs the collector's rows carry (tether.advantage_inputs reads them).
    advantage_tags: ClassVar[frozenset[str]]

    @classmethod
    def from_config(cls, cfg: Config, tokenizer: Any) -> Collector:
        """The collector of ``cfg``'s workload, encoding prompts with ``tokenizer`` (``tether train``, ``eval``)."""

    def collect(self, engine: RolloutEngine, seeds: StepSeeds,
                hooks: GenerationHooks) -> tuple[RolloutBatch, dict[str, float]]:
        """One RL step's batch, on the CPU, and its rollout metrics."""

    def validate(self, engine: RolloutEngine, seed: int) -> dict[str, float]:
        """Validation metrics (``val/...``) on the held-out set, sampled from ``seed``."""

    def state_dict(self) -> dict[str, Any]:
        """Where the training data stands (checkpointed)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


class SampleGroups(Protocol):
    """``n`` scored samples of each task item by ``engine``, seeded from ``seed``; the rows of ``items[j]`` share
    ``group_ids[j]`` (fresh ids when None) and carry ``source`` (0: on-policy; a method's own rows, another)."""

    def __call__(self, engine: RolloutEngine, items: list[TaskItem], n: int, params: SamplingParams, seed: int, *,
                 group_ids: list[int] | None = None, source: int = 0) -> RolloutBatch: ...


@runtime_checkable
class GroupSampler(Protocol):
    """A collector that also samples groups of task items on demand (:class:`SampleGroups`): the single-turn
    collector, whose rollouts are groups of one task item each."""

    def generate(self, engine: RolloutEngine, items: list[TaskItem], n: int, params: SamplingParams, seed: int, *,
                 group_ids: list[int] | None = None, source: int = 0) -> RolloutBatch:
        """The collector's own :class:`SampleGroups`."""


def group_sampler(collector: Any) -> SampleGroups | None:
    """``collector``'s :class:`SampleGroups` when it is a :class:`GroupSampler` (``StepContext.sample_groups``), else
    None."""
    return collector.generate if isinstance(collector, GroupSampler) else None
