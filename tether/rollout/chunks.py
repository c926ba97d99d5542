"""How both collectors call the engine: in chunks of :data:`GENERATE_ROWS` rows, each seeded by its place.

The single-turn collector's groups and each turn of the agent loop go through :func:`generate_in_chunks`, so the
chunk size and the seed of every engine call (:mod:`tether.seeding`) are said once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

from tether.seeding import derive_seed

if TYPE_CHECKING:
    from tether.engine.base import Generation, Intervention, RolloutEngine, SamplingParams

GENERATE_ROWS = 64  # rows per engine call: bounds KV-cache memory on CPU

Row = TypeVar("Row")


def generate_in_chunks(engine: RolloutEngine, rows: Sequence[Row], encode: Callable[[Row], list[int]],
                       params: SamplingParams, seed: tuple[int, ...], intervention: Intervention | None = None,
                       ) -> Iterator[tuple[int, Sequence[Row], list[list[int]], Generation]]:
    """One response per row, in engine calls of at most :data:`GENERATE_ROWS` rows: the call at row offset
    ``start`` samples from ``derive_seed(*seed, start)``.

    A chunk's prompts are encoded just before its call (a visual prompt holds its pixels), and each chunk is
    yielded before the next is sampled, so the caller scores it, or steps its envs, first.

    Yields:
        (start, the chunk's rows, their prompt ids, the engine's :class:`~tether.engine.base.Generation`).
    """
    for start in range(0, len(rows), GENERATE_ROWS):
        chunk = rows[start:start + GENERATE_ROWS]
        prompts = [encode(row) for row in chunk]
        yield start, chunk, prompts, engine.generate(prompts, params, seed=derive_seed(*seed, start),
                                                     intervention=intervention)
