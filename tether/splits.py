"""Seeded splits: the one shuffle every split of tether draws, and the one train/val split of the SFT commands.

A split is a seeded permutation of the row indices (``random.Random(seed).shuffle``), then consecutive slices of
it: the first rows are held out, the rest train. The tasks carve their held-out splits from the same permutation
(:func:`tether.tasks.jsonl_task.carve`). This module imports nothing of tether's.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable
from typing import Any, Literal, TypeVar

Row = TypeVar("Row")

# How a held-out share becomes a count of rows: ``nearest``, Python's round (half to even), at least one row when
# the share is above 0 (``tether sft``); ``floor``, int(n x share), which may hold none out (SEED's stage 1, as the
# paper's code cuts its records).
Rounding = Literal["nearest", "floor"]


def seeded_order(n: int, seed: int) -> list[int]:
    """A permutation of ``range(n)`` drawn from ``seed``: the same for any rows of the same length."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


def held_out_count(n: int, val_fraction: float, rounding: Rounding = "nearest") -> int:
    """Rows of ``n`` that ``val_fraction`` holds out; never every row (at least one trains when there is one)."""
    if rounding == "floor":
        count = int(n * val_fraction)
    else:
        count = 0 if val_fraction == 0 else max(1, round(val_fraction * n))
    return min(count, max(n - 1, 0))


def split_train_val(rows: list[Row], val_fraction: float, seed: int, rounding: Rounding = "nearest",
                    key: Callable[[Row], Hashable] | None = None) -> tuple[list[Row], list[Row]]:
    """``(train, val)``: a seeded shuffle of ``rows``, the first :func:`held_out_count` of it val, the rest train.

    ``key``: rows of one key (the examples of one prompt) stay on one side, so no val row shares its key with a
    training row; the shuffle and ``val_fraction`` then count keys, in the order of their first rows. With every
    key distinct the split is the one without ``key``.
    """
    if key is not None:
        groups: dict[Hashable, list[Row]] = {}
        for row in rows:
            groups.setdefault(key(row), []).append(row)
        train, val = split_train_val(list(groups.values()), val_fraction, seed, rounding)
        return [row for group in train for row in group], [row for group in val for row in group]
    order = seeded_order(len(rows), seed)
    n_val = held_out_count(len(rows), val_fraction, rounding)
    return [rows[i] for i in order[n_val:]], [rows[i] for i in order[:n_val]]


def shuffled(rows: list[Any], seed: int) -> list[Any]:
    """``rows`` in the order of :func:`seeded_order`."""
    return [rows[i] for i in seeded_order(len(rows), seed)]
