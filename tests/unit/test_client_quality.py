"""benchmark.metrics.client_quality: per-client (and per-expert) Frechet distances from the samples
to the clients' own images inside the cached reference subset."""

from __future__ import annotations

import numpy as np
import pytest

from dfbench.benchmark.metrics.client_quality import MIN_CLIENT_ROWS, client_distances, client_quality_rows
from dfbench.benchmark.metrics.fid import frechet_distance


def _fd(a: np.ndarray, b: np.ndarray) -> float:
    return frechet_distance(a.mean(0), np.cov(a, rowvar=False), b.mean(0), np.cov(b, rowvar=False))


def _setup():
    # prepare: a 200-image "dataset" of 4-d features; the subset holds 120 of them in seeded order;
    # client 0 holds images shifted by +2 (the samples look like client 1's data)
    rng = np.random.default_rng(0)
    data = rng.standard_normal((200, 4))
    data[:100] += 2.0
    subset_indices = rng.permutation(200)[:120]
    clients = [np.arange(0, 100), np.arange(100, 195), np.arange(195, 200)]  # client 2: too few rows
    samples = rng.standard_normal((80, 4))
    return data, subset_indices, clients, samples


def test_distances_use_each_clients_subset_rows():
    data, subset_indices, clients, samples = _setup()
    per_client, used = client_distances(samples, data[subset_indices], subset_indices, clients)
    for client, value, rows in zip(clients, per_client, used):
        held = subset_indices[np.isin(subset_indices, client)]
        assert rows == held.size
        if rows >= MIN_CLIENT_ROWS:
            assert value == pytest.approx(_fd(samples, data[held]), rel=1e-7)
        else:
            assert value is None  # too few rows: not scored, never zero
    assert per_client[0] > 5 * per_client[1]  # the shifted client is served worse


def test_rows_report_mean_worst_and_per_expert():
    data, subset_indices, clients, samples = _setup()
    rows, note = client_quality_rows("fd_fmnist", samples, data[subset_indices], subset_indices, clients,
                                     group_of_client=np.array([0, 1, 1]))
    assert note is None
    mean, worst, expert = rows
    scored = [v for v in mean["per_client"] if v is not None]
    assert mean["metric"] == "client_fd_fmnist_mean" and mean["value"] == pytest.approx(np.mean(scored))
    assert worst["metric"] == "client_fd_fmnist_worst" and worst["value"] == max(scored) and worst["worst_client"] == 0
    assert mean["clients_scored"] == 2 and mean["num_clients"] == 3
    # expert 1 pools clients 1 and 2
    pooled = subset_indices[np.isin(subset_indices, np.arange(100, 200))]
    assert expert["metric"] == "expert_fd_fmnist_worst"
    assert expert["per_expert"][1] == pytest.approx(_fd(samples, data[pooled]), rel=1e-7)
    assert expert["value"] == max(expert["per_expert"])


def test_no_scorable_client_is_a_note():
    data, subset_indices, _, samples = _setup()
    rows, note = client_quality_rows("fid", samples, data[subset_indices], subset_indices,
                                     [np.arange(i, i + 2) for i in range(0, 200, 2)])
    assert rows == [] and "too many clients" in note


def test_mismatched_inputs_are_rejected():
    data, subset_indices, clients, samples = _setup()
    with pytest.raises(ValueError, match="differ in length"):
        client_distances(samples, data[subset_indices][:5], subset_indices, clients)
    with pytest.raises(ValueError, match="one extractor space"):
        client_distances(samples[:, :3], data[subset_indices], subset_indices, clients)
