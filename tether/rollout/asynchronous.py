"""Asynchronous rollouts (``rollout.max_staleness: k``): the batch of step ``s + k`` is sampled in a background thread
while step ``s`` trains.

The schedule is fixed, so a run is as reproducible as a synchronous one:

* the batch trained at step ``s`` is sampled by the weights of step ``max(s - k, s0)`` (``s0``: the step the run
  started at, or resumed at where its checkpoint held no batch of step ``s``); each row records that version in
  ``info["policy_version"]``, and ``rollout/staleness`` logs ``s - version``;
* at step ``s`` the collector hands over the batch of step ``s`` (the first step after a start samples it and the
  next ``k - 1`` synchronously, as does a resume for those its checkpoint does not hold), then starts the job of
  step ``s + k`` and waits until the job holds the engine: the job then samples with the weights of step ``s``,
  because the weights of ``s + 1`` are pushed through the same lock (:class:`LockedEngine`) and wait until it is
  done. One job runs at a time, overlapping one update;
* the job samples with the seeds of the step the batch is for (:class:`~tether.seeding.StepSeeds`), so a batch gets
  the prompts and seeds it would get in a synchronous run; only the weights are older;
* the engine samples from weights of its own (``rollout.dtype``'s copy, or a copy in the policy's dtype for the
  in-process engine, which otherwise samples with the very tensors the optimiser updates);
* a checkpoint holds the batches in flight (the job of a step is done before its weights are pushed, and a
  checkpoint is written after the push), so a resumed run trains on exactly the batches the uninterrupted one does.

``rollout.correction`` corrects the staleness: the behaviour log-probs are those the older weights recorded. Methods
(ARMOR's anchors and reference resets, EAPO's lock-step injections, SEED's re-scoring) run hooks against the trainer's
current state, so a run with methods is refused with ``max_staleness > 0`` (:mod:`tether.checks.components`).
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from tether.engine.registry import engine_entry
from tether.health.round_trip import RecordingEngine
from tether.rollout.base import NoHooks
from tether.rollout.batch import RolloutBatch
from tether.seeding import StepSeeds

VERSION = "policy_version"  # RolloutBatch.info key: the trainer step whose weights sampled the row


class LockedEngine:
    """An engine whose every call holds one re-entrant lock: a job holds the lock for a whole batch, so no weight push
    lands in the middle of one. It keeps no count of the weights: a batch's version comes from the schedule
    (:class:`AsyncCollector`), which ``tests/rollout/test_async_schedule.py`` checks against the weights that
    sampled."""

    def __init__(self, engine: Any, lock: threading.RLock) -> None:
        self.engine, self.lock = engine, lock

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            return self.engine.generate(*args, **kwargs)

    def score(self, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            return self.engine.score(*args, **kwargs)

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        with self.lock:
            self.engine.load_weights(state_dict)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


class AsyncCollector:
    """A collector (single-turn or the agent loop) whose batches are sampled ``max_staleness`` steps ahead.

    Args:
        collector: the synchronous collector; ``collect`` calls of the background job and every other call hold the
            engine's lock, so its state is never read while a job changes it.
        engine: the trainer's engine over weights of its own (:func:`private_engine`), locked.
        max_staleness: ``k >= 1``.
        last_step: ``train.steps``: no batch is sampled for a step beyond it.
    """

    def __init__(self, collector: Any, engine: LockedEngine, max_staleness: int, last_step: int) -> None:
        self.inner, self.engine, self.k, self.last_step = collector, engine, max_staleness, last_step
        self.pending: deque[tuple[int, RolloutBatch, dict[str, float], set]] = deque()
        self.job: tuple[int, Future] | None = None
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tether-rollout")

    def collect(self, engine: Any, seeds: StepSeeds, hooks: Any) -> tuple[RolloutBatch, dict[str, float]]:
        """The batch of step ``seeds.step``, sampled ``seeds.step - version`` steps ago; starts the job of step
        ``seeds.step + k``. ``engine`` is the trainer's sampling engine (the health checks' recorder around
        :attr:`engine`, or :attr:`engine` itself); ``hooks`` are empty, since runs with methods are refused."""
        step = seeds.step
        self._finish_job()
        # the pipeline holds the batches of steps step .. step + k - 1. A start, or a resume that changed
        # train.steps or max_staleness, lacks some (a checkpoint taken within k steps of its run's last step holds
        # none past it), holds some beyond, or holds some staler than a lowered k allows: those missing are
        # sampled now with the current weights
        wanted = range(step, min(step + self.k, self.last_step))
        held = {entry[0]: entry for entry in self.pending if entry[0] in wanted and self._within_staleness(entry)}
        self.pending = deque(held[s] if s in held else self._sample(seeds, s, version=step) for s in wanted)
        _, batch, metrics, samples = self.pending.popleft()
        if isinstance(engine, RecordingEngine):  # the health check's round trip reads what was sampled
            engine.samples.update(samples)
        if step + self.k < self.last_step:
            self._start_job(seeds, step + self.k, version=step)
        staleness = [step - v for v in batch.info[VERSION]]
        return batch, {**metrics, "rollout/staleness": sum(staleness) / max(1, len(staleness))}

    def _within_staleness(self, entry: tuple[int, RolloutBatch, dict[str, float], set]) -> bool:
        """Whether a batch in flight, trained at its step, is at most ``max_staleness`` steps stale."""
        step, batch, *_ = entry
        return all(step - version <= self.k for version in batch.info[VERSION])

    def _sample(self, seeds: StepSeeds, step: int, version: int) -> tuple[int, RolloutBatch, dict[str, float], set]:
        """The batch of ``step`` with the engine's current weights, those of step ``version`` (holding the lock)."""
        with self.engine.lock:
            samples: set = set()
            batch, metrics = self.inner.collect(RecordingEngine(self.engine, samples),
                                                StepSeeds(seeds.run_seed, step), NoHooks())
        batch.info[VERSION] = [version] * len(batch)
        return step, batch, metrics, samples

    def _start_job(self, seeds: StepSeeds, step: int, version: int) -> None:
        """Run :meth:`_sample` for ``step`` in the background and return once it holds the engine's lock."""
        holding = threading.Event()

        def job() -> tuple[int, RolloutBatch, dict[str, float], set]:
            with self.engine.lock:
                holding.set()
                return self._sample(seeds, step, version)

        self.job = (step, self.executor.submit(job))
        holding.wait()

    def _finish_job(self) -> None:
        if self.job is not None:
            _, future = self.job
            self.job = None
            self.pending.append(future.result())  # a job's exception surfaces here, in the trainer's thread

    # -- the rest of the collector's interface: under the lock, after any job ------------------------------------

    def validate(self, engine: Any, seed: int) -> dict[str, float]:
        self._finish_job()
        with self.engine.lock:
            return self.inner.validate(engine, seed)

    def state_dict(self) -> dict[str, Any]:
        """The collector's state and the batches in flight (the job's included, finished first)."""
        self._finish_job()
        with self.engine.lock:
            return {"inner": self.inner.state_dict(),
                    "pending": [(s, b, m, sorted(samples)) for s, b, m, samples in self.pending]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "inner" not in state:  # a checkpoint of a synchronous run: nothing in flight
            self.inner.load_state_dict(state)
            return
        self.inner.load_state_dict(state["inner"])
        self.pending = deque((s, b, m, set(samples)) for s, b, m, samples in state["pending"])

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def private_engine(cfg: Any, engine: Any, policy: Any, make_engine: Any) -> Any:
    """``engine``, or for an engine that samples with the policy module itself, the same engine over a copy of the
    policy (``rollout.dtype``'s, else the policy's own dtype) that weight pushes refresh."""
    from tether.engine.hf import rollout_copy

    if not engine_entry(cfg.rollout.engine).shares_policy or engine.model is not policy:
        return engine
    dtype = getattr(torch, cfg.rollout.dtype) if cfg.rollout.dtype else next(policy.parameters()).dtype
    return make_engine(rollout_copy(policy, dtype))


def asynchronous(cfg: Any, collector: Any, engine: Any, policy: Any, make_engine: Any) -> tuple[Any, Any]:
    """``(collector, engine)`` for the trainer: unchanged with ``rollout.max_staleness: 0``, else an
    :class:`AsyncCollector` and its locked engine over weights of its own (``make_engine(model)`` builds one)."""
    k = cfg.rollout.max_staleness
    if k == 0:
        return collector, engine
    locked = LockedEngine(private_engine(cfg, engine, policy, make_engine), threading.RLock())
    return AsyncCollector(collector, locked, k, cfg.train.steps), locked
