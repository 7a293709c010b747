"""The bits/quality frontier (results/cpu-compression/frontier.py) against hand-computed cases."""

import math

import numpy as np
import pandas as pd
import pytest

from helpers import load_script

frontier = load_script("results/cpu-compression/frontier.py")
claim_table, frontier_table, pareto_mask = frontier.claim_table, frontier.frontier_table, frontier.pareto_mask


def test_pareto_mask_by_hand():
    # (uplink, score), lower score better: b dominates a (less uplink, better score); c is the cheapest;
    # d ties c's uplink with a worse score (dominated); e equals b exactly (neither strictly better: both kept)
    uplink = np.array([10.0, 5.0, 1.0, 1.0, 5.0])
    score = np.array([300.0, 250.0, 400.0, 450.0, 250.0])
    assert pareto_mask(uplink, score).tolist() == [False, True, True, False, True]
    # higher is better flips the score order: d (450) at the least uplink now beats every other point
    assert pareto_mask(uplink, score, higher_better=True).tolist() == [False, False, False, True, False]


def _runs(rows):
    return pd.DataFrame([{"dataset": "fmnist", "partition": "dirichlet:0.5", "budget_key": "{}", "baseline": False,
                          **r} for r in rows])


def test_frontier_table_paired_and_ratios():
    rows = []
    for seed, (ref, a, b) in enumerate([(100.0, 110.0, 300.0), (120.0, 125.0, 330.0), (110.0, 121.0, 290.0)]):
        rows += [{"method": "fedavg", "setting": "fedavg", "seed": seed, "uplink_mb": 32.0, "fd": ref},
                 {"method": "qsgd", "setting": "qsgd [levels=7]", "seed": seed, "uplink_mb": 4.0, "fd": a},
                 {"method": "qsgd", "setting": "qsgd [levels=1]", "seed": seed, "uplink_mb": 2.0, "fd": b}]
    rows.append({"method": "fedavg", "setting": "untrained (fedavg)", "seed": 0, "uplink_mb": 0.0, "fd": 900.0,
                 "baseline": True})
    t = frontier_table(_runs(rows), "fd").set_index("setting")
    assert "untrained (fedavg)" not in t.index
    assert t.loc["qsgd [levels=7]", "compression"] == pytest.approx(8.0)
    assert t.loc["qsgd [levels=1]", "compression"] == pytest.approx(16.0)
    # paired differences 10, 5, 11: mean 26/3, t-interval with the float64 sample sd and t_{0.975, 2}
    d = np.array([10.0, 5.0, 11.0])
    half = 4.302652729911275 * d.std(ddof=1) / math.sqrt(3)
    assert t.loc["qsgd [levels=7]", "diff"] == pytest.approx(d.mean())
    assert t.loc["qsgd [levels=7]", "diff_low"] == pytest.approx(d.mean() - half)
    assert t.loc["qsgd [levels=7]", "wins"] == "0/3"
    assert t.loc["qsgd [levels=7]", "metric_ratio"] == pytest.approx(356.0 / 330.0)
    assert t.loc["qsgd [levels=1]", "metric_ratio"] == pytest.approx(920.0 / 330.0)
    assert math.isnan(t.loc["fedavg", "diff"])
    # every point is on the frontier here: each step down in uplink costs quality
    assert t["pareto"].all()
    claims = claim_table(t.reset_index()).set_index("method")
    assert claims.loc["qsgd", "settings_at_4x"] == 2
    assert claims.loc["qsgd", "best_setting"] == "qsgd [levels=7]"
    assert bool(claims.loc["qsgd", "holds"])  # 1.08x the metric at 8x less uplink


def test_claim_fails_and_dominated_point():
    rows = []
    for seed in range(3):
        rows += [{"method": "fedavg", "setting": "fedavg", "seed": seed, "uplink_mb": 32.0, "fd": 100.0 + seed},
                 {"method": "signsgd", "setting": "signsgd [error_feedback=False]", "seed": seed, "uplink_mb": 1.0,
                  "fd": 200.0 + seed},  # 1.98x: the claim fails
                 {"method": "powersgd", "setting": "powersgd [rank=1]", "seed": seed, "uplink_mb": 16.0,
                  "fd": 250.0},  # 2x less only: not eligible, and dominated by signsgd
                 ]
    t = frontier_table(_runs(rows), "fd")
    claims = claim_table(t).set_index("method")
    assert not bool(claims.loc["signsgd", "holds"])
    assert claims.loc["signsgd", "best_metric_ratio"] == pytest.approx(201.0 / 101.0)
    assert claims.loc["powersgd", "settings_at_4x"] == 0 and not bool(claims.loc["powersgd", "holds"])
    assert not bool(t.set_index("setting").loc["powersgd [rank=1]", "pareto"])


def test_no_reference_block_is_skipped_and_names_are_the_pages():
    rows = [{"method": "qsgd", "setting": "qsgd [levels=7]", "seed": 0, "uplink_mb": 4.0, "fd": 1.0}]
    assert frontier_table(_runs(rows), "fd").empty
    # the points are named by the one naming function (names.setting_names): the hyperparameters off
    # the method's defaults and those that vary between its settings
    rows = []
    for seed in range(2):
        rows += [{"method": "fedavg", "setting": "fedavg", "seed": seed, "uplink_mb": 32.0, "fd": 100.0}]
        for ef, fraction in ((True, 0.09), (True, 0.022), (False, 0.022)):
            rows.append({"method": "topk_update", "setting": f"topk_update [error_feedback={ef}, fraction={fraction}, scope=layer]",
                         "param.error_feedback": ef, "param.fraction": fraction, "param.scope": "layer", "seed": seed,
                         "uplink_mb": 32.0 * fraction, "fd": 100.0 + fraction})
    names = dict(zip(*frontier_table(_runs(rows), "fd")[["setting", "name"]].to_numpy().T))
    assert names["fedavg"] == "fedavg"
    assert names["topk_update [error_feedback=True, fraction=0.09, scope=layer]"] == "topk_update (error_feedback=True, fraction=0.09)"
    assert names["topk_update [error_feedback=False, fraction=0.022, scope=layer]"] == "topk_update (error_feedback=False, fraction=0.022)"


def test_the_untrained_floor_is_averaged_as_the_settings_are():
    # a distance: the geometric mean of the seeds (as `mean` and the leaderboard's untrained figure), not the arithmetic
    import math

    import pandas as pd

    untrained_floors = frontier.untrained_floors

    runs = pd.DataFrame({"dataset": ["fmnist"] * 4, "partition": ["iid"] * 4, "baseline": [True, True, True, False],
                         "fd_fmnist": [800.0, 900.0, 1000.0, 300.0]})
    floor = untrained_floors(runs, "fd_fmnist")[("fmnist", "iid")]
    assert floor == pytest.approx(math.exp((math.log(800) + math.log(900) + math.log(1000)) / 3))
    assert floor != pytest.approx(900.0, abs=1.0)
