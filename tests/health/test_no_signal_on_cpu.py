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
