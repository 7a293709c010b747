"""Memorization: which generated samples are copies of a training image, and whose.

The rule of Yoon et al. 2023, "Diffusion probabilistic models generalize when they
fail to memorize" (ICML 2023 workshop on structured probabilistic inference &
generative modeling), as used by Gu et al. 2023, "On memorization in diffusion
models": a sample x is a copy when

    ||x - NN1(x)|| / ||x - NN2(x)|| < 1/3,

NN1 / NN2 its nearest and second nearest training rows (Euclidean, in pixel or in a
feature extractor's space). A ratio needs no scale, unlike a distance threshold: x
must be far closer to one training image than to any other. When d2 == 0 the ratio
is 0/0; such a sample is a copy iff d1 == 0 (it equals two identical training
images, which real datasets do contain, and is still a copy).

Baselines a model that does not memorize would show: the same rule applied to
held-out test images (`copy_rate_test_*`), and the distance of a sample to its
nearest *test* row next to its nearest *training* row (`nn_test_*` vs `nn_train_*`;
a model that copies has nn_train << nn_test). In federated training a copy also
names a client: the owner of NN1, so `copy_rate_client_max_*` says how much one
client's data leaks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from dfbench.benchmark.core.seeds import derive_seed, np_rng
from dfbench.benchmark.metrics.uncertainty import bootstrap_statistic

__all__ = ["COPY_RATIO", "copy_flags", "memorization_rows", "nearest_two", "subsample"]

COPY_RATIO = 1 / 3  # Yoon et al. 2023; Gu et al. 2023
# Reference rows per query re-measured exactly after the matmul ranking: enough for
# near-ties and duplicated training images (ties among more equidistant rows than
# this are broken by the ranking, not by index).
_CANDIDATES = 8

Array = np.ndarray | torch.Tensor


def _rows(x: Array, name: str) -> torch.Tensor:
    """A float64 CPU matrix [rows, D], or ValueError naming `name`."""
    t = torch.as_tensor(x).detach().to(device="cpu", dtype=torch.float64)
    if t.ndim != 2:
        raise ValueError(f"{name} must be [rows, D] (flatten images first), got shape {tuple(t.shape)}")
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} contains NaN or inf")
    return t


def nearest_two(query: Array, reference: Array, *, chunk: int = 1024) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(d1 [M], d2 [M], idx1 [M]): distances to the nearest and second nearest reference row, and
    the index of the nearest (float64; of equidistant rows the lower index is the nearest)."""
    q, r = _rows(query, "query"), _rows(reference, "reference")
    if r.shape[0] < 2:
        raise ValueError(f"reference needs >= 2 rows for a second nearest neighbour, got {r.shape[0]}")
    if q.shape[1] != r.shape[1]:
        raise ValueError(f"query and reference differ in dimension: {q.shape[1]} vs {r.shape[1]}")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    k = min(_CANDIDATES, r.shape[0])
    r_sq = (r * r).sum(dim=1)
    d1, d2 = torch.empty(q.shape[0], dtype=torch.float64), torch.empty(q.shape[0], dtype=torch.float64)
    idx1 = torch.empty(q.shape[0], dtype=torch.long)
    for start in range(0, q.shape[0], chunk):
        block = q[start:start + chunk]
        # rank by ||b||^2 - 2ab (one matmul; ||a||^2 is the same for the whole row). Its rounding,
        # ~1e-16 ||a||^2, blurs near-ties and turns an exact copy's 0 into ~1e-8 ||a||, which would
        # make d1/d2 noise for a copy of a duplicated image: the best k are re-measured exactly.
        cand = torch.topk(r_sq[None, :] - 2.0 * (block @ r.T), k, dim=1, largest=False).indices
        cand = cand.sort(dim=1).values  # index order, so the stable sort below prefers the lower index
        exact = torch.stack([torch.linalg.vector_norm(block - r[cand[:, j]], dim=1) for j in range(k)], dim=1)
        dist, order = torch.sort(exact, dim=1, stable=True)
        stop = start + block.shape[0]
        d1[start:stop], d2[start:stop] = dist[:, 0], dist[:, 1]
        idx1[start:stop] = cand.gather(1, order[:, :1])[:, 0]
    return d1.numpy(), d2.numpy(), idx1.numpy()


def copy_flags(d1: np.ndarray, d2: np.ndarray, threshold: float = COPY_RATIO) -> np.ndarray:
    """d1 / d2 < threshold per row; where d2 == 0, a copy iff d1 == 0 (a sample equal to two
    identical training images is still a copy)."""
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], e.g. {COPY_RATIO:.4f}, got {threshold}")
    d1, d2 = np.asarray(d1, dtype=np.float64), np.asarray(d2, dtype=np.float64)
    if d1.shape != d2.shape:
        raise ValueError(f"d1 and d2 differ in shape: {d1.shape} vs {d2.shape}")
    with np.errstate(divide="ignore", invalid="ignore"):  # d2 == 0 is decided by the second branch
        return np.where(d2 > 0, d1 / d2 < threshold, d1 == 0)


def subsample(n_rows: int, k: int, seed: int) -> np.ndarray:
    """Sorted indices of k of n_rows rows drawn without replacement (all rows when k >= n_rows).

    The draw depends on (seed, n_rows, k) only, so every space of one evaluation takes the same
    test images and a test can reproduce the subset."""
    if k >= n_rows:
        return np.arange(n_rows)
    return np.sort(np_rng(seed, "memorization", "subsample").choice(n_rows, size=k, replace=False))


def _bootstrap_row(
    metric: str,
    values: np.ndarray,
    statistic: Callable[[np.ndarray], float],
    common: dict[str, Any],
    *,
    seed: int,
    replicates: int,
    over: str | None = None,
) -> dict[str, Any]:
    """A metrics row with a percentile-bootstrap interval, resampling `values` (one entry per image)."""
    point, interval = bootstrap_statistic(values, statistic, replicates=replicates,
                                          seed=derive_seed(seed, "bootstrap", metric), method="percentile")
    if over is not None:  # bootstrap_statistic names the rows "generated samples"
        interval = replace(interval, method=interval.method.replace("generated samples", over))
    return {"metric": metric, "value": point, **interval.as_row(), **common}


def memorization_rows(
    samples: Mapping[str, Array],
    train: Mapping[str, Array],
    owner: np.ndarray,
    test: Mapping[str, Array],
    *,
    num_clients: int,
    threshold: float = COPY_RATIO,
    seed: int = 0,
    replicates: int = 200,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Metric rows per space (the dicts' keys, e.g. "pixel", "fmnist") and notes on rows left out.

    copy_rate_<space>: fraction of samples that are copies of a training row.
    copy_rate_test_<space>: the same for min(T, M) seeded test rows (the no-memorization baseline).
    nn_train_<space> / nn_test_<space>: mean distance of a sample to its nearest training row /
        to its nearest of min(N, T) seeded test rows (equal set sizes keep the two comparable).
    copy_rate_client_max_<space>: max over clients k of the fraction of samples copying a row of
        client k; `per_client` lists every client's fraction (they sum to copy_rate), `client_of_max`
        names the client (None without copies). Its percentile interval can lie above the point when
        clients tie: the bootstrap maximum is biased upwards.
    Intervals are percentile bootstraps over the rows of each rate or mean.
    """
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if replicates < 2:
        raise ValueError(f"replicates must be >= 2 for an interval, got {replicates}")
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], e.g. {COPY_RATIO:.4f}, got {threshold}")
    owner = np.asarray(owner)
    if owner.ndim != 1 or not (owner.size == 0 or np.issubdtype(owner.dtype, np.integer)):
        raise ValueError(f"owner must be a 1-d integer array (client index per training row), got "
                         f"shape {owner.shape} dtype {owner.dtype}")
    if owner.size and (owner.min() < 0 or owner.max() >= num_clients):
        raise ValueError(f"owner values must lie in [0, num_clients={num_clients}), got "
                         f"{int(owner.min())}..{int(owner.max())}")
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for space, samp in samples.items():
        if space not in train:
            raise ValueError(f"train has no {space!r} rows; samples and train need the same spaces")
        x, tr = _rows(samp, f"samples[{space!r}]"), _rows(train[space], f"train[{space!r}]")
        te = _rows(test[space], f"test[{space!r}]") if space in test else None
        for name, other in ((f"train[{space!r}]", tr), (f"test[{space!r}]", te)):
            if other is not None and other.shape[1] != x.shape[1]:
                raise ValueError(f"samples[{space!r}] and {name} differ in dimension: {x.shape[1]} vs {other.shape[1]}")
        m, n = x.shape[0], tr.shape[0]
        if owner.shape[0] != n:
            raise ValueError(f"owner has {owner.shape[0]} entries but train[{space!r}] has {n} rows; "
                             f"one client index per training row")
        if n < 2:
            notes.append(f"memorization {space}: {n} training rows; the copy rule needs a second nearest neighbour")
            continue
        if m < 2:
            notes.append(f"memorization {space}: {m} samples; a bootstrap interval needs >= 2")
            continue
        common = {"space": space, "copy_threshold": float(threshold), "num_samples": m, "num_train": n}
        boot = {"seed": seed, "replicates": replicates}

        d1, d2, idx1 = nearest_two(x, tr)
        flags = copy_flags(d1, d2, threshold)
        rows.append(_bootstrap_row(f"copy_rate_{space}", flags.astype(np.float64), np.mean, common, **boot))
        rows.append(_bootstrap_row(f"nn_train_{space}", d1, np.mean, common, **boot))

        # the client whose training row each copy reproduces; -1 for samples that are no copy
        copied = np.where(flags, owner[idx1], -1)
        per_client = np.bincount(copied[copied >= 0], minlength=num_clients) / m
        row = _bootstrap_row(f"copy_rate_client_max_{space}", copied,
                             lambda c: np.bincount(c[c >= 0], minlength=num_clients).max() / c.shape[0],
                             common, **boot)
        row["per_client"] = [float(f) for f in per_client]
        row["client_of_max"] = int(per_client.argmax()) if flags.any() else None
        rows.append(row)

        if te is None:
            notes.append(f"memorization {space}: no test rows; copy_rate_test_{space} and nn_test_{space} left out")
            continue
        t = te.shape[0]
        # as many test images as samples, so the baseline rate is measured as precisely
        held = te[torch.from_numpy(subsample(t, min(t, m), seed))]
        if held.shape[0] < 2:
            notes.append(f"memorization {space}: {t} test rows; copy_rate_test_{space} needs >= 2")
        else:
            t1, t2, _ = nearest_two(held, tr)
            rows.append(_bootstrap_row(f"copy_rate_test_{space}", copy_flags(t1, t2, threshold).astype(np.float64),
                                       np.mean, {**common, "num_test": held.shape[0]}, **boot,
                                       over="held-out test images"))
        # nearest-neighbour distance shrinks as the set grows: compare with as many test rows as training rows
        ref = te[torch.from_numpy(subsample(t, min(t, n), seed))]
        if ref.shape[0] < 2:
            notes.append(f"memorization {space}: {t} test rows; nn_test_{space} needs >= 2")
            continue
        if t < n:
            notes.append(f"memorization {space}: nn_test_{space} uses all {t} test rows, fewer than the {n} training "
                         f"rows, so it is biased upwards against nn_train_{space}")
        s1, _, _ = nearest_two(x, ref)
        rows.append(_bootstrap_row(f"nn_test_{space}", s1, np.mean, {**common, "num_test": ref.shape[0]}, **boot))
    return rows, notes
