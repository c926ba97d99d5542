"""The statistics of a lab report: means with t intervals, paired differences, minimum detectable effects, p-values
with Holm's correction over a protocol's comparisons, and labels with a sign.

Seeds are the unit of replication: each run (arm, seed) gives one endpoint value, and two arms run with the same
seed share their prompt order and sampling seeds, so differences are paired by seed.

Paired differences that are all equal have no sample spread: the t statistic is infinite (or 0/0), so the t test's
p-value is 0 (scipy agrees) and the interval has zero width, yet equal differences over a few seeds say nothing
about the seed-to-seed spread. Such a comparison is *spread not estimable*: no p-value, no interval, no MDE, and no
better/worse/no-effect label (:func:`paired_difference`, :func:`label`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import integrate, optimize, stats

POWER = 0.8  # the conventional power of a minimum detectable effect
ALPHA = 0.05
# A spread of the paired differences at most this fraction of the largest value they come from is float rounding,
# not seed-to-seed variation: 0.7 - 0.6 and 0.2 - 0.1 differ in the last bit, so three "equal" differences of 0.1
# had a spread of 2e-17 and p = 1e-32. Rounding leaves ~1e-16 of the values; an evaluation mean over fewer than a
# million answers moves in steps of at least 1e-6, far above this floor.
SPREAD_FLOOR = 1e-9


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


def unpaired_seeds(arm: dict[int, float], baseline: dict[int, float]) -> tuple[list[int], list[int]]:
    """The seeds only the arm has and those only the baseline has: left out of the paired difference."""
    return sorted(set(arm) - set(baseline)), sorted(set(baseline) - set(arm))


def paired_difference(arm: dict[int, float], baseline: dict[int, float]) -> Interval:
    """Mean and interval of ``arm[seed] - baseline[seed]`` over the seeds both have (:func:`unpaired_seeds` names
    the others). Two or more differences equal up to float rounding (:data:`SPREAD_FLOOR`) have ``sd`` 0 and NaN
    ends: the spread, and so the interval, is not estimable (:func:`spread_not_estimable`).

    Raises:
        ValueError: no seed in common.
    """
    seeds = sorted(set(arm) & set(baseline))
    if not seeds:
        raise ValueError("no seed in common between the arm and its baseline")
    diff = mean_ci([arm[s] - baseline[s] for s in seeds])
    scale = max(abs(v) for s in seeds for v in (arm[s], baseline[s]))
    if diff.n >= 2 and diff.sd <= SPREAD_FLOOR * scale:
        return Interval(diff.n, diff.mean, 0.0, math.nan, math.nan)
    return diff


def spread_not_estimable(diff: Interval) -> bool:
    """Two or more paired differences with no spread (:func:`paired_difference`): nothing to test them against."""
    return diff.n >= 2 and diff.sd == 0


def mde(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest true mean difference a two-sided paired t test at ``alpha`` detects with ``power``, for differences
    of standard deviation ``sd`` over ``n`` seeds (NaN below two seeds): ``lambda * sd / sqrt(n)``, where the
    noncentrality ``lambda`` gives the test that power exactly (:func:`t_test_power`). The textbook shortcut
    ``(t_{1-alpha/2} + t_{power}) * sd / sqrt(n)`` leaves out the far tail and the noncentral t's extra spread: it
    is 14% too small with 2 seeds (power 0.73, not 0.8) and 5% with 3; from about 16 seeds the two agree. NaN
    with no spread: an MDE of 0 would claim any effect is detectable."""
    if n < 2 or math.isnan(sd) or sd == 0:
        return math.nan
    df = n - 1
    shortcut = stats.t.ppf(1 - alpha / 2, df) + stats.t.ppf(power, df)  # within a few % of the answer
    lam = optimize.brentq(lambda x: t_test_power(x, df, alpha) - power, shortcut / 2, 2 * shortcut, xtol=1e-12)
    return lam * sd / math.sqrt(n)


def seeds_for(sd: float, delta: float, alpha: float = ALPHA, power: float = POWER) -> int:
    """The fewest seeds (at least 2) whose :func:`mde` at spread ``sd`` is at most ``delta``. The normal
    approximation ``((z_{1-alpha/2} + z_{power}) sd / delta)^2`` is a lower bound (the t test needs more), so the
    search starts there.

    Raises:
        ValueError: ``delta`` or ``sd`` is not positive (no number of seeds reaches it, or there is no spread).
    """
    if delta <= 0:
        raise ValueError(f"a test size of {delta} cannot be reached by any number of seeds")
    if not sd > 0:
        raise ValueError(f"a spread of {sd} gives no minimum detectable effect")
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)
    n = max(2, math.ceil((z * sd / delta) ** 2))
    while mde(sd, n, alpha, power) > delta:
        n += 1
    return n


def t_test_power(noncentrality: float, df: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided t test at ``alpha`` with ``df`` degrees of freedom under a noncentral t statistic:
    ``P(|Z + lambda| > t_crit * sqrt(V / df))``, ``V`` chi-squared with ``df``, integrated over ``V`` (scipy's
    ``nct`` returns NaN at one degree of freedom beyond a noncentrality of ~12, where 2 seeds need ~16)."""
    crit = stats.t.ppf(1 - alpha / 2, df)
    log_norm = (df / 2) * math.log(2) + math.lgamma(df / 2)

    def given(v: float) -> float:
        if v <= 0:
            return 0.0
        density = math.exp((df / 2 - 1) * math.log(v) - v / 2 - log_norm)
        s = crit * math.sqrt(v / df)
        # P(Z < -s - lambda) + P(Z > s - lambda), each through erfc to keep the far tail's digits
        low_tail = math.erfc((s + noncentrality) / math.sqrt(2))
        high_tail = math.erfc((s - noncentrality) / math.sqrt(2))
        return density * 0.5 * (low_tail + high_tail)

    # split at the chi-squared mode: over [0, inf) in one piece quad missed its narrow peak from ~190 degrees of
    # freedom on (power 2e-14 at df 199 for a test whose power is 0.80, so mde() raised)
    mode = max(df - 2, 0)
    return integrate.quad(given, 0, mode, limit=200)[0] + integrate.quad(given, mode, math.inf, limit=200)[0]


def paired_p_value(diff: Interval) -> float:
    """Two-sided p-value of the paired t test that the mean difference is 0: NaN below two seeds and with no spread
    (:func:`spread_not_estimable`; the t test's own answer there, p = 0 for equal nonzero differences, rests on a
    spread of 0 that a few seeds cannot show). Holm counts a NaN as 1."""
    if diff.n < 2 or math.isnan(diff.sd) or spread_not_estimable(diff):
        return math.nan
    t = diff.mean / (diff.sd / math.sqrt(diff.n))
    return float(2 * stats.t.sf(abs(t), diff.n - 1))


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values, in the given order: the i-th smallest p (from 1) is
    multiplied by ``m - i + 1``, the products are made non-decreasing in that order and capped at 1. A NaN (a
    comparison that could not be computed) counts as 1, so it still counts in the family."""
    m = len(p_values)
    filled = [1.0 if math.isnan(p) else p for p in p_values]
    order = sorted(range(m), key=lambda i: filled[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * filled[i]))
        adjusted[i] = running
    return adjusted


BETTER = "better"
WORSE = "worse"
NO_EFFECT = "no effect of size delta"
INCONCLUSIVE = "inconclusive"
NOT_TESTABLE = "not testable in this setting"
SPREAD_NOT_ESTIMABLE = "spread not estimable"


def equivalence_interval(diff: Interval, family: int, alpha: float = ALPHA) -> tuple[float, float]:
    """The ``1 - alpha / family`` t interval of the mean difference: Bonferroni's adjustment of the 95% interval
    over the ``family`` comparisons Holm corrects. "No effect of size delta" holds when it lies inside ``+-delta``
    (two one-sided tests, each at ``alpha / (2 family)``), so the chance of calling any true effect of size delta
    "no effect" stays within the family's rate, as Holm keeps that of a false better/worse; the unadjusted 95%
    interval let each comparison of a family make that error at the full rate. Infinite ends below two seeds; NaN
    ends when the spread is not estimable (:func:`spread_not_estimable`), as the 95% interval's."""
    if diff.n < 2 or math.isnan(diff.sd):
        return -math.inf, math.inf
    if spread_not_estimable(diff):
        return math.nan, math.nan
    half = stats.t.ppf(1 - alpha / (2 * family), diff.n - 1) * diff.sd / math.sqrt(diff.n)
    return diff.mean - half, diff.mean + half


def label(diff: Interval, p_adjusted: float, delta: float, family: int, alpha: float = ALPHA) -> str:
    """``spread not estimable`` when the paired differences are all equal (:func:`spread_not_estimable`);
    ``better``/``worse`` when the Holm-adjusted p-value (over ``family`` comparisons) is below ``alpha`` (the sign
    of the mean difference gives which); ``no effect of size delta`` when the whole Bonferroni-adjusted interval
    (:func:`equivalence_interval`) lies inside ``(-delta, delta)``; otherwise ``inconclusive``."""
    if spread_not_estimable(diff):
        return SPREAD_NOT_ESTIMABLE
    if p_adjusted < alpha:
        return BETTER if diff.mean > 0 else WORSE
    low, high = equivalence_interval(diff, family, alpha)
    if -delta < low and high < delta:
        return NO_EFFECT
    return INCONCLUSIVE
