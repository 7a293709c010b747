"""Metric agreement in the report: Kendall tau between the ranking metric and every other quality metric
across settings, its seed-resampled interval, and the label when the winner holds under one metric only."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dfbench.benchmark.report.agreement import block_agreement, quality_metrics
from dfbench.benchmark.report.build import build_report
from helpers import fd, make_run


def _runs(values: dict[str, dict[str, list[float]]]) -> pd.DataFrame:
    """setting -> metric -> one value per seed, as the report's run frame holds them."""
    rows = []
    for setting, by_metric in values.items():
        seeds = len(next(iter(by_metric.values())))
        for s in range(seeds):
            rows.append({"group_key": setting, "seed": s, "baseline": setting == "untrained",
                         **{m: v[s] for m, v in by_metric.items()}})
    return pd.DataFrame(rows)


def test_tau_is_scipys_kendall_tau_of_the_seed_means_signed_by_direction():
    gen = np.random.default_rng(3)
    fd_ = gen.uniform(10, 100, size=(6, 3))
    ae = fd_ + gen.normal(0, 20, size=(6, 3))
    recall = -fd_ + gen.normal(0, 20, size=(6, 3))  # higher is better: agrees with fd when it falls as fd grows
    runs = _runs({f"s{i}": {"fd_fmnist": list(fd_[i]), "fd_fmnist_ae": list(ae[i]), "client_fd_fmnist_mean": list(recall[i])}
                  for i in range(6)})
    got = {r["metric"]: r for r in block_agreement(runs, "fd_fmnist", ["fd_fmnist", "fd_fmnist_ae", "client_fd_fmnist_mean"])["rows"]}
    def seed_mean(x):  # a positive distance is averaged on its log (the leaderboard's geometric mean)
        return np.log(x).mean(1) if (x > 0).all() else x.mean(1)

    want = stats.kendalltau(seed_mean(fd_), seed_mean(ae)).statistic
    assert got["fd_fmnist_ae"]["tau"] == pytest.approx(want)
    assert got["fd_fmnist_ae"]["tau_low"] <= got["fd_fmnist_ae"]["tau"] <= got["fd_fmnist_ae"]["tau_high"]
    assert got["fd_fmnist_ae"]["settings"] == 6 and got["fd_fmnist_ae"]["seeds"] == 3


def test_identical_and_reversed_orders_and_the_untrained_baseline_left_out():
    same = {f"s{i}": {"fd_fmnist": [i, i + 0.5], "kid_fmnist": [2 * i, 2 * i + 0.1], "denoise_loss": [5 - i, 5.2 - i]}
            for i in range(4)}
    same["untrained"] = {"fd_fmnist": [900.0, 910.0], "kid_fmnist": [9.0, 9.1], "denoise_loss": [9.0, 9.0]}
    out = block_agreement(_runs(same), "fd_fmnist", ["fd_fmnist", "kid_fmnist", "denoise_loss"])
    rows = {r["metric"]: r for r in out["rows"]}
    assert rows["kid_fmnist"]["tau"] == pytest.approx(1.0) and rows["kid_fmnist"]["agrees_on_best"] is True
    # reversed on the methods: without leaving the baseline out, tau would be pulled up by its agreed last place
    assert rows["denoise_loss"]["tau"] == pytest.approx(-1.0) and rows["denoise_loss"]["agrees_on_best"] is False
    assert out["best"] == "s0" and rows["denoise_loss"]["settings"] == 4


def test_settings_are_compared_on_the_seeds_they_all_ran():
    # prepare: "long" ran 6 seeds (30 on seeds 0-2, 5 on 3-5), "short" and "other" only seeds 0-2 (20, 25):
    # over its own seeds long is first (12.2), over the 3 seeds all three ran it is last (30)
    runs = _runs({"long": {"fd_fmnist": [30.0, 30, 30, 5, 5, 5], "kid_fmnist": [3.0, 3, 3, 0.5, 0.5, 0.5]}})
    runs = pd.concat([runs, _runs({"short": {"fd_fmnist": [20.0, 21, 19], "kid_fmnist": [2.0, 2.1, 1.9]},
                                   "other": {"fd_fmnist": [25.0, 26, 24], "kid_fmnist": [2.5, 2.6, 2.4]}})])
    # execute
    out = block_agreement(runs, "fd_fmnist", ["fd_fmnist", "kid_fmnist"])
    # assert: the first place and the tau come from seeds 0-2, and the row says 3 seeds
    assert out["best"] == "short" and out["rows"][0]["seeds"] == 3 and out["rows"][0]["tau"] == pytest.approx(1.0)


def test_only_quality_metrics_other_than_the_ranking_one_are_compared():
    got = quality_metrics(["fd_fmnist", "fd_fmnist_ae", "kid_fmnist", "precision_fmnist", "class_tv", "denoise_loss",
                           "client_fd_fmnist_mean", "client_fd_fmnist_worst", "mia_auc"], "fd_fmnist")
    assert got == ["fd_fmnist_ae", "kid_fmnist", "denoise_loss", "client_fd_fmnist_mean"]


def _loss(value: float) -> dict:
    return {"metric": "denoise_loss", "value": value, "std_err": 0.01, "reference": "fmnist/test"}


@pytest.mark.slow
def test_the_report_shows_agreement_and_labels_a_first_place_that_holds_under_one_metric_only(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "out"
    # fedavg is first by fd_fmnist, but the held-out loss puts fedprox first on every seed
    for seed in range(3):
        make_run(runs, f"s{seed}-fa", seed=seed, evaluations=[fd(10.0 + seed), _loss(1.5)])
        make_run(runs, f"s{seed}-fp", seed=seed, method="fedprox", params={"mu": 0.01},
                 evaluations=[fd(20.0 + seed), _loss(1.2)])
        make_run(runs, f"s{seed}-rp", seed=seed, method="random_prune", params={"keep_ratio": 0.5},
                 evaluations=[fd(30.0 + seed), _loss(1.4)])
    build_report(runs, out)
    md = (out / "leaderboard.md").read_text()
    assert "### Metric agreement" in md or "Metric agreement" in md
    assert "holds under fd_fmnist only" in md
    meta = json.loads((out / "report.json").read_text())
    (block,) = meta["agreement"].values()
    (row,) = block["rows"]
    assert row["metric"] == "denoise_loss" and row["tau"] == pytest.approx(-1 / 3) and row["agrees_on_best"] is False
