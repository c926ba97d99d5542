"""AsyncCollector's schedule for any ``k`` (the trainer tests run k = 1 only): the batch trained at step ``s`` is
sampled by the weights of step ``max(s - k, s0)``, its rows say so, ``rollout/staleness`` is ``s`` minus that, and
no batch is sampled for a step at or past ``train.steps``.

A fake inner collector records which step it sampled for and which weights the engine held at that moment (the
weights pushed through the locked engine after each step, as the trainer does), so the labels are checked against
what really sampled.
"""

from __future__ import annotations

import threading

import pytest
import torch

from tether.rollout.asynchronous import VERSION, AsyncCollector, LockedEngine
from tether.rollout.base import NoHooks
from tether.rollout.batch import RolloutBatch
from tether.seeding import StepSeeds


class WeightsEngine:
    """Holds only the version of the weights last pushed."""

    def __init__(self, version: int) -> None:
        self.version = version

    def load_weights(self, state_dict: dict) -> None:
        self.version = state_dict["version"]


class StepCollector:
    """Two rows per batch; remembers (step, weights version) of every batch it sampled."""

    def __init__(self) -> None:
        self.sampled: list[tuple[int, int]] = []

    def collect(self, engine, seeds, hooks):
        self.sampled.append((seeds.step, engine.version))
        batch = RolloutBatch(prompt_ids=[[1], [2]], response_ids=torch.zeros(2, 1, dtype=torch.long),
                             response_mask=torch.ones(2, 1), sample_log_probs=torch.zeros(2, 1),
                             group_ids=torch.tensor([0, 0]), rewards=torch.zeros(2),
                             correct=torch.zeros(2, dtype=torch.bool), source=torch.zeros(2, dtype=torch.long),
                             info={"weights": [engine.version] * 2})
        return batch, {"sampled_for": float(seeds.step)}


def run(k: int, first: int, last_step: int) -> tuple[StepCollector, list[tuple[list, list, float, float]]]:
    """Train steps ``first .. last_step - 1`` from weights of version ``first``, pushing version ``s + 1`` after
    step ``s``; per step: the rows' version labels, the weights that really sampled them, the staleness metric and
    the step the batch was sampled for."""
    inner = StepCollector()
    locked = LockedEngine(WeightsEngine(first), threading.RLock())
    collector = AsyncCollector(inner, locked, k, last_step)
    out = []
    try:
        for step in range(first, last_step):
            batch, metrics = collector.collect(locked, StepSeeds(0, step), NoHooks())
            out.append((batch.info[VERSION], batch.info["weights"], metrics["rollout/staleness"],
                        metrics["sampled_for"]))
            locked.load_weights({"version": step + 1})  # the update's push waits for a job holding the engine
        collector._finish_job()
    finally:
        collector.executor.shutdown(wait=True)
    return inner, out


def test_k_2_samples_two_steps_ahead_with_the_weights_of_step_minus_2():
    inner, out = run(k=2, first=0, last_step=6)
    versions = [0, 0, 0, 1, 2, 3]
    assert [labels for labels, *_ in out] == [[v, v] for v in versions]
    assert [weights for _, weights, *_ in out] == [[v, v] for v in versions]  # the labels are the truth
    assert [staleness for _, _, staleness, _ in out] == [0.0, 1.0, 2.0, 2.0, 2.0, 2.0]
    assert [step for *_, step in out] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert [step for step, _ in inner.sampled] == [0, 1, 2, 3, 4, 5]  # nothing sampled for step 6 or later


@pytest.mark.parametrize(("k", "first", "last_step"), [(1, 0, 5), (2, 3, 8), (3, 0, 7), (3, 2, 4)])
def test_each_step_trains_on_the_weights_of_max_step_minus_k_and_the_start(k, first, last_step):
    inner, out = run(k, first, last_step)
    steps = range(first, last_step)
    want = [max(s - k, first) for s in steps]
    assert [labels for labels, *_ in out] == [[v, v] for v in want]
    assert [weights for _, weights, *_ in out] == [[v, v] for v in want]
    assert [staleness for _, _, staleness, _ in out] == [float(s - v) for s, v in zip(steps, want, strict=True)]
    assert sorted(step for step, _ in inner.sampled) == list(steps)  # each step once, none past the last


def test_a_resume_with_a_lower_max_staleness_samples_again_what_is_too_stale_for_it():
    """A k = 2 run checkpointed at step 2 holds the batches of steps 2 (weights 0) and 3 (weights 1). Resumed with
    k = 1, the batch of step 2 would train 2 steps stale: it is sampled again with the weights of step 2."""
    saved = AsyncCollector(StepCollector(), LockedEngine(WeightsEngine(0), threading.RLock()), 2, 6)
    try:
        for step in range(2):
            saved.collect(saved.engine, StepSeeds(0, step), NoHooks())
            saved.engine.load_weights({"version": step + 1})
        saved._finish_job()
    finally:
        saved.executor.shutdown(wait=True)
    assert [(s, b.info[VERSION][0]) for s, b, *_ in saved.pending] == [(2, 0), (3, 1)]
    inner = StepCollector()
    resumed = AsyncCollector(inner, LockedEngine(WeightsEngine(2), threading.RLock()), 1, 6)
    resumed.pending = saved.pending
    try:
        batch, metrics = resumed.collect(resumed.engine, StepSeeds(0, 2), NoHooks())
        resumed._finish_job()
    finally:
        resumed.executor.shutdown(wait=True)
    assert batch.info[VERSION] == batch.info["weights"] == [2, 2] and metrics["rollout/staleness"] == 0.0
    assert inner.sampled == [(2, 2), (3, 2)]  # step 2 again at the resume, step 3 by the job (its held one dropped)
