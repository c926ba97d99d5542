"""Format functions for the dataset task's tests: a row (a dict) in, ``{"prompt", "answer", ...}`` out."""

from __future__ import annotations


def to_chat(row):
    return {"prompt": row["messages"], "answer": row["target"], "source": "test"}


def bad_messages(row):
    return {"prompt": ["hello"], "answer": "x"}


def no_args():
    return {}


def not_a_dict(row):
    return [row]
