"""Rewards from user code: TRL-style reward functions (``task.rewards``), reward models and LLM judges.

>>> # task: {name: jsonl, kwargs: {path: data.jsonl}, rewards: [{fn: "my_rewards:format_reward", weight: 0.1}]}

Each name is imported at its first use, so that a reward term's own process (``timeout_s``,
:mod:`tether.rewards.process`) imports :mod:`tether.rewards.terms` alone, not torch with the reward model or every
task: that made the process's start take seconds.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tether.rewards.judge import Judge
    from tether.rewards.model import RewardModel
    from tether.rewards.task import (
        FAULT_LOG,
        RewardedTask,
        build_config_task,
        build_task,
        check_reward_calls,
        item_columns,
    )
    from tether.rewards.terms import (
        RewardTerm,
        TermResult,
        check_batch_signature,
        check_reward_columns,
        check_reward_terms,
        probe_reward_terms,
    )
    from tether.rewards.verl_score import VerlScore

#: Each public name's module.
_MODULES = {"Judge": "judge", "RewardModel": "model", "VerlScore": "verl_score",
            **dict.fromkeys(["FAULT_LOG", "RewardedTask", "build_config_task", "build_task", "check_reward_calls",
                             "item_columns"], "task"),
            **dict.fromkeys(["RewardTerm", "TermResult", "check_batch_signature", "check_reward_columns",
                             "check_reward_terms", "probe_reward_terms"], "terms")}

__all__ = ["FAULT_LOG", "Judge", "RewardModel", "RewardTerm", "RewardedTask", "TermResult", "VerlScore",
           "build_config_task", "build_task", "check_batch_signature", "check_reward_calls", "check_reward_columns",
           "check_reward_terms", "item_columns", "probe_reward_terms"]


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return __all__
