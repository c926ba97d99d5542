"""What a run does after a collapse: ``stop`` ends it cleanly, keeping the peak; the ARMOR recipe's
``--after-collapse`` continues from the peak with ARMOR as stage 2 (tether/recipes/armor.py)."""

from __future__ import annotations

import itertools
import json
import warnings
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.rollout.helpers import agent_config
from tests.trainer.helpers import tiny_config
from tether.cli import app
from tether.config import ConfigError
from tether.health import CollapseError, CollapseGuard
from tether.recipes.armor import armor_stage_config, run_after_collapse
from tether.rollout.single_turn import SingleTurnCollector
from tether.seeding import step_seed
from tether.trainer import Trainer
from tether.trainer.checkpoint import load_state

# validation by step: a peak at step 1, then a fall of 0.3 (more than health.collapse.drop)
VAL = {0: 0.5, 1: 0.6, 2: 0.3, 3: 0.3, 4: 0.3}
COLLAPSE = ["val.every=1", "val.samples=2", "health.collapse.patience=1", "train.steps=4", "train.save_every=0",
            "rollout.max_gen_batches=30"]


@pytest.fixture
def scripted_collapse(monkeypatch):
    """Validation follows VAL and the training reward rises every step, so the guard sees a collapse at step 2."""
    step_of = {step_seed(0, step, "val"): step for step in VAL}  # validation's seed names its step (tether.seeding)
    monkeypatch.setattr(SingleTurnCollector, "validate", lambda self, engine, seed: {"val/avg@k": VAL[step_of[seed]]})
    rewards, observe = itertools.count(1), CollapseGuard.observe_train
    monkeypatch.setattr(CollapseGuard, "observe_train", lambda self, _: observe(self, float(next(rewards))))


def test_armor_stage_config_is_stage_one_from_the_peak_with_armor(tmp_path):
    cfg = tiny_config(tmp_path, "train.steps=10", "algorithm.loss_kwargs.clip_high=0.3", "model.ref_name=elsewhere")
    stage2 = armor_stage_config(cfg, steps_done=4)
    run_dir = Path(cfg.run_dir)
    assert stage2.run_dir == str(run_dir / "armor") and stage2.train.steps == 6
    assert stage2.model.name == str(run_dir / "checkpoints" / "best") and stage2.model.ref_name is None
    assert stage2.algorithm.policy_loss == "armor" and stage2.algorithm.loss_kwargs == {}
    assert stage2.methods == {"armor": {}} and stage2.health.collapse.action == "warn"
    assert stage2.rollout == cfg.rollout and stage2.optim == cfg.optim  # everything else is stage 1's
    with pytest.raises(ConfigError, match="single-turn task"):
        armor_stage_config(agent_config(tmp_path), steps_done=0)


def test_the_old_armor_action_points_at_the_recipe_and_the_recipe_refuses_what_it_cannot_run(tmp_path):
    with pytest.raises(ConfigError, match=r"health\.collapse\.action.*tether recipe armor CONFIG --after-collapse"):
        tiny_config(tmp_path, "health.collapse.action=armor")
    with pytest.raises(ConfigError, match=r"health\.collapse\.action=off never reports"):
        run_after_collapse(tiny_config(tmp_path, "health.collapse.action='off'"))
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_config(tmp_path).model_dump(mode="json")))
    for args in ([str(config)], [str(config), str(config), "--after-collapse"]):
        out = CliRunner().invoke(app, ["recipe", "armor", *args])
        assert out.exit_code == 2 and "STAGE1 STAGE2, or one config with --after-collapse" in out.stderr


def test_stop_ends_the_run_at_the_collapse_keeping_the_peak_and_the_summary(tmp_path, tiny_policy, scripted_collapse):
    model, tok = tiny_policy
    trainer = Trainer(tiny_config(tmp_path, "health.collapse.action=stop", *COLLAPSE), policy=model, tokenizer=tok)
    with pytest.raises(CollapseError, match=r"peaked at 0\.6 at step 1") as stopped:
        trainer.fit()
    assert (stopped.value.step, stopped.value.peak_step) == (2, 1)
    run = tmp_path / "run"
    assert load_state(run / "checkpoints" / "best")["step"] == 1
    assert json.loads((run / "summary.json").read_text())["steps"] == 2
    assert trainer.tracker.sinks == []  # closed: the metric files are complete


def test_tether_train_says_why_it_stopped(tmp_path, tiny_policy, scripted_collapse):
    model, tok = tiny_policy
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_config(tmp_path, *COLLAPSE).model_dump(mode="json")))
    out = CliRunner().invoke(app, ["train", str(config), f"model.name={tmp_path / 'model'}",
                                   "health.collapse.action=stop"])
    assert out.exit_code == 3 and "over-optimisation" in out.stderr and "Traceback" not in out.output


@pytest.mark.slow
def test_armor_continues_from_the_peak_for_the_steps_left_and_resumes_there(tmp_path, tiny_policy,
                                                                              scripted_collapse):
    model, tok = tiny_policy
    cfg = tiny_config(tmp_path, *COLLAPSE)  # the guard's default action (warn): the recipe runs stage 1 with stop
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # stage 2's own guard warns: its validations follow VAL too
        out = run_after_collapse(cfg, policy=model, tokenizer=tok)
    run = tmp_path / "run"
    assert out["stage1"]["steps"] == 2 and (out["collapse"]["step"], out["collapse"]["peak_step"]) == (2, 1)
    assert json.loads((run / "health" / "collapse.json").read_text())["step"] == 2
    written = yaml.safe_load((run / "armor" / "config.yaml").read_text())
    assert written["model"]["name"] == str(run / "checkpoints" / "best")
    assert written["algorithm"]["policy_loss"] == "armor" and "armor" in written["methods"]
    assert out["stage2"]["steps"] == 2  # 4 steps in all
    rows = [json.loads(line) for line in (run / "armor" / "metrics.jsonl").read_text().splitlines()]
    assert any(key.startswith("armor/") for row in rows for key in row)
    # the same command again: stage 1 is not replayed, stage 2 resumes from its last checkpoint (here: done)
    again = run_after_collapse(cfg)
    assert "stage1" not in again and again["stage2"]["steps"] == 2
