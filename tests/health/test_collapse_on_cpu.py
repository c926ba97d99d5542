"""Over-optimisation guard: validation below its peak while training reward rises."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from tests.trainer.helpers import tiny_config
from tether.config import CollapseConfig
from tether.health import CollapseGuard, HealthError
from tether.trainer import Trainer

METRIC = "val/avg@k"


def run(guard: CollapseGuard, steps: list[tuple[list[float], float]]) -> list[dict[str, float]]:
    """Each entry: the training rewards of the steps before a validation, then that validation's value."""
    out, step = [], 0
    for rewards, value in steps:
        for r in rewards:
            guard.observe_train(r)
            step += 1
        out.append(guard.observe_val(step, {METRIC: value}))
    return out


def guard(**settings) -> CollapseGuard:
    return CollapseGuard(CollapseConfig(**settings), METRIC, Path("run/checkpoints/best"))


def test_a_collapse_while_training_reward_rises_warns_once_naming_the_peak():
    g = guard(drop=0.1, patience=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metrics = run(g, [([], 0.3), ([0.1, 0.2], 0.5), ([0.3], 0.35)])  # peak at step 2, one drop
    assert metrics[-1] == {"health/val_peak": 0.5, "health/val_below_peak": pytest.approx(0.15),
                           "health/val_drops": 1.0}
    with pytest.warns(UserWarning) as caught:
        run(g, [([0.4, 0.5], 0.3), ([0.6], 0.2)])
    assert len(caught) == 1  # not again on the next validation
    message = str(caught[0].message)
    assert "peaked at 0.5 at step 2" in message and "rose from 0.15 to 0.45" in message
    assert "run/checkpoints/best" in message


def test_no_collapse_when_the_training_reward_falls_too_or_the_drop_is_small():
    g = guard(drop=0.1, patience=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run(g, [([0.5], 0.5), ([0.3], 0.2)])  # both fall: learning went wrong, not over-optimisation
        run(g, [([0.9], 0.45)])  # reward rose, but validation is within drop of the peak
    assert g.below == 0 and g.failure is None


def test_the_peak_is_one_checkpoints_best_can_hold():
    # with train.best_from_step=1 (the lab's, for an endpoint at best) the step-0 validation is never saved as
    # checkpoints/best: a fall from it named it as the peak "in checkpoints/best", which held a later step
    g = CollapseGuard(CollapseConfig(drop=0.1, patience=2), METRIC, Path("run/checkpoints/best"), from_step=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metrics = run(g, [([], 0.6), ([0.1], 0.4), ([0.2], 0.35)])  # within drop of the step-1 peak
    assert metrics[0] == {} and (g.peak, g.peak_step) == (0.4, 1) and g.below == 0
    with pytest.warns(UserWarning, match=r"peaked at 0\.4 at step 1 "):
        run(g, [([0.3], 0.2), ([0.4], 0.1)])
    assert guard(drop=0.1).peak_step == 0 and guard(drop=0.1).from_step == 0  # the default keeps step 0


def test_a_new_peak_resets_the_count_and_the_baseline():
    g = guard(drop=0.0, patience=2)
    run(g, [([0.1], 0.5), ([0.2], 0.4), ([0.3], 0.6)])
    assert (g.peak, g.peak_step, g.peak_reward, g.below) == (0.6, 3, 0.3, 0)


def test_stop_fails_the_run_and_the_state_survives_a_checkpoint():
    g = guard(drop=0.0, patience=1, action="stop")
    run(g, [([0.1], 0.5)])
    restored = guard(drop=0.0, patience=1, action="stop")
    restored.load_state_dict(g.state_dict())
    run(restored, [([0.2], 0.4)])
    assert restored.failure is not None and "peaked at 0.5 at step 1" in restored.failure


def test_the_trainer_stops_at_the_validation_that_completes_a_collapse(tmp_path, tiny_policy, monkeypatch):
    model, tok = tiny_policy
    trainer = Trainer(tiny_config(tmp_path, "health.collapse.action=stop", "health.collapse.patience=1"),
                      policy=model, tokenizer=tok)
    values = iter([0.5, 0.2])
    monkeypatch.setattr(trainer.collector, "validate", lambda engine, seed: {METRIC: next(values)})
    trainer.health.collapse.observe_train(0.1)
    assert trainer.validate()["health/val_peak"] == 0.5
    trainer.health.collapse.observe_train(0.9)
    with pytest.raises(HealthError, match="over-optimisation"):
        trainer.validate()
    assert "health/val_below_peak" in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1]


def test_the_guards_comparisons_are_strict_and_a_tie_keeps_the_earlier_peak():
    """More than ``drop`` below the peak, a mean reward *above* the peak's, and a validation equal to the peak is
    not a new one (checkpoints/best keeps the earliest of tied validations). Values exact in binary."""
    g = guard(drop=0.25, patience=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metrics = run(g, [([0.5], 0.75),  # step 1: the peak, mean reward 0.5 before it
                          ([0.25, 0.75], 0.5),  # step 3: exactly drop below, and the reward is the peak's
                          ([0.25, 0.75], 0.25),  # step 5: more than drop below, the reward still the peak's
                          ([0.625], 0.75)])  # step 6: a tie with the peak
    assert [m["health/val_drops"] for m in metrics] == [0.0, 0.0, 1.0, 0.0] and g.failure is None
    assert (g.peak, g.peak_step, g.peak_reward) == (0.75, 1, 0.5)
    with pytest.warns(UserWarning, match=r"peaked at 0.75 at step 1 .* rose from 0.5 to 0.5625"):
        run(g, [([0.5625], 0.25)])
