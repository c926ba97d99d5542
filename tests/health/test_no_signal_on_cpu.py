"""No-signal stop: ``patience`` steps in a row whose mean absolute advantage is 0 (or NaN) stop the run or warn once;
one step with signal starts the count again (tether/health/no_signal.py)."""

from __future__ import annotations

import json
import math
import warnings

import pytest

from tether.config import NoSignalConfig
from tether.health.no_signal import NoSignalCheck

NONE = {"train/advantage_abs_mean": 0.0}
SOME = {"train/advantage_abs_mean": 0.25}


def counts(check: NoSignalCheck, steps: list[dict[str, float]], start: int = 1) -> list[float]:
    return [check.observe(step, m)["health/no_signal_steps"] for step, m in enumerate(steps, start)]


def test_the_count_is_steps_in_a_row_without_signal_and_a_step_with_signal_resets_it():
    check = NoSignalCheck(NoSignalConfig(patience=3))
    nan, missing = {"train/advantage_abs_mean": math.nan}, {"train/reward_mean": 0.5}
    assert counts(check, [NONE, nan, SOME, NONE, missing, SOME, SOME, NONE]) == [1, 2, 0, 1, 2, 0, 0, 1]
    assert check.failure is None  # never 3 in a row
    assert counts(check, [NONE, NONE], start=9) == [2, 3] and check.failure is not None


def test_stop_fires_at_exactly_patience_steps_and_names_them():
    check = NoSignalCheck(NoSignalConfig(patience=3))
    counts(check, [SOME, NONE, NONE], start=4)  # steps 5 and 6 without signal
    assert check.failure is None
    check.observe(7, {**NONE, "reward/faults": 4.0})
    assert check.failure.startswith("nothing trained for 3 steps in a row (steps 5-7): every advantage was 0 "
                                    "(reward/faults=4 so far")
    assert "health.no_signal.patience=3" in check.failure


def test_warn_warns_once_and_off_counts_nothing():
    check = NoSignalCheck(NoSignalConfig(patience=2, action="warn"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        counts(check, [NONE] * 5)
    assert [str(w.message)[:44] for w in caught] == ["nothing trained for 2 steps in a row (steps "]
    assert "every group's rewards were equal" in str(caught[0].message) and check.failure is None
    off = NoSignalCheck(NoSignalConfig(patience=1, action="off"))
    assert off.observe(1, NONE) == {} and off.in_a_row == 0 and off.failure is None


def test_the_count_survives_a_checkpoint():
    check = NoSignalCheck(NoSignalConfig(patience=3))
    counts(check, [SOME, NONE, NONE])
    resumed = NoSignalCheck(NoSignalConfig(patience=3))
    resumed.load_state_dict(json.loads(json.dumps(check.state_dict())))
    assert resumed.observe(4, NONE) == {"health/no_signal_steps": 3.0}
    assert "(steps 2-4)" in resumed.failure
    warned = NoSignalCheck(NoSignalConfig(patience=1, action="warn"))
    with pytest.warns(UserWarning):
        warned.observe(1, NONE)
    again = NoSignalCheck(NoSignalConfig(patience=1, action="warn"))
    again.load_state_dict(warned.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned before the checkpoint: not again after it
        again.observe(2, NONE)


def test_a_run_whose_rollout_correction_drops_every_token_stops(tmp_path, tiny_policy):
    """Advantages that the rollout correction drops on every token reach no gradient: the weights stayed bit for bit
    while train/advantage_abs_mean was 0.375-0.81 and health/no_signal_steps stayed 0, so with parity off the run went
    to its end and exited 0. A bfloat16 engine puts |log pi_old - log mu| near 0.007 on every token (k3 about 2e-5
    per token), so mask_seq_mean with max_kl 1e-9 drops every row."""
    import copy

    import torch

    from tests.trainer.helpers import tiny_config
    from tether.health import HealthError
    from tether.trainer import Trainer

    model, tok = tiny_policy
    cfg = tiny_config(tmp_path, "rollout.dtype=bfloat16", "rollout.correction.mode=mask_seq_mean",
                      "rollout.correction.max_kl=1e-9", "health.parity.enabled=false", "train.steps=4",
                      "health.no_signal.patience=2", "health.degenerate.enabled=false")
    trainer = Trainer(cfg, policy=copy.deepcopy(model), tokenizer=tok)
    before = torch.cat([p.detach().flatten() for p in trainer.policy.parameters()])
    logged = []
    log = trainer.tracker.log
    trainer.tracker.log = lambda metrics, step: (logged.append(dict(metrics)), log(metrics, step))[1]
    with pytest.raises(HealthError, match=r"^nothing trained for 2 steps in a row \(steps 1-2\): the rollout "
                                          r"correction dropped every token \(rollout_corr/masked_frac=1\)"):
        trainer.fit()
    assert trainer.step == 2 and len(logged) == 2
    assert torch.equal(torch.cat([p.detach().flatten() for p in trainer.policy.parameters()]), before)
    for metrics in logged:
        assert metrics["train/advantage_abs_mean"] > 0 and metrics["rollout_corr/masked_frac"] == 1.0
        assert metrics["actor/kept_advantage_abs_mean"] == 0.0


def test_a_correction_that_keeps_some_token_is_signal():
    check = NoSignalCheck(NoSignalConfig(patience=1))
    dropped = {**SOME, "actor/kept_advantage_abs_mean": 0.0}
    assert counts(check, [{**SOME, "actor/kept_advantage_abs_mean": 0.01}, dropped]) == [0, 1]
    assert "the rollout correction dropped every token" in check.failure
