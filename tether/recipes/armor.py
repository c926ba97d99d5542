"""ARMOR's two stages as one run (Huang et al., arXiv:2607.10481, Sec. 3 and 5.1; docs/methods/armor.md).

Stage 1 trains (DAPO or QAE, validated) to its validation peak; stage 2 continues from that checkpoint, with the
reference equal to it, with ARMOR (the ``armor`` method and policy loss) or a baseline. Two forms:

* ``tether recipe armor STAGE1 STAGE2`` (:func:`run_two_stage`): stage 1 runs its whole budget, and stage 2 is a
  config of its own; each stage is an ordinary ``tether train`` config.
* ``tether recipe armor CONFIG --after-collapse`` (:func:`run_after_collapse`): stage 1 ends at the validation that
  completes a collapse (the over-optimisation guard, :mod:`tether.health.collapse`, run with ``health.collapse.action:
  stop``), and stage 2 trains from ``run_dir/checkpoints/best`` in ``run_dir/armor`` for the steps stage 1 had
  left. Stage 2 is stage 1's config with (:func:`armor_stage_config`):

  * ``model.name``: the peak; ``model.ref_name`` unset, so the reference is the trainer's frozen copy of the peak;
  * ``methods.armor`` added (stage 1's settings for it kept if it had any, else ARMOR's defaults: Anchor Rollout);
  * ``algorithm.policy_loss: armor`` at the loss's defaults (the paper's: alpha 15/16, clip 0.2/0.28, dual clip
    10), since stage 1's ``loss_kwargs`` belong to another loss;
  * ``train.steps``: the steps left; ``health.collapse.action: warn`` (a second collapse is reported, not chased).

  ``run_dir/health/collapse.json`` records the collapse, so running the same command again resumes stage 2 instead
  of replaying stage 1.
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
from tether.trainer import Trainer, train_run
from tether.trainer.checkpoint import load_state

STAGE2_DIR = "armor"  # the after-collapse stage 2's run_dir, inside stage 1's
RECORD = Path("health") / "collapse.json"


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
    first_summary = train_run(stage1)  # a stage 1 that ended before loads nothing
    _free_memory()
    best = Path(stage1.run_dir) / "checkpoints" / "best"
    if not (best / "trainer_state.pt").is_file():
        raise RuntimeError(f"stage 1 wrote no {best}: train.best_metric={stage1.train.best_metric!r} was "
                           "never logged by validation")
    picked = load_state(best)
    cfg = stage2.model_copy(deep=True)
    cfg.model.name = str(best)
    return {"best_checkpoint": str(best), "best_step": picked["step"],
            "best_metric": {picked["name"]: picked["metric"]},
            "stage1": first_summary, "stage2": train_run(cfg)}


def _free_memory() -> None:
    """Stage 1's models, optimiser state and engines go before stage 2 builds its own (the caller has dropped its
    trainer): on a GPU, two trainers of the paper's 7B model (or two vLLM engines) would not fit side by side."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# -- after a collapse -------------------------------------------------------------------------------


def armor_stage_config(cfg: Config, steps_done: int) -> Config:
    """Stage 2 of ``cfg`` after a collapse at step ``steps_done``: ARMOR from ``cfg``'s validation peak (module
    docstring).

    Raises:
        ConfigError: ``cfg`` trains an agent environment (Anchor Rollout needs a single-turn task), or the stage-2
            config does not validate.
    """
    if cfg.env is not None:
        raise ConfigError("tether recipe armor --after-collapse: ARMOR's Anchor Rollout needs a single-turn task "
                          "(task: ...), not an env; use health.collapse.action=stop with tether train")
    data = cfg.model_dump(mode="json")
    run_dir = Path(cfg.run_dir)
    data["run_dir"] = str(run_dir / STAGE2_DIR)
    data["model"].update(name=str(run_dir / "checkpoints" / "best"), ref_name=None)
    data["methods"] = {**data["methods"], "armor": data["methods"].get("armor", {})}
    data["algorithm"].update(policy_loss="armor", loss_kwargs={})
    data["train"]["steps"] = max(cfg.train.steps - steps_done, 0)
    data["health"]["collapse"]["action"] = "warn"
    return load_config(data=data)


def run_after_collapse(cfg: Config, *, policy: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """Stage 1 until it ends or collapses; after a collapse, stage 2 (:func:`armor_stage_config`) for the steps left.

    Args:
        cfg: stage 1's run; it runs with ``health.collapse.action: stop`` whatever the config says (``off`` is
            refused: no collapse would ever end stage 1).
        policy, tokenizer: stage 1's model instead of ``cfg.model`` (tests); stage 2 loads the peak.

    Returns:
        ``stage1``: stage 1's summary (absent when this call resumed stage 2), ``collapse``: the record of the
        collapse (absent when none happened), ``stage2``: stage 2's summary (absent when none ran).

    Raises:
        ConfigError: ``health.collapse.action`` is off, or :func:`armor_stage_config` refuses ``cfg``; both before
            any model loads.
    """
    if cfg.health.collapse.action == "off":
        raise ConfigError("tether recipe armor --after-collapse ends stage 1 at a collapse, which "
                          "health.collapse.action=off never reports; set it to warn or stop (stage 1 runs with stop)")
    armor_stage_config(cfg, 0)  # stage 2's settings are checked before stage 1 loads a model
    stage1 = cfg.model_copy(deep=True)
    stage1.health.collapse.action = "stop"
    record_path = Path(cfg.run_dir) / RECORD
    if cfg.train.resume == "never" and cfg.train.overwrite:
        record_path.unlink(missing_ok=True)  # a fresh start over the earlier run replays stage 1
    out: dict[str, Any] = {}
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        print(f"resuming stage 2 (ARMOR) of {cfg.run_dir}: stage 1 collapsed at step {record['step']}",
              file=sys.stderr)
    else:
        record, out["stage1"] = _stage_one(stage1, policy, tokenizer)
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
    """(the collapse's record or None, stage 1's summary). Its trainer is freed before this returns."""
    trainer = Trainer(cfg, policy=policy, tokenizer=tokenizer)
    record = None
    try:
        trainer.fit()
    except CollapseError as err:
        record = {"step": err.step, "peak_step": err.peak_step, "message": str(err)}
    summary = trainer.summary()
    del trainer
    _free_memory()
    return record, summary
