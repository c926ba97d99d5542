"""Issue #43's remainder: global generators seeded and restored, a DAPO refill shortfall as a one-line stop a
resume may fix, a run in which nothing trains stopped, reward faults counted per split."""

from __future__ import annotations

import copy
import math
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.trainer.helpers import tiny_config
from tether.distributed import DataParallel
from tether.errors import EXIT_HEALTH, EXIT_STOPPED, TrainingStopped
from tether.health import HealthError
from tether.seeding import seed_everything
from tether.tasks import Score
from tether.trainer import Trainer
from tether.trainer.checkpoint import CheckpointManager, load_state
from tether.trainer.rundir import prepare_run_dir


def trainer_for(cfg, tiny_policy) -> Trainer:
    policy, tokenizer = tiny_policy
    return Trainer(cfg, policy=policy, tokenizer=tokenizer)


def constant_reward(trainer: Trainer, value: float = 0.0) -> None:
    trainer.collector.task.score = lambda item, text: Score(reward=value, correct=False, extracted="1")


def test_every_global_generator_is_seeded_from_the_run_seed():
    draws = []
    for _ in range(2):
        seed_everything(7)
        draws.append((random.random(), float(np.random.rand()), float(torch.rand(1))))
    assert draws[0] == draws[1]
    seed_everything(8)
    assert random.random() != draws[0][0]


def test_a_trainer_seeds_them_and_a_resume_restores_them(tmp_path, tiny_policy, _tiny_policy_master):
    cfg = tiny_config(tmp_path, "train.steps=1", "seed=5")
    trainer_for(cfg, tiny_policy)
    seeded = random.random()
    seed_everything(5)
    assert seeded == random.random()  # nothing drew from it while the trainer was built
    trainer_for(cfg, (copy.deepcopy(_tiny_policy_master[0]), _tiny_policy_master[1])).fit()
    saved = load_state(Path(cfg.run_dir) / "checkpoints" / "step_000001")["rng"]
    random.seed(123)  # whatever ran in between
    np.random.seed(123)
    trainer_for(tiny_config(tmp_path, "train.steps=2", "seed=5"),
                (copy.deepcopy(_tiny_policy_master[0]), _tiny_policy_master[1]))
    assert random.getstate() == saved["python"]
    restored = np.random.get_state()
    assert restored[0] == saved["numpy"][0] and np.array_equal(restored[1], saved["numpy"][1])


def test_a_refill_shortfall_is_one_line_naming_the_checkpoint_and_a_resume_may_change_the_setting(
        tmp_path, tiny_policy):
    cfg = tiny_config(tmp_path, "rollout.dynamic_sampling=true", "rollout.max_gen_batches=2", "train.steps=3",
                      "train.save_every=1", "health.no_signal.action=off")
    trainer = trainer_for(cfg, tiny_policy)
    varied = [Score(reward=float(i % 2), correct=bool(i % 2), extracted="1") for i in range(4)]

    def score(item, text):  # varied rewards in step 1, then every group equal: nothing survives the filter
        return varied[score.calls % 4] if trainer.step == 0 else Score(reward=0.0, correct=False, extracted=None)

    score.calls = 0

    def counting(item, text):
        score.calls += 1
        return score(item, text)

    trainer.collector.task.score = counting
    with pytest.raises(TrainingStopped) as stop:
        trainer.fit()
    message = str(stop.value)
    assert stop.value.exit_code == EXIT_STOPPED == 4 and "\n" not in message
    assert message.startswith("step 2: only 0 of rollout.prompts_per_step=2 groups survived")
    assert f"the last checkpoint is {Path(cfg.run_dir) / 'checkpoints' / 'step_000001'}" in message
    assert "rollout.partial_batches=true" in message and "rollout.max_gen_batches" in message
    fixed = tiny_config(tmp_path, "rollout.dynamic_sampling=true", "rollout.partial_batches=true", "train.steps=3",
                        "rollout.max_gen_batches=4", "train.save_every=1")
    ckpts = CheckpointManager(Path(cfg.run_dir), cfg.train.keep_last)
    assert prepare_run_dir(fixed, ckpts, DataParallel()).name == "step_000001"  # the change is accepted


def test_a_run_in_which_nothing_trains_stops_with_the_reason(tmp_path, tiny_policy):
    cfg = tiny_config(tmp_path, "train.steps=5", "health.no_signal.patience=2")
    trainer = trainer_for(cfg, tiny_policy)
    constant_reward(trainer, float("nan"))
    with pytest.raises(HealthError) as stop, pytest.warns(UserWarning, match="non-finite rewards"):
        trainer.fit()
    assert stop.value.exit_code == EXIT_HEALTH == 3 and trainer.step == 2
    assert str(stop.value).startswith("nothing trained for 2 steps in a row (steps 1-2): every advantage was 0 "
                                      "(reward/faults=16 so far")
    assert (Path(cfg.run_dir) / "summary.json").is_file()  # finished like any health stop


def test_nothing_trains_can_warn_instead(tmp_path, tiny_policy):
    cfg = tiny_config(tmp_path, "train.steps=2", "health.no_signal.patience=1", "health.no_signal.action=warn")
    trainer = trainer_for(cfg, tiny_policy)
    constant_reward(trainer)
    with pytest.warns(UserWarning, match=r"nothing trained for 1 steps in a row .*every group's rewards were equal"):
        trainer.fit()
    assert trainer.step == 2


def test_reward_faults_are_counted_per_split(tmp_path, tiny_policy):
    cfg = tiny_config(tmp_path, "train.steps=1", "val.every=1")
    trainer = trainer_for(cfg, tiny_policy)
    constant_reward(trainer, float("nan"))
    with pytest.warns(UserWarning, match="non-finite rewards"):
        metrics = trainer.validate()
    rows = len(trainer.collector.task.val) * cfg.val.samples
    assert metrics["val/reward_faults"] == rows and metrics["val/fault_frac"] == 1.0
    assert trainer.collector.reward_faults == 0  # the training count holds training rows only
    with pytest.warns(UserWarning, match="non-finite rewards"):
        _, step_metrics = trainer.collect()
    assert step_metrics["reward/faults"] == 8 and math.isfinite(step_metrics["rollout/accuracy_all"])


def test_a_reward_past_its_limit_faults_its_rows_counted_per_split_and_nothing_trains_stops_the_run(tmp_path,
                                                                                                      tiny_policy):
    cfg = tiny_config(tmp_path, "train.steps=2", "val.samples=1", "task.score=false", "health.no_signal.patience=1",
                      'task.rewards=[{fn: "tests.rewards.user_rewards:sleeps", timeout_s: 0.1}]')
    trainer = trainer_for(cfg, tiny_policy)
    start = time.perf_counter()
    with pytest.warns(UserWarning, match=r"reward function 'sleeps' faulted \(the call timed out after 0\.1s"):
        metrics = trainer.validate()
    rows = len(trainer.collector.task.val)
    assert metrics["val/reward_faults"] == rows and metrics["val/fault_frac"] == 1.0
    assert trainer.collector.reward_faults == 0  # the training count holds training rows only
    with pytest.raises(HealthError, match=r"^nothing trained for 1 steps in a row \(steps 1-1\): every advantage "
                                          r"was 0 \(reward/faults=8 so far"):
        trainer.fit()
    assert trainer.step == 1 and trainer.collector.reward_faults == 8
    assert time.perf_counter() - start < 8.0  # a sleep of 600 s, per batch, without the limit
