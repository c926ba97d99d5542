"""The trainer: one RL step from rollouts to the optimiser, with hooks for method plug-ins."""

from tether.trainer.evaluation import evaluate
from tether.trainer.trainer import Trainer

__all__ = ["Trainer", "evaluate"]
