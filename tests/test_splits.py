"""tether.splits: the one seeded shuffle and the one train/val split of ``tether sft`` and ``tether seed-sft``."""

from __future__ import annotations

import hashlib
import json
import random

import pytest

from tether.splits import held_out_count, seeded_order, shuffled, split_train_val

GRID = [(n, f, s) for n in (0, 1, 2, 3, 5, 10, 37, 100) for f in (0.0, 0.05, 0.1, 0.2, 0.5, 0.95) for s in (0, 2026)]


def _digest(outputs: list) -> str:
    return hashlib.sha256(json.dumps(outputs).encode()).hexdigest()


def test_the_splits_are_those_of_the_two_functions_they_replace():
    """Recorded before the change over GRID (sizes, fractions, seeds): sft.split_examples on range(n), and
    recipes/seed_sft.split_records on records whose every third one (i % 3 == 1) failed to parse. Same rows in the
    same splits, in the same order."""
    sft = [list(split_train_val(list(range(n)), f, s)) for n, f, s in GRID]
    assert _digest(sft) == "3efd72fcec63589222576c49060960b16cec0ec261b62685507a87889aef3f45"

    def seed_sft(n: int, f: float, s: int) -> list[list[int]]:
        kept = [i for i in range(n) if i % 3 != 1]
        return list(split_train_val(kept, f, s, rounding="floor"))

    assert _digest([seed_sft(*case) for case in GRID]) == \
        "d25c3c7fa206d4ff79018c45d8c9a6c293a9f1f37a6514437c10278bf2a1f8ac"
    assert split_train_val(list(range(10)), 0.2, 2026) == ([2, 3, 8, 4, 7, 9, 5, 1], [0, 6])


@pytest.mark.parametrize("n, fraction, nearest, floor", [
    (10, 0.0, 0, 0), (10, 0.05, 1, 0), (10, 0.25, 2, 2), (10, 0.35, 4, 3), (30, 0.05, 2, 1), (3, 0.95, 2, 2),
    (1, 0.5, 0, 0), (0, 0.5, 0, 0), (20, 0.125, 2, 2),  # round(2.5) is 2 (half to even)
])
def test_held_out_count(n, fraction, nearest, floor):
    assert held_out_count(n, fraction) == nearest
    assert held_out_count(n, fraction, "floor") == floor


@pytest.mark.parametrize("n, fraction, seed", [(0, 0.1, 0), (1, 0.5, 3), (7, 0.3, 1), (50, 0.1, 2026)])
def test_a_split_is_a_seeded_permutation_cut_in_two(n, fraction, seed):
    rows = [f"row{i}" for i in range(n)]
    train, val = split_train_val(rows, fraction, seed)
    order = list(range(n))
    random.Random(seed).shuffle(order)  # the direct reference: random.shuffle of the indices
    assert val + train == [rows[i] for i in order] == shuffled(rows, seed)
    assert len(val) == held_out_count(n, fraction) and (n == 0 or train)
    assert seeded_order(n, seed) == order
    assert split_train_val(rows, fraction, seed + 1) != (train, val) or n < 3


@pytest.mark.parametrize("fraction, seed", [(0.05, 0), (0.25, 3), (0.5, 2026)])
def test_a_keyed_split_keeps_each_key_on_one_side(fraction, seed):
    rows = [(f"prompt{i}", k) for i in range(40) for k in range(i % 4 + 1)]  # 1 to 4 rows per prompt
    train, val = split_train_val(rows, fraction, seed, key=lambda row: row[0])
    assert sorted(train + val) == sorted(rows)
    assert val and not {p for p, _ in val} & {p for p, _ in train}
    prompts = list(dict.fromkeys(p for p, _ in rows))  # the reference: the keys split as rows of their own
    _, val_prompts = split_train_val(prompts, fraction, seed)
    assert {p for p, _ in val} == set(val_prompts)
    unique = [f"row{i}" for i in range(40)]
    assert split_train_val(unique, fraction, seed, key=lambda row: row) == split_train_val(unique, fraction, seed)
