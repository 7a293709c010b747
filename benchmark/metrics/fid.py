"""Distances between feature distributions: Frechet distance (FID) and KID.

Pure numpy/scipy maths, float64 throughout; no networks here (see
`benchmark.metrics.features`). Each function names the equation it implements.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import linalg

__all__ = ["frechet_distance", "kid", "GaussianMoments"]


def _as_stats(mu: np.ndarray, sigma: np.ndarray, which: str) -> tuple[np.ndarray, np.ndarray]:
    mu = np.atleast_1d(np.asarray(mu, dtype=np.float64))
    sigma = np.atleast_2d(np.asarray(sigma, dtype=np.float64))
    if mu.ndim != 1 or sigma.shape != (mu.shape[0], mu.shape[0]):
        raise ValueError(
            f"{which}: expected a mean of shape [D] and a covariance of shape [D, D], "
            f"got {tuple(mu.shape)} and {tuple(sigma.shape)}"
        )
    return mu, sigma


def frechet_distance(
    mu1: np.ndarray,
    sigma1: np.ndarray,
    mu2: np.ndarray,
    sigma2: np.ndarray,
    *,
    eps: float = 1e-6,
) -> float:
    """Frechet distance between N(mu1, sigma1) and N(mu2, sigma2), in float64.

    d^2 = ||mu1 - mu2||^2 + Tr(sigma1 + sigma2 - 2 (sigma1 sigma2)^(1/2))
    (Dowson & Landau 1982; used as FID by Heusel et al. 2017). Numerical
    handling follows pytorch-fid so that values are comparable with it: if the
    matrix square root of the product is not finite (near-singular
    covariances), `eps` is added to both diagonals and the root recomputed;
    a small imaginary residue from `scipy.linalg.sqrtm` is dropped, a large one
    (|imag| on the diagonal > 1e-3) is an error.
    """
    mu1, sigma1 = _as_stats(mu1, sigma1, "first distribution")
    mu2, sigma2 = _as_stats(mu2, sigma2, "second distribution")
    if mu1.shape != mu2.shape:
        raise ValueError(
            f"feature dimensions differ: {mu1.shape[0]} vs {mu2.shape[0]}; "
            "both statistics must come from the same extractor"
        )

    diff = mu1 - mu2
    covmean = linalg.sqrtm(sigma1 @ sigma2)
    if not np.isfinite(covmean).all():
        # Near-singular product (e.g. fewer samples than feature dimensions):
        # regularise both covariances, as pytorch-fid does.
        offset = np.eye(sigma1.shape[0]) * eps
        covmean = linalg.sqrtm((sigma1 + offset) @ (sigma2 + offset))
    if np.iscomplexobj(covmean):
        # sigma1 sigma2 has real non-negative eigenvalues in exact arithmetic
        # (it is similar to sigma1^1/2 sigma2 sigma1^1/2); imaginary parts are
        # rounding residue unless they are large.
        if not np.allclose(np.diagonal(covmean).imag, 0.0, atol=1e-3):
            raise ValueError(
                f"sqrtm(sigma1 @ sigma2) has an imaginary component of "
                f"{np.max(np.abs(covmean.imag)):.3g}; the covariances are not "
                "valid (symmetric positive semi-definite) or badly conditioned"
            )
        covmean = covmean.real
    value = diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2.0 * np.trace(covmean)
    return float(value)


def _polynomial_kernel(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    # k(x, y) = (x.y / d + 1)^3, the KID kernel of Binkowski et al. 2018.
    return (x @ y.T / x.shape[1] + 1.0) ** 3


def kid(
    feats_a: np.ndarray,
    feats_b: np.ndarray,
    *,
    num_subsets: int = 100,
    subset_size: int = 1000,
    seed: int = 0,
) -> tuple[float, float]:
    """Kernel Inception Distance (Binkowski et al. 2018): unbiased MMD^2.

    For each of `num_subsets` subsets, `m = min(subset_size, len(a), len(b))`
    rows are drawn without replacement from each set and the unbiased
    estimator (Gretton et al. 2012, eq. 3)

        MMD^2_u = sum_{i!=j} k(a_i,a_j)/(m(m-1)) + sum_{i!=j} k(b_i,b_j)/(m(m-1))
                  - 2 sum_{i,j} k(a_i,b_j)/m^2

    is evaluated with the cubic polynomial kernel. Returns (mean over subsets,
    standard error). The standard error is the spread of the per-subset
    estimates (standard deviation, ddof=1), i.e. the standard error of one
    size-m estimate -- the convention of Binkowski et al. and clean-fid. It is
    conservative for the average (subsets overlap, so dividing by
    sqrt(num_subsets) would overstate the precision); NaN when num_subsets=1.
    The mean can be negative: the estimator is unbiased, not clipped.
    """
    a = np.asarray(feats_a, dtype=np.float64)
    b = np.asarray(feats_b, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(
            f"kid expects two [N, D] feature arrays with the same D, got {a.shape} and {b.shape}"
        )
    if num_subsets < 1:
        raise ValueError(f"num_subsets must be >= 1, got {num_subsets}")
    m = min(subset_size, a.shape[0], b.shape[0])
    if m < 2:
        raise ValueError(
            f"kid needs at least 2 samples per set (got {a.shape[0]} and {b.shape[0]}, "
            f"subset_size={subset_size})"
        )

    rng = np.random.default_rng(seed)
    estimates = np.empty(num_subsets, dtype=np.float64)
    for s in range(num_subsets):
        x = a[rng.choice(a.shape[0], m, replace=False)]
        y = b[rng.choice(b.shape[0], m, replace=False)]
        k_xx = _polynomial_kernel(x, x)
        k_yy = _polynomial_kernel(y, y)
        k_xy = _polynomial_kernel(x, y)
        within = (k_xx.sum() - np.trace(k_xx) + k_yy.sum() - np.trace(k_yy)) / (m * (m - 1))
        estimates[s] = within - 2.0 * k_xy.mean()
    std_err = float(estimates.std(ddof=1)) if num_subsets > 1 else math.nan
    return float(estimates.mean()), std_err


class GaussianMoments:
    """Streaming mean and covariance (float64) of feature batches.

    Reference sets have up to 60k x 2048 features; holding them all in float64
    costs ~1 GB, so the sums are accumulated batch by batch instead. The sums
    are taken around a shift (the first batch's mean) to avoid the
    cancellation of the naive E[xx^T] - mu mu^T formula.
    """

    def __init__(self) -> None:
        self.count = 0
        self._shift: np.ndarray | None = None
        self._sum: np.ndarray | None = None
        self._outer: np.ndarray | None = None

    def update(self, batch: np.ndarray) -> None:
        """Add a [B, D] batch of features."""
        x = np.asarray(batch, dtype=np.float64)
        if x.ndim != 2:
            raise ValueError(f"expected a [B, D] batch, got shape {x.shape}")
        if x.shape[0] == 0:
            return
        if self._shift is None:
            self._shift = x.mean(axis=0)
            self._sum = np.zeros(x.shape[1])
            self._outer = np.zeros((x.shape[1], x.shape[1]))
        centred = x - self._shift
        self._sum += centred.sum(axis=0)
        self._outer += centred.T @ centred
        self.count += x.shape[0]

    def finalize(self) -> tuple[np.ndarray, np.ndarray]:
        """Return (mean, unbiased covariance), matching np.mean / np.cov(rowvar=False)."""
        if self.count < 2 or self._shift is None:
            raise ValueError(f"need at least 2 samples for a covariance, got {self.count}")
        mean_centred = self._sum / self.count
        cov = (self._outer - self.count * np.outer(mean_centred, mean_centred)) / (self.count - 1)
        return self._shift + mean_centred, cov
