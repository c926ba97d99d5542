"""The update's micro-batch plan (tether/trainer/micro_batches.py): one process plans every row, a rank its
contiguous share, a sharded run pads every rank to as many micro-batches."""

from __future__ import annotations

import torch

from tether.trainer.micro_batches import (
    chunk_by_length,
    every_rank_micro_batches,
    micro_batches,
    pack_by_tokens,
    rank_micro_batches,
)


def test_fixed_size_micro_batches_cover_every_row_once():
    lengths = [(1, 1)] * 5  # equal lengths: the longest-first fill keeps row order
    assert rank_micro_batches(lengths, 2, None) == [[0, 1], [2, 3], [4]]
    rows = [r for rank in range(3) for mb in rank_micro_batches([(1, 1)] * 7, 2, None, rank=rank, world_size=3)
            for r in mb]
    assert rows == list(range(7))


def test_token_budget_groups_cover_every_row_once_under_the_budget():
    g = torch.Generator().manual_seed(0)
    lengths = [(int(p), int(t)) for p, t in zip(torch.randint(1, 30, (40,), generator=g),
                                                torch.randint(0, 60, (40,), generator=g), strict=True)]
    lengths[7] = (50, 60)  # alone over the budget
    groups = pack_by_tokens(range(40), lengths, 100)
    assert rank_micro_batches(lengths, 4, 100) == groups  # one process: the budget plan of every row
    assert sorted(r for mb in groups for r in mb) == list(range(40))
    assert [7] in groups
    for mb in groups:
        if mb != [7]:
            assert len(mb) * (max(lengths[r][0] for r in mb) + max(lengths[r][1] for r in mb)) <= 100
    totals = [sum(lengths[r]) for mb in groups for r in mb]
    assert totals == sorted(totals, reverse=True)  # longest first, so each group's rows have similar lengths
    assert pack_by_tokens(range(3), [(1, 1)] * 3, 10**6) == [[0, 1, 2]]
    per_rank = [r for rank in range(3) for mb in rank_micro_batches(lengths, 4, 100, rank=rank, world_size=3)
                for r in mb]
    assert sorted(per_rank) == list(range(40))


def test_fixed_size_micro_batches_by_length_keep_their_sizes():
    lengths = [(2, 1), (2, 6), (3, 2), (2, 5), (1, 1)]
    assert rank_micro_batches(lengths, 2, None) == chunk_by_length(range(5), lengths, 2) == [[1, 3], [0, 2], [4]]
    assert rank_micro_batches(lengths, 5, None) == [range(0, 5)]  # one: as it was
    # each rank groups its own contiguous share
    assert rank_micro_batches(lengths, 1, None, rank=1, world_size=2) == [[3], [4]]


def test_every_rank_micro_batches_are_each_ranks_own_in_rank_order():
    """Scoring runs every rank's micro-batches of the update on each rank: rank 0's rows [0, 3), rank 1's [3, 5)."""
    lengths = [(2, 1), (2, 6), (3, 2), (2, 5), (1, 1)]
    own = [[list(mb.rows) for mb in micro_batches(lengths, 2, None, rank=r, world_size=2)] for r in range(2)]
    assert own == [[[1, 2], [0]], [[3, 4]]]
    assert [list(rows) for rows in every_rank_micro_batches(2, lengths, 2, None)] == own[0] + own[1]
    assert [list(rows) for rows in every_rank_micro_batches(1, lengths, 2, None)] == [[1, 3], [0, 2], [4]]


def test_lock_step_token_budget_pads_ranks_to_the_same_count():
    lengths = [(2, 5), (2, 5), (2, 5), (2, 1), (2, 1)]  # rank 0: three long rows, one per micro-batch
    plans = [micro_batches(lengths, 5, 8, rank=r, world_size=2, lock_step=True) for r in range(2)]
    assert [[list(mb.rows) for mb in p if not mb.padding] for p in plans] == [[[0], [1], [2]], [[3, 4]]]
    assert [mb.padding for mb in plans[1]] == [False, True, True]
    assert not any(mb.padding for mb in micro_batches(lengths, 5, 8, rank=1, world_size=2))  # replicated: none


def test_lock_step_micro_batches_pad_ranks_to_the_same_count_and_cover_every_row_once():
    rows = [(1, 1)] * 7  # (prompt, response) lengths

    def plan(rank, world, lengths, size):
        return micro_batches(lengths, size, None, rank=rank, world_size=world, lock_step=True)

    plans = [plan(r, 3, rows, 2) for r in range(3)]  # shares 3, 2, 2 rows
    assert [len(p) for p in plans] == [2, 2, 2]
    assert sorted(r for p in plans for mb in p if not mb.padding for r in mb.rows) == list(range(7))
    assert [mb.padding for mb in plan(1, 2, rows[:1], 4)] == [True]  # no rows
    assert plan(0, 2, [], 4) == []
