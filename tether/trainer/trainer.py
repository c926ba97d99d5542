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

from typing import Any

from tether.config import Config
from tether.trainer.build import TrainerBuild
from tether.trainer.loop import TrainingLoop
from tether.trainer.state import RunState
from tether.trainer.step import StepPhases


class Trainer(TrainerBuild, StepPhases, TrainingLoop, RunState):
    """On-policy RL of ``cfg``: ``Trainer(cfg).fit()``. ``policy``/``tokenizer`` override ``cfg.model``."""


def train_run(cfg: Config) -> dict[str, Any]:
    """Train ``cfg`` to its end and return its summary; a run already finished with these settings returns its
    summary without loading anything (``tether train`` again, or a recipe's stage that ended before)."""
    from tether.track.progress import status
    from tether.trainer.rundir import finished_summary

    if (done := finished_summary(cfg)) is not None:
        status(f"{cfg.run_dir} is finished at step {done['steps']}: nothing to do")
        return done
    trainer = Trainer(cfg)
    trainer.fit()
    return trainer.summary()
