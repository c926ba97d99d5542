"""Rewards from user code: TRL-style reward functions (``task.rewards``), reward models and LLM judges.

>>> # task: {name: jsonl, kwargs: {path: data.jsonl}, rewards: [{fn: "my_rewards:format_reward", weight: 0.1}]}
"""

from tether.rewards.judge import Judge
from tether.rewards.model import RewardModel
from tether.rewards.task import FAULT_LOG, RewardedTask, build_config_task, build_task, item_columns
from tether.rewards.terms import (
    RewardTerm,
    TermResult,
    check_batch_signature,
    check_reward_terms,
    probe_reward_terms,
)
from tether.rewards.verl_score import VerlScore

__all__ = ["FAULT_LOG", "Judge", "RewardModel", "RewardTerm", "RewardedTask", "TermResult", "VerlScore",
           "build_config_task", "build_task", "check_batch_signature", "check_reward_terms", "item_columns",
           "probe_reward_terms"]
