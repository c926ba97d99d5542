"""ARMOR's two stages as one run (Huang et al., arXiv:2607.10481, Sec. 3 and 5.1; docs/methods/armor.md).

Stage 1 trains (DAPO or QAE, validated) to its validation peak; stage 2 continues from that checkpoint, with the
reference equal to it, with ARMOR (the ``armor`` method and policy loss) or a baseline. ``tether recipe armor
STAGE1 STAGE2`` runs it; each stage is an ordinary ``tether train`` config.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import torch

from tether.config import Config, ConfigError
from tether.trainer import Trainer
from tether.trainer.checkpoint import load_state


def run_two_stage(stage1: Config, stage2: Config) -> dict[str, Any]:
    """Stage 1 (DAPO or QAE, validated) to its best checkpoint, then stage 2 with policy and reference = it.

    The paper's setting (Sec. 3, 5.1): train until the validation score falls, take the best checkpoint
    (by ``stage1.train.best_metric``; the trainer keeps it in ``run_dir/checkpoints/best``), then continue
    with ARMOR (or a baseline) from it, with the reference equal to that checkpoint, never the base model
    (footnote 1). Stage 2's reference is the trainer's frozen copy of its initial policy.

    Args:
        stage1: validated run (``val.every > 0``).
        stage2: the continual run; its ``model.name`` is replaced by the best checkpoint.

    Returns:
        ``best_checkpoint`` (path), ``best_step``, ``best_metric`` ({name: value}), and the ``stage1`` and
        ``stage2`` summaries of :meth:`tether.trainer.Trainer.summary`.

    Raises:
        ConfigError: stage 1 does not validate, stage 2 names its own reference, or both share a run_dir.
        RuntimeError: stage 1 ended without a best checkpoint.
    """
    if not stage1.val.every:
        raise ConfigError("stage 1 needs validation to pick its best checkpoint: set val.every > 0")
    if stage2.model.ref_name is not None:
        raise ConfigError("stage 2 model.ref_name: the recipe's reference is stage 1's best checkpoint; "
                          "remove it")
    if Path(stage1.run_dir).resolve() == Path(stage2.run_dir).resolve():
        raise ConfigError(f"stage 1 and stage 2 share run_dir {stage1.run_dir!r}; give them different ones")
    first = Trainer(stage1)
    first.fit()
    first_summary = first.summary()
    # Stage 1's models, optimiser state and engines go before stage 2 builds its own: on a GPU, two trainers of the
    # paper's 7B model (or two vLLM engines) would not fit side by side.
    del first
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    best = Path(stage1.run_dir) / "checkpoints" / "best"
    if not (best / "trainer_state.pt").is_file():
        raise RuntimeError(f"stage 1 wrote no {best}: train.best_metric={stage1.train.best_metric!r} was "
                           "never logged by validation")
    picked = load_state(best)
    cfg = stage2.model_copy(deep=True)
    cfg.model.name = str(best)
    second = Trainer(cfg)
    second.fit()
    return {"best_checkpoint": str(best), "best_step": picked["step"],
            "best_metric": {picked["name"]: picked["metric"]},
            "stage1": first_summary, "stage2": second.summary()}
