"""The one seed-sizing rule (benchmark/report/verdicts.py: sd_upper_bound, sizing_power, seeds_needed), checked
against independent references: the chi-square bound by hand (df 2 has a closed form) and by simulation, the
powers against statsmodels' TTestPower, the counts against a plain search over n with scipy's noncentral t."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.power import TTestPower

from dfbench.benchmark.report import verdicts as V

LOG10 = (math.log(0.9), math.log(1.1))  # +-10 % on the log scale


def test_the_sd_upper_bound_by_hand_at_two_degrees_of_freedom():
    # prepare: chi2 with 2 degrees of freedom is an exponential of mean 2: its q-quantile is -2 ln(1 - q)
    sd, n = 0.16, 3
    # execute / assert: sd x sqrt((n - 1) / chi2_{1 - c}(n - 1)) = sd x sqrt(2 / (-2 ln c)) = sd / sqrt(-ln c)
    for confidence in (0.8, 0.9):
        assert V.sd_upper_bound(sd, n, confidence) == pytest.approx(sd / math.sqrt(-math.log(confidence)), rel=1e-12)
    assert V.sd_upper_bound(sd, n) == V.sd_upper_bound(sd, n, V.SIZING_CONFIDENCE) == pytest.approx(0.3387, abs=1e-4)
    # the bound shrinks toward the sample sd as the pilot grows, and is never below it
    bounds = [V.sd_upper_bound(sd, k) for k in (2, 3, 5, 10, 30, 300)]
    assert all(a > b > sd for a, b in zip(bounds, bounds[1:]))
    assert math.isnan(V.sd_upper_bound(sd, 1)) and math.isnan(V.sd_upper_bound(math.nan, 5))
    with pytest.raises(ValueError, match="confidence"):
        V.sd_upper_bound(sd, 3, 1.0)


@pytest.mark.parametrize("n", [3, 6])
def test_the_sd_upper_bound_covers_the_true_sd_at_its_confidence(n):
    # prepare: 100,000 pilots of n normal differences with a known sd
    rng = np.random.default_rng(61)
    sigma = 0.3
    sample_sd = rng.normal(0.1, sigma, size=(100_000, n)).std(axis=1, ddof=1)
    # execute: the upper bound of each pilot (the factor is the same for all, so one call gives it)
    factor = V.sd_upper_bound(1.0, n)
    covered = float(np.mean(sample_sd * factor >= sigma))
    # assert: one-sided 80 % coverage (binomial sd of the estimate ~0.0013)
    assert covered == pytest.approx(0.8, abs=0.006)


def _first_n(power, most: int = 1000) -> int | None:
    """An independent search: the first n >= 2 where `power(n)` reaches 0.8, by walking up."""
    return next((n for n in range(2, most + 1) if power(n) >= 0.8), None)


@pytest.mark.parametrize("mean,sd,pilot", [(0.5, 0.4, 3), (-0.1263, 0.1619, 3), (-0.4104, 0.1595, 3), (0.2, 0.3, 10)])
def test_sizing_a_difference_is_the_noncentral_t_sample_size_at_the_upper_bound(mean, sd, pilot):
    # prepare: an effect so far outside +-10 % (or so small against its spread) that only the difference test counts
    alpha = 0.025
    upper = sd * math.sqrt((pilot - 1) / stats.chi2.ppf(0.2, pilot - 1))

    def power(n: int) -> float:  # the two-sided paired t-test's power from scipy's noncentral t, in float64
        df, ncp = n - 1, abs(mean) / upper * math.sqrt(n)
        crit = stats.t.ppf(1 - alpha / 2, df)
        return float(stats.nct.sf(crit, df, ncp) + stats.nct.cdf(-crit, df, ncp))

    # execute
    got = V.seeds_needed(mean, sd, pilot, LOG10 if abs(mean) > 0.3 else (-1e-9, 1e-9), alpha)
    # assert: the search, statsmodels' sample size, and never fewer seeds than the point estimate asks for
    assert got == _first_n(power)
    assert got == math.ceil(TTestPower().solve_power(effect_size=abs(mean) / upper, alpha=alpha, power=0.8,
                                                     alternative="two-sided"))
    point = V.seeds_needed(mean, sd, pilot, LOG10 if abs(mean) > 0.3 else (-1e-9, 1e-9), alpha, confidence=None)
    assert point is not None and point <= got
    assert V.seeds_needed(mean, upper, pilot, LOG10 if abs(mean) > 0.3 else (-1e-9, 1e-9), alpha, confidence=None) == got


def test_the_upper_bound_count_is_never_below_the_point_count():
    rng = np.random.default_rng(62)
    for _ in range(200):
        mean, sd, pilot = float(rng.normal(0, 0.3)), float(rng.uniform(0.01, 0.6)), int(rng.integers(2, 20))
        alpha = float(rng.choice([0.05, 0.025, 0.0083]))
        test = str(rng.choice(V.SIZING_TESTS))
        bounds = (-math.inf, 0.1) if test == "bound" else LOG10
        point = V.seeds_needed(mean, sd, pilot, bounds, alpha, test=test, confidence=None)  # type: ignore[arg-type]
        upper = V.seeds_needed(mean, sd, pilot, bounds, alpha, test=test)  # type: ignore[arg-type]
        # out of reach (None) at the point estimate stays out of reach at the bound
        assert (upper is None) if point is None else (upper is None or upper >= point), (mean, sd, pilot, alpha, test)


def test_sizing_a_bound_is_the_one_sided_noncentral_t_sample_size():
    # prepare: an at_most claim A / B <= 1.75 with the evidence at x1.01 (the sized test: one-sided, below the bound)
    limit, mean, sd, pilot, alpha = math.log(1.75), math.log(1.01), 0.35, 3, 0.05 / 3
    upper = V.sd_upper_bound(sd, pilot)

    def power(n: int) -> float:
        df, ncp = n - 1, abs(mean - limit) / upper * math.sqrt(n)
        return float(stats.nct.sf(stats.t.ppf(1 - alpha, df), df, ncp))

    # execute
    got = V.seeds_needed(mean, sd, pilot, (-math.inf, limit), alpha, test="bound")
    # assert: the search, statsmodels' one-sided power at every n, and the power the rule reports
    assert got == _first_n(power)
    for n in (2, 3, 7, got):
        assert V.power_one_sided(n, mean, upper, limit, alpha) == pytest.approx(
            TTestPower().power(effect_size=abs(mean - limit) / upper, nobs=n, alpha=alpha, alternative="larger"), abs=1e-9)
    assert V.sizing_power(got, mean, upper, (-math.inf, limit), alpha, "bound") >= 0.8 > V.sizing_power(
        got - 1, mean, upper, (-math.inf, limit), alpha, "bound")
    # on the bound nothing can be sized; nor without spread
    assert V.seeds_needed(limit, sd, pilot, (-math.inf, limit), alpha, test="bound") is None
    assert V.seeds_needed(mean, 0.0, pilot, (-math.inf, limit), alpha, test="bound") is None


def test_an_equivalence_is_sized_by_the_tost_power_bound():
    # prepare: a near-zero difference (cpu-bf16's pilot: +0.0117, sd 0.0277 over 3 seeds) inside +-5 %
    mean, sd, pilot, alpha = 0.0117, 0.0277, 3, 0.05 / 3
    bounds = V.equivalence_bounds("log", 0.05, 1.0)
    upper = V.sd_upper_bound(sd, pilot)
    # execute
    got = V.seeds_needed(mean, sd, pilot, bounds, alpha)
    # assert: the first n where the TOST's power (its lower bound, checked against a simulation in test_verdicts)
    # or the difference test's reaches 0.8 at the upper bound of the sd
    assert got == _first_n(lambda n: max(V.power_equivalence(n, mean, upper, bounds, alpha),
                                         V.power_difference(n, mean, upper, alpha)))
    assert got == 25 and V.seeds_needed(mean, sd, pilot, bounds, alpha, confidence=None) == 8
    with pytest.raises(ValueError, match="sizing test"):
        V.sizing_power(5, mean, sd, bounds, alpha, "both")  # type: ignore[arg-type]


def test_one_verdict_function_for_leaderboards_and_claims():
    # difference and equivalence (the leaderboard's and a better / worse / equivalent claim's)
    assert V.verdict(0.01, 0.5, -0.2, lower_better=True) == "better"
    assert V.verdict(0.01, 0.5, -0.2, lower_better=False) == "worse"
    assert V.verdict(0.2, 0.01, 0.01, lower_better=True) == "equivalent"
    assert V.verdict(0.2, 0.2, 0.01, lower_better=True) == "inconclusive"
    assert V.verdict(math.nan, math.nan, 0.01, lower_better=True) == "inconclusive"
    # a bound (an at_most claim): the test below it, its counter-test above it
    assert V.verdict(0.01, 0.9, -0.5, lower_better=True, bound=True) == "within the bound"
    assert V.verdict(0.9, 0.01, 0.9, lower_better=True, bound=True) == "beyond the bound"
    assert V.verdict(0.2, 0.2, 0.0, lower_better=True, bound=True) == "inconclusive"
    # no spread: undecidable, whatever the p-values say
    assert V.verdict(0.0, 0.0, -1.0, lower_better=True, spread=V.NO_SPREAD) == "undecidable"
    assert V.verdict(0.0, 1.0, -1.0, lower_better=True, bound=True, spread=V.NO_SPREAD) == "undecidable"
