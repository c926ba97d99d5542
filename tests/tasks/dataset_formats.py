"""Format functions for the dataset task's tests: a row (a dict) in, ``{"prompt", "answer", ...}`` out."""

from __future__ import annotations


def to_chat(row):
    return {"prompt": row["messages"], "answer": row["target"], "source": "test"}


def misspelt_column(row):
    return {"prompt": row["mesages"], "answer": row["target"]}


def one_message(row):
    return {"prompt": row["messages"][0], "answer": row["target"]}


def sharegpt(row):
    return {"prompt": [{"from": "human", "value": row["messages"][0]["content"]}], "answer": row["target"]}


def bad_messages(row):
    return {"prompt": ["hello"], "answer": "x"}


def no_args():
    return {}


def not_a_dict(row):
    return [row]


def verl_row(row):
    """verl's parquet layout: chat prompt, ground truth nested under reward_model, data_source and extra_info."""
    return {"prompt": row["prompt"], "answer": row["reward_model"]["ground_truth"],
            "data_source": row["data_source"], "extra_info": row["extra_info"]}


def with_image(row):
    """TRL's multimodal message: an image part (its bytes inline, as a parquet image column holds them) and a text."""
    image = {"type": "image", "image": {"bytes": "\x89PNG" + "A" * 50_000}}
    return {"prompt": [{"role": "user", "content": [image, {"type": "text", "text": row["target"]}]}], "answer": "x"}


def solution_reward(prompts, completions, solution, **kwargs):
    """A TRL reward function on a column of the dataset (``solution``, a number here): its value, plus 0.5 where the
    completion is TRL's conversational one (one assistant message) and the prompt a conversation."""
    chat = [isinstance(p, list) and isinstance(c, list) and c[0]["role"] == "assistant"
            for p, c in zip(prompts, completions, strict=True)]
    return [float(value) + 0.5 * is_chat for value, is_chat in zip(solution, chat, strict=True)]


def completion_reward(completions, completion, **kwargs):
    """A TRL reward function on a reference ``completion`` column: its length."""
    return [float(len(reference)) for reference in completion]
