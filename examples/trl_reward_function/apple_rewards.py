"""Reward functions written for TRL's GRPOTrainer (``reward_funcs=[...]``); tether calls them unchanged.

The signature is TRL's: ``fn(prompts, completions, **kwargs) -> list[float | None]``, called once per batch of
responses. ``completions`` are strings here (the prompts are plain text); every other column of the dataset
arrives as a keyword list, so ``answer`` is the gold answers of the batch's rows.
"""

import re

ANSWER = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")


def correctness_reward(prompts, completions, answer, **kwargs):
    """1.0 when the number inside <answer></answer> is the gold answer, else 0.0."""
    rewards = []
    for completion, gold in zip(completions, answer, strict=True):
        found = ANSWER.search(completion)
        rewards.append(1.0 if found is not None and found.group(1) == gold else 0.0)
    return rewards


def format_reward(prompts, completions, **kwargs):
    """1.0 when the response ends with exactly one <answer>...</answer>, else 0.0 (TRL's format reward)."""
    return [1.0 if len(ANSWER.findall(c)) == 1 and c.strip().endswith("</answer>") else 0.0 for c in completions]
