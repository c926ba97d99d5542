"""The statistics of a lab report: means with t intervals, paired differences, minimum detectable effects, labels.

Seeds are the unit of replication: each run (arm, seed) gives one endpoint value, and two arms run with the same
seed share their prompt order and sampling seeds, so differences are paired by seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats

POWER = 0.8  # the conventional power of a minimum detectable effect
ALPHA = 0.05


@dataclass(frozen=True)
class Interval:
    """A mean with its two-sided 95% t interval over ``n`` values (``sd`` the sample standard deviation)."""

    n: int
    mean: float
    sd: float
    low: float
    high: float

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


def mean_ci(values: list[float], alpha: float = ALPHA) -> Interval:
    """Mean and ``1 - alpha`` t interval; with one value the interval is unbounded (NaN sd, infinite ends)."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_ci of no values")
    mean = math.fsum(values) / n
    if n == 1:
        return Interval(1, mean, math.nan, -math.inf, math.inf)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = stats.t.ppf(1 - alpha / 2, n - 1) * sd / math.sqrt(n)
    return Interval(n, mean, sd, mean - half, mean + half)


def paired_difference(arm: dict[int, float], baseline: dict[int, float]) -> Interval:
    """Mean and interval of ``arm[seed] - baseline[seed]`` over the seeds both have.

    Raises:
        ValueError: no seed in common.
    """
    seeds = sorted(set(arm) & set(baseline))
    if not seeds:
        raise ValueError("no seed in common between the arm and its baseline")
    return mean_ci([arm[s] - baseline[s] for s in seeds])


def mde(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest true mean difference a two-sided paired t test at ``alpha`` detects with ``power``:
    ``(t_{1-alpha/2, n-1} + t_{power, n-1}) * sd / sqrt(n)`` (NaN below two seeds)."""
    if n < 2 or math.isnan(sd):
        return math.nan
    return (stats.t.ppf(1 - alpha / 2, n - 1) + stats.t.ppf(power, n - 1)) * sd / math.sqrt(n)


def evaluation_floor_mde(p: float, samples: int, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The MDE of a paired comparison when the only noise is the evaluation's own: each run's accuracy is a
    binomial proportion over ``samples`` answers, so a difference of two runs has variance ``2 p (1 - p) / samples``.
    A lower bound on :func:`mde` (seeds add training noise on top); uses normal quantiles."""
    if samples < 1 or n < 1:
        return math.nan
    sd = math.sqrt(2 * p * (1 - p) / samples)
    return (stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)) * sd / math.sqrt(n)


EFFECT = "effect detected"
NO_PAPER_EFFECT = "no effect of the paper's size"
INCONCLUSIVE = "inconclusive"


def label(diff: Interval, paper_effect: float | None) -> str:
    """``effect detected`` when the 95% interval of the difference excludes 0; ``no effect of the paper's size``
    when it lies inside ``(-paper_effect, paper_effect)``; otherwise ``inconclusive``."""
    if diff.low > 0 or diff.high < 0:
        return EFFECT
    if paper_effect is not None and -paper_effect < diff.low and diff.high < paper_effect:
        return NO_PAPER_EFFECT
    return INCONCLUSIVE
