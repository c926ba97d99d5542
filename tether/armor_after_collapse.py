"""``health.collapse.action: armor``: when validation collapses, continue from its peak with ARMOR as stage 2.

ARMOR's setting (docs/methods/armor.md) is a run whose held-out score peaked and fell while the training reward rose:
continue from the peak with the peak as the reference. With this action the over-optimisation guard
(:mod:`tether.health.collapse`) ends stage 1 at the validation that completes a collapse, and stage 2 trains from
``run_dir/checkpoints/best`` in ``run_dir/armor`` for the steps stage 1 had left. Stage 2 is stage 1's config with:

* ``model.name``: the peak; ``model.ref_name`` unset, so the reference is the trainer's frozen copy of the peak;
* ``methods.armor`` added (stage 1's settings for it kept if it had any, else ARMOR's defaults: Anchor Rollout);
* ``algorithm.policy_loss: armor`` at the loss's defaults (the paper's: alpha 15/16, clip 0.2/0.28, dual clip 10),
  since stage 1's ``loss_kwargs`` belong to another loss;
* ``train.steps``: the steps left; ``health.collapse.action: warn`` (a second collapse is reported, not chased).

``run_dir/health/collapse.json`` records the collapse, so running the same command again resumes stage 2 instead of
replaying stage 1. The entry points are :func:`armor_stage_config` (the stage-2 config, a pure function a recipe
can call) and :func:`train_with_armor_after_collapse` (what ``tether train`` runs under this action).
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path
from typing import Any

import torch

from tether.config import Config, ConfigError, load_config
from tether.health import CollapseError
from tether.track import write_text_atomic
from tether.trainer import Trainer

STAGE2_DIR = "armor"  # stage 2's run_dir, inside stage 1's
RECORD = Path("health") / "collapse.json"


def armor_stage_config(cfg: Config, steps_done: int) -> Config:
    """Stage 2 of ``cfg`` after a collapse at step ``steps_done``: ARMOR from ``cfg``'s validation peak.

    Raises:
        ConfigError: ``cfg`` trains an agent environment (Anchor Rollout needs a single-turn task), or the stage-2
            config does not validate.
    """
    if cfg.env is not None:
        raise ConfigError("health.collapse.action=armor: ARMOR's Anchor Rollout needs a single-turn task (task: ...), "
                          "not an env; use health.collapse.action=stop")
    data = cfg.model_dump(mode="json")
    run_dir = Path(cfg.run_dir)
    data["run_dir"] = str(run_dir / STAGE2_DIR)
    data["model"].update(name=str(run_dir / "checkpoints" / "best"), ref_name=None)
    data["methods"] = {**data["methods"], "armor": data["methods"].get("armor", {})}
    data["algorithm"].update(policy_loss="armor", loss_kwargs={})
    data["train"]["steps"] = max(cfg.train.steps - steps_done, 0)
    data["health"]["collapse"]["action"] = "warn"
    return load_config(data=data)


def train_with_armor_after_collapse(cfg: Config, *, policy: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """Stage 1 until it ends or collapses; after a collapse, stage 2 (:func:`armor_stage_config`) for the steps left.

    Args:
        cfg: the run, with ``health.collapse.action: armor``.
        policy, tokenizer: stage 1's model instead of ``cfg.model`` (tests); stage 2 loads the peak.

    Returns:
        ``stage1``: stage 1's summary (absent when this call resumed stage 2), ``collapse``: the record of the
        collapse (absent when none happened), ``stage2``: stage 2's summary (absent when none ran).
    """
    armor_stage_config(cfg, 0)  # stage 2's settings are checked before stage 1 loads a model
    record_path = Path(cfg.run_dir) / RECORD
    if cfg.train.resume == "never" and cfg.train.overwrite:
        record_path.unlink(missing_ok=True)  # a fresh start over the earlier run replays stage 1
    out: dict[str, Any] = {}
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        print(f"resuming stage 2 (ARMOR) of {cfg.run_dir}: stage 1 collapsed at step {record['step']}",
              file=sys.stderr)
    else:
        record, out["stage1"] = _stage_one(cfg, policy, tokenizer)
        if record is None:
            return out
        write_text_atomic(record_path, json.dumps(record, indent=2))
    out["collapse"] = record
    stage2 = armor_stage_config(cfg, record["step"])
    if stage2.train.steps == 0:
        return out
    print(f"continuing from the peak of step {record['peak_step']} with ARMOR for {stage2.train.steps} steps in "
          f"{stage2.run_dir}", file=sys.stderr)
    trainer = Trainer(stage2)
    trainer.fit()
    out["stage2"] = trainer.summary()
    return out


def _stage_one(cfg: Config, policy: Any, tokenizer: Any) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(the collapse's record or None, stage 1's summary). Its trainer is freed before this returns, so that stage 2's
    models, optimiser state and engines never sit beside stage 1's (on a GPU two 7B trainers would not fit)."""
    trainer = Trainer(cfg, policy=policy, tokenizer=tokenizer)
    record = None
    try:
        trainer.fit()
    except CollapseError as err:
        record = {"step": err.step, "peak_step": err.peak_step, "message": str(err)}
    summary = trainer.summary()
    del trainer
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return record, summary
