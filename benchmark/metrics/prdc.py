"""Precision, recall, density and coverage of generated samples in feature space.

Precision / recall: Kynkaanniemi et al. 2019, "Improved Precision and Recall
Metric for Assessing Generative Models" (k-NN balls, k = 3). Density /
coverage: Naeem et al. 2020, "Reliable Fidelity and Diversity Metrics for
Generative Models". Conventions follow the authors' `prdc` package (a point's
radius is the distance to its k-th nearest *other* point of its own set;
"inside" is strict `<`), so values match it exactly; distances are computed in
row chunks so a 10k x 10k comparison never holds the whole matrix.

    precision = mean_j [ exists i: ||f_j - r_i|| < rad_r(i) ]
    recall    = mean_i [ exists j: ||r_i - f_j|| < rad_f(j) ]
    density   = 1/(k M) sum_j #{ i: ||f_j - r_i|| < rad_r(i) }
    coverage  = mean_i [ min_j ||r_i - f_j|| < rad_r(i) ]
"""

from __future__ import annotations

import numpy as np

__all__ = ["PRDC_K", "PRDC_METRICS", "knn_radii", "prdc"]

PRDC_K = 3  # Kynkaanniemi et al. 2019 and Naeem et al. 2020 both use k = 3 in their main results
PRDC_METRICS: tuple[str, ...] = ("precision", "recall", "density", "coverage")
_CHUNK = 1024  # rows per distance block: 1024 x 10k float64 = 80 MB


def _distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Euclidean distances [len(a), len(b)] in float64 (expanded form, clipped at 0 before the root)."""
    sq = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * (a @ b.T)
    return np.sqrt(np.clip(sq, 0.0, None))


def _check(feats: np.ndarray, name: str, k: int) -> np.ndarray:
    x = np.asarray(feats, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"{name} features must be [N, D], got shape {x.shape}")
    if x.shape[0] <= k:
        raise ValueError(f"{name} features need more than k={k} rows for k-NN radii, got {x.shape[0]}")
    if not np.isfinite(x).all():
        raise ValueError(f"{name} features contain NaN or inf; check the extractor's input images")
    return x


def knn_radii(feats: np.ndarray, k: int = PRDC_K) -> np.ndarray:
    """Distance of every row to its k-th nearest other row of the same set."""
    x = _check(feats, "input", k)
    out = np.empty(x.shape[0])
    for start in range(0, x.shape[0], _CHUNK):
        block = _distances(x[start:start + _CHUNK], x)
        # the (k+1)-th smallest distance: the row itself (distance 0) is the 1st
        out[start:start + block.shape[0]] = np.partition(block, k, axis=1)[:, k]
    return out


def prdc(real: np.ndarray, fake: np.ndarray, k: int = PRDC_K) -> dict[str, float]:
    """Precision, recall, density and coverage of `fake` rows against `real` rows (same feature space)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    r = _check(real, "real", k)
    f = _check(fake, "fake", k)
    if r.shape[1] != f.shape[1]:
        raise ValueError(f"real and fake features differ in dimension: {r.shape[1]} vs {f.shape[1]}; use one extractor")
    rad_r, rad_f = knn_radii(r, k), knn_radii(f, k)
    fake_inside = np.zeros(f.shape[0], dtype=bool)  # precision: f_j in some real ball
    fake_count = np.zeros(f.shape[0], dtype=np.int64)  # density: real balls holding f_j
    real_recalled = np.empty(r.shape[0], dtype=bool)  # recall: r_i in some fake ball
    real_covered = np.empty(r.shape[0], dtype=bool)  # coverage: nearest fake inside r_i's ball
    for start in range(0, r.shape[0], _CHUNK):
        stop = min(start + _CHUNK, r.shape[0])
        d = _distances(r[start:stop], f)
        inside = d < rad_r[start:stop, None]
        fake_inside |= inside.any(axis=0)
        fake_count += inside.sum(axis=0)
        real_recalled[start:stop] = (d < rad_f[None, :]).any(axis=1)
        real_covered[start:stop] = d.min(axis=1) < rad_r[start:stop]
    return {
        "precision": float(fake_inside.mean()),
        "recall": float(real_recalled.mean()),
        "density": float(fake_count.mean() / k),
        "coverage": float(real_covered.mean()),
    }
