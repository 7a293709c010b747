"""Verdicts from paired evidence: how a setting compares with a reference, where it ranks, whether it collapsed.

Runs at the same seed share the partition, the initial model and the fixed evaluation noises (the
run records all three: partition.json's ``indices_sha256``, metrics.json's ``pairing``), so most of
the seed-to-seed spread is common to every setting and cancels in the per-seed difference. Every
statistic here works on those per-seed differences:

- **scale**: a positive metric (a Frechet distance, a loss; `metrics.table.scale`) is compared on
  the log scale, so an estimate is a ratio (setting / reference) and no interval of it reaches 0;
  any other metric (KID, precision, class counts) by plain differences.
- **verdict** against the reference, per setting: *better* or *worse* when the paired t-test
  (scipy.stats.ttest_1samp on the differences) rejects no-difference, *equivalent* when the two
  one-sided tests (statsmodels' ``ttost_paired``) put the ratio inside ``1 +- margin`` (or the
  difference inside ``+- margin x |reference mean|``), else *inconclusive*. Both families of p-values
  are Holm-corrected (statsmodels' ``multipletests``) over the block's comparisons. Level 0.05.
  Differences that are the same at every seed (e.g. an attack AUC of 1.000 for both settings at
  every seed) have no spread to test: *undecidable* (no spread), never equivalent by rule; only two
  settings that agree exactly at every seed while their scores vary over seeds (the same
  computation) are equivalent without a test.
- **interval**: the 95 % paired Student-t interval of the mean difference (a ratio interval on the
  log scale). Not a percentile bootstrap: with 3 seeds that interval lies within the range of the
  three differences, which misses the true mean of a symmetric spread one time in four (all three
  on one side), so it covers at most 75 %, not 95 %.
- **floor**: a setting the paired test does not show better than the untrained model of the same
  seeds (the block's first untrained model that pairs with it: one per width where widths differ) is marked so and ranks after every setting that is; with one seed, the two runs' own
  sampling intervals must be disjoint.
- **collapse**: a seed whose score lies nearer (on the metric's scale) to the untrained model's at
  that seed than to the reference's has collapsed; a setting is flagged with how many did.
- **rank**: the settings ordered by their mean on the metric's scale (a geometric mean on the log
  scale) over the seeds every ranked setting of the block ran (``rank_seeds`` of them; a block whose
  settings share no seed falls back to each setting's own seeds, ``rank_seeds`` 0), floor-marked
  settings last. Equal means share the better rank.
- **rank interval**: from the paired contrasts, not from resampling seeds: for every pair of ranked
  settings the paired t-test over the seeds the two share (at least 2), Holm-corrected over all the
  block's pairs; setting i's interval is [1 + the settings significantly better than i, the settings
  not significantly worse than i (i counted)], floor-marked settings after the others. When every
  Holm-significant order holds (probability >= 95 %), every true rank lies in its interval, so the
  intervals hold jointly at 95 % whatever the number of seeds; a bootstrap of 3 seeds showed "1 (1-1)"
  one time in eight under a true tie. Conservative: a setting with fewer than 2 seeds shared with
  another is never shown apart from it.
- **seeds to decide**: for an inconclusive contrast, the fewest seeds at which, with the observed
  mean and spread of the differences taken as true, a verdict (better/worse, or equivalent) would
  come with probability 0.8 at the block's strictest Holm level (alpha / m): `seeds_needed` with the
  sample sd (what the spread seen asks for). A study sized from a pilot calls the same function with
  the pilot's sd at its upper confidence bound (`SIZING_CONFIDENCE`), as a pilot of a few seeds
  underestimates the spread.

Pure numpy/scipy/statsmodels: no torch, so the reporter imports it cheaply.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

ALPHA = 0.05
MARGIN = 0.10  # the equivalence margin when a study declares none: +- 10 % of the reference
POWER = 0.8
MAX_SEEDS = 1000  # seeds_needed searches up to here; beyond it the contrast is called out of reach
# a study is sized from this one-sided upper confidence bound of its pilot's paired sd (Browne 1995, "On the use of
# a pilot sample for sample size determination", Stat. Med. 14: the 80 % bound), not the sample sd
SIZING_CONFIDENCE = 0.8

Scale = Literal["log", "difference"]
Verdict = Literal["better", "worse", "equivalent", "inconclusive", "undecidable", "within the bound", "beyond the bound"]
SizingTest = Literal["decide", "bound"]
SIZING_TESTS: tuple[str, ...] = ("decide", "bound")
VERDICTS: tuple[str, ...] = ("better", "worse", "equivalent", "inconclusive", "undecidable")
NO_SPREAD = ("no spread: the difference is the same at every seed (e.g. a score at its bound for both), "
             "so no test applies")


# -- the statistics, each on a fixed array (tests/unit/test_verdicts.py checks them against scipy / statsmodels) --

def transform(values: Sequence[float] | np.ndarray, scale: Scale) -> np.ndarray:
    """The values on the scale they are compared on (natural log for "log"). ValueError for a value
    <= 0 on the log scale: a positive metric that is not positive is a broken record."""
    x = np.asarray(values, dtype=np.float64)
    if scale == "log":
        if np.any(~(x > 0)):
            raise ValueError(f"a positive metric has a value <= 0 or NaN ({x.tolist()}): it cannot be compared as a ratio")
        return np.log(x)
    return x


def back(value: float, scale: Scale) -> float:
    """A mean difference on the comparison scale as it is shown: a ratio for "log", else itself."""
    return math.exp(value) if scale == "log" else value


@dataclass(frozen=True)
class PairedT:
    """The paired t-test of differences d = setting - reference (transformed): mean, its (1 - alpha) interval,
    the two-sided p-value of no difference, the sample sd and the number of pairs."""

    mean: float
    low: float
    high: float
    p: float
    sd: float
    n: int


def paired_t(d: Sequence[float] | np.ndarray, alpha: float = ALPHA) -> PairedT:
    """Student-t on the per-seed differences (scipy.stats.ttest_1samp against 0). One pair: no spread,
    so NaN interval and p. Identical differences (sd 0): no spread either, so no interval; p is 1 when
    they are all 0 (nothing to reject), else NaN (a t-test of no spread is not a test: `undecidable`)."""
    from scipy import stats

    x = np.asarray(d, dtype=np.float64)
    n = int(x.size)
    if n == 0:
        return PairedT(math.nan, math.nan, math.nan, math.nan, math.nan, 0)
    mean = float(x.mean())
    if n < 2:
        return PairedT(mean, math.nan, math.nan, math.nan, math.nan, 1)
    sd = float(x.std(ddof=1))
    if no_spread(sd, mean):
        return PairedT(mean, math.nan, math.nan, 1.0 if abs(mean) <= 1e-12 else math.nan, 0.0, n)
    res = stats.ttest_1samp(x, 0.0)
    ci = res.confidence_interval(1 - alpha)
    return PairedT(mean, float(ci.low), float(ci.high), float(res.pvalue), sd, n)


def no_spread(sd: float, mean: float) -> bool:
    """Identical differences up to float rounding (a ratio of exactly 0.5 at every seed gives log
    differences equal to the last bit): no spread to test, as scipy warns it cannot tell."""
    return sd <= 1e-12 * max(1.0, abs(mean))


def identical(x: Sequence[float] | np.ndarray, reference: Sequence[float] | np.ndarray) -> bool:
    """The two settings agree exactly at every seed (>= 2) while their scores vary over seeds: the same
    computation (e.g. keep ratio 1 and FedAvg, bitwise), equivalent without a test. Equal scores that do
    not vary (an attack AUC of 1 at every seed for both) are a metric at its bound, not this."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    return a.size >= 2 and bool(np.array_equal(a, b)) and float(np.ptp(a)) > 0


def spread_problem(x: Sequence[float] | np.ndarray, reference: Sequence[float] | np.ndarray) -> str | None:
    """`NO_SPREAD` when the paired differences (>= 2) are the same at every seed and the settings are not
    `identical`: the contrast is undecidable, whatever its p-values would say; else None."""
    d = np.asarray(x, dtype=np.float64) - np.asarray(reference, dtype=np.float64)
    if d.size < 2 or identical(x, reference):
        return None
    return NO_SPREAD if no_spread(float(d.std(ddof=1)), float(d.mean())) else None


def equivalence_bounds(scale: Scale, margin: float, reference_mean: float) -> tuple[float, float]:
    """The equivalence region of the mean difference on the comparison scale: log(1 - margin) ..
    log(1 + margin) for ratios, +- margin x |reference mean| for differences."""
    if not 0 < margin < 1:
        raise ValueError(f"equivalence margin {margin!r}: give a fraction of the reference in (0, 1), e.g. 0.1 for +-10 %")
    if scale == "log":
        return math.log1p(-margin), math.log1p(margin)
    half = margin * abs(reference_mean)
    return -half, half


def tost_p(x: Sequence[float], reference: Sequence[float], bounds: tuple[float, float]) -> float:
    """p-value of the paired two one-sided tests that mean(x - reference) lies inside `bounds`
    (x and reference already on the comparison scale): statsmodels' ``ttost_paired``. NaN with fewer
    than 2 pairs and with differences of no spread (`spread_problem`: no test, never equivalent by
    rule), except for `identical` settings: 0 (inside any bounds)."""
    from statsmodels.stats.weightstats import ttost_paired

    a, b = np.asarray(x, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    d = a - b
    if d.size < 2:
        return math.nan
    if identical(a, b):
        return 0.0
    if no_spread(float(d.std(ddof=1)), float(d.mean())):
        return math.nan
    return float(ttost_paired(a, b, bounds[0], bounds[1])[0])


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values (statsmodels' ``multipletests(method="holm")``) over the finite entries;
    NaN (no test) stays NaN and does not count in the family."""
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full(p.shape, math.nan)
    ok = np.isfinite(p)
    if ok.sum() == 1:  # a family of one is its own adjustment (multipletests runs gc.collect on every call)
        out[ok] = p[ok]
    elif ok.any():
        out[ok] = multipletests(p[ok], alpha=ALPHA, method="holm")[1]
    return out.tolist()


def power_difference(n: int, mean: float, sd: float, alpha: float) -> float:
    """Power of the two-sided paired t-test at n pairs when the true mean difference is `mean` and its
    sd `sd`: P(|T| > t_crit) with T noncentral t (df n - 1, noncentrality mean / sd x sqrt(n)), the
    formula of statsmodels' TTestPower (tests compare the two), which returns NaN at large
    noncentralities where scipy's noncentral t does not."""
    from scipy import stats

    if sd <= 0 or n < 2:
        return math.nan
    df, ncp = n - 1, abs(mean) / sd * math.sqrt(n)
    crit = stats.t.ppf(1 - alpha / 2, df)
    return _nct_sf(crit, df, ncp) + _nct_cdf(-crit, df, ncp)


def _nct_cdf(x: float, df: int, ncp: float) -> float:
    """scipy's noncentral-t cdf; where it returns NaN (a far tail at a large noncentrality, scipy 1.17),
    the normal approximation, which is then 0 or 1 to many digits."""
    from scipy import stats

    p = float(stats.nct.cdf(x, df, ncp))
    return float(stats.norm.cdf(x - ncp)) if math.isnan(p) else p


def _nct_sf(x: float, df: int, ncp: float) -> float:
    from scipy import stats

    p = float(stats.nct.sf(x, df, ncp))
    return float(stats.norm.sf(x - ncp)) if math.isnan(p) else p


def power_equivalence(n: int, mean: float, sd: float, bounds: tuple[float, float], alpha: float) -> float:
    """A lower bound on the power of the paired TOST at n pairs (true mean `mean`, sd `sd`): each
    one-sided test's power from the noncentral t, and P(both) >= P(lower) + P(upper) - 1. statsmodels
    has no TOST power; tests check the bound against a simulation."""
    from scipy import stats

    if sd <= 0 or n < 2:
        return math.nan
    df, se = n - 1, sd / math.sqrt(n)
    crit = stats.t.ppf(1 - alpha, df)
    lower = _nct_sf(crit, df, (mean - bounds[0]) / se)  # t1 = (dbar - low) / se > crit
    upper = _nct_cdf(-crit, df, (mean - bounds[1]) / se)  # t2 = (dbar - upp) / se < -crit
    return max(0.0, float(lower + upper - 1.0))


def sd_upper_bound(sd: float, n: int, confidence: float = SIZING_CONFIDENCE) -> float:
    """The one-sided upper `confidence` bound of the sd of normal differences, from their sample sd over n of
    them: sd x sqrt((n - 1) / chi2.ppf(1 - confidence, n - 1)), the chi-square interval of a variance. NaN with
    fewer than 2 (no spread seen). With 3 pilot seeds the 80 % bound is 2.12 x the sample sd, the 90 % one 3.08 x."""
    from scipy import stats

    if n < 2 or not math.isfinite(sd):
        return math.nan
    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence!r}: give a level in (0, 1), e.g. {SIZING_CONFIDENCE}")
    return sd * math.sqrt((n - 1) / float(stats.chi2.ppf(1 - confidence, n - 1)))


def power_one_sided(n: int, mean: float, sd: float, limit: float, alpha: float) -> float:
    """Power of the one-sided paired t-test of the mean against `limit` on the side the mean lies (an
    ``at_most`` claim: within or beyond its bound) at n pairs: P(T > t_crit), T noncentral t (df n - 1,
    noncentrality |mean - limit| / sd x sqrt(n))."""
    from scipy import stats

    if sd <= 0 or n < 2:
        return math.nan
    df = n - 1
    return _nct_sf(float(stats.t.ppf(1 - alpha, df)), df, abs(mean - limit) / sd * math.sqrt(n))


def sizing_power(n: int, mean: float, sd: float, bounds: tuple[float, float], alpha: float,
                 test: SizingTest = "decide") -> float:
    """The power at n pairs of the test that decides a contrast, with `mean` and `sd` taken as the truth:
    for "decide" the better of the paired t-test of no difference (`power_difference`) and the TOST inside
    `bounds` (`power_equivalence`), since either verdict decides it; for "bound" the one-sided test against
    bounds[1] (`power_one_sided`)."""
    if test == "bound":
        return power_one_sided(n, mean, sd, bounds[1], alpha)
    if test != "decide":
        raise ValueError(f"sizing test {test!r}: one of {SIZING_TESTS}")
    difference = power_difference(n, mean, sd, alpha) if mean != 0 else 0.0
    return max(difference, power_equivalence(n, mean, sd, bounds, alpha))


def seeds_needed(mean: float, sd: float, pilot_seeds: int, bounds: tuple[float, float], alpha: float, *,
                 test: SizingTest = "decide", confidence: float | None = SIZING_CONFIDENCE, power: float = POWER,
                 most: int = MAX_SEEDS) -> int | None:
    """THE seed sizing: the fewest seeds (>= 2) at which the test of a contrast (`sizing_power`: "decide" for a
    difference or an equivalence, "bound" for a one-sided bound at bounds[1]) reaches `power` at level `alpha`,
    with the pilot's mean difference taken as the truth and its spread as the one-sided `confidence` upper bound of
    the sd over its `pilot_seeds` pairs (`sd_upper_bound`), not the sample sd: 3-seed pilots underestimated
    confirmatory-2's paired sd 2-13x. None when even `most` seeds do not reach it, or nothing can be sized (no
    spread, a mean on the bound, an sd from fewer than 2 pairs).

    ``confidence=None`` takes the sample sd as the truth: the report's ``seeds_to_decide`` column, which says
    what the observed spread asks for, and the studies sized before this rule, which reproduce their tables."""
    if confidence is not None:
        sd = sd_upper_bound(sd, pilot_seeds, confidence)
    if not (math.isfinite(mean) and math.isfinite(sd)) or sd <= 0 or (test == "bound" and mean == bounds[1]):
        return None

    def enough(n: int) -> bool:
        return sizing_power(n, mean, sd, bounds, alpha, test) >= power

    if not enough(most):
        return None
    lo, hi = 2, most  # power grows with n for every test here: bisect the first n that is enough
    while lo < hi:
        mid = (lo + hi) // 2
        if enough(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def verdict(p_holm: float, p_counter_holm: float, mean: float, *, lower_better: bool, alpha: float = ALPHA,
            bound: bool = False, spread: str = "") -> Verdict:
    """THE verdict of one contrast (leaderboards and claims), from its Holm-adjusted p-values and its mean
    difference (setting minus reference, on the comparison scale): better / worse when no-difference is rejected,
    else equivalent when the two one-sided tests (`p_counter_holm`) reject a difference beyond the margin, else
    inconclusive. For a one-sided bound (an ``at_most`` claim, ``bound=True``): within the bound when the test
    below it rejects, beyond the bound when the test above it (`p_counter_holm`) does, else inconclusive. A
    contrast with no spread (`spread`: `spread_problem`'s reason) is undecidable, whatever the p-values say."""
    if spread:
        return "undecidable"
    if bound:
        return ("within the bound" if math.isfinite(p_holm) and p_holm < alpha else
                "beyond the bound" if math.isfinite(p_counter_holm) and p_counter_holm < alpha else "inconclusive")
    if math.isfinite(p_holm) and p_holm < alpha:
        return "better" if (mean < 0) == lower_better else "worse"
    if math.isfinite(p_counter_holm) and p_counter_holm < alpha:
        return "equivalent"
    return "inconclusive"


def point_ranks(values: Mapping[str, Mapping[Any, float]], *, lower_better: bool = True,
                last: frozenset[str] | set[str] = frozenset()) -> tuple[dict[str, int], int]:
    """(setting -> its rank, 1 = best; the number of seeds the ranks compare). `values`: setting -> {seed:
    value on the comparison scale}. The ranks order the means over the seeds every setting has, so no
    setting is compared on seeds another lacks; without a seed they all share, each setting's own mean
    (and 0 seeds). Settings in `last` rank after all the others (the floor rule); equal means share the
    better rank."""
    sign = 1.0 if lower_better else -1.0
    common = set.intersection(*(set(v) for v in values.values())) if values else set()
    mean = {k: float(np.mean([v[s] for s in common] if common else list(v.values()))) for k, v in values.items()}
    key = {k: (k in last, sign * m) for k, m in mean.items()}
    return {k: 1 + sum(1 for j in values if key[j] < key[k]) for k in values}, len(common)


def rank_intervals(values: Mapping[str, Mapping[Any, float]], *, lower_better: bool = True,
                   last: frozenset[str] | set[str] = frozenset(), alpha: float = ALPHA) -> dict[str, tuple[int, int]]:
    """setting -> (lowest, highest) rank it can take given the paired evidence. `values` as in `point_ranks`.
    Every pair of settings on the same side of the floor rule (`last`) sharing >= 2 seeds is tested by the
    paired t-test over those seeds (`paired_t`), Holm-corrected over all the pairs tested; setting i's
    interval is [1 + the settings significantly better than i, the settings not significantly worse than
    i, i counted], the `last` settings after the others. A pair without a test (under 2 shared seeds, no
    spread) counts as not significant either way, which widens both intervals."""
    sign = 1.0 if lower_better else -1.0
    groups = [[k for k in values if k not in last], [k for k in values if k in last]]
    pairs: list[tuple[str, str, float]] = []
    pvalues: list[float] = []
    for group in groups:
        for a, b in itertools.combinations(group, 2):
            seeds = [s for s in values[a] if s in values[b]]
            if len(seeds) < 2:
                continue
            t = paired_t([values[a][s] - values[b][s] for s in seeds], alpha)
            pairs.append((a, b, t.mean))
            pvalues.append(t.p)
    beaten_by: dict[str, int] = {k: 0 for k in values}  # settings significantly better than k
    beats: dict[str, int] = {k: 0 for k in values}  # settings significantly worse than k
    for (a, b, mean), p in zip(pairs, holm(pvalues)):
        if math.isfinite(p) and p < alpha:
            win, lose = (a, b) if sign * mean < 0 else (b, a)
            beats[win] += 1
            beaten_by[lose] += 1
    out: dict[str, tuple[int, int]] = {}
    offset = 0
    for group in groups:
        for k in group:
            out[k] = (offset + 1 + beaten_by[k], offset + len(group) - beats[k])
        offset += len(group)
    return out


def collapsed(value: float, untrained: float, reference: float) -> bool:
    """A seed's score (on the comparison scale) lies nearer to the untrained model's than to the reference's."""
    return abs(value - untrained) < abs(value - reference)


# -- a leaderboard block -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Setting:
    """One setting of a block as the verdicts see it: its per-seed values and the runs' pairing records."""

    key: str  # the leaderboard's group_key
    values: Mapping[Any, float]  # seed -> metric value (as recorded)
    fingerprints: Mapping[Any, Mapping[str, str]]  # seed -> {partition_sha256, init_sha256, eval_noise_sha256} present
    budget: str = ""  # the leaderboard's budget_key
    intervals: Mapping[Any, tuple[float, float]] | None = None  # seed -> the run's own (sampling) interval
    baseline: bool = False
    is_reference: bool = False
    primary: bool = False  # of several reference settings, the block's own (named just the reference)


FINGERPRINT_NAMES = {"partition_sha256": "partitions", "init_sha256": "initial models", "eval_noise_sha256": "evaluation noises"}


def setting_of_runs(runs: Any, metric: str, key: str, **fields: Any) -> Setting:
    """A `Setting` from the per-run rows of one setting (a DataFrame with seed, `metric`, the pairing records
    and, where the run has one, its own interval `metric`__lo / __hi): runs without the metric left out."""
    rows = runs[runs[metric].notna()] if metric in runs else runs.iloc[0:0]
    values, prints, intervals = {}, {}, {}
    for _, r in rows.iterrows():
        seed = r["seed"]
        values[seed] = float(r[metric])
        prints[seed] = {k: r[k] for k in FINGERPRINT_NAMES if isinstance(r.get(k), str) and r.get(k)}
        lo, hi = r.get(f"{metric}__lo"), r.get(f"{metric}__hi")
        intervals[seed] = (float(lo) if lo is not None else math.nan, float(hi) if hi is not None else math.nan)
    return Setting(key=key, values=values, fingerprints=prints, intervals=intervals, **fields)


def pairing_problem(a: Setting, b: Setting, seeds: Sequence[Any], treatment: Sequence[str] = ()) -> str | None:
    """Why runs of `a` and `b` at the same seed must not be paired (a record that both have and that
    differs), or None. A record one run lacks (written before it was kept) is not held against it, nor one
    named in `treatment` (a FINGERPRINT_NAMES value, e.g. "partitions": what the compared factor itself changes,
    as iid against Dirichlet clients do; the seed then still pairs everything else)."""
    for s in seeds:
        fa, fb = a.fingerprints.get(s, {}), b.fingerprints.get(s, {})
        for name, what in FINGERPRINT_NAMES.items():
            if what in treatment:
                continue
            if fa.get(name) and fb.get(name) and fa[name] != fb[name]:
                return f"seed {s}: the {what} differ ({fa[name][:10]} vs {fb[name][:10]}), so the runs are not paired"
    return None


def _shared(a: Setting, b: Setting) -> list[Any]:
    return sorted(set(a.values) & set(b.values), key=lambda s: (str(type(s)), s))


def _differences(a: Setting, b: Setting, seeds: Sequence[Any], scale: Scale) -> tuple[np.ndarray, np.ndarray]:
    return (transform([a.values[s] for s in seeds], scale), transform([b.values[s] for s in seeds], scale))


def references(contenders: Sequence[Setting]) -> dict[str, Setting]:
    """group_key -> the setting it is compared with (absent when there is none): the reference setting of
    the same budget where there is exactly one, else the primary reference (flagged, or the only reference
    setting). A reference setting maps to itself, unless no setting is compared with it and there is a
    primary one: then it is compared with that."""
    refs = [s for s in contenders if s.is_reference]
    flagged = [r for r in refs if r.primary]
    primary = flagged[0] if len(flagged) == 1 else (refs[0] if len(refs) == 1 else None)
    out: dict[str, Setting] = {}
    for s in contenders:
        if s.is_reference:
            continue
        same = [r for r in refs if r.budget == s.budget]
        ref = same[0] if len(same) == 1 else primary
        if ref is not None:
            out[s.key] = ref
    used = {r.key for r in out.values()} | ({primary.key} if primary is not None else set())
    for r in refs:  # without a primary one, each reference setting stays its own budget's reference
        out[r.key] = primary if r.key not in used and primary is not None else r
    return out


def untrained_of(s: Setting, floors: Sequence[Setting]) -> Setting:
    """The untrained model a setting is tested against: the first of `floors` that pairs with it (shares
    a seed, and its partition, initial model and noises there: a block of several widths has one per
    width), else the first."""
    for f in floors:
        seeds = _shared(s, f)
        if seeds and pairing_problem(s, f, seeds) is None:
            return f
    return floors[0]


def block_verdicts(settings: Sequence[Setting], *, scale: Scale, lower_better: bool, margin: float = MARGIN,
                   alpha: float = ALPHA) -> dict[str, dict[str, Any]]:
    """group_key -> the verdict columns of that setting (see `COLUMNS`) for one block of a leaderboard.

    The reference of a setting is the reference setting (``is_reference``) of the same budget, else the
    block's primary reference (the one flagged ``primary``, or the only one). A reference setting that no
    other setting is compared with (the reference method under another clock, privacy or recipe) is itself
    compared with the primary one. The untrained model is the block's baseline. Holm runs over the
    block's contrasts with the references (one family for the difference tests, one for the equivalence
    tests) and over its contrasts with the untrained model."""
    sign = 1.0 if lower_better else -1.0  # a negative sign * difference favours the setting
    contenders = [s for s in settings if not s.baseline and s.values]
    refs = [s for s in contenders if s.is_reference]
    floors = [s for s in settings if s.baseline and s.values]  # the first is the default one
    out: dict[str, dict[str, Any]] = {s.key: _empty() for s in contenders}
    reference_of = references(contenders)

    # -- against the reference ------------------------------------------------------------------------
    tests: list[tuple[Setting, str | None, list[Any], PairedT, float, tuple[float, float]]] = []
    for s in contenders:
        row = out[s.key]
        ref = reference_of.get(s.key)
        if ref is None:
            row["verdict_note"] = "no reference setting in this block" if not refs else "no reference at this budget"
            continue
        row["reference"] = ref.key
        if ref is s:
            row["verdict"] = "reference"
            continue
        seeds = _shared(s, ref)
        if not seeds:
            row["verdict_note"] = "no seed shared with the reference"
            continue
        problem = pairing_problem(s, ref, seeds)
        if problem:
            row["verdict"], row["verdict_note"] = "unpaired", problem
            continue
        x, r = _differences(s, ref, seeds, scale)
        t = paired_t(x - r, alpha)
        ref_mean = float(np.mean([ref.values[q] for q in seeds]))
        bounds = equivalence_bounds(scale, margin, ref_mean)
        row.update(paired_seeds=len(seeds), estimate=back(t.mean, scale), estimate_low=back(t.low, scale),
                   estimate_high=back(t.high, scale), p=t.p, p_equivalence=tost_p(x, r, bounds),
                   wins=int(np.sum(sign * (x - r) < 0)), margin=margin)
        tests.append((s, spread_problem(x, r), seeds, t, row["p_equivalence"], bounds))
    p_diff = holm([t.p for _, _, _, t, _, _ in tests])
    p_eq = holm([pe for _, _, _, _, pe, _ in tests])
    m = max(1, sum(1 for _, _, _, t, _, _ in tests if math.isfinite(t.p)))
    for (s, flat, seeds, t, _, bounds), pd_, pe in zip(tests, p_diff, p_eq):
        row = out[s.key]
        row["p_holm"], row["p_equivalence_holm"] = pd_, pe
        # the same difference at every seed (flat): no test, whatever a rule would say
        row["verdict"] = verdict(pd_, pe, t.mean, lower_better=lower_better, alpha=alpha, spread=flat or "")
        if flat:
            row["verdict_note"] = flat
        elif row["verdict"] == "inconclusive":
            if len(seeds) < 2:
                row["verdict_note"] = "one paired seed: no spread to test"
            else:
                row["seeds_to_decide"] = seeds_needed(t.mean, t.sd, len(seeds), bounds, alpha / m, confidence=None)
                if row["seeds_to_decide"] is None:
                    row["verdict_note"] = f"not decided by {MAX_SEEDS} seeds at this spread"

    # -- against the untrained model, and collapse ---------------------------------------------------------
    floor_tests: list[tuple[Setting, float]] = []
    for s in contenders:
        row = out[s.key]
        if not floors:
            row["floor_note"] = "no untrained model in this block"
            continue
        floor = untrained_of(s, floors)
        seeds = _shared(s, floor)
        problem = pairing_problem(s, floor, seeds) if seeds else "no seed shared with the untrained model"
        if problem:
            row["floor_note"] = problem
            row["floor"] = True
            continue
        x, u = _differences(s, floor, seeds, scale)
        if len(seeds) >= 2:
            t = paired_t(x - u, alpha)
            # one-sided evidence in the better direction: the two-sided p halved when the mean points that way
            p = t.p / 2 if math.isfinite(t.p) and sign * t.mean < 0 else 1.0
            floor_tests.append((s, p))
        else:  # one seed: only the sampling uncertainty of the two runs
            q = seeds[0]
            mine = (s.intervals or {}).get(q)
            theirs = (floor.intervals or {}).get(q)
            clear = (mine is not None and theirs is not None and all(map(math.isfinite, (*mine, *theirs)))
                     and (mine[1] < theirs[0] if lower_better else mine[0] > theirs[1]))
            row["floor"] = not clear
            row["floor_note"] = "one seed: the runs' own sampling intervals " + ("are disjoint" if clear else "overlap or are missing")
        ref_key = row.get("reference")
        ref = next((c for c in contenders if c.key == ref_key), None)
        if ref is not None and ref is not s:
            both = [q for q in seeds if q in ref.values]
            if both:
                k = sum(collapsed(*transform([s.values[q], floor.values[q], ref.values[q]], scale)) for q in both)
                row["collapsed"], row["collapse_seeds"] = int(k), len(both)
    for (s, _), p in zip(floor_tests, holm([p for _, p in floor_tests])):
        out[s.key]["floor"] = not (math.isfinite(p) and p < alpha)
        out[s.key]["p_untrained_holm"] = p

    # -- ranks ----------------------------------------------------------------------------------------------
    values = {s.key: dict(zip(s.values, transform(list(s.values.values()), scale))) for s in contenders}
    last = {s.key for s in contenders if out[s.key]["floor"]}
    ranks, common = point_ranks(values, lower_better=lower_better, last=last)
    intervals = rank_intervals(values, lower_better=lower_better, last=last, alpha=alpha)
    for k, rank in ranks.items():
        out[k]["rank"], out[k]["rank_seeds"] = rank, common
        if len(values[k]) >= 2:  # the interval holds the point rank (it can lie outside only without shared seeds)
            low, high = intervals[k]
            out[k]["rank_low"], out[k]["rank_high"] = min(low, rank), max(high, rank)
    return out


COLUMNS: dict[str, Any] = {
    "reference": None, "verdict": None, "verdict_note": "", "paired_seeds": 0, "estimate": math.nan,
    "estimate_low": math.nan, "estimate_high": math.nan, "p": math.nan, "p_holm": math.nan,
    "p_equivalence": math.nan, "p_equivalence_holm": math.nan, "margin": math.nan, "wins": math.nan,
    "seeds_to_decide": None, "floor": False, "floor_note": "", "p_untrained_holm": math.nan,
    "collapsed": math.nan, "collapse_seeds": math.nan, "rank": math.nan, "rank_low": math.nan, "rank_high": math.nan,
    "rank_seeds": math.nan,
}


def _empty() -> dict[str, Any]:
    return dict(COLUMNS)
