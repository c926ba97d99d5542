"""Token round trip: the ids the trainer trains on are exactly the ids the engine was given and sampled.

A re-rendered chat template, a prompt re-tokenised from text, or a loss mask one token off all train the policy on
sequences it never produced (TRL #6250, verl #6719, slime #2263). Nothing in the loss notices: the gradient is just
wrong. So while the collector runs, the trainer's engine is wrapped in a :class:`RecordingEngine` that remembers every
``(prompt ids, sampled response ids)`` pair it produced; before any training work, every on-policy row of the batch
(its prompt ids, and its response ids under ``response_mask``) must be one of them. A row that is not stops the run
with the first differing position, decoded (:func:`check_round_trip`).

The mask check falls out of the same comparison: response ids are read under ``response_mask``, so a mask that
covers one token too many (a pad) or too few (no EOS) gives a sequence the engine did not sample.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from tether.engine.base import Generation, SamplingParams
from tether.health.errors import HealthError
from tether.rollout.batch import RolloutBatch

Sample = tuple[tuple[int, ...], tuple[int, ...]]  # (prompt ids, sampled response ids up to and including EOS)


class RoundTripError(HealthError):
    """The batch holds a row whose ids or loss mask are not what the engine sampled."""


def masked_rows(ids: list[list[int]], mask: list[list[float]]) -> list[tuple[int, ...]]:
    """Each row's ids where its mask is set."""
    return [tuple(t for t, m in zip(row, row_mask, strict=True) if m > 0) for row, row_mask in zip(ids, mask,
                                                                                                 strict=True)]


class RecordingEngine:
    """Any engine, remembering what each ``generate`` call was given and sampled; every other attribute is the
    wrapped engine's."""

    def __init__(self, engine: Any, samples: set[Sample]) -> None:
        self.engine, self.samples = engine, samples

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, **kwargs: Any) -> Generation:
        gen = self.engine.generate(prompt_ids, params, **kwargs)
        responses = masked_rows(gen.response_ids.tolist(), gen.response_mask.tolist())
        self.samples.update((tuple(p), r) for p, r in zip(prompt_ids, responses, strict=True))
        return gen

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Length of the longest common prefix.

    >>> common_prefix((1, 2, 3), (1, 2, 4, 5))
    2
    """
    n = 0
    for x, y in zip(a, b, strict=False):  # prefixes of unequal length
        if x != y:
            break
        n += 1
    return n


def check_round_trip(batch: RolloutBatch, samples: Collection[Sample], tokenizer: Any) -> None:
    """Raise :class:`RoundTripError` on the first on-policy row that is not a recorded sample."""
    responses = masked_rows(batch.response_ids.tolist(), batch.response_mask.tolist())
    for i, (prompt, source) in enumerate(zip(batch.prompt_ids, batch.source.tolist(), strict=True)):
        trained = (tuple(prompt), responses[i])
        if source == 0 and trained not in samples:
            raise RoundTripError(describe_mismatch(i, trained, samples, tokenizer))


def describe_mismatch(row: int, trained: Sample, samples: Collection[Sample], tokenizer: Any) -> str:
    """Where row ``row`` departs from the closest recorded sample, decoded."""
    if not samples:
        return (f"row {row}: the engine sampled nothing through trainer.engine while the batch was collected, so "
                "no row can be checked; collectors must sample with trainer.engine")
    same_prompt = [r for p, r in samples if p == trained[0]]
    if same_prompt:
        part, ours = "response", trained[1]
        theirs = max(same_prompt, key=lambda r: common_prefix(r, ours))
    else:
        part, ours = "prompt", trained[0]
        theirs = max((p for p, _ in samples), key=lambda p: common_prefix(p, ours))
    pos = common_prefix(ours, theirs)

    def token(ids: tuple[int, ...]) -> str:
        return repr(tokenizer.decode([ids[pos]])) if pos < len(ids) else "<end>"

    context = tokenizer.decode(list(ours[max(0, pos - 12):pos]))
    what = "sampled" if part == "response" else "was given"
    text = (f"row {row}: the {part} the trainer would train on is not what the engine {what}: they differ at {part} "
            f"token {pos} (after ...{context!r}): trained {token(ours)}, engine {token(theirs)}. ")
    if part == "response" and pos == min(len(ours), len(theirs)):
        text += (f"The loss mask covers {len(ours)} tokens where the engine sampled {len(theirs)}: it is off by "
                 f"{len(ours) - len(theirs):+d}. ")
    elif part == "prompt":
        text += ("The prompt was rebuilt after sampling (re-tokenised or re-templated): train on the ids the "
                 "engine saw. ")
    return text + "Refusing to train on it (docs/health.md, health.round_trip)."
