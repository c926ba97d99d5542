"""The trainer: one RL step from rollouts to the optimiser, with hooks for method plug-ins."""

from tether.trainer.evaluation import evaluate
from tether.trainer.trainer import Trainer, train_run

__all__ = ["Trainer", "evaluate", "train_run"]
