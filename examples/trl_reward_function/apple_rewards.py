"""Reward functions written for TRL's GRPOTrainer (``reward_funcs=[...]``); tether calls them unchanged.

The signature is TRL's: ``fn(prompts, completions, **kwargs) -> list[float | None]``, called once per batch of
responses. ``completions`` are strings here (the prompts are plain text); every other column of the dataset
arrives as a keyword list, so ``answer`` is the gold answers of the batch's rows.

The prompt asks for the number alone, which SmolLM2-135M-Instruct often does but not always: it tends to answer in
a sentence ("Tom has 41 apples."). So correctness reads the last number of the response, and the format reward pays
for the bare number the prompt asked for.
"""

import re

NUMBER = re.compile(r"-?\d+")


def correctness_reward(prompts, completions, answer, **kwargs):
    """1.0 when the last number of the response is the gold answer, else 0.0."""
    rewards = []
    for completion, gold in zip(completions, answer, strict=True):
        numbers = NUMBER.findall(completion)
        rewards.append(1.0 if numbers and numbers[-1] == gold else 0.0)
    return rewards


def format_reward(prompts, completions, **kwargs):
    """1.0 when the response is a number and nothing else (a final period allowed), else 0.0."""
    return [1.0 if NUMBER.fullmatch(c.strip().removesuffix(".")) else 0.0 for c in completions]
