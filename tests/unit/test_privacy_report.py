"""The privacy report (results/cpu-privacy/privacy.py) on a hand-built run table: means and t-intervals
over seeds, seed-paired differences to FedAvg, DP settings labelled apart from plain FedAvg, epsilon."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from scipy import stats

from helpers import load_script

privacy = load_script("results/cpu-privacy/privacy.py")
LEAKS, plot, privacy_table, to_markdown = privacy.LEAKS, privacy.plot, privacy.privacy_table, privacy.to_markdown


def _runs() -> pd.DataFrame:
    rows = []
    fd = {"fedavg": [100.0, 110.0, 120.0], "dp": [300.0, 330.0, 360.0], "quantized": [105.0, 112.0, 125.0]}
    copy = {"fedavg": [0.5, 0.6, 0.7], "dp": [0.0, 0.1, 0.05], "quantized": [0.45, 0.6, 0.65]}
    for name in fd:
        for seed in range(3):
            rows.append({"run_id": f"{name}{seed}", "dataset": "fmnist", "partition": "iid",
                         "setting": "quantized [bits=4]" if name == "quantized" else "fedavg",
                         "method": "quantized" if name == "quantized" else "fedavg", "baseline": False, "seed": seed,
                         "param.bits": 4 if name == "quantized" else math.nan,
                         "cfg.clip": 0.5 if name == "dp" else 0.0, "cfg.noise": 1.0 if name == "dp" else 0.0,
                         "cfg.rounds": 10, "epsilon": 19.0 if name == "dp" else math.nan,
                         "fd_fmnist": fd[name][seed], "copy_rate_pixel": copy[name][seed],
                         **{m: 0.5 for m in LEAKS if m != "copy_rate_pixel"}})
    rows.append({"run_id": "u0", "dataset": "fmnist", "partition": "iid", "setting": "untrained (fedavg)", "method": "fedavg",
                 "baseline": True, "seed": 0, "cfg.clip": 0.0, "cfg.noise": 0.0, "cfg.rounds": 0, "epsilon": math.nan,
                 "fd_fmnist": 800.0, "copy_rate_pixel": 0.0, **{m: 0.5 for m in LEAKS if m != "copy_rate_pixel"}})
    return pd.DataFrame(rows)


def test_rows_are_means_with_t_intervals_and_seed_paired_differences(tmp_path):
    # execute
    table = privacy_table(_runs(), "fd_fmnist").set_index("setting")
    # assert: every setting is named by the one naming function (names.setting_names): the DP setting by
    # the config that tells it apart, quantized by its bits off the default 8; plain FedAvg first, the floor last
    assert list(table.index) == ["fedavg", "fedavg (clip=0.5, noise=1)", "quantized (bits=4)", "untrained (fedavg)"]
    dp = table.loc["fedavg (clip=0.5, noise=1)"]
    # a distance: the geometric mean over seeds, its t-interval on the logs mapped back (never below 0)
    logs = pd.Series([math.log(300.0), math.log(330.0), math.log(360.0)])
    half = stats.t.ppf(0.975, 2) * logs.std(ddof=1) / math.sqrt(3)
    assert dp["fd_fmnist"] == pytest.approx((300.0 * 330.0 * 360.0) ** (1 / 3))
    assert dp["fd_fmnist_high"] == pytest.approx(math.exp(logs.mean() + half)) and dp["fd_fmnist_low"] > 0
    # differences paired by seed: 200, 220, 240 -> mean 220; copy -0.5, -0.5, -0.65
    assert dp["fd_fmnist_diff"] == pytest.approx(220.0)
    assert dp["copy_rate_pixel_diff"] == pytest.approx((-0.5 - 0.5 - 0.65) / 3)
    assert dp["epsilon"] == 19.0 and dp["dp"]
    assert math.isinf(table.loc["fedavg", "epsilon"]) and not table.loc["fedavg", "dp"]
    assert math.isnan(table.loc["fedavg", "fd_fmnist_diff"]) and math.isnan(table.loc["untrained (fedavg)", "fd_fmnist_low"])
    # the writers run on it
    md = to_markdown(table.reset_index(), "fd_fmnist", "fedavg")
    assert "| fedavg (clip=0.5, noise=1) | 3 | 329.1 [" in md and "| 19 |" in md
    assert plot(table.reset_index(), "fd_fmnist", "fedavg", tmp_path / "p.png").stat().st_size > 1000


def test_no_spread_is_said_the_attack_size_shown_and_paired_seeds_counted():
    # prepare: every setting's attack AUC 1.0 at every seed (a score at its bound), 16 members against 1000
    # non-members; plain FedAvg lacks seed 2, so the others pair with it on 2 of their 3 seeds
    runs = _runs()
    runs["mia_auc"] = 1.0
    runs = runs[runs["run_id"] != "fedavg2"].reset_index(drop=True)
    sizes = {r: (16, 1000) for r in runs["run_id"]}
    # execute
    table = privacy_table(runs, "fd_fmnist", sizes=sizes)
    md = to_markdown(table, "fd_fmnist", "fedavg")
    rows = {line.split(" | ")[0].lstrip("| "): line for line in md.splitlines() if line.startswith("| ")}
    # assert: the AUC is "1.000 (no spread)", never "[1.000, 1.000]"; the attack's size and chance band shown
    assert "1.000 (no spread)" in rows["fedavg"] and "[1.000, 1.000]" not in md
    assert "16 / 1000 (±0.14)" in rows["fedavg"]
    # the paired difference says on how many seeds, where fewer than the setting's own
    quantized = table.set_index("setting").loc["quantized (bits=4)"]
    assert quantized["seeds"] == 3 and quantized["fd_fmnist_diff_seeds"] == 2
    assert quantized["fd_fmnist_diff"] == pytest.approx(((105.0 - 100.0) + (112.0 - 110.0)) / 2)
    assert rows["quantized (bits=4)"].count("(2 paired seeds)") == 2  # Δ fd_fmnist and Δ copy
    # every interval of a leakage metric is >= 0
    lows = [c for c in table.columns if c.endswith("_low") and not c.endswith("_diff_low")]
    assert (table[lows].fillna(0) >= 0).all().all()
