"""How a mini-batch is cut into micro-batches, in one process or on each of N ranks.

One process plans the whole mini-batch: :func:`rank_micro_batches` with the defaults (rank 0 of 1). Under
``torchrun`` every rank holds the whole mini-batch and plans its own contiguous share of the rows the same way
(:func:`~tether.distributed.data_parallel.split_evenly`), so a plan needs no collective. The trainer's update takes
its rank's plan (:func:`micro_batches`; a sharded strategy's ``lock_step`` adds padding ones) and its scoring every
rank's (:func:`every_rank_micro_batches`), so both run each row beside the same rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tether.distributed.data_parallel import split_evenly


@dataclass(frozen=True)
class MicroBatch:
    """Rows of a mini-batch for one forward/backward; a ``padding`` one only keeps ranks in step (weight 0)."""

    rows: Sequence[int]
    padding: bool = False


def rank_micro_batches(lengths: Sequence[tuple[int, int]], size: int, max_tokens: int | None, *, rank: int = 0,
                       world_size: int = 1) -> list[Sequence[int]]:
    """A rank's rows of a mini-batch in micro-batches (one process: every row): ``size`` rows each, or, with
    ``max_tokens``, grouped by length under that many padded tokens (:func:`pack_by_tokens`).

    Several ``size``-row micro-batches are filled longest rows first (:func:`chunk_by_length`), so that the update's
    shuffled short rows are not padded to long ones; a single one keeps its rows as they were.

    Args:
        lengths: ``(prompt tokens, response tokens)`` of every row of the mini-batch.
        rank, world_size: whose contiguous share of the rows (possibly none) is planned.
    """
    lo, hi = split_evenly(len(lengths), world_size)[rank]
    if max_tokens is not None:
        return pack_by_tokens(range(lo, hi), lengths, max_tokens)
    if hi - lo <= size:
        return [range(lo, hi)] if hi > lo else []
    return chunk_by_length(range(lo, hi), lengths, size)


def micro_batches(lengths: Sequence[tuple[int, int]], size: int, max_tokens: int | None, *, rank: int = 0,
                  world_size: int = 1, lock_step: bool = False) -> list[MicroBatch]:
    """This rank's micro-batches of a mini-batch (:func:`rank_micro_batches`), with ``lock_step`` padded to as many
    as any rank runs.

    A sharded model (FSDP2) all-gathers inside every forward and reduce-scatters inside every backward, so all ranks
    must make the same number of calls; a padding micro-batch re-runs row 0 with weight 0. Every rank holds the
    whole mini-batch, so it plans the other ranks' micro-batches too, without a collective.
    """
    own = [MicroBatch(rows) for rows in rank_micro_batches(lengths, size, max_tokens, rank=rank,
                                                           world_size=world_size)]
    if not lock_step:
        return own
    most = max(len(rank_micro_batches(lengths, size, max_tokens, rank=r, world_size=world_size))
               for r in range(world_size))
    return own + [MicroBatch(range(0, 1), padding=True)] * (most - len(own))


def every_rank_micro_batches(world_size: int, lengths: Sequence[tuple[int, int]], size: int,
                             max_tokens: int | None) -> list[Sequence[int]]:
    """Every rank's micro-batches of a mini-batch, rank 0's first, as :func:`micro_batches` gives each rank its own
    (less the lock-step padding): the plan of a pass that each rank runs over the whole mini-batch (the trainer's
    scoring), in the update's groups. Every rank makes the same calls, so none needs padding."""
    return [rows for rank in range(world_size)
            for rows in rank_micro_batches(lengths, size, max_tokens, rank=rank, world_size=world_size)]


def pack_by_tokens(rows: Iterable[int], lengths: Sequence[tuple[int, int]], max_tokens: int) -> list[list[int]]:
    """Group ``rows`` by length into micro-batches of at most ``max_tokens`` padded tokens each.

    A micro-batch of ``n`` rows is padded to its longest prompt plus its longest response, so it costs
    ``n * (max prompt + max response)`` tokens of activations. Rows are taken longest first (prompt plus
    response; equal lengths keep their order) and added to the current micro-batch while that cost stays
    within the budget; a row that alone exceeds it gets a micro-batch of its own (a row is never split).

    Args:
        rows: the rows to group (indices into ``lengths``).
        lengths: ``(prompt tokens, response tokens)`` of every row of the mini-batch.
        max_tokens: the budget of padded tokens per micro-batch.

    >>> pack_by_tokens(range(4), [(2, 1), (2, 6), (2, 2), (2, 5)], 16)
    [[1, 3], [2, 0]]
    """
    groups: list[list[int]] = []
    prompt_w = response_w = 0
    for row in sorted(rows, key=lambda r: -sum(lengths[r])):
        p, t = lengths[row]
        if groups and (len(groups[-1]) + 1) * (max(prompt_w, p) + max(response_w, t)) <= max_tokens:
            groups[-1].append(row)
            prompt_w, response_w = max(prompt_w, p), max(response_w, t)
        else:
            groups.append([row])
            prompt_w, response_w = p, t
    return groups


def chunk_by_length(rows: Iterable[int], lengths: Sequence[tuple[int, int]], size: int) -> list[list[int]]:
    """``rows`` in micro-batches of ``size`` rows, longest first (prompt plus response), each in row order.

    A micro-batch is padded to its longest prompt and its longest response, so rows of similar length waste
    little; the number of micro-batches, and each one's row count, are those of the fixed chunks.

    >>> chunk_by_length(range(4), [(2, 1), (2, 6), (2, 2), (2, 5)], 2)
    [[1, 3], [0, 2]]
    """
    by_length = sorted(rows, key=lambda r: -sum(lengths[r]))
    return [sorted(by_length[s:s + size]) for s in range(0, len(by_length), size)]
