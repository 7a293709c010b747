"""Uncertainty of scores and ranks that respect it.

- `FrechetReference`: the Frechet distance to *fixed* reference statistics in
  eigenvalue form. sqrt(Sigma_ref) is computed once; each distance then needs
  only the eigenvalues of one symmetric matrix, so a bootstrap over 2048-d
  Inception features stays affordable.
- `bootstrap_frechet`: an interval for the distance, resampling the generated
  samples' features (reference statistics fixed).
- `bootstrap_statistic`: the same resampling for any statistic of the rows.
- `t_interval`: mean and Student-t interval across seeds.
- `tie_ranks`: a method's rank is 1 + the number of methods *clearly* better
  (intervals disjoint). Overlap is not transitive: two methods whose intervals
  overlap can rank apart when a third is clearly better than one of them only.

Interval convention (recorded with every interval, see `Interval.method`):
"centred" (the default for Frechet distances) is the value +- half the replicates' central range,
[t - (q_hi - q_lo) / 2, t + (q_hi - q_lo) / 2]: an interval of the plug-in value at this sample count
(what another draw of as many samples would score), so it always holds the value it is shown beside.
The plug-in Frechet distance is biased upwards by O(d / n), and so is this interval: it is not an
interval of the population distance, and runs are compared at equal sample counts. "basic" is the
basic (reverse-percentile) bootstrap, [2 t - q_hi, 2 t - q_lo] (Davison & Hinkley 1997, eq. 5.6): it
subtracts the bias to first order and covers the population distance better (measured in
tests/unit/test_uncertainty.py), but it is an interval of another estimator than the value shown, and
with few samples in many dimensions it lies wholly below it (194 of 356 committed label-free
Fashion-MNIST distances, 200 samples in the autoencoder's space). Both have the same width; an
interval recorded as "basic" is turned into the "centred" one exactly (`recentre`). Intervals are
clipped at 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

__all__ = [
    "BootstrapMethod",
    "FrechetReference",
    "Interval",
    "bootstrap_frechet",
    "bootstrap_statistic",
    "centred_method",
    "default_replicates",
    "psd_sqrt",
    "recentre",
    "t_interval",
    "seed_interval",
    "tie_ranks",
]

BootstrapMethod = Literal["centred", "basic", "percentile"]
BOOTSTRAP_METHODS: tuple[str, ...] = ("centred", "basic", "percentile")
FRECHET_WHAT = "over generated samples (reference fixed)"  # what a Frechet interval resamples
# float64 elements of one batch of resampled feature sets [B, n, D] (2^24 = 128 MB)
_BATCH_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class Interval:
    """A confidence interval and how it was made (stored next to the value it belongs to)."""

    low: float
    high: float
    level: float  # e.g. 0.95
    method: str  # e.g. "basic bootstrap over generated samples (reference fixed)"
    replicates: int | None = None  # bootstrap replicates; None for analytic intervals

    def as_row(self) -> dict[str, Any]:
        """The fields a metrics row carries: ci_low, ci_high, ci_level, ci_method, ci_replicates."""
        return {
            "ci_low": float(self.low),
            "ci_high": float(self.high),
            "ci_level": float(self.level),
            "ci_method": self.method,
            "ci_replicates": self.replicates,
        }


def default_replicates(dims: int) -> int:
    """Bootstrap replicates for a feature dimension: 200 up to 512-d, 100 above (2048-d Inception)."""
    return 200 if dims <= 512 else 100


def psd_sqrt(sigma: np.ndarray) -> np.ndarray:
    """Symmetric square root of a symmetric PSD matrix via eigh (negative rounding residue clipped to 0)."""
    sym = torch.from_numpy(np.asarray(sigma, dtype=np.float64))
    vals, vecs = torch.linalg.eigh((sym + sym.T) / 2.0)  # torch: its thread count is ours to set
    return ((vecs * vals.clamp_min(0.0).sqrt()) @ vecs.T).numpy()


def _check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), e.g. 0.95, got {level}")


class FrechetReference:
    """Frechet distance to fixed reference statistics N(mu_ref, Sigma_ref), eigenvalue form.

    d^2 = ||mu - mu_ref||^2 + tr Sigma + tr Sigma_ref - 2 tr (Sigma Sigma_ref)^(1/2), and
    tr (Sigma Sigma_ref)^(1/2) = sum_i sqrt(lambda_i(A Sigma A)) with A = Sigma_ref^(1/2), since
    Sigma A A and A Sigma A have the same eigenvalues. For n centred samples Y = (X - mean) A,
    A Sigma A = Y^T Y / (n - 1), whose non-zero eigenvalues are those of the n x n Gram matrix
    Y Y^T / (n - 1): the smaller of the two is decomposed.
    """

    def __init__(self, mu: np.ndarray, sigma: np.ndarray, *, device: str | torch.device = "cpu") -> None:
        mu = np.atleast_1d(np.asarray(mu, dtype=np.float64))
        sigma = np.atleast_2d(np.asarray(sigma, dtype=np.float64))
        if mu.ndim != 1 or sigma.shape != (mu.shape[0], mu.shape[0]):
            raise ValueError(
                f"reference statistics must be a mean [D] and a covariance [D, D], got {mu.shape} and {sigma.shape}"
            )
        self.device = torch.device(device)
        self.dims = mu.shape[0]
        self.mu = torch.from_numpy(mu).to(self.device)
        self.trace_ref = float(np.trace(sigma))
        self._small = self.device.type == "cpu" and self.dims <= 512  # small CPU linear algebra: one thread
        with _one_thread(self._small):
            self.sqrt_ref = torch.from_numpy(psd_sqrt(sigma)).to(self.device)  # A, computed once

    def _check(self, feats: np.ndarray) -> torch.Tensor:
        x = np.asarray(feats, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.dims:
            raise ValueError(
                f"features must be [N, {self.dims}] (the reference's extractor), got {x.shape}"
            )
        if x.shape[0] < 2:
            raise ValueError(f"need at least 2 feature rows for a covariance, got {x.shape[0]}")
        return torch.from_numpy(x).to(self.device)

    def _distances(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Distances of a batch of row sets x [B, n, D] whose projections are y = x A."""
        n = x.shape[1]
        mean = x.mean(dim=1)
        diff = mean - self.mu
        trace = ((x - mean[:, None]) ** 2).sum(dim=(1, 2)) / (n - 1)
        yc = y - y.mean(dim=1, keepdim=True)
        gram = yc @ yc.transpose(1, 2) if n <= self.dims else yc.transpose(1, 2) @ yc
        eig = torch.linalg.eigvalsh(gram / (n - 1)).clamp_min(0.0)
        return (diff * diff).sum(dim=1) + trace + self.trace_ref - 2.0 * eig.sqrt().sum(dim=1)

    def _resampled(self, x: torch.Tensor, y: torch.Tensor, sq: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Distances of resampled row sets idx [B, n], through each row's multiplicity w (no row copies):
        mean = w x / n, tr Sigma = (w |x|^2 - n |mean|^2) / (n - 1),
        A Sigma A = (Y^T diag(w) Y - n m_y m_y^T) / (n - 1) with Y = x A, m_y = w Y / n."""
        b, n = idx.shape
        w = torch.zeros(b, n, dtype=x.dtype, device=x.device).scatter_add_(1, idx, torch.ones_like(idx, dtype=x.dtype))
        mean, my = w @ x / n, w @ y / n
        diff = mean - self.mu
        trace = (w @ sq - n * (mean * mean).sum(dim=1)) / (n - 1)
        if n <= self.dims:  # n x n Gram form: sqrt(w_i) (y_i - m_y) . (y_j - m_y) sqrt(w_j)
            yc = (y[None] - my[:, None]) * w.sqrt()[:, :, None]
            gram = yc @ yc.transpose(1, 2)
        else:
            gram = (y[None] * w[:, :, None]).transpose(1, 2) @ y - n * my[:, :, None] * my[:, None, :]
        eig = torch.linalg.eigvalsh(gram / (n - 1)).clamp_min(0.0)
        return (diff * diff).sum(dim=1) + trace + self.trace_ref - 2.0 * eig.sqrt().sum(dim=1)

    def distance(self, feats: np.ndarray) -> float:
        """Frechet distance from the features' Gaussian fit (mean, unbiased covariance) to the reference."""
        x = self._check(feats)
        with _one_thread(self._small or (self.device.type == "cpu" and x.shape[0] <= 512)):
            return float(self._distances(x[None], (x @ self.sqrt_ref)[None])[0])

    def bootstrap(
        self,
        feats: np.ndarray,
        *,
        replicates: int,
        seed: int,
        level: float = 0.95,
        method: BootstrapMethod = "centred",
    ) -> tuple[float, Interval, np.ndarray]:
        """(distance, interval, replicate distances) resampling the rows of `feats` with replacement."""
        _check_level(level)
        if replicates < 2:
            raise ValueError(f"replicates must be >= 2 for an interval, got {replicates}")
        if method not in BOOTSTRAP_METHODS:
            raise ValueError(f"unknown bootstrap method {method!r}; choose one of {list(BOOTSTRAP_METHODS)}")
        x = self._check(feats)
        y = x @ self.sqrt_ref  # projected once; a replicate is a row selection of both
        point = float(self._distances(x[None], y[None])[0])
        n = x.shape[0]
        # all replicate indices drawn up front from one seeded generator: the interval
        # does not depend on the batch size or the device
        gen = torch.Generator(device="cpu").manual_seed(int(seed) % (2**63))
        idx = torch.randint(0, n, (replicates, n), generator=gen).to(self.device)
        batch = max(1, _BATCH_ELEMENTS // (n * self.dims))  # replicates per batched eigvalsh (bounds memory)
        sq = (x * x).sum(dim=1)
        with _one_thread(self.device.type == "cpu" and min(n, self.dims) <= 512):
            reps = torch.cat([self._resampled(x, y, sq, i) for i in idx.split(batch)]).cpu().numpy()
        interval = _interval(point, reps, level, method, FRECHET_WHAT)
        if interval.low < 0:  # a distance is >= 0; the interval's half width (or the basic one's bias shift) can cross 0
            interval = Interval(0.0, max(interval.high, 0.0), level, interval.method + ", clipped at 0", replicates)
        return point, interval, reps


@contextmanager
def _one_thread(active: bool) -> Iterator[None]:
    """Run small batched CPU linear algebra on one thread: a batch of 200 128 x 128 eigvalsh
    took 15-38 s with 2 MKL threads on a busy 2-core machine, 0.4 s with one."""
    threads = torch.get_num_threads()
    if active:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def centred_method(level: float, what: str) -> str:
    """The `Interval.method` of a "centred" bootstrap interval (see the module doc)."""
    return f"{level:.0%} bootstrap interval of the value: ± half the central {level:.0%} range of the replicates {what}"


def recentre(value: float, low: float, high: float) -> tuple[float, float]:
    """A "basic" interval [2 t - q_hi, 2 t - q_lo] of value t as the "centred" one of the same replicates,
    t -+ (q_hi - q_lo) / 2 (the two have the same width), clipped at 0: exact, not an approximation."""
    half = (high - low) / 2
    return max(0.0, value - half), value + half


def _interval(point: float, reps: np.ndarray, level: float, method: str, what: str) -> Interval:
    lo_q, hi_q = np.quantile(reps, [(1 - level) / 2, (1 + level) / 2])
    if method == "centred":  # the value +- half the central range: always holds the value
        half = (hi_q - lo_q) / 2
        return Interval(float(point - half), float(point + half), level, centred_method(level, what), len(reps))
    if method == "basic":
        low, high = 2 * point - hi_q, 2 * point - lo_q
    else:
        low, high = lo_q, hi_q
    return Interval(float(low), float(high), level, f"{level:.0%} {method} bootstrap {what}", len(reps))


def bootstrap_frechet(
    feats: np.ndarray,
    mu_ref: np.ndarray,
    sigma_ref: np.ndarray,
    *,
    replicates: int = 200,
    seed: int = 0,
    level: float = 0.95,
    method: BootstrapMethod = "centred",
) -> tuple[float, Interval]:
    """Frechet distance of `feats` to N(mu_ref, sigma_ref) and its bootstrap interval."""
    point, interval, _ = FrechetReference(mu_ref, sigma_ref).bootstrap(
        feats, replicates=replicates, seed=seed, level=level, method=method
    )
    return point, interval


def bootstrap_statistic(
    rows: np.ndarray,
    statistic: Callable[[np.ndarray], float],
    *,
    replicates: int = 200,
    seed: int = 0,
    level: float = 0.95,
    method: BootstrapMethod = "basic",
) -> tuple[float, Interval]:
    """statistic(rows) and its bootstrap interval, resampling rows (axis 0) with replacement."""
    _check_level(level)
    if method not in BOOTSTRAP_METHODS:
        raise ValueError(f"unknown bootstrap method {method!r}; choose one of {list(BOOTSTRAP_METHODS)}")
    rows = np.asarray(rows)
    if rows.shape[0] < 2 or replicates < 2:
        raise ValueError(f"need >= 2 rows and >= 2 replicates, got {rows.shape[0]} and {replicates}")
    rng = np.random.default_rng(seed)
    point = float(statistic(rows))
    reps = np.array([statistic(rows[rng.integers(0, rows.shape[0], rows.shape[0])]) for _ in range(replicates)])
    return point, _interval(point, reps, level, method, "over generated samples")


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, Interval | None]:
    """Mean of per-seed values and its Student-t interval (None for fewer than 2 values).

    mean +- t_{(1+level)/2, n-1} * s / sqrt(n), s the sample standard deviation.
    """
    from scipy import stats

    _check_level(level)
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if x.size == 0:
        raise ValueError("t_interval needs at least one finite value")
    mean = float(x.mean())
    if x.size < 2:
        return mean, None
    half = float(stats.t.ppf((1 + level) / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return mean, Interval(mean - half, mean + half, level, f"{level:.0%} t-interval across {x.size} seeds")


def seed_interval(values: Sequence[float], positive: bool, level: float = 0.95) -> tuple[float, float, float]:
    """(point, low, high) over seeds: for a positive quantity (`positive`, all values > 0; a Frechet
    distance, a loss) the geometric mean and the t-interval of the log values mapped back, which never
    reaches 0; else the mean and its t-interval. NaN bounds with one value, all NaN with none."""
    x = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not x:
        return math.nan, math.nan, math.nan
    if positive and all(v > 0 for v in x):
        mean, interval = t_interval([math.log(v) for v in x], level)
        if interval is None:
            return math.exp(mean), math.nan, math.nan
        return math.exp(mean), math.exp(interval.low), math.exp(interval.high)
    mean, interval = t_interval(x, level)
    return (mean, interval.low, interval.high) if interval else (mean, math.nan, math.nan)


def tie_ranks(
    values: Sequence[float],
    lows: Sequence[float | None],
    highs: Sequence[float | None],
    *,
    higher_is_better: bool = False,
) -> list[tuple[int | None, bool]]:
    """(rank, tied) per entry: rank = 1 + number of entries clearly better.

    j is clearly better than i when their intervals are disjoint and j is on the
    better side (lower is better: high_j < low_i). Entries whose intervals
    overlap are not clearly better than one another, though they can still
    rank apart (a third entry clearly better than one of them only); `tied`
    marks a rank held by more than one entry. An entry without an interval
    counts as the point [value, value]; a missing / NaN value gets (None, False).
    """
    if not len(values) == len(lows) == len(highs):
        raise ValueError(f"values, lows and highs differ in length: {len(values)}, {len(lows)}, {len(highs)}")
    sign = -1.0 if higher_is_better else 1.0  # flip so that lower is better below
    spans: list[tuple[float, float] | None] = []
    for v, lo, hi in zip(values, lows, highs):
        if v is None or not math.isfinite(v):
            spans.append(None)
            continue
        lo = v if lo is None or not math.isfinite(lo) else lo
        hi = v if hi is None or not math.isfinite(hi) else hi
        a, b = sorted((sign * lo, sign * hi))
        spans.append((min(a, sign * v), max(b, sign * v)))
    ranks: list[int | None] = []
    for span in spans:
        if span is None:
            ranks.append(None)
            continue
        ranks.append(1 + sum(1 for other in spans if other is not None and other[1] < span[0]))
    counts: dict[int, int] = {}
    for r in ranks:
        if r is not None:
            counts[r] = counts.get(r, 0) + 1
    return [(r, r is not None and counts[r] > 1) for r in ranks]
