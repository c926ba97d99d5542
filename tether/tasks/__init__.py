"""Single-turn verifiable tasks: items, scoring, answer extraction, sampling metrics.

>>> from tether.tasks import make_task
>>> task = make_task("reasoning_gym", dataset="chain_sum", train_size=8, val_size=4)  # doctest: +SKIP
"""

from tether.tasks import addition, dataset_task, jsonl_task, parity, reasoning_gym_task  # noqa: F401  (registers the built-in tasks)
from tether.tasks.addition import AdditionTask
from tether.tasks.base import RewardMap, Score, Task, TaskItem, fault_score, safe_score, task_split
from tether.tasks.extract import (
    ANSWER_INSTRUCTION,
    DEFAULT_PROMPT_TEMPLATE,
    EXTRACT_MODES,
    extract_answer,
    extract_answer_tag,
    extract_boxed,
    extract_last_number,
)
from tether.tasks.jsonl_task import JsonlTask, math_equal
from tether.tasks.metrics import avg_at_k, pass_at_k, sample_metrics
from tether.tasks.reasoning_gym_task import ReasoningGymTask
from tether.tasks.registry import make_task, register_task, task_names, unregister_task

__all__ = [
    "ANSWER_INSTRUCTION",
    "DEFAULT_PROMPT_TEMPLATE",
    "EXTRACT_MODES",
    "AdditionTask",
    "JsonlTask",
    "ReasoningGymTask",
    "RewardMap",
    "Score",
    "Task",
    "TaskItem",
    "avg_at_k",
    "extract_answer",
    "extract_answer_tag",
    "extract_boxed",
    "extract_last_number",
    "fault_score",
    "make_task",
    "math_equal",
    "pass_at_k",
    "register_task",
    "safe_score",
    "sample_metrics",
    "task_names",
    "task_split",
    "unregister_task",
]
