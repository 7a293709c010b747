"""datasets.partitioners: spec parsing and the five partitioners."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dfbench.datasets import Partition, PartitionSpec, parse_partition, partition
from dfbench.datasets.partitioners import MAX_TRIES, cluster_features, mean_tv_distance

FMNIST_SYS = Path("/usr/share/datasets/fashion-mnist")


@pytest.fixture(scope="module")
def fmnist_labels() -> np.ndarray:
    """The real Fashion-MNIST train labels when installed, else same-size balanced labels."""
    if (FMNIST_SYS / "train-labels-idx1-ubyte.gz").is_file():
        from dfbench.datasets import load

        return load("fmnist", "train").labels.numpy()
    return np.random.default_rng(123).permutation(np.repeat(np.arange(10), 6000))


def check_valid(p: Partition, n: int, num_clients: int, *, all_assigned: bool = True, min_size: int = 1):
    assert isinstance(p, Partition) and len(p.indices) == num_clients
    for idx in p.indices:
        assert idx.dtype == np.int64 and idx.ndim == 1
        assert np.all(np.diff(idx) > 0), "sorted, no duplicates within a client"
        assert idx.size == 0 or (idx[0] >= 0 and idx[-1] < n)
        assert idx.size >= min_size
    allidx = np.concatenate(p.indices)
    assert np.unique(allidx).size == allidx.size, "an index is assigned to two clients"
    if all_assigned:
        assert allidx.size == n


def same(a: Partition, b: Partition) -> bool:
    return len(a.indices) == len(b.indices) and all(np.array_equal(x, y) for x, y in zip(a.indices, b.indices))


# ---------------------------------------------------------------------------------------------
# spec parsing


@pytest.mark.parametrize("text,kind,param,canon", [
    ("iid", "iid", None, "iid"),
    (" IID ", "iid", None, "iid"),
    ("dirichlet:0.5", "dirichlet", 0.5, "dirichlet:0.5"),
    ("dirichlet: 100", "dirichlet", 100.0, "dirichlet:100"),
    ("dirichlet:1e-2", "dirichlet", 0.01, "dirichlet:0.01"),
    ("shards:2", "shards", 2, "shards:2"),
    ("quantity:0", "quantity", 0.0, "quantity:0"),
    ("quantity:1.5", "quantity", 1.5, "quantity:1.5"),
    ("clusters:4", "clusters", 4, "clusters:4"),
])
def test_parse_valid(text, kind, param, canon):
    ps = parse_partition(text)
    assert ps == PartitionSpec(kind, param) and str(ps) == canon
    assert parse_partition(ps) == ps


@pytest.mark.parametrize("text", [
    "", "iid:3", "dirichlet", "dirichlet:", "dirichlet:0", "dirichlet:-1", "dirichlet:nan",
    "dirichlet:inf", "dirichlet:abc", "shards:0", "shards:1.5", "shards:x", "quantity:-0.1",
    "clusters:0", "clusters", "label_skew:3", "noniid",
])
def test_parse_invalid(text):
    with pytest.raises(ValueError) as e:
        parse_partition(text)
    msg = str(e.value)
    assert repr(text) in msg
    for form in ("iid", "dirichlet:ALPHA", "shards:K", "quantity:SIGMA", "clusters:K"):
        assert form in msg


def test_parse_non_string():
    with pytest.raises(ValueError, match="valid forms"):
        parse_partition(3)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# acceptance: Dirichlet on Fashion-MNIST-size labels


@pytest.mark.parametrize("alpha", [0.05, 0.5, 100])
@pytest.mark.parametrize("clients", [10, 100])
def test_dirichlet_acceptance(fmnist_labels, alpha, clients):
    y = fmnist_labels
    p = partition(y, f"dirichlet:{alpha}", clients, seed=0)
    check_valid(p, y.size, clients)
    assert p.spec == f"dirichlet:{alpha:g}"
    assert same(p, partition(y, f"dirichlet:{alpha}", clients, seed=0))
    assert not same(p, partition(y, f"dirichlet:{alpha}", clients, seed=1))
    hist = p.histogram(y)
    dist = hist / hist.sum(axis=1, keepdims=True)
    tv_to_uniform = 0.5 * np.abs(dist - 0.1).sum(axis=1)
    het = p.heterogeneity(y)
    if alpha == 100:  # near-iid: every client's label distribution is close to uniform
        assert tv_to_uniform.max() < 0.15, tv_to_uniform.max()
        assert het < 0.06
        assert p.sizes.max() / p.sizes.min() < 1.5
    elif alpha == 0.05:  # strongly skewed
        assert het > 0.6
        top2 = np.sort(dist, axis=1)[:, -2:].sum(axis=1)
        assert np.median(top2) > 0.75  # most clients are dominated by one or two classes
    else:
        assert 0.25 < het < 0.6


def test_iid_is_balanced(fmnist_labels):
    y = fmnist_labels
    p = partition(y, "iid", 7, seed=3)
    check_valid(p, y.size, 7)
    assert p.sizes.max() - p.sizes.min() <= 1
    assert p.heterogeneity(y) < 0.02
    assert p.cluster_of_client is None


# ---------------------------------------------------------------------------------------------
# properties (hypothesis; derandomized so CI is deterministic)


@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(
    alpha=st.floats(0.01, 100.0),
    clients=st.integers(2, 200),
    classes=st.integers(2, 10),
    n=st.integers(1, 3000),
    seed=st.integers(0, 2**32 - 1),
    min_size=st.integers(0, 5),
)
def test_dirichlet_properties(alpha, clients, classes, n, seed, min_size):
    y = np.random.default_rng(seed).integers(0, classes, n)
    spec = f"dirichlet:{alpha!r}"
    t0 = time.perf_counter()
    try:
        p = partition(y, spec, clients, seed, min_size=min_size)
    except ValueError as e:
        event("refused")
        assert time.perf_counter() - t0 < 10, "a refusal must come in bounded time"
        msg = str(e)
        assert "dirichlet" in msg and str(clients) in msg
        assert clients > n or clients * min_size > n or (
            f"min_size={min_size}" in msg and "fewer clients" in msg and "larger alpha" in msg)
        return
    event("partitioned")
    check_valid(p, n, clients, min_size=min_size)
    assert same(p, partition(y, spec, clients, seed, min_size=min_size))
    others = [partition(y, spec, clients, (seed + d) % 2**32, min_size=min_size) for d in range(1, 9)]
    assert any(not same(p, o) for o in others), "another seed must give another partition"


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(
    kind=st.sampled_from(["iid", "shards:1", "shards:2", "shards:3", "quantity:0", "quantity:0.7",
                          "quantity:2"]),
    clients=st.integers(2, 200),
    classes=st.integers(3, 10),
    n=st.integers(1, 3000),
    seed=st.integers(0, 2**32 - 1),
)
def test_other_kinds_properties(kind, clients, classes, n, seed):
    y = np.random.default_rng(seed).integers(0, classes, n)
    try:
        p = partition(y, kind, clients, seed)
    except ValueError as e:
        event(f"refused: {str(e).split(':')[1][:40]}")
        assert kind.split(":")[0] in str(e)
        return
    event("partitioned")
    present = np.unique(y).size
    all_assigned = not kind.startswith("shards") or clients * int(kind.split(":")[1]) >= present
    check_valid(p, n, clients, all_assigned=all_assigned)
    assert same(p, partition(y, kind, clients, seed))
    others = [partition(y, kind, clients, (seed + d) % 2**32) for d in range(1, 9)]
    assert any(not same(p, o) for o in others)
    if kind.startswith("shards"):
        k = int(kind.split(":")[1])
        assert ((p.histogram(y) > 0).sum(axis=1) <= k).all()


# ---------------------------------------------------------------------------------------------
# errors and bounds


def test_more_clients_than_samples():
    with pytest.raises(ValueError, match="11 clients but only 10 samples"):
        partition(np.arange(10) % 2, "iid", 11, 0)


def test_min_size_impossible_is_immediate():
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="min_size=30.*needs 300 samples, only 100"):
        partition(np.arange(100) % 10, "dirichlet:1", 10, 0, min_size=30)
    assert time.perf_counter() - t0 < 1


def test_min_size_unreachable_gives_up(fmnist_labels):
    t0 = time.perf_counter()
    with pytest.raises(ValueError) as e:
        partition(fmnist_labels, "dirichlet:0.01", 200, 0, min_size=50)
    assert time.perf_counter() - t0 < 30
    msg = str(e.value)
    for part in ("dirichlet:0.01", "200 clients", "min_size=50", f"{MAX_TRIES} tries",
                 "fewer clients", "larger alpha", "smaller min_size"):
        assert part in msg


def test_min_size_met_by_retry():
    y = np.random.default_rng(0).integers(0, 10, 2000)
    first = partition(y, "dirichlet:0.2", 50, 0, min_size=0)  # the seed's own draw
    assert first.sizes.min() < 5
    p = partition(y, "dirichlet:0.2", 50, 0, min_size=5)  # a derived seed's draw
    assert p.sizes.min() >= 5 and not same(p, first)
    check_valid(p, y.size, 50, min_size=5)
    assert same(p, partition(y, "dirichlet:0.2", 50, 0, min_size=5))


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_clients=0), "num_clients must be >= 1"),
    (dict(num_clients=2.0), "num_clients must be an integer"),
    (dict(seed=-1), "seed must be >= 0"),
    (dict(min_size=-1), "min_size must be >= 0"),
])
def test_bad_arguments(kwargs, match):
    args = dict(num_clients=2, seed=0) | kwargs
    with pytest.raises(ValueError, match=match):
        partition(np.arange(10) % 3, "iid", **args)


def test_bad_labels():
    with pytest.raises(ValueError, match="1-D"):
        partition(np.zeros((4, 2), int), "iid", 2, 0)
    with pytest.raises(ValueError, match="integers"):
        partition(np.zeros(4), "iid", 2, 0)
    with pytest.raises(ValueError, match=">= 0"):
        partition(np.array([0, -1, 1, 2]), "iid", 2, 0)


def test_independent_of_global_rng_and_input_type():
    y = np.random.default_rng(0).integers(0, 10, 1000)
    np.random.seed(1)
    torch.manual_seed(1)
    a = partition(y, "dirichlet:0.3", 10, 42)
    np.random.seed(2)
    torch.manual_seed(2)
    np.random.random(100)
    b = partition(torch.from_numpy(y), "dirichlet:0.3", 10, 42)
    c = partition(y.astype(np.int32).tolist(), "dirichlet:0.3", 10, 42)
    assert same(a, b) and same(a, c)


def test_partition_is_immutable():
    p = partition(np.arange(100) % 10, "iid", 4, 0)
    with pytest.raises(ValueError):
        p.indices[0][0] = 5
    with pytest.raises(AttributeError):
        p.spec = "x"  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# shards


@pytest.mark.parametrize("k", [1, 2, 3, 10])
def test_shards_classes_per_client(fmnist_labels, k):
    y = fmnist_labels
    p = partition(y, f"shards:{k}", 20, seed=5)
    check_valid(p, y.size, 20)
    per_client = (p.histogram(y) > 0).sum(axis=1)
    assert (per_client <= k).all() and (per_client == k).all()
    # class usage is balanced: every class is held by 20*k/10 clients (+-1)
    holders = (p.histogram(y) > 0).sum(axis=0)
    assert holders.max() - holders.min() <= 1


def test_shards_drops_unheld_classes_only_when_it_must():
    y = np.repeat(np.arange(10), 30)
    p = partition(y, "shards:2", 3, seed=0)  # 3 clients x 2 classes < 10 classes
    check_valid(p, y.size, 3, all_assigned=False)
    assert np.concatenate(p.indices).size == 6 * 30
    assert p.summary(y).attrs["dropped"] == 4 * 30


def test_shards_k_larger_than_classes():
    with pytest.raises(ValueError, match="K=4 classes per client but the labels have only 3"):
        partition(np.arange(30) % 3, "shards:4", 3, 0)


# ---------------------------------------------------------------------------------------------
# quantity


def test_quantity_sigma_zero_is_equal():
    y = np.arange(1003) % 10
    p = partition(y, "quantity:0", 10, seed=1)
    check_valid(p, y.size, 10)
    assert p.sizes.max() - p.sizes.min() <= 1


@pytest.mark.parametrize("sigma", [0.5, 1.0, 1.5])
def test_quantity_lognormal_spread(sigma):
    n, clients = 300_000, 1000
    y = np.zeros(n, dtype=np.int64)
    p = partition(y, f"quantity:{sigma}", clients, seed=7)
    check_valid(p, n, clients)
    logs = np.log(p.sizes)
    assert abs(logs.std() - sigma) < 0.1 * sigma + 0.03, (logs.std(), sigma)
    assert p.sizes.sum() == n


def test_quantity_respects_min_size():
    y = np.arange(500) % 5
    p = partition(y, "quantity:3", 50, seed=0, min_size=4)
    assert p.sizes.min() >= 4
    check_valid(p, 500, 50, min_size=4)


# ---------------------------------------------------------------------------------------------
# clusters


def blobs(n_per: int = 150, k: int = 4, seed: int = 0, size: int = 8):
    """k well-separated image blobs: blob j is a distinct random template plus small noise."""
    rng = np.random.default_rng(seed)
    templates = rng.integers(0, 256, (k, 1, size, size))
    blob = np.repeat(np.arange(k), n_per)
    rng.shuffle(blob)
    noise = rng.integers(-8, 9, (blob.size, 1, size, size))
    images = np.clip(templates[blob] + noise, 0, 255).astype(np.uint8)
    return images, blob


@pytest.mark.parametrize("clients", [4, 10])
def test_clusters_recover_blobs(clients):
    images, blob = blobs()
    labels = np.zeros(blob.size, dtype=np.int64)
    p = partition(labels, "clusters:4", clients, seed=3, images=images)
    check_valid(p, blob.size, clients)
    assert p.cluster_of_client.tolist() == [c % 4 for c in range(clients)]
    blob_of_client = []
    for idx in p.indices:
        owners = np.unique(blob[idx])
        assert owners.size == 1, "a client mixes blobs"
        blob_of_client.append(int(owners[0]))
    # clients of one cluster share a blob; different clusters have different blobs
    for c in range(clients):
        for d in range(clients):
            assert (blob_of_client[c] == blob_of_client[d]) == (c % 4 == d % 4)
    # each cluster's samples are split iid (+-1) among its clients
    for j in range(4):
        sizes = p.sizes[p.cluster_of_client == j]
        assert sizes.max() - sizes.min() <= 1
    js = p.to_json(labels)
    assert js["cluster_of_client"] == [c % 4 for c in range(clients)]


def test_clusters_reproducible_and_torch_input():
    images, blob = blobs(n_per=60)
    labels = blob % 2
    a = partition(labels, "clusters:4", 8, seed=11, images=images)
    b = partition(labels, "clusters:4", 8, seed=11, images=torch.from_numpy(images))
    c = partition(labels, "clusters:4", 8, seed=12, images=images)
    assert same(a, b) and not same(a, c)


def test_clusters_feature_map_is_fixed():
    images, _ = blobs(n_per=10)
    f1 = cluster_features(images)
    f2 = cluster_features(torch.from_numpy(images))
    f3 = cluster_features(images[:, 0])  # [N, H, W]
    assert f1.shape == (40, 32)
    np.testing.assert_array_equal(f1, f2)
    np.testing.assert_array_equal(f1, f3)


def test_clusters_errors():
    images, blob = blobs(n_per=20)
    y = np.zeros(blob.size, dtype=np.int64)
    with pytest.raises(ValueError, match="pass images"):
        partition(y, "clusters:4", 4, 0)
    with pytest.raises(ValueError, match="3 clients for 4 clusters.*num_clients >= 4"):
        partition(y, "clusters:4", 3, 0, images=images)
    with pytest.raises(ValueError, match="80 images but 79 labels"):
        partition(y[:-1], "clusters:4", 4, 0, images=images)
    # 7 clients: clusters 0-2 have two clients (10 samples each), cluster 3 one
    with pytest.raises(ValueError, match="clusters:4.*min_size=11.*fewer clients or clusters"):
        partition(y, "clusters:4", 7, 0, images=images, min_size=11)
    assert partition(y, "clusters:4", 7, 0, images=images, min_size=10).sizes.min() == 10


def test_clusters_on_fmnist_runs_in_reasonable_time():
    if not (FMNIST_SYS / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip("Fashion-MNIST not installed")
    from dfbench.datasets import load

    ds = load("fmnist", "test")
    t0 = time.perf_counter()
    p = partition(ds.labels, "clusters:5", 10, 0, images=ds.images)
    assert time.perf_counter() - t0 < 20
    check_valid(p, len(ds), 10)
    assert p.heterogeneity(ds.labels) > 0.2  # clusters of images are label-skewed


# ---------------------------------------------------------------------------------------------
# result helpers


def test_histogram_json_summary():
    y = np.repeat(np.arange(4), 25)
    p = partition(y, "shards:1", 4, seed=0)
    h = p.histogram(y, num_classes=4)
    assert h.dtype == np.int64 and h.shape == (4, 4)
    assert sorted(h.max(axis=1).tolist()) == [25] * 4 and (h > 0).sum() == 4
    js = p.to_json(y)
    json.dumps(js)
    assert js["spec"] == "shards:1" and js["sizes"] == [25] * 4 and js["num_assigned"] == 100
    assert len(js["label_histograms"]) == 4 and js["cluster_of_client"] is None
    assert "indices" not in js and len(js["indices_sha256"]) == 64
    assert js["heterogeneity"]["metric"] == "mean_tv_to_global"
    assert js["heterogeneity"]["value"] == pytest.approx(0.75)  # disjoint classes: 1 - 1/4
    df = p.summary(y)
    assert list(df.columns) == ["size", "classes", "top_class_share", "tv_to_global"]
    assert df["classes"].tolist() == [1] * 4
    assert df.attrs["heterogeneity"] == pytest.approx(0.75)
    assert "total-variation" in df.attrs["heterogeneity_metric"]
    with pytest.raises(ValueError, match="num_classes"):
        p.histogram(y, num_classes=3)


def test_mean_tv_distance():
    assert mean_tv_distance(np.array([[5, 5], [5, 5]])) == 0
    assert mean_tv_distance(np.array([[10, 0], [0, 10]])) == pytest.approx(0.5)
    assert mean_tv_distance(np.array([[10, 0], [0, 0]])) == 0  # empty clients are ignored
