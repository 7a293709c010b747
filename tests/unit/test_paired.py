"""Seed-paired differences to FedAvg (benchmark/report/paired.py, scripts/paired.py) against hand-computed values; the
verdict is the leaderboard's (tests/unit/test_verdicts.py checks the statistics)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from dfbench.benchmark.report.paired import paired_table, to_markdown
from helpers import load_script

main = load_script("paired").main

T975_DF2 = 4.302652729911275  # Student-t 97.5 % quantile, 2 degrees of freedom (printed tables)
T975_DF1 = 12.706204736174707  # 1 degree of freedom


def _budget(**extra: object) -> str:
    return json.dumps({"rounds": 9, "local_steps": 8, "capacity": "", **extra}, sort_keys=True)


def _runs(rows: list[tuple]) -> pd.DataFrame:
    cols = ["dataset", "partition", "budget_key", "setting", "baseline", "seed", "fd"]
    return pd.DataFrame(rows, columns=cols)


def _base_rows(metric_ref=(100.0, 200.0, 300.0)) -> list[tuple]:
    return [("fmnist", "dirichlet:0.5", _budget(), "fedavg", False, s, v) for s, v in enumerate(metric_ref)]


def test_differences_wins_and_t_interval_by_hand():
    rows = _base_rows() + [("fmnist", "dirichlet:0.5", _budget(), "good", False, s, v)
                           for s, v in enumerate((90.0, 189.0, 288.0))]  # -10, -11, -12
    table = paired_table(_runs(rows), "fd")
    assert len(table) == 1
    r = table.iloc[0]
    half = T975_DF2 * 1.0 / math.sqrt(3)  # sample sd of (-10, -11, -12) is 1
    assert r["setting"] == "good" and r["seeds"] == "0,1,2" and r["wins"] == "3/3"
    assert r["differences"] == "-10.0 / -11.0 / -12.0"
    assert r["mean"] == pytest.approx(-11.0)
    assert (r["low"], r["high"]) == (pytest.approx(-11.0 - half), pytest.approx(-11.0 + half))
    assert r["verdict"] == "better"


def test_inconclusive_when_the_interval_holds_zero_and_only_shared_seeds_count():
    rows = _base_rows() + [
        ("fmnist", "dirichlet:0.5", _budget(), "noisy", False, 0, 150.0),  # +50
        ("fmnist", "dirichlet:0.5", _budget(), "noisy", False, 1, 170.0),  # -30
        ("fmnist", "dirichlet:0.5", _budget(), "noisy", False, 7, 1.0),  # no fedavg at seed 7: ignored
    ]
    r = paired_table(_runs(rows), "fd").iloc[0]
    sd = math.sqrt(((50 - 10) ** 2 + (-30 - 10) ** 2) / 1)
    assert r["seeds"] == "0,1" and r["wins"] == "1/2" and r["mean"] == pytest.approx(10.0)
    assert r["high"] - r["mean"] == pytest.approx(T975_DF1 * sd / math.sqrt(2))
    assert r["verdict"] == "inconclusive"


def test_blocks_capacity_tiers_baselines_and_other_budgets():
    rows = _base_rows() + [
        # a capacity-tiered run pairs with the untiered FedAvg of its block
        *[("fmnist", "dirichlet:0.5", _budget(capacity="1.0:0.5,0.5:0.5"), "heterofl", False, s, v)
          for s, v in enumerate((120.0, 221.0, 322.0))],
        # another budget (no FedAvg there) and another partition: no pairs
        ("fmnist", "dirichlet:0.5", _budget(rounds=20), "long", False, 0, 1.0),
        ("fmnist", "dirichlet:0.1", _budget(), "elsewhere", False, 0, 1.0),
        # the untrained baseline is not a setting to compare
        ("fmnist", "dirichlet:0.5", _budget(), "fedavg [untrained]", True, 0, 900.0),
    ]
    table = paired_table(_runs(rows), "fd")
    assert list(table["setting"]) == ["heterofl"]
    r = table.iloc[0]
    assert r["differences"] == "+20.0 / +21.0 / +22.0" and r["wins"] == "0/3"
    assert r["low"] == pytest.approx(21.0 - T975_DF2 / math.sqrt(3)) and r["verdict"] == "worse"


def test_higher_is_better_flips_wins_and_verdict():
    rows = _base_rows((0.5, 0.6, 0.7)) + [("fmnist", "dirichlet:0.5", _budget(), "x", False, s, v)
                                         for s, v in enumerate((0.6, 0.71, 0.79))]  # +0.1, +0.11, +0.09
    r = paired_table(_runs(rows), "fd", higher_better=True).iloc[0]
    assert r["wins"] == "3/3" and r["verdict"] == "better"
    md = to_markdown(paired_table(_runs(rows), "fd", higher_better=True), "fd", "fedavg", True)
    assert "| x | 0,1,2 | +0.1 / +0.1 / +0.1 | 3/3 | +0.1 [" in md and "positive difference" in md


def test_cli_names_the_problem(tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        main(["--runs", str(tmp_path), "--out", str(tmp_path / "out")])
    assert "no scored runs" in str(err.value) and "run the grid first" in str(err.value)
    assert not (tmp_path / "out").exists()


def test_a_distance_is_compared_as_a_ratio_with_holm_over_the_block():
    # half: a ratio of 0.5, 0.505, 0.495 (the same ratio at every seed would have no spread to test: undecidable)
    rows = _base_rows() + [("fmnist", "dirichlet:0.5", _budget(), "half", False, s, v) for s, v in enumerate((50.0, 101.0, 148.5))]
    rows += [("fmnist", "dirichlet:0.5", _budget(), "same", False, s, v * f) for s, (v, f) in
             enumerate(((100.0, 1.01), (200.0, 0.99), (300.0, 1.0)))]
    frame = _runs(rows).rename(columns={"fd": "fd_fmnist"})
    table = paired_table(frame, "fd_fmnist").set_index("setting")
    assert table.loc["half", "ratio"] == pytest.approx(0.5, rel=1e-3) and table.loc["half", "verdict"] == "better"
    assert table.loc["same", "verdict"] == "equivalent"  # within +-1 %: inside the +-10 % margin
    assert 0 < table.loc["same", "ratio_low"] < 1 < table.loc["same", "ratio_high"]
