"""Honest ranks on constructed run folders: the order of the scores (geometric means over seeds),
with the ranks the paired contrasts leave each setting in brackets, paired verdicts against FedAvg,
settings not shown better than the untrained model last; the leaderboard says what the interval
is; metrics that could not be computed are absent with a note, never zero. The statistics
themselves are checked against scipy / statsmodels in tests/unit/test_verdicts.py."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from dfbench.benchmark.report.build import build_report, collect  # noqa: E402
from dfbench.benchmark.metrics.uncertainty import tie_ranks  # noqa: E402  (kept for other callers: tested below)
from helpers import fd, make_run  # noqa: E402

pytestmark = pytest.mark.slow  # whole reports

CI = "95% basic bootstrap over generated samples (reference fixed)"  # as older runs recorded it
SHOWN = "95% bootstrap interval of the value: ± half the central 95% range of the replicates over generated samples (reference fixed)"


def fd_ci(value: float, low: float, high: float) -> dict[str, Any]:
    return fd(value, ci_low=low, ci_high=high, ci_level=0.95, ci_method=CI, ci_replicates=200)


def _ranks(out: Path) -> dict[str, tuple[int, Any, Any]]:
    csv = pd.read_csv(out / "leaderboard.csv")
    def num(v):
        return None if pd.isna(v) else int(v)
    return {m: (int(r), num(lo), num(hi)) for m, r, lo, hi in zip(csv["method"], csv["rank"], csv["rank_low"], csv["rank_high"])}


def test_one_seed_each_orders_single_runs_and_settles_nothing(tmp_path):
    # fedprox 318.1 [305, 331] and fedavg 321.7 [309, 334]: one run each, so no rank is settled
    runs = tmp_path / "runs"
    make_run(runs, "a", method="fedprox", params={"mu": 0.01}, evaluations=[fd_ci(318.1, 305.0, 331.0)])
    make_run(runs, "b", method="fedavg", evaluations=[fd_ci(321.7, 309.0, 334.0)])
    build_report(runs, tmp_path / "out")
    assert _ranks(tmp_path / "out") == {"fedprox": (1, None, None), "fedavg": (2, None, None)}
    md = (tmp_path / "out" / "leaderboard.md").read_text()
    assert "| 1 | fedprox |" in md and "| 2 | fedavg |" in md and "1=" not in md
    assert "With one seed per setting no rank is settled" in md
    assert "| ×0.989 (1 seed: not tested) |" in md  # 318.1 / 321.7, one pair: no spread, so no test
    assert "inconclusive ×0.989" not in md and "1 not tested (one seed: no spread to test)" in md
    assert f"Intervals [low, high]: {SHOWN}." in md and "Holm-corrected over all pairs of the block" in md
    assert "over the 1 seed every setting ran" in md
    assert "318.1 [305, 331]" in md  # the recorded basic interval recentred on its value: 318.1 -+ 13
    html = (tmp_path / "out" / "leaderboard.html").read_text()
    assert "1 seed: not tested" in html and SHOWN in html


def test_separated_intervals_get_different_ranks(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "a", method="fedprox", params={"mu": 0.01}, evaluations=[fd_ci(318.1, 310.0, 326.0)])
    make_run(runs, "b", method="fedavg", evaluations=[fd_ci(421.7, 409.0, 434.0)])
    make_run(runs, "c", method="random_prune", params={"keep_ratio": 0.5}, evaluations=[fd_ci(867.5, 850.0, 880.0)])
    build_report(runs, tmp_path / "out")
    assert _ranks(tmp_path / "out") == {"fedprox": (1, None, None), "fedavg": (2, None, None), "random_prune": (3, None, None)}


def test_seeds_give_paired_verdicts_rank_intervals_and_positive_intervals(tmp_path):
    # fedavg 10.0 / 10.2 / 9.9 (tight), fedprox 12.0 / 12.1 / 11.8 (x1.2 at every seed: worse, paired),
    # quantized 10.0 / 14.0 / 6.0 (wide): its geometric mean 9.43 is the lowest, but nothing is settled
    runs = tmp_path / "runs"
    for seed, (a, b, c) in enumerate([(10.0, 12.0, 10.0), (10.2, 12.1, 14.0), (9.9, 11.8, 6.0)]):
        make_run(runs, f"fa{seed}", seed=seed, evaluations=[fd_ci(a, a - 5, a + 5)])
        make_run(runs, f"fp{seed}", seed=seed, method="fedprox", params={"mu": 0.1}, evaluations=[fd_ci(b, b - 5, b + 5)])
        make_run(runs, f"q{seed}", seed=seed, method="quantized", params={"bits": 4}, evaluations=[fd_ci(c, c - 5, c + 5)])
    build_report(runs, tmp_path / "out")
    ranks = _ranks(tmp_path / "out")
    assert ranks["quantized"][0] == 1 and ranks["quantized"][1:] == (1, 3)
    assert ranks["fedavg"][0] == 2 and ranks["fedprox"][0] == 3
    csv = pd.read_csv(tmp_path / "out" / "leaderboard.csv").set_index("method")
    assert csv.loc["fedprox", "verdict"] == "worse" and csv.loc["quantized", "verdict"] == "inconclusive"
    assert csv.loc["fedavg", "verdict"] == "reference"
    assert csv.loc["fedprox", "estimate"] == pytest.approx((12.0 * 12.1 * 11.8 / (10.0 * 10.2 * 9.9)) ** (1 / 3))
    assert csv.loc["quantized", "seeds_to_decide"] > 3
    fedavg = csv.loc["fedavg"]
    assert "geometric mean" in fedavg["fd_fmnist_ci_method"] and "3 seeds" in fedavg["fd_fmnist_ci_method"]
    assert fedavg["fd_fmnist_ci_low"] < (10.0 * 10.2 * 9.9) ** (1 / 3) < fedavg["fd_fmnist_ci_high"] < 10.6
    assert (csv["fd_fmnist_ci_low"] > 0).all()  # a distance's interval never reaches 0
    md = (tmp_path / "out" / "leaderboard.md").read_text()
    assert "first place is not settled: the paired evidence puts it at ranks 1–3" in md
    assert "- rank (a–b): a = 1 + the settings significantly better, b = the settings not significantly worse" in md
    assert ranks["fedavg"][1:] == (1, 2) and ranks["fedprox"][1:] == (2, 3)  # fedprox: worse than fedavg at every seed
    assert "Against fedavg, paired by seed (Holm-corrected, equivalent within ±10%): 1 worse, 1 inconclusive." in md


def test_new_metric_columns_and_absent_metrics(tmp_path):
    runs = tmp_path / "runs"
    prec = {"metric": "precision_fmnist", "value": 0.61, "better": "higher", "extractor": "fmnist"}
    make_run(runs, "a", evaluations=[fd_ci(20.0, 15.0, 25.0), prec],
             extra_metrics={"evaluation_notes": ["mode coverage: no classifier for dataset 'fmnist'"]})
    make_run(runs, "b", method="fedprox", params={"mu": 0.1}, evaluations=[fd_ci(30.0, 26.0, 34.0)])
    build_report(runs, tmp_path / "out")
    data = collect(runs)
    assert "precision_fmnist" in data.metrics
    csv = pd.read_csv(tmp_path / "out" / "leaderboard.csv")
    fedprox = csv[csv["method"] == "fedprox"].iloc[0]
    assert math.isnan(fedprox["precision_fmnist_mean"])  # absent, never 0
    md = (tmp_path / "out" / "leaderboard.md").read_text()
    assert "precision_fmnist ↑" in md
    assert "not computed: mode coverage: no classifier for dataset 'fmnist'" in md


def test_interval_sentence_names_each_kind_once_with_its_metrics(tmp_path):
    # fd_fmnist carries the reference-fixed bootstrap, mode_tv the plain one: each named once, with its metric
    runs = tmp_path / "runs"
    plain = "95% basic bootstrap over generated samples"
    tv = {"metric": "mode_tv", "value": 0.2, "ci_low": 0.15, "ci_high": 0.25, "ci_level": 0.95, "ci_method": plain}
    make_run(runs, "a", evaluations=[fd_ci(20.0, 15.0, 25.0), tv])
    make_run(runs, "b", method="fedprox", params={"mu": 0.1}, evaluations=[fd_ci(30.0, 26.0, 34.0), dict(tv, value=0.3)])
    build_report(runs, tmp_path / "out")
    md = (tmp_path / "out" / "leaderboard.md").read_text()
    line = next(x for x in md.splitlines() if "Intervals [low, high]:" in x)
    line = line[line.index("Intervals [low, high]:"):]
    assert f"fd_fmnist: {SHOWN}" in line and f"mode_tv: {plain};" not in line and f"mode_tv: {plain}." in line
    assert line.count("basic bootstrap") == 1


@pytest.mark.parametrize(
    "values,lows,highs,higher,expected",
    [
        # A overlaps B, B overlaps C, A and C disjoint: A=1, B=1 (nothing clearly better), C=2
        ([1.0, 2.0, 3.0], [0.5, 1.2, 2.6], [1.5, 2.8, 3.5], False, [(1, True), (1, True), (2, False)]),
        ([0.9, 0.5], [0.85, 0.4], [0.95, 0.6], True, [(1, False), (2, False)]),  # higher is better
        ([1.0, float("nan"), 2.0], [None, None, None], [None, None, None], False, [(1, False), (None, False), (2, False)]),
    ],
)
def test_tie_ranks_by_hand(values, lows, highs, higher, expected):
    assert tie_ranks(values, lows, highs, higher_is_better=higher) == expected


def test_a_planted_bimodal_setting_is_flagged_on_the_page_and_not_ranked_first(tmp_path):
    # two good seeds (better than FedAvg's) and one collapsed at the untrained score: its geometric mean
    # (232) would not rank it first anyway, but its arithmetic mean of its good seeds would; the page
    # must say it collapsed once and is not shown better than the untrained model, and rank it last
    runs = tmp_path / "runs"
    for seed, (fa, bi, un) in enumerate([(150.0, 118.0, 880.0), (120.0, 1010.0, 900.0), (160.0, 115.0, 870.0)]):
        make_run(runs, f"fa{seed}", seed=seed, evaluations=[fd_ci(fa, fa - 5, fa + 5)])
        make_run(runs, f"bi{seed}", seed=seed, method="random_prune", params={"keep_ratio": 0.5},
                 evaluations=[fd_ci(bi, bi - 5, bi + 5)])
        make_run(runs, f"un{seed}", seed=seed, rounds=0, evaluations=[fd_ci(un, un - 5, un + 5)], uplink_bits=0)
    build_report(runs, tmp_path / "out")
    csv = pd.read_csv(tmp_path / "out" / "leaderboard.csv")
    trained = csv[~csv["baseline"]].set_index("method")
    assert trained.loc["random_prune", "rank"] == 2 and trained.loc["fedavg", "rank"] == 1
    assert (trained.loc["random_prune", "collapsed"], trained.loc["random_prune", "collapse_seeds"]) == (1, 3)
    assert bool(trained.loc["random_prune", "floor"]) and not bool(trained.loc["fedavg", "floor"])
    md = (tmp_path / "out" / "leaderboard.md").read_text()
    assert "collapsed 1/3 (unstable); not better than untrained" in md
    assert "Not shown better than the untrained model (ranked last): random_prune (keep_ratio=0.5)." in md
    assert "Collapsed on some seeds only: random_prune (keep_ratio=0.5) (1/3)." in md
    # each flag the table uses is explained under it, once
    legend = [ln for ln in md.splitlines() if ln.startswith(("- collapsed k/n:", "- unstable:", "- not better than untrained:"))]
    assert len(legend) == 3 and "untrained model" in legend[0]
