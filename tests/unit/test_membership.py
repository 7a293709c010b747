"""benchmark.metrics.membership: AUC and TPR at low FPR against brute force, bootstrap intervals
that hold 0.5 without leakage and the true AUC with it, the leakiest client, and rows left out."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from scipy import stats

from dfbench.benchmark.metrics.membership import auc, membership_rows, tpr_at_fpr, tpr_metric_name


def _brute_auc(members: np.ndarray, nonmembers: np.ndarray) -> float:
    # every pair, one by one: win 1, tie 1/2
    total = 0.0
    for a in members:
        for b in nonmembers:
            total += 1.0 if a > b else 0.5 if a == b else 0.0
    return total / (len(members) * len(nonmembers))


def _brute_tpr(members: np.ndarray, nonmembers: np.ndarray, fpr: float) -> float:
    # every distinct observed score as the threshold, plus +inf (TPR 0); FPR(t) <= fpr, the largest TPR
    best = 0.0
    for t in np.unique(np.concatenate([members, nonmembers, [np.inf]])):
        if np.mean(nonmembers >= t) <= fpr:
            best = max(best, float(np.mean(members >= t)))
    return best


@pytest.mark.parametrize("seed", range(5))
def test_auc_matches_all_pairs_with_ties(seed):
    # prepare: integer scores, so many ties on purpose
    rng = np.random.default_rng(seed)
    members = rng.integers(0, 6, 30).astype(float)
    nonmembers = rng.integers(0, 5, 41).astype(float)
    # execute
    value = auc(members, nonmembers)
    # assert
    assert value == pytest.approx(_brute_auc(members, nonmembers), abs=1e-12)


def test_auc_hand_cases():
    # prepare
    low, high = np.arange(10.0), np.arange(10.0) + 100
    # execute / assert: separated -> 1, reversed -> 0, identical sets -> every pair a tie or mirrored -> 0.5
    assert auc(high, low) == 1.0
    assert auc(low, high) == 0.0
    assert auc(low, low) == 0.5
    assert auc(np.full(3, 2.0), np.full(7, 2.0)) == 0.5


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("fpr", [0.0, 0.01, 0.07, 0.1, 0.29, 0.5, 1.0])  # 0.07, 0.29: fpr * n is not exact in float
def test_tpr_at_fpr_matches_every_threshold(seed, fpr):
    # prepare: ties within and across the sets
    rng = np.random.default_rng(seed)
    members = rng.integers(0, 30, 57).astype(float) + 3
    nonmembers = rng.integers(0, 30, 100).astype(float)
    # execute
    value = tpr_at_fpr(members, nonmembers, fpr)
    # assert
    assert value == _brute_tpr(members, nonmembers, fpr)


def test_tpr_at_fpr_hand_case():
    # prepare
    nonmembers = np.arange(100.0)  # 0..99
    members = np.arange(50.0, 150.0)  # 50..149
    # execute
    value = tpr_at_fpr(members, nonmembers, 0.01)
    # assert: 1 false positive of 100 is allowed, so the threshold is 99 (only nonmember 99 is >= it;
    # 98 would let in 2); members >= 99 are 99..149, 51 of 100 -> TPR 0.51
    assert value == pytest.approx(0.51)
    # at fpr 0.05 five false positives (95..99) -> threshold 95, members 95..149 -> 0.55
    assert tpr_at_fpr(members, nonmembers, 0.05) == pytest.approx(0.55)


def test_tpr_at_fpr_with_few_nonmembers_needs_a_threshold_above_all():
    # prepare: 10 nonmembers, 10 * 0.01 < 1 -> no false positive allowed
    nonmembers = np.arange(10.0)  # max 9
    members = np.array([5.0, 9.0, 9.5, 10.0, 20.0])
    # execute
    value = tpr_at_fpr(members, nonmembers, 0.01)
    # assert: only t > 9 qualifies, so the members strictly above 9 count: 9.5, 10, 20 -> 3 / 5
    # (the member tied with the top nonmember is not detected)
    assert value == pytest.approx(0.6)
    assert value == _brute_tpr(members, nonmembers, 0.01)
    assert tpr_at_fpr(np.array([1.0, 2.0]), nonmembers, 0.01) == 0.0  # +inf only: TPR 0


@pytest.mark.parametrize("fn", [auc, tpr_at_fpr])
def test_empty_or_non_finite_scores_raise_naming_the_set(fn):
    ok = np.array([1.0, 2.0])
    with pytest.raises(ValueError, match="members scores are empty"):
        fn(np.array([]), ok)
    with pytest.raises(ValueError, match="nonmembers scores are empty"):
        fn(ok, np.array([]))
    with pytest.raises(ValueError, match="nonmembers scores hold 1 non-finite"):
        fn(ok, np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="^members scores hold 2 non-finite"):
        fn(np.array([np.inf, -np.inf]), ok)


# Coverage over seeds is binomial: with nominal 95 % coverage, P(>= 5 misses of 30) = 1.6 %, so the
# check rarely fails by chance (18 of 20 would fail 7.5 % of the time); at 80 % coverage it passes 26 %.
# Measured on 200 other seeds: 95.5 % for both the null and the shifted case.
SEEDS, MIN_COVERED = 30, 26


def _pooled(rows: list[dict], metric: str) -> dict:
    (row,) = [r for r in rows if r["metric"] == metric]
    return row


@pytest.mark.slow
def test_no_leakage_interval_holds_one_half():
    # prepare: members and nonmembers from one distribution, 400 each
    n_m = n_n = 400
    se = math.sqrt((n_m + n_n + 1) / (12 * n_m * n_n))  # SE of the AUC under H0 (Mann-Whitney)
    covered = 0
    for seed in range(SEEDS):
        rng = np.random.default_rng(seed)
        # execute
        rows, notes = membership_rows([rng.standard_normal(n_m)], rng.standard_normal(n_n), seed=seed)
        row = _pooled(rows, "mia_auc")
        # assert (per seed): the point within 4 SE of 0.5 (fails with probability ~6e-5)
        assert abs(row["value"] - 0.5) < 4 * se
        assert notes == []
        covered += row["ci_low"] <= 0.5 <= row["ci_high"]
    # assert: a 95% interval misses on ~1.5 seeds of 30
    assert covered >= MIN_COVERED


@pytest.mark.slow
def test_shifted_members_interval_excludes_one_half_and_holds_the_true_auc():
    # prepare: members N(1, 1), nonmembers N(0, 1): AUC = P(X - Y > 0) with X - Y ~ N(1, 2) = Phi(1 / sqrt 2)
    true_auc = float(stats.norm.cdf(1 / math.sqrt(2)))  # 0.7602
    covered = 0
    for seed in range(SEEDS):
        rng = np.random.default_rng(100 + seed)
        # execute
        rows, _ = membership_rows([rng.standard_normal(400) + 1.0], rng.standard_normal(400), seed=seed)
        row = _pooled(rows, "mia_auc")
        # assert: 0.76 is ~13 SE from 0.5, so 0.5 is never inside
        assert row["ci_low"] > 0.5
        covered += row["ci_low"] <= true_auc <= row["ci_high"]
    assert covered >= MIN_COVERED
    assert abs(true_auc - 0.760) < 5e-4


def test_rows_fields_names_and_reproducibility():
    # prepare
    rng = np.random.default_rng(7)
    clients = [rng.standard_normal(50) + 0.5, rng.standard_normal(30)]
    non = rng.standard_normal(200)
    # execute
    rows, notes = membership_rows(clients, non, fpr=0.05, seed=3, replicates=50)
    again, _ = membership_rows(clients, non, fpr=0.05, seed=3, replicates=50)
    # assert
    assert notes == []
    assert [r["metric"] for r in rows] == ["mia_auc", "mia_tpr_5fpr", "mia_auc_client_max"]
    for row in rows:
        assert {"ci_low", "ci_high", "ci_level", "ci_method", "ci_replicates"} <= row.keys()
        assert 0.0 <= row["ci_low"] <= row["ci_high"] <= 1.0
        assert (row["num_members"], row["num_nonmembers"], row["attack"]) == (80, 200, "loss")
        assert row["ci_level"] == 0.95 and row["ci_replicates"] == 50 and "percentile" in row["ci_method"]
    pooled = np.concatenate(clients)
    assert rows[0]["value"] == auc(pooled, non)
    assert rows[1]["value"] == tpr_at_fpr(pooled, non, 0.05) and rows[1]["fpr"] == 0.05
    assert rows == again  # seeded by (seed, "bootstrap", metric)
    assert tpr_metric_name(0.01) == "mia_tpr_1fpr" and tpr_metric_name(0.001) == "mia_tpr_0p1fpr"


def test_client_max_points_at_the_leaking_client():
    # prepare: 4 clients of 150 members, only client 2 shifted (AUC ~ Phi(1.5 / sqrt 2) = 0.86);
    # client 4 holds no members
    rng = np.random.default_rng(11)
    clients = [rng.standard_normal(150) for _ in range(4)] + [np.array([])]
    clients[2] = clients[2] + 1.5
    non = rng.standard_normal(600)
    # execute
    rows, notes = membership_rows(clients, non, seed=1)
    row = _pooled(rows, "mia_auc_client_max")
    # assert
    assert notes == []
    assert row["client_of_max"] == 2
    assert row["per_client"][4] is None
    assert row["per_client"][:4] == [auc(c, non) for c in clients[:4]]
    assert row["value"] == row["per_client"][2] > 0.8
    assert all(abs(a - 0.5) < 0.1 for k, a in enumerate(row["per_client"][:4]) if k != 2)
    assert row["ci_low"] > 0.75 and row["num_members"] == 600
    assert _pooled(rows, "mia_auc")["value"] < row["value"]  # pooling dilutes one leaking client


@pytest.mark.parametrize(
    ("clients", "non", "expect"),
    [
        ([np.arange(5.0)], np.array([]), "0 nonmember"),
        ([np.array([]), np.array([])], np.arange(5.0), "0 member"),
        ([], np.arange(5.0), "0 member"),
        ([np.arange(5.0)], np.array([1.0]), "at least 2 of each"),
        ([np.arange(5.0)], np.array([1.0, np.nan]), "non-finite scores \\(nonmembers: 1\\)"),
        ([np.arange(3.0), np.array([np.inf])], np.arange(5.0), "client 1 members: 1"),
    ],
)
def test_rows_that_cannot_be_computed_are_left_out_with_a_note(clients, non, expect):
    # execute
    rows, notes = membership_rows(clients, non, replicates=10)
    # assert
    assert rows == []
    assert len(notes) == 1 and re.search(expect, notes[0])


def test_client_max_left_out_when_no_client_has_two_members():
    # prepare: 3 clients of one member each (pooled 3 members: the pooled rows still stand)
    rows, notes = membership_rows([np.array([1.0]), np.array([2.0]), np.array([3.0])], np.arange(10.0), replicates=10)
    # assert
    assert [r["metric"] for r in rows] == ["mia_auc", "mia_tpr_1fpr"]
    assert len(notes) == 1 and "mia_auc_client_max" in notes[0]


def test_chance_band_is_the_spread_of_the_auc_without_leakage():
    # prepare: 4000 draws of 16 members and 16 non-members from one distribution (cpu-privacy's attack size)
    from dfbench.benchmark.metrics.membership import chance_band

    rng = np.random.default_rng(0)
    draws = [auc(rng.standard_normal(16), rng.standard_normal(16)) for _ in range(4000)]
    # execute
    band = chance_band(16, 16)
    # assert: the Mann-Whitney null sd by hand, and 95 % of the simulated AUCs inside 0.5 +- band
    assert band == pytest.approx(stats.norm.ppf(0.975) * math.sqrt(33 / (12 * 16 * 16)))
    inside = np.mean(np.abs(np.array(draws) - 0.5) <= band)
    assert 0.93 <= inside <= 0.97
    assert chance_band(16, 1000) < band and chance_band(256, 256) == pytest.approx(0.05, abs=0.001)
    with pytest.raises(ValueError, match="at least one member"):
        chance_band(0, 10)
