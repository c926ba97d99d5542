"""The one seed formula of tether: every sampling seed is a hash of (run seed, step, purpose, k, ...).

Training rollouts, validation, ``tether eval``, the shuffles of the update and the methods' own sampling all draw
their seeds here, so a resumed run replays exactly and ``tether eval`` of the checkpoint of step ``s`` samples with
the seeds the run's own validation used at step ``s`` (and reproduces its value).

==================  ==================================================================================
purpose             used by
==================  ==================================================================================
``rollout``         the collector's generation batches of a training step (``k``: the batch's index)
``val``             validation inside the run, and ``tether eval`` of a checkpoint of that step
``shuffle``         the order of the rows over the update's mini-batches
``armor/ref``       ARMOR's reference samples (``k``: the generation batch)
``eapo``            EAPO's prior injections (``k``: the generation batch)
``seed/analysis``   SEED's self-analyses (``k``: the analysis batch)
``""`` (none)       ``tether seed-sft``'s rollouts, at step 0 (``k``: the first task of the batch)
==================  ==================================================================================

Under ``torchrun`` and with the Ray engine's actors, an engine call seeded ``s`` is split by rank: rank ``r`` samples
its share with :func:`rank_seed` of ``(s, r)``, ``s`` itself on rank 0, a hash of ``(s, "rank", r)`` on the others.

Each engine call of a collector samples from :func:`derive_seed` of its caller's seed and its place in it (the
row offset of its chunk; in an agent, the turn too), as EAPO's injection does per engine call. The seeds are
hashes, not linear offsets: with ``seed + turn * 1009 + start`` and ``run_seed * 1_000_003 + step * 10_007 + ...``
two calls got the same seed where the offsets added up alike (``tether seed-sft`` with 16 tasks x 8 rollouts per
batch: the rows 64-127 of the batch of task 0 and the rows 0-63 of the batch of task 64, in every turn), and the
same seed gives the same samples to the same prompt.

``tether sft`` draws its split, its batch order and its rejection samples from ``sft.data_seed``: a seed of the
data, the same whatever the run's ``seed``.

Every other draw comes from the global generators (Python's ``random``, NumPy's, torch's): every command seeds them
from the run's ``seed`` when it starts (:func:`seed_everything`, called by :func:`tether.start.start_run`), and a
training checkpoint saves their state for its resume (``tether.trainer.checkpoint.rng_state``).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

import numpy as np
import torch

SEED_BITS = 62  # every engine takes it: torch.Generator.manual_seed (64 bits), vLLM's per-request seed, Random


def derive_seed(*parts: int | str) -> int:
    """A ``SEED_BITS``-bit seed that is a hash (BLAKE2b) of ``parts``: a pure function of them, so resumes replay,
    and two different tuples collide with probability ``2**-62``, whatever their values.

    >>> derive_seed(0, 0, "rollout", 1) == derive_seed(0, 0, "rollout", 1) != derive_seed(0, 0, "rollout", 2)
    True
    """
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()  # repr tells 1 from "1"
    return int.from_bytes(digest, "little") >> (64 - SEED_BITS)


def rank_seed(seed: int, rank: int) -> int:
    """The sampling seed of data-parallel ``rank`` (or Ray engine actor) for an engine call seeded ``seed``: rank 0
    keeps ``seed`` itself, so one rank or one actor samples what the unsharded engine samples; rank ``r > 0`` takes
    ``derive_seed(seed, "rank", r)``. It was ``seed + r * 1_000_000_007``, a linear offset: the call seeded ``s``
    gave rank 1 the seed of rank 0 of a call seeded ``s + 1_000_000_007``.

    >>> rank_seed(5, 0), rank_seed(5, 1) == derive_seed(5, "rank", 1)
    (5, True)
    """
    return seed if rank == 0 else derive_seed(seed, "rank", rank)


def step_seed(run_seed: int, step: int, purpose: str, k: int = 0) -> int:
    """A sampling seed that depends only on (run seed, step, purpose, k): resumes replay exactly.

    >>> step_seed(1, 2, "val") == step_seed(1, 2, "val") != step_seed(1, 3, "val")
    True
    """
    return derive_seed(run_seed, step, purpose, k)


@dataclass(frozen=True)
class StepSeeds:
    """The seeds of one step of a run: ``seeds("rollout", k)`` is :func:`step_seed` of (run seed, step, purpose, k).

    Attributes:
        run_seed: the run's ``seed``.
        step: RL steps done (``k`` during step ``k + 1``; a checkpoint's step for ``tether eval``).
    """

    run_seed: int
    step: int

    def __call__(self, purpose: str, k: int = 0) -> int:
        return step_seed(self.run_seed, self.step, purpose, k)


def seed_everything(seed: int) -> None:
    """Seed every global generator from the run's seed: Python's ``random``, NumPy's legacy global one and torch's
    (CPU and every GPU). Sampling draws from seeds of its own (:func:`step_seed`); these make any other draw, in
    tether or in user code (a reward function, an environment, a LoRA adapter's initialisation), repeat from run
    to run."""
    random.seed(seed)
    np.random.seed(seed % 2**32)  # NumPy takes 32 bits
    torch.manual_seed(seed)  # also seeds every CUDA device
