"""A run ends early without losing work: a signal finishes the step and saves, a clock saves often, and updates
that stay non-finite stop the run with finite weights."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

from tests.trainer.helpers import tiny_config
from tether.algos import LossOutput
from tether.errors import TrainingStopped
from tether.models import tiny_model
from tether.trainer import Trainer


def make_trainer(cfg):
    model, tok = tiny_model(seed=0)
    return Trainer(cfg, policy=model, tokenizer=tok)


def params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_sigterm_finishes_the_step_saves_it_and_resumes_from_it(tmp_path):
    trainer = make_trainer(tiny_config(tmp_path, "train.steps=5", "train.save_every_s=0"))
    step = trainer.train_step

    def step_then_signal():
        metrics = step()
        if trainer.step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return metrics

    trainer.train_step = step_then_signal
    before = signal.getsignal(signal.SIGTERM)  # SIG_DFL, or Ray's handler when a Ray test ran first
    with pytest.raises(TrainingStopped, match=r"stopped by SIGTERM after step 2, saved in .*step_000002") as stop:
        trainer.fit()
    assert stop.value.exit_code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before  # the loop's handler is gone, the previous one is back
    assert make_trainer(tiny_config(tmp_path, "train.steps=5")).step == 2


def test_the_clock_saves_between_scheduled_saves(tmp_path):
    make_trainer(tiny_config(tmp_path, "train.steps=3", "train.keep_last=5", "train.save_every_s=1e-9")).fit()
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step_*"))
    assert names == ["step_000001", "step_000002", "step_000003"]


def test_the_default_saves_only_at_the_end_of_a_short_run(tmp_path):
    make_trainer(tiny_config(tmp_path, "train.steps=2")).fit()
    assert [p.name for p in (tmp_path / "run" / "checkpoints").glob("step_*")] == ["step_000002"]


def test_non_finite_updates_are_skipped_counted_and_stop_the_run(tmp_path):
    trainer = make_trainer(tiny_config(tmp_path, "train.steps=5", "train.max_skipped_updates=2"))
    before = params(trainer.policy).clone()
    loss_fn = trainer.policy_loss_fn

    def nan_loss(inputs, **kwargs):
        out = loss_fn(inputs, **kwargs)
        return LossOutput(loss=out.loss * float("nan"), metrics=out.metrics)

    trainer.policy_loss_fn = nan_loss
    metrics = trainer.train_step()
    assert metrics["actor/skipped_updates"] == 1
    assert torch.equal(params(trainer.policy), before)  # no optimiser step on a NaN gradient
    with pytest.raises(TrainingStopped, match=r"2 optimiser steps in a row had a non-finite loss or gradient "
                                              r"\(train\.max_skipped_updates=2\)") as stop:
        trainer.fit()
    assert stop.value.exit_code == 4
    assert torch.equal(params(trainer.policy), before)
    assert not list((tmp_path / "run" / "checkpoints").glob("step_*"))  # nothing non-finite was saved
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["actor/skipped_updates"] == 1


def test_a_finite_update_resets_the_run_of_skips(tmp_path):
    trainer = make_trainer(tiny_config(tmp_path, "train.steps=4", "train.max_skipped_updates=2"))
    loss_fn = trainer.policy_loss_fn

    def nan_every_other_step(inputs, **kwargs):
        out = loss_fn(inputs, **kwargs)
        return LossOutput(loss=out.loss * (float("nan") if trainer.step % 2 else 1.0), metrics=out.metrics)

    trainer.policy_loss_fn = nan_every_other_step
    assert trainer.fit()["actor/skipped_updates"] == 2


def test_non_finite_rewards_are_faults_and_the_step_still_learns(tmp_path):
    from tether.rollout.single_turn import replace_nonfinite
    from tether.tasks import Score

    nan, inf = float("nan"), float("inf")
    rewards, bad = replace_nonfinite(torch.tensor([1.0, nan, 0.5, inf, -inf, nan]), torch.tensor([0, 0, 0, 1, 1, 2]))
    assert rewards.tolist() == [1.0, 0.5, 0.5, 0.0, 0.0, 0.0] and bad.tolist() == [0, 1, 0, 1, 1, 1]

    trainer = make_trainer(tiny_config(tmp_path))
    calls = []

    def every_third_is_nan(item, text):
        calls.append(1)
        return Score(reward=nan if len(calls) % 3 == 0 else float(len(calls) % 2), correct=True, extracted=None)

    trainer.collector.task.score = every_third_is_nan
    before = params(trainer.policy).clone()
    with pytest.warns(UserWarning, match="non-finite rewards; each is counted in reward/faults"):
        metrics = trainer.train_step()
    assert metrics["reward/faults"] == 2  # rows 3 and 6 of 8 scored NaN
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    assert metrics["actor/skipped_updates"] == 0 and not torch.equal(params(trainer.policy), before)
