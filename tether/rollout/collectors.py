"""Which collector makes a step's :class:`~tether.rollout.batch.RolloutBatch`: single-turn groups or the agent loop.

The one place that maps a config's workload to its collector; the trainer, ``tether eval`` and the checks of
``algorithm.advantage`` (:mod:`tether.advantage_inputs`) all ask here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tether.config import Config
    from tether.rollout.base import Collector


def collector_classes() -> dict[str, type[Collector]]:
    """Every collector, by the config section that picks it: ``task`` single-turn groups, ``env`` the agent loop."""
    from tether.rollout.multi_turn import AgentCollector
    from tether.rollout.single_turn import SingleTurnCollector

    return {"task": SingleTurnCollector, "env": AgentCollector}


def collector_class(cfg: Config) -> type[Collector]:
    """The collector of ``cfg``'s workload: its ``task`` or its ``env`` (a config has exactly one)."""
    return collector_classes()["task" if cfg.task is not None else "env"]
