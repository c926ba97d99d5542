"""Lab statistics against direct computations (tether/lab/stats.py)."""

from __future__ import annotations

import math

import pytest

from tether.lab import stats

T_975_DF4 = 2.7764451051977987  # Student t, 97.5% quantile, 4 degrees of freedom (tables)
T_80_DF4 = 0.9409645470242280
Z_975, Z_80 = 1.959963984540054, 0.8416212335729143


def test_mean_ci_matches_the_textbook_formula():
    values = [0.10, 0.20, 0.15, 0.30, 0.25]
    ci = stats.mean_ci(values)
    mean = sum(values) / 5
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / 4)
    assert ci.mean == pytest.approx(mean) and ci.sd == pytest.approx(sd)
    assert ci.low == pytest.approx(mean - T_975_DF4 * sd / math.sqrt(5))
    assert ci.high == pytest.approx(mean + T_975_DF4 * sd / math.sqrt(5))
    assert ci.half_width == pytest.approx(T_975_DF4 * sd / math.sqrt(5))


def test_one_value_has_an_unbounded_interval_and_none_is_an_error():
    ci = stats.mean_ci([0.4])
    assert ci.mean == 0.4 and math.isinf(ci.low) and math.isinf(ci.high)
    with pytest.raises(ValueError):
        stats.mean_ci([])


def test_paired_difference_uses_only_common_seeds():
    arm = {0: 0.5, 1: 0.6, 2: 0.7, 9: 5.0}
    base = {0: 0.4, 1: 0.4, 2: 0.4, 3: 9.0}
    diff = stats.paired_difference(arm, base)
    assert diff.n == 3 and diff.mean == pytest.approx((0.1 + 0.2 + 0.3) / 3)
    with pytest.raises(ValueError, match="no seed in common"):
        stats.paired_difference({0: 1.0}, {1: 1.0})


def test_mde_matches_its_formula():
    assert stats.mde(0.05, 5) == pytest.approx((T_975_DF4 + T_80_DF4) * 0.05 / math.sqrt(5))
    assert math.isnan(stats.mde(0.05, 1))
    floor = stats.evaluation_floor_mde(0.5, 2048, 5)
    assert floor == pytest.approx((Z_975 + Z_80) * math.sqrt(2 * 0.25 / 2048) / math.sqrt(5))


@pytest.mark.parametrize(("low", "high", "paper", "want"), [
    (0.01, 0.05, 0.1, stats.EFFECT),
    (-0.05, -0.01, 0.1, stats.EFFECT),
    (-0.02, 0.03, 0.05, stats.NO_PAPER_EFFECT),
    (-0.02, 0.08, 0.05, stats.INCONCLUSIVE),
    (-0.02, 0.03, None, stats.INCONCLUSIVE),
])
def test_labels(low, high, paper, want):
    diff = stats.Interval(n=5, mean=(low + high) / 2, sd=0.1, low=low, high=high)
    assert stats.label(diff, paper) == want
