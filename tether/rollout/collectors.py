"""Which collector makes a step's :class:`~tether.rollout.batch.RolloutBatch`: single-turn groups or the agent loop."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tether.config import Config


def collector_class(cfg: Config) -> type:
    """Single-turn groups for a ``task``, the multi-turn agent loop for an ``env``."""
    if cfg.task is not None:
        from tether.rollout.single_turn import SingleTurnCollector

        return SingleTurnCollector
    from tether.rollout.multi_turn import AgentCollector

    return AgentCollector
