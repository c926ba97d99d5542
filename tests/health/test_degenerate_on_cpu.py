"""Collapsed-policy warning: entropy at its maximum or near 0, or a gradient norm of exactly 0, for many steps."""

from __future__ import annotations

import json
import math
import warnings

import pytest

from tests.trainer.helpers import tiny_config
from tether.config import DegenerateConfig
from tether.health import DegenerateCheck
from tether.trainer import Trainer

UNIFORM = math.log(100)  # the largest entropy of a 100-token vocabulary
HEALTHY = {"actor/entropy": 2.0, "actor/grad_norm": 0.5}


def feed(check: DegenerateCheck, steps: list[dict[str, float]], start: int = 1) -> list[str]:
    """The warnings ``steps`` raise, one metrics dict per step; asserts the counted metric is returned each time."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step, metrics in enumerate(steps, start):
            assert set(check.observe(step, metrics)) == {"health/degenerate_steps"}
    return [str(w.message) for w in caught]


@pytest.mark.parametrize("collapsed, symptom", [
    ({"actor/entropy": 0.995 * UNIFORM, "actor/grad_norm": 0.5}, "of its maximum log(vocabulary) = 4.605: it samples "
                                                                 "uniformly"),
    ({"actor/entropy": 1e-4, "actor/grad_norm": 0.5}, "entropy 0.0001 nats per token: it always samples the same"),
    ({"actor/entropy": 2.0, "actor/grad_norm": 0.0}, "gradient norm exactly 0: no update changes the weights"),
])
def test_patience_collapsed_steps_in_a_row_warn_once_and_are_counted(collapsed, symptom):
    check = DegenerateCheck(DegenerateConfig(patience=3), vocab_size=100)
    assert feed(check, [HEALTHY, collapsed, collapsed]) == []  # two in a row: not yet
    lines = feed(check, [collapsed, collapsed, collapsed], start=4)
    assert len(lines) == 1 and "\n" not in lines[0]
    assert lines[0].startswith("step 4: the policy looks collapsed for 3 steps in a row (health.degenerate.patience=3)")
    assert symptom in lines[0]
    assert check.observe(7, HEALTHY) == {"health/degenerate_steps": 5.0}  # counted since the start, healthy or not
    assert len(feed(check, [collapsed] * 3, start=8)) == 1  # a new run of collapsed steps warns again


def test_healthy_steps_in_between_and_a_random_model_starting_uniform_do_not_warn():
    check = DegenerateCheck(DegenerateConfig(patience=2), vocab_size=100)
    zero_grad = {"actor/entropy": 2.0, "actor/grad_norm": 0.0}
    assert feed(check, [zero_grad, HEALTHY, zero_grad, HEALTHY, zero_grad]) == []
    fresh = DegenerateCheck(DegenerateConfig(patience=2), vocab_size=100)  # random weights sample near uniformly
    assert feed(fresh, [{"actor/entropy": 0.999 * UNIFORM, "actor/grad_norm": 0.3}] * 4) == []
    assert feed(fresh, [{"actor/entropy": float("nan"), "actor/grad_norm": float("nan")}] * 4) == []  # skipped updates
    off = DegenerateCheck(DegenerateConfig(enabled=False, patience=1), vocab_size=100)
    assert off.observe(1, zero_grad) == {}


def test_the_count_survives_a_checkpoint():
    check = DegenerateCheck(DegenerateConfig(patience=3), vocab_size=100)
    feed(check, [HEALTHY, {"actor/entropy": 2.0, "actor/grad_norm": 0.0}, {"actor/grad_norm": 0.0}])
    resumed = DegenerateCheck(DegenerateConfig(patience=3), vocab_size=100)
    resumed.load_state_dict(json.loads(json.dumps(check.state_dict())))
    assert len(feed(resumed, [{"actor/grad_norm": 0.0}], start=4)) == 1  # the third in a row, across the resume


def test_a_learning_rate_that_collapses_the_policy_warns_during_training(tmp_path, tiny_policy):
    # issue #22: optim.lr=1e3 makes the gradient exactly 0 from step 2 and the policy uniform from step 3
    cfg = tiny_config(tmp_path, "optim.lr=1000.0", "train.steps=4", "health.degenerate.patience=2")
    with pytest.warns(UserWarning, match=r"^step 3: the policy looks collapsed for 2 steps in a row") as caught:
        Trainer(cfg, policy=tiny_policy[0], tokenizer=tiny_policy[1]).fit()
    assert len([w for w in caught if "looks collapsed" in str(w.message)]) == 1
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["health/degenerate_steps"] for r in rows if "health/degenerate_steps" in r] == [0.0, 1.0, 2.0, 3.0]


def test_both_entropy_thresholds_are_inclusive():
    """Uniform: entropy *at least* max_entropy_frac x log(V); deterministic: *at most* min_entropy (the same
    float expressions as the check's, so each boundary is hit exactly)."""
    cfg = DegenerateConfig(patience=1, max_entropy_frac=0.99, min_entropy=1e-3)
    check = DegenerateCheck(cfg, vocab_size=100)
    assert check.symptom(2.0, 0.5) is None  # below the maximum first: uniform afterwards is a collapse
    assert "samples uniformly" in check.symptom(0.99 * math.log(100), 0.5)
    assert check.symptom(math.nextafter(0.99 * math.log(100), 0.0), 0.5) is None
    assert "always samples the same tokens" in check.symptom(1e-3, 0.5)
    assert check.symptom(math.nextafter(1e-3, 1.0), 0.5) is None
