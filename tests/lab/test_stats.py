"""Lab statistics against direct computations (tether/lab/stats.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate as scipy_integrate
from scipy import stats as scipy_stats

from tether.lab import stats

T_975_DF4 = 2.7764451051977987  # Student t, 97.5% quantile, 4 degrees of freedom (tables)


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


def power_by_scipy(noncentrality, df):
    """The two-sided t test's power at 5%: scipy's noncentral t, or (where it gives NaN, one degree of freedom) the
    same probability integrated with scipy's chi-squared and normal distributions."""
    crit = scipy_stats.t.ppf(0.975, df)
    power = scipy_stats.nct.sf(crit, df, noncentrality) + scipy_stats.nct.cdf(-crit, df, noncentrality)
    if not math.isnan(power):
        return power

    def given(v):
        s = crit * math.sqrt(v / df)
        return scipy_stats.chi2.pdf(v, df) * (scipy_stats.norm.cdf(-s - noncentrality)
                                              + scipy_stats.norm.sf(s - noncentrality))

    return scipy_integrate.quad(given, 0, math.inf, limit=200)[0]


@pytest.mark.parametrize("n", [2, 3, 5, 16])
def test_the_mde_is_the_difference_detected_with_80_percent_power(n):
    """The paired t test on differences whose true mean is the MDE rejects with probability 0.8, exactly: for 2
    and 3 seeds the textbook shortcut (t_0.975 + t_0.8) s / sqrt(n) is 14% and 5% smaller (power 0.73, 0.77)."""
    sd = 0.05
    noncentrality = stats.mde(sd, n) * math.sqrt(n) / sd
    assert power_by_scipy(noncentrality, n - 1) == pytest.approx(0.8, abs=1e-6)
    shortcut = scipy_stats.t.ppf(0.975, n - 1) + scipy_stats.t.ppf(0.8, n - 1)
    if n <= 3:
        assert power_by_scipy(shortcut, n - 1) < 0.78
    # a simulation of the test itself agrees (standard error of the rate 0.0013)
    rng = np.random.default_rng(0)
    d = rng.normal(stats.mde(sd, n), sd, size=(100_000, n))
    t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(n))
    assert np.mean(np.abs(t) > scipy_stats.t.ppf(0.975, n - 1)) == pytest.approx(0.8, abs=0.006)


@pytest.mark.parametrize("n", [200, 1000])
def test_the_mde_of_many_seeds_is_still_the_difference_detected_with_80_percent_power(n):
    """Integrated over [0, inf) in one piece, the chi-squared's narrow peak was missed from ~190 degrees of freedom:
    power 2e-14 at 199 where scipy's noncentral t gives 0.80, and mde() raised (no sign change to bracket)."""
    assert stats.t_test_power(2.8, n - 1) == pytest.approx(power_by_scipy(2.8, n - 1), abs=1e-8)
    noncentrality = stats.mde(0.05, n) * math.sqrt(n) / 0.05
    assert power_by_scipy(noncentrality, n - 1) == pytest.approx(0.8, abs=1e-6)


@pytest.mark.parametrize(("sd", "delta"), [(0.05, 0.1), (0.0696, 0.05), (0.1508, 0.03)])
def test_seeds_for_is_the_fewest_whose_mde_reaches_delta(sd, delta):
    """The fewest seeds at which the paired t test detects ``delta`` with power 0.8 (scipy's noncentral t); the
    last is armor_smollm2's spread and test size (~200 seeds)."""
    n = stats.seeds_for(sd, delta)
    assert power_by_scipy(delta * math.sqrt(n) / sd, n - 1) >= 0.8 > power_by_scipy(
        delta * math.sqrt(n - 1) / sd, n - 2)
    assert stats.mde(sd, n) <= delta < stats.mde(sd, n - 1)
    with pytest.raises(ValueError, match="cannot be reached"):
        stats.seeds_for(sd, 0.0)


def test_the_mde_needs_two_seeds():
    assert math.isnan(stats.mde(0.05, 1)) and math.isnan(stats.mde(math.nan, 5))
    assert stats.mde(0.1, 5) == pytest.approx(2 * stats.mde(0.05, 5), rel=1e-9)  # linear in the spread


def test_paired_p_value_is_the_two_sided_t_test():
    diff = stats.mean_ci([0.01, 0.03, 0.02, 0.05, 0.04])
    t = diff.mean / (diff.sd / math.sqrt(5))
    p = stats.paired_p_value(diff)
    assert p == pytest.approx(2 * (1 - stats.stats.t.cdf(t, 4)))
    # p < 0.05 exactly when the 95% interval excludes 0: the interval's low end at p = 0.05 is 0
    assert (p < 0.05) == (diff.low > 0)
    assert math.isnan(stats.paired_p_value(stats.mean_ci([0.1])))
    # equal differences: no spread to test against (spread not estimable), whatever their mean
    assert math.isnan(stats.paired_p_value(stats.mean_ci([0.0, 0.0, 0.0])))
    assert math.isnan(stats.paired_p_value(stats.mean_ci([0.25, 0.25, 0.25])))


@pytest.mark.parametrize(("arm", "base"), [
    ({0: 0.5, 1: 0.6}, {0: 0.4, 1: 0.5}),                  # 2 seeds, +0.1 each: scipy's t test gives p = 0
    ({0: 0.7, 1: 0.3, 2: 0.2}, {0: 0.6, 1: 0.2, 2: 0.1}),  # +0.1 each but for the last bit: sd 2e-17, p 1e-32
    ({0: 0.4, 1: 0.4, 2: 0.4}, {0: 0.4, 1: 0.4, 2: 0.4}),  # identical arms: was p = 1 and "no effect"
])
def test_equal_paired_differences_get_no_p_value_interval_or_label(arm, base):
    """A t test on differences with no spread rests on a spread of 0 that a few seeds cannot show: scipy's paired
    test reads them as certain (p ~ 0) or as nothing (NaN), and the lab labelled them better or no effect."""
    seeds = sorted(arm)
    direct = [arm[s] - base[s] for s in seeds]
    diff = stats.paired_difference(arm, base)
    assert diff.n == len(seeds) and diff.mean == pytest.approx(sum(direct) / len(direct), abs=1e-15)
    assert diff.sd == 0 and math.isnan(diff.low) and math.isnan(diff.high)
    assert math.isnan(stats.paired_p_value(diff)) and math.isnan(stats.mde(diff.sd, diff.n))
    assert all(math.isnan(end) for end in stats.equivalence_interval(diff, 2))  # no zero-width [mean, mean]
    assert stats.spread_not_estimable(diff)
    # Holm counts the missing p as 1, and no p-value or interval decides the label
    p_holm = stats.holm([stats.paired_p_value(diff), 0.001])[0]
    assert p_holm == 1.0
    assert stats.label(diff, p_holm, delta=0.5, family=2) == stats.SPREAD_NOT_ESTIMABLE
    if diff.mean != 0:
        assert scipy_stats.ttest_rel([arm[s] for s in seeds], [base[s] for s in seeds]).pvalue < 1e-30


def test_a_small_real_spread_is_still_tested():
    """Differences that vary by a step of an evaluation mean (1/1024) are a spread: tested as before."""
    arm, base = {0: 0.5 + 1 / 1024, 1: 0.5, 2: 0.5 + 2 / 1024}, {0: 0.4, 1: 0.4, 2: 0.4}
    diff = stats.paired_difference(arm, base)
    x = [arm[s] for s in range(3)]
    y = [base[s] for s in range(3)]
    assert diff.sd > 0 and not stats.spread_not_estimable(diff)
    assert stats.paired_p_value(diff) == pytest.approx(scipy_stats.ttest_rel(x, y).pvalue, rel=1e-9)


def holm_by_definition(p):
    """Holm (1979), per element: the adjusted p of p_i is the largest, over every p_j <= p_i, of
    min(1, (m - r_j + 1) p_j), where r_j is p_j's rank from 1 in ascending order."""
    m = len(p)
    ranked = sorted(p)
    return [max(min(1.0, (m - r) * ranked[r]) for r in range(m) if ranked[r] <= pi) for pi in p]


def test_holm_on_a_textbook_family():
    p = [0.01, 0.04, 0.03, 0.005]
    # by hand: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04; running max 0.02, 0.03,
    # 0.06, 0.06; back in the given order:
    assert stats.holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm(p) == pytest.approx(holm_by_definition(p))
    # ARMOR's KL beta=1 (p ~ 0.043) among six comparisons: significant alone, not after Holm
    family = [0.043, 0.25, 0.31, 0.45, 0.62, 0.71]
    assert stats.holm(family)[0] == pytest.approx(min(1.0, 6 * 0.043)) and stats.holm(family)[0] > 0.05
    assert stats.holm(family) == pytest.approx(holm_by_definition(family))


def test_holm_counts_a_missing_comparison_as_p_one():
    assert stats.holm([0.01, math.nan]) == pytest.approx([0.02, 1.0])


def interval(low, high, n=5):
    """The paired difference over ``n`` seeds whose 95% t interval is ``[low, high]``."""
    half = (high - low) / 2
    return stats.Interval(n, (low + high) / 2, half * math.sqrt(n) / scipy_stats.t.ppf(0.975, n - 1), low, high)


@pytest.mark.parametrize(("low", "high", "p_holm", "delta", "want"), [
    (0.01, 0.05, 0.01, 0.1, stats.BETTER),
    (-0.05, -0.01, 0.01, 0.1, stats.WORSE),           # a detected harm is labelled as one
    (0.01, 0.05, 0.2, 0.1, stats.NO_EFFECT),          # excludes 0 alone, not after Holm; inside +-delta
    (-0.02, 0.03, 0.6, 0.05, stats.NO_EFFECT),
    (-0.02, 0.08, 0.6, 0.05, stats.INCONCLUSIVE),
    (-0.024, 0.079, 0.3, 0.10, stats.NO_EFFECT),
    (-0.024, 0.079, 0.3, 0.034, stats.INCONCLUSIVE),  # ARMOR's interval against half its fall
])
def test_labels(low, high, p_holm, delta, want):
    assert stats.label(interval(low, high), p_holm, delta, family=1) == want


def test_no_effect_reads_the_bonferroni_interval_of_the_family():
    """Holm keeps the family's chance of a false better/worse at 5%; "no effect" must keep its own error (calling a
    true effect of size delta none) to the family's rate too: the 1 - 0.05/m interval, each side at 2.5%/m. Against
    scipy's t quantiles in float64."""
    diff = stats.mean_ci([0.031, -0.012, 0.054, 0.008, 0.027])
    sem = diff.sd / math.sqrt(5)
    for m in (1, 2, 4):
        low, high = stats.equivalence_interval(diff, m)
        want = scipy_stats.t.interval(1 - 0.05 / m, 4, loc=diff.mean, scale=sem)
        assert (low, high) == pytest.approx(want, rel=1e-12)
    assert stats.equivalence_interval(diff, 1) == pytest.approx((diff.low, diff.high), rel=1e-12)
    # delta between the 95% interval's high end (+0.0525) and the 98.75% one's (+0.0697): inside at m = 1 only
    delta = 0.06
    assert diff.high < delta < scipy_stats.t.interval(1 - 0.05 / 4, 4, loc=diff.mean, scale=sem)[1]
    assert stats.label(diff, 0.3, delta, family=1) == stats.NO_EFFECT
    assert stats.label(diff, 0.3, delta, family=4) == stats.INCONCLUSIVE
    assert stats.equivalence_interval(stats.mean_ci([0.1]), 3) == (-math.inf, math.inf)


def test_unpaired_seeds_are_named():
    assert stats.unpaired_seeds({0: 1.0, 1: 1.0, 4: 1.0}, {0: 1.0, 1: 1.0, 2: 1.0}) == ([4], [2])


def test_label_thresholds_are_strict_at_their_boundaries():
    """``better``/``worse`` need p *below* alpha, and ``no effect`` an interval strictly inside (-delta, delta): a
    Holm-adjusted p of exactly 0.05, or an interval end exactly at +-delta, decides neither."""
    clear = interval(-0.125, 0.25)
    low, high = stats.equivalence_interval(clear, 1)
    assert stats.label(clear, 0.05, 0.5, 1) == stats.NO_EFFECT  # p at alpha: not detected; inside +-0.5
    assert stats.label(clear, 0.05 - 1e-12, 0.5, 1) == stats.BETTER
    assert stats.label(clear, 0.3, high, 1) == stats.INCONCLUSIVE  # high end exactly at delta
    assert stats.label(clear, 0.3, high + 2**-20, 1) == stats.NO_EFFECT
    mirrored = interval(-0.25, 0.125)
    low, high = stats.equivalence_interval(mirrored, 1)
    assert stats.label(mirrored, 0.3, -low, 1) == stats.INCONCLUSIVE  # low end exactly at -delta
    assert stats.label(mirrored, 0.05, 0.5, 1) == stats.NO_EFFECT
    assert stats.label(mirrored, 0.01, 0.5, 1) == stats.WORSE


def test_interval_p_value_and_mde_agree_with_scipy_for_several_seed_counts():
    values = [0.031, -0.012, 0.054, 0.008, 0.027, 0.019, -0.004, 0.041]
    for n in (2, 3, 8):
        x = values[:n]
        ci = stats.mean_ci(x)
        sem = scipy_stats.sem(x)  # sd / sqrt(n) with ddof=1
        low, high = scipy_stats.t.interval(0.95, n - 1, loc=sum(x) / n, scale=sem)
        assert (ci.low, ci.high) == pytest.approx((low, high), rel=1e-12, abs=1e-15)
        assert stats.paired_p_value(ci) == pytest.approx(scipy_stats.ttest_1samp(x, 0.0).pvalue, rel=1e-9)
        noncentrality = stats.mde(ci.sd, n) / sem
        assert power_by_scipy(noncentrality, n - 1) == pytest.approx(0.8, abs=1e-6)
