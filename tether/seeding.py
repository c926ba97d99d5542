"""The one seed formula of tether: every sampling seed is a function of (run seed, step, purpose, k).

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
``eapo``            EAPO's prior injections (``k``: 1,000 x the generation batch)
``seed/analysis``   SEED's self-analyses (``k``: the analysis batch)
``""`` (none)       ``tether seed-sft``'s rollouts, at step 0 (``k``: the first task of the batch)
==================  ==================================================================================

``tether sft`` draws its split, its batch order and its rejection samples from ``sft.data_seed``: a seed of the
data, the same whatever the run's ``seed``.

Every other draw comes from the global generators (Python's ``random``, NumPy's, torch's): every command seeds them
from the run's ``seed`` when it starts (:func:`seed_everything`, called by :func:`tether.start.start_run`), and a
training checkpoint saves their state for its resume (``tether.trainer.checkpoint.rng_state``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch


def step_seed(run_seed: int, step: int, purpose: str, k: int = 0) -> int:
    """A sampling seed that depends only on (run seed, step, purpose, k): resumes replay exactly.

    >>> step_seed(0, 0, "", 5)  # no step, no purpose: the run seed's block, offset by k
    5
    >>> step_seed(1, 2, "val") == step_seed(1, 2, "val")
    True
    """
    salt = sum(ord(c) * 31**i for i, c in enumerate(purpose)) % 100_003
    return (run_seed * 1_000_003 + step * 10_007 + salt * 101 + k) % 2**62


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
