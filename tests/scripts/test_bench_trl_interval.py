"""benchmarks/bench_trl.py's interval of the speed ratio, against the bootstrap distribution enumerated exactly."""

from __future__ import annotations

import itertools
import statistics

import pytest

from benchmarks.bench_trl import ratio_interval


def steps(seconds):
    return [{"step_s": s} for s in seconds]


def test_two_steps_span_the_exact_bootstrap_distribution():
    # two timed steps (after one warm-up) have four equally likely paired resamples; the 2.5th and 97.5th
    # percentiles of 10,000 draws are then the least and greatest of their ratios
    trl, tether = [99.0, 30.0, 40.0], [99.0, 10.0, 8.0]
    ratios = [statistics.median(trl[1 + i] for i in pick) / statistics.median(tether[1 + i] for i in pick)
              for pick in itertools.product(range(2), repeat=2)]
    lo, hi = ratio_interval(steps(trl), steps(tether), warmup=1)
    assert (lo, hi) == pytest.approx((min(ratios), max(ratios)))
    assert lo < 35.0 / 9.0 < hi  # the point estimate (ratio of medians) lies inside


def test_a_constant_ratio_has_no_width():
    tether = [5.0, 7.0, 9.0, 6.0]
    assert ratio_interval(steps([3 * s for s in tether]), steps(tether), warmup=0) == pytest.approx((3.0, 3.0))
