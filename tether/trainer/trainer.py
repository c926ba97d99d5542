"""The trainer: one RL step from rollouts to the optimiser, with hooks for method plug-ins.

:class:`Trainer` is assembled from one class per concern, each in its own file:

=====================  ===========================================================================================
file                   what it holds
=====================  ===========================================================================================
``build.py``           construction in dependency order; the engine, the seeds, the hook context
``step.py``            one RL step, top to bottom: collect, score, advantages, update, after
``loop.py``            :meth:`~TrainingLoop.fit`: the step loop, validation, the save schedule, signals, best
``state.py``           :meth:`~RunState.save` and :meth:`~RunState.resume`
=====================  ===========================================================================================
"""

from __future__ import annotations

import torch

from tether.checks import run_checks
from tether.config import Config
from tether.distributed import resolve_device
from tether.engine.registry import build_engine
from tether.models import load_policy
from tether.trainer.build import TrainerBuild, build_collector
from tether.trainer.loop import TrainingLoop
from tether.trainer.state import RunState
from tether.trainer.step import StepPhases


class Trainer(TrainerBuild, StepPhases, TrainingLoop, RunState):
    """On-policy RL of ``cfg``: ``Trainer(cfg).fit()``. ``policy``/``tokenizer`` override ``cfg.model``."""


def evaluate(cfg: Config) -> dict[str, float]:
    """Validation metrics of ``cfg.model.name`` (a checkpoint directory, say) on the held-out set."""
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    device = resolve_device(cfg.train.device)
    run_checks(cfg)
    policy, tokenizer = load_policy(cfg.model.name)
    policy.to(device).eval()
    engine = build_engine(cfg.rollout.engine, policy, tokenizer, cfg.model, cfg.rollout.engine_kwargs)
    return build_collector(cfg, tokenizer).validate(engine, cfg.seed * 1_000_003)

