"""A conversational dataset saved with ``datasets``' ``save_to_disk``, and the format function that reads it.

Run this file once to write the dataset next to it (``python examples/conversational_dataset/chat_format.py``):
each row is a short support conversation (a list of ``{role, content}`` messages) ending with a user's question
(a sum of two digits: SmolLM2-135M-Instruct gets about one in five right at the start, enough for GRPO to learn
from), and the number that answers it.
"""

import random
from pathlib import Path

OPENERS = ["Hi! Can you help me with a sum?", "Hello, I have a quick maths question.", "Hey, are you good at sums?"]


def to_prompt(row):
    """One row of the saved dataset -> what the dataset task reads: the prompt (the conversation so far, a list of
    messages) and the gold answer; any other key would reach reward functions as a column."""
    return {"prompt": row["conversation"], "answer": str(row["solution"])}


def make_dataset(path, rows=200, seed=0):
    """Write ``rows`` distinct conversations (at most 243) to ``path`` with ``Dataset.save_to_disk``."""
    import datasets

    pairs = [(opener, a, b) for opener in OPENERS for a in range(1, 10) for b in range(1, 10)]
    data = [{"conversation": [
        {"role": "user", "content": opener},
        {"role": "assistant", "content": "Of course. What is the question?"},
        {"role": "user", "content": f"What is {a} plus {b}?"},
    ], "solution": a + b} for opener, a, b in random.Random(seed).sample(pairs, rows)]
    datasets.Dataset.from_list(data).save_to_disk(str(path))


if __name__ == "__main__":
    make_dataset(Path(__file__).with_name("chats"))
