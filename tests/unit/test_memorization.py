"""benchmark.metrics.memorization: nearest neighbours against brute force, the copy rule, planted copies."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dfbench.benchmark.metrics import memorization as mem


def _brute_nearest_two(query: np.ndarray, reference: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d1, d2, idx1 = [], [], []
    for q in query:
        dist = np.array([np.linalg.norm(q - r) for r in reference])
        order = np.argsort(dist, kind="stable")
        d1.append(dist[order[0]])
        d2.append(dist[order[1]])
        idx1.append(order[0])
    return np.array(d1), np.array(d2), np.array(idx1)


def _by_metric(rows: list[dict]) -> dict[str, dict]:
    return {row["metric"]: row for row in rows}


def _planted(seed: int = 0, m: int = 20, n: int = 60, t: int = 80, d: int = 16):
    """Random training rows over 3 clients, random samples with sample 5 an exact copy of a client-2 row."""
    rng = np.random.default_rng(seed)
    train = rng.standard_normal((n, d))
    owner = rng.integers(0, 3, n)
    owner[17] = 2
    samples = rng.standard_normal((m, d))
    samples[5] = train[17]
    test = rng.standard_normal((t, d))
    return samples, train, owner, test


@pytest.mark.parametrize("as_torch", [False, True])
def test_nearest_two_equals_brute_force(as_torch):
    # prepare: 37 queries in 5 chunks of 8
    rng = np.random.default_rng(1)
    query, reference = rng.standard_normal((37, 11)), rng.standard_normal((53, 11))
    args = (torch.from_numpy(query).float(), torch.from_numpy(reference).float()) if as_torch else (query, reference)
    if as_torch:  # the reference sees the same float32-rounded values
        query, reference = args[0].double().numpy(), args[1].double().numpy()
    # execute
    d1, d2, idx1 = mem.nearest_two(*args, chunk=8)
    # assert
    e1, e2, eidx = _brute_nearest_two(query, reference)
    np.testing.assert_array_equal(idx1, eidx)
    np.testing.assert_allclose(d1, e1, rtol=0, atol=1e-9)
    np.testing.assert_allclose(d2, e2, rtol=0, atol=1e-9)


def test_nearest_two_ties_and_duplicates():
    # prepare: rows 2 and 5 identical; query 1 exactly between rows 0 and 1
    reference = np.array([[0.0, 0.0], [2.0, 0.0], [7.0, 7.0], [9.0, 9.0], [-5.0, 3.0], [7.0, 7.0]])
    query = np.array([[7.0, 7.0], [1.0, 0.0]])
    # execute
    d1, d2, idx1 = mem.nearest_two(query, reference)
    # assert: exact zeros for the copy of a duplicated row, lower index wins both ties
    np.testing.assert_array_equal(d1, [0.0, 1.0])
    np.testing.assert_array_equal(d2, [0.0, 1.0])
    np.testing.assert_array_equal(idx1, [2, 0])
    assert mem.copy_flags(d1, d2).tolist() == [True, False]


def test_copy_flags_by_hand():
    # prepare: ratio 0, exactly 1/3, just below, 0/0, d1 > d2 = 0 (not a valid pair), ratio 0.3
    d1 = np.array([0.0, 1.0, 0.99, 0.0, 2.0, 0.9])
    d2 = np.array([1.0, 3.0, 3.0, 0.0, 0.0, 3.0])
    # execute
    flags = mem.copy_flags(d1, d2)
    # assert: strict "<"; d2 == 0 is a copy iff d1 == 0
    assert flags.dtype == bool
    assert flags.tolist() == [True, False, True, True, False, True]
    assert mem.copy_flags(d1, d2, threshold=0.5).tolist() == [True, True, True, True, False, True]


def test_near_copy_is_flagged_and_midpoint_is_not():
    # prepare
    rng = np.random.default_rng(2)
    train = rng.standard_normal((50, 16))
    samples = np.stack([train[3] + 1e-3 * rng.standard_normal(16), (train[10] + train[20]) / 2])
    # execute
    d1, d2, idx1 = mem.nearest_two(samples, train)
    flags = mem.copy_flags(d1, d2)
    # assert
    assert flags.tolist() == [True, False]
    assert idx1[0] == 3


def test_planted_copy_rate_and_its_client():
    # prepare
    samples, train, owner, test = _planted()
    m = samples.shape[0]
    # execute
    rows, notes = mem.memorization_rows({"pixel": samples}, {"pixel": train}, owner, {"pixel": test},
                                        num_clients=3, seed=4, replicates=100)
    # assert
    got = _by_metric(rows)
    assert set(got) == {"copy_rate_pixel", "copy_rate_test_pixel", "nn_train_pixel", "nn_test_pixel",
                        "copy_rate_client_max_pixel"}
    assert notes == []
    rate = got["copy_rate_pixel"]
    assert rate["value"] == pytest.approx(1 / m)
    assert 0.0 <= rate["ci_low"] <= rate["value"] <= rate["ci_high"] <= 1.0
    assert rate["ci_replicates"] == 100 and "percentile" in rate["ci_method"]
    client = got["copy_rate_client_max_pixel"]
    assert client["per_client"] == pytest.approx([0.0, 0.0, 1 / m])
    assert client["client_of_max"] == 2 and client["value"] == pytest.approx(1 / m)
    assert sum(client["per_client"]) == pytest.approx(rate["value"])
    for row in rows:
        assert row["space"] == "pixel" and row["copy_threshold"] == mem.COPY_RATIO
        assert row["num_samples"] == m and row["num_train"] == train.shape[0]
        assert row["ci_low"] <= row["ci_high"]
    # a copy sits at distance 0, so the mean nearest training distance is below the test one
    assert got["nn_train_pixel"]["value"] < got["nn_test_pixel"]["value"]
    # the same seed gives the same rows
    again, _ = mem.memorization_rows({"pixel": samples}, {"pixel": train}, owner, {"pixel": test},
                                     num_clients=3, seed=4, replicates=100)
    assert again == rows


def test_no_copies_gives_zero_and_no_client():
    # prepare
    samples, train, owner, test = _planted()
    samples[5] += 5.0
    # execute
    rows, _ = mem.memorization_rows({"pixel": samples}, {"pixel": train}, owner, {"pixel": test}, num_clients=3)
    # assert
    got = _by_metric(rows)
    assert got["copy_rate_pixel"]["value"] == 0.0
    assert got["copy_rate_client_max_pixel"]["per_client"] == [0.0, 0.0, 0.0]
    assert got["copy_rate_client_max_pixel"]["client_of_max"] is None


def test_copy_rate_test_far_images_and_subset_size():
    # prepare: test images far from every training row; T > M so the baseline takes M of them
    samples, train, owner, test = _planted()
    far = test + 100.0
    # execute
    rows, _ = mem.memorization_rows({"fmnist": samples}, {"fmnist": train}, owner, {"fmnist": far},
                                    num_clients=3)
    # assert
    row = _by_metric(rows)["copy_rate_test_fmnist"]
    assert row["value"] == 0.0 and row["ci_low"] == row["ci_high"] == 0.0
    assert row["num_test"] == samples.shape[0]
    assert "held-out test images" in row["ci_method"]


def test_copy_rate_test_equals_the_rule_on_the_seeded_subset():
    # prepare: half the test set copies training rows
    samples, train, owner, test = _planted()
    test[:40] = train[:40]
    seed = 6
    sub = mem.subsample(test.shape[0], samples.shape[0], seed)
    # execute
    rows, _ = mem.memorization_rows({"pixel": samples}, {"pixel": train}, owner, {"pixel": test},
                                    num_clients=3, seed=seed)
    # assert
    e1, e2, _ = _brute_nearest_two(test[sub], train)
    expected = float(np.mean(e1 / e2 < 1 / 3))
    assert 0.0 < expected < 1.0  # the subset holds copies and non-copies
    assert _by_metric(rows)["copy_rate_test_pixel"]["value"] == pytest.approx(expected)


@pytest.mark.parametrize("t", [80, 40])
def test_nn_test_uses_min_n_t_seeded_test_rows(t):
    # prepare: N = 60 training rows, T = 80 (subset of 60) or 40 (all, with a note)
    samples, train, owner, test = _planted(t=t)
    seed = 3
    sub = mem.subsample(t, train.shape[0], seed)
    # execute
    rows, notes = mem.memorization_rows({"pixel": samples}, {"pixel": train}, owner, {"pixel": test},
                                        num_clients=3, seed=seed)
    # assert
    row = _by_metric(rows)["nn_test_pixel"]
    expected = np.mean([min(np.linalg.norm(s - r) for r in test[sub]) for s in samples])
    assert row["value"] == pytest.approx(expected, abs=1e-9)
    assert row["num_test"] == min(t, train.shape[0])
    assert row["ci_low"] <= row["value"] <= row["ci_high"]
    assert (len(notes) == 1 and "nn_test_pixel" in notes[0]) == (t < train.shape[0])
    nn_train = np.mean([min(np.linalg.norm(s - r) for r in train) for s in samples])
    assert _by_metric(rows)["nn_train_pixel"]["value"] == pytest.approx(nn_train, abs=1e-9)


def test_subsample_is_seeded_sorted_and_without_replacement():
    # execute
    a, b, c = mem.subsample(100, 30, 1), mem.subsample(100, 30, 1), mem.subsample(100, 30, 2)
    # assert
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert len(set(a.tolist())) == 30 and np.all(np.diff(a) > 0) and a.min() >= 0 and a.max() < 100
    np.testing.assert_array_equal(mem.subsample(10, 20, 1), np.arange(10))


def test_rows_that_cannot_be_computed_are_left_out_with_a_note():
    # prepare
    samples, train, owner, test = _planted()
    # execute: one training row; one sample; no test rows for the space
    one_train, notes_n = mem.memorization_rows({"pixel": samples}, {"pixel": train[:1]}, owner[:1],
                                               {"pixel": test}, num_clients=3)
    one_sample, notes_m = mem.memorization_rows({"pixel": samples[:1]}, {"pixel": train}, owner,
                                                {"pixel": test}, num_clients=3)
    no_test, notes_t = mem.memorization_rows({"pixel": samples}, {"pixel": train}, owner, {}, num_clients=3)
    # assert
    assert one_train == [] and "second nearest" in notes_n[0]
    assert one_sample == [] and "1 samples" in notes_m[0]
    assert {r["metric"] for r in no_test} == {"copy_rate_pixel", "nn_train_pixel", "copy_rate_client_max_pixel"}
    assert "no test rows" in notes_t[0]


@pytest.mark.parametrize(
    "case,match",
    [
        ("train_dim", r"samples\['pixel'\] and train\['pixel'\] differ in dimension"),
        ("test_dim", r"samples\['pixel'\] and test\['pixel'\] differ in dimension"),
        ("owner_length", "owner has 59 entries"),
        ("owner_negative", "owner values"),
        ("owner_too_large", "owner values"),
        ("owner_float", "owner must be a 1-d integer array"),
        ("missing_space", "train has no 'pixel'"),
        ("not_2d", r"samples\['pixel'\] must be \[rows, D\]"),
        ("num_clients", "num_clients"),
        ("replicates", "replicates"),
    ],
)
def test_bad_inputs_raise(case, match):
    # prepare
    samples, train, owner, test = _planted()
    kwargs = {"num_clients": 3}
    if case == "train_dim":
        train = train[:, :8]
    elif case == "test_dim":
        test = test[:, :8]
    elif case == "owner_length":
        owner = owner[:59]
    elif case == "owner_negative":
        owner[0] = -1
    elif case == "owner_too_large":
        owner[0] = 3
    elif case == "owner_float":
        owner = owner.astype(float)
    elif case == "not_2d":
        samples = samples.reshape(20, 4, 4)
    elif case == "num_clients":
        kwargs["num_clients"] = 0
    elif case == "replicates":
        kwargs["replicates"] = 1
    train_by_space = {"fmnist": train} if case == "missing_space" else {"pixel": train}
    # execute / assert
    with pytest.raises(ValueError, match=match):
        mem.memorization_rows({"pixel": samples}, train_by_space, owner, {"pixel": test}, **kwargs)


@pytest.mark.parametrize(
    "query,reference,match",
    [
        (np.zeros((3, 2)), np.zeros((1, 2)), "reference needs >= 2 rows"),
        (np.zeros((3, 2)), np.zeros((4, 3)), "differ in dimension"),
        (np.zeros(3), np.zeros((4, 3)), r"query must be \[rows, D\]"),
        (np.full((3, 2), np.nan), np.zeros((4, 2)), "query contains NaN"),
    ],
)
def test_nearest_two_bad_inputs_raise(query, reference, match):
    with pytest.raises(ValueError, match=match):
        mem.nearest_two(query, reference)


def test_copy_flags_bad_inputs_raise():
    with pytest.raises(ValueError, match="differ in shape"):
        mem.copy_flags(np.zeros(3), np.ones(4))
    with pytest.raises(ValueError, match="threshold"):
        mem.copy_flags(np.zeros(3), np.ones(3), threshold=0.0)
