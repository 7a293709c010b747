"""Per-client quality: does the global model serve every client's own data?

For each client, the Frechet distance between the generated samples and that
client's training images, in the same extractor space as the headline
distance. The client images are those of the seeded reference subset cached
with the reference statistics (`evaluation`), so no extra feature pass is
needed; this requires the reference split to be the training split the
clients hold. Reported as the mean and the worst (largest) client distance; a
method that groups clients (expert mixtures: `group_of_client`, each client's
expert) also gets the distance to each group's pooled data (the row keeps its
metrics.json name ``expert_<fd>_worst``). Row names: `benchmark.metrics.table`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dfbench.benchmark.metrics import table
from dfbench.benchmark.metrics.uncertainty import FrechetReference

__all__ = ["MIN_CLIENT_ROWS", "client_distances", "client_quality_rows"]

# A client with fewer subset rows than this is not scored (its covariance would be noise).
MIN_CLIENT_ROWS = 10


def client_distances(
    sample_feats: np.ndarray,
    subset_feats: np.ndarray,
    subset_indices: np.ndarray,
    groups: Sequence[np.ndarray],
) -> tuple[list[float | None], list[int]]:
    """Frechet distance from the samples to each group of dataset indices, using the subset rows it holds.

    Returns (distance per group, or None with fewer than MIN_CLIENT_ROWS rows; rows used per group).
    The samples are the fixed side of the eigenvalue form (one matrix square root for all groups).
    """
    samples = np.asarray(sample_feats, dtype=np.float64)
    subset = np.asarray(subset_feats, dtype=np.float64)
    indices = np.asarray(subset_indices)
    if subset.shape[0] != indices.shape[0]:
        raise ValueError(f"subset features ({subset.shape[0]} rows) and subset indices ({indices.shape[0]}) differ in length")
    if samples.ndim != 2 or subset.ndim != 2 or samples.shape[1] != subset.shape[1]:
        raise ValueError(f"features must be [N, D] in one extractor space, got {samples.shape} and {subset.shape}")
    ref = FrechetReference(samples.mean(axis=0), np.cov(samples, rowvar=False))
    out: list[float | None] = []
    used: list[int] = []
    for group in groups:
        rows = np.isin(indices, np.asarray(group))
        used.append(int(rows.sum()))
        # the Frechet distance is symmetric: client data against the samples' Gaussian
        out.append(ref.distance(subset[rows]) if rows.sum() >= MIN_CLIENT_ROWS else None)
    return out, used


def client_quality_rows(
    fd_metric: str,
    sample_feats: np.ndarray,
    subset_feats: np.ndarray,
    subset_indices: np.ndarray,
    client_indices: Sequence[np.ndarray],
    group_of_client: np.ndarray | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """Rows ``client_<fd>_mean`` / ``client_<fd>_worst`` (and ``expert_<fd>_worst``), or ([], why not)."""
    per_client, used = client_distances(sample_feats, subset_feats, subset_indices, client_indices)
    scored = [d for d in per_client if d is not None]
    if not scored:
        return [], (f"per-client quality: no client holds {MIN_CLIENT_ROWS} images of the "
                    f"{len(subset_indices)}-image reference subset (too many clients for the subset)")
    mean_name, worst_name, group_name = table.client_metric_names(fd_metric)
    info = {"per_client": per_client, "client_subset_rows": used, "clients_scored": len(scored),
            "num_clients": len(per_client), "better": table.better(mean_name), "min_client_rows": MIN_CLIENT_ROWS}
    worst = int(np.nanargmax([np.nan if d is None else d for d in per_client]))
    rows: list[dict[str, Any]] = [
        {"metric": mean_name, "value": float(np.mean(scored)), **info},
        {"metric": worst_name, "value": float(max(scored)), "worst_client": worst, **info},
    ]
    if group_of_client is not None:
        owner = np.asarray(group_of_client)
        groups = [np.concatenate([client_indices[c] for c in np.flatnonzero(owner == e)]) for e in range(int(owner.max()) + 1)]
        per_expert, expert_rows = client_distances(sample_feats, subset_feats, subset_indices, groups)
        if any(d is not None for d in per_expert):
            rows.append({"metric": group_name,
                         "value": float(max(d for d in per_expert if d is not None)),
                         "per_expert": per_expert, "expert_subset_rows": expert_rows, "better": table.better(group_name)})
    return rows, None
