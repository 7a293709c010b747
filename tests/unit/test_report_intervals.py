"""Every interval the report shows of a metric that is >= 0 stays >= 0, and a run's own interval holds the
value it is shown beside (benchmark/report/frames.py: run_interval, the seed intervals of aggregate)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from dfbench.benchmark.metrics.scoring import kid_interval
from dfbench.benchmark.metrics.uncertainty import centred_method
from dfbench.benchmark.report.frames import _interval_columns, run_interval

BASIC = "95% basic bootstrap over generated samples (reference fixed)"


def test_a_recorded_basic_frechet_interval_is_shown_centred_on_its_value():
    # prepare: a label-free distance whose basic interval lies wholly below the plug-in value (as 194 of 356
    # committed fd_fmnist_ae intervals did): q_lo = 2t - high = 46, q_hi = 2t - low = 58
    entry = {"value": 40.0, "ci_low": 22.0, "ci_high": 34.0, "ci_level": 0.95, "ci_method": BASIC}
    # execute
    low, high, method = run_interval("fd_fmnist_ae", entry)
    # assert: the same replicates' centred interval, t -+ (q_hi - q_lo) / 2, holding the value
    assert (low, high) == pytest.approx((34.0, 46.0))
    assert low <= entry["value"] <= high
    assert method == centred_method(0.95, "over generated samples (reference fixed)")
    # a basic interval clipped at 0 lost its width: dropped, not guessed
    clipped = dict(entry, ci_low=0.0, ci_method=BASIC + ", clipped at 0")
    assert all(isinstance(v, float) and math.isnan(v) for v in run_interval("fd_fmnist_ae", clipped)[:2])


def test_an_interval_of_a_non_negative_metric_is_clipped_at_0_and_says_so():
    low, high, method = run_interval("kid_fmnist", {"value": 0.001, "ci_low": -0.002, "ci_high": 0.004,
                                                    "ci_method": "95% normal interval from the spread of KID subset estimates"})
    assert (low, high) == (0.0, 0.004) and method.endswith("clipped at 0 (kid_fmnist >= 0)")
    # a name the metric table does not know is shown as recorded
    assert run_interval("my_score", {"value": -1.0, "ci_low": -2.0, "ci_high": 0.0, "ci_method": "x"}) == (-2.0, 0.0, "x")
    # at the source: a KID row's normal interval never goes below 0
    row = kid_interval(0.001, 0.002, 100)
    assert row["ci_low"] == 0.0 and row["ci_high"] == pytest.approx(0.00492) and "clipped at 0" in row["ci_method"]
    assert "clipped" not in kid_interval(0.01, 0.001, 100)["ci_method"]


def test_seed_intervals_of_kid_stay_at_or_above_0_and_a_negative_mean_is_said():
    # prepare: KID over 3 seeds, one estimate below 0 (an unbiased estimate of a value near 0)
    values = pd.Series([0.004, -0.001, 0.0005])
    row: dict = {}
    # execute
    _interval_columns(row, pd.DataFrame({"kid_fmnist": values}), "kid_fmnist", values)
    # assert: the t-interval clipped at 0, the rule in the method; no geometric mean of a value <= 0
    assert row["kid_fmnist_ci_low"] == 0.0 and row["kid_fmnist_ci_high"] > 0.004
    assert "clipped at 0" in row["kid_fmnist_ci_method"] and math.isnan(row["kid_fmnist_gmean"])
    negative = pd.Series([-0.002, 0.0005, -0.001])
    _interval_columns(row, pd.DataFrame({"kid_fmnist": negative}), "kid_fmnist", negative)
    assert row["kid_fmnist_ci_low"] == 0.0 and "the mean is below 0" in row["kid_fmnist_ci_method"]
    # a distance: the geometric mean's interval on the logs, above 0 without clipping
    fd = pd.Series([30.0, 300.0, 60.0])
    _interval_columns(row, pd.DataFrame({"fd_fmnist": fd}), "fd_fmnist", fd)
    assert 0 < row["fd_fmnist_ci_low"] < row["fd_fmnist_gmean"] < row["fd_fmnist_ci_high"]
