"""A leaderboard's paired contrast is re-decided on the declared independent checks of the ranking metric, and says
whether they agree and whether the two settings had the same budget (issue 54, items 1 and 4;
benchmark/report/frames.py `_across_metrics`, benchmark/report/budget.py, the page's "Paired verdicts on every
metric")."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dfbench.benchmark.metrics import table as metric_table
from dfbench.benchmark.report import budget
from dfbench.benchmark.report.frames import collect
from dfbench.benchmark.report.layout import PageMeta, sections
from helpers import fd, make_run

SEEDS = range(5)
FEDAVG_FD = [100.0, 120.0, 90.0, 110.0, 105.0]
FEDAVG_LOSS = [0.50, 0.52, 0.49, 0.51, 0.50]
JITTER = [1.00, 1.02, 0.99, 1.01, 0.98]


def _loss(value: float) -> dict:
    return {"metric": "denoise_loss", "value": value, "std_err": 0.001, "reference": "fmnist/test"}


@pytest.fixture()
def report(tmp_path):
    runs = tmp_path / "runs"
    for s in SEEDS:
        make_run(runs, f"s{s}-fa", seed=s, evaluations=[fd(FEDAVG_FD[s]), _loss(FEDAVG_LOSS[s])])
        # fedprox: half the distance, but a held-out loss 1.2x FedAvg's on every seed (the metrics disagree)
        make_run(runs, f"s{s}-fp", seed=s, method="fedprox", params={"mu": 0.01},
                 evaluations=[fd(0.5 * FEDAVG_FD[s] * JITTER[s]), _loss(1.2 * FEDAVG_LOSS[s] * JITTER[::-1][s])])
        # random pruning: better in both, but trained twice the rounds (an unequal budget)
        make_run(runs, f"s{s}-rp", seed=s, method="random_prune", params={"keep_ratio": 0.5}, rounds=6,
                 evaluations=[fd(0.6 * FEDAVG_FD[s] * JITTER[s]), _loss(0.8 * FEDAVG_LOSS[s] * JITTER[s])])
    return collect(runs)


def _row(data, method: str) -> pd.Series:
    return data.table[data.table["method"] == method].iloc[0]


def test_denoise_loss_is_a_declared_independent_check_of_the_ranking_metric():
    assert "denoise_loss" in metric_table.independent_checks("fmnist")


def test_a_contrast_the_held_out_loss_reverses_is_metric_dependent_with_each_estimate(report):
    row = _row(report, "fedprox")
    assert row["verdict"] == "better" and row["estimate"] == pytest.approx(0.5 * np.exp(np.mean(np.log(JITTER))))
    assert row["metrics_agree"] == "metric-dependent" and row["budget"] == "equal"
    # the loss's estimate: the geometric mean of the per-seed ratios, from numpy, and its verdict worse
    ratio = np.exp(np.mean(np.log(1.2 * np.array(JITTER[::-1]))))
    assert f"denoise_loss ×{ratio:.3g} worse" in row["other_metrics"]
    # the same test by scipy on the logs: significant even after Holm over the block's two contrasts
    loss = {m: np.log([r["denoise_loss"] for _, r in report.runs[report.runs["method"] == m].sort_values("seed").iterrows()])
            for m in ("fedavg", "fedprox")}
    assert 2 * stats.ttest_rel(loss["fedprox"], loss["fedavg"]).pvalue < 0.05


def test_a_contrast_every_metric_decides_the_same_way_agrees_and_an_unequal_budget_is_named(report):
    row = _row(report, "random_prune")
    assert row["verdict"] == "better" and row["metrics_agree"] == "agree"
    assert "denoise_loss" in row["other_metrics"] and row["other_metrics"].endswith("better")
    # the runs record no client_images: client work = rounds x local steps x batch x clients (helpers.BUDGET: 2, 8,
    # 4), 6 x 64 = 384 against 3 x 64 = 192
    assert row["budget"] == "unequal budget (client work A: 384, B: 192; rounds A: 6, B: 3)"
    assert _row(report, "fedavg")["metrics_agree"] == ""  # the reference has no contrast of its own


def test_the_page_marks_both_in_the_paired_column_and_lists_every_metric(report):
    (sec,) = sections(report.table, report.metrics, PageMeta(), {})
    col = next(i for i, h in enumerate(sec.main.headers) if h.endswith("(paired)"))
    cells = {r[1]: r[col] for r in sec.main.rows}
    assert cells["fedprox"].startswith("better") and cells["fedprox"].endswith("· metric-dependent")
    assert cells["random_prune"].endswith("· unequal budget") and "metric-dependent" not in cells["random_prune"]
    (table,) = [t for t in sec.secondary if t.title == "Paired verdicts on every metric"]
    assert {r[1].split(" ")[0]: r[4] for r in table.rows} == {"fedprox": "metric-dependent", "random_prune": "agree"}


def test_budget_compare_prefers_recorded_client_work_and_counts_edge_rounds():
    a = pd.DataFrame({"client_images": [100.0, 100.0], "cfg.rounds": [2, 2], "cfg.edges": [2, 2], "cfg.edge_rounds": [3, 3]})
    b = pd.DataFrame({"client_images": [100.5, 99.5], "cfg.rounds": [6, 6], "cfg.edges": [0, 0], "cfg.edge_rounds": [3, 3]})
    assert budget.compare([a, b]) == "equal"  # 2 cloud rounds x 3 edge rounds = 6 client rounds; work within 1 %
    c = b.assign(client_images=[150.0, 150.0], **{"cfg.rounds": [5, 5]})
    assert budget.compare([a, c]) == "unequal budget (client work A: 100, B: 150; rounds A: 6, B: 5)"


def test_a_single_paired_seed_is_not_tested_across_metrics_either(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "s0-fa", seed=0, evaluations=[fd(100.0), _loss(0.5)])
    make_run(runs, "s0-fp", seed=0, method="fedprox", params={"mu": 0.01}, evaluations=[fd(50.0), _loss(0.6)])
    data = collect(runs)
    row = _row(data, "fedprox")
    assert row["metrics_agree"] == "not tested (one seed)" and "denoise_loss ×1.2" in row["other_metrics"]
    (sec,) = sections(data.table, data.metrics, PageMeta(), {})
    col = next(i for i, h in enumerate(sec.main.headers) if h.endswith("(paired)"))
    assert not any("metric-dependent" in r[col] for r in sec.main.rows)


def test_one_seed_says_not_tested_in_both_tables_and_in_a_page_rerendered_from_an_old_csv(tmp_path):
    # issue 61, item 7: with one seed the main table said "1 seed: not tested" while "Paired verdicts on every metric"
    # said "inconclusive" for the very same contrast
    runs = tmp_path / "runs"
    make_run(runs, "s0-fa", seed=0, evaluations=[fd(100.0), _loss(0.5)])
    make_run(runs, "s0-fp", seed=0, method="fedprox", params={"mu": 0.01}, evaluations=[fd(50.0), _loss(0.6)])
    data = collect(runs)
    assert _row(data, "fedprox")["verdict"] == "inconclusive"  # the CSV keeps the verdict, beside paired_seeds = 1
    (sec,) = sections(data.table, data.metrics, PageMeta(), {})
    col = next(i for i, h in enumerate(sec.main.headers) if h.endswith("(paired)"))
    main_cell = {r[1]: r[col] for r in sec.main.rows}["fedprox"]
    assert main_cell.endswith("(1 seed: not tested)")
    (across,) = [t for t in sec.secondary if t.title == "Paired verdicts on every metric"]
    (row,) = across.rows
    assert row[1].startswith("fedprox") and "inconclusive" not in " ".join(row[2:4])
    assert row[2] == "fd_fmnist ×0.5 (1 seed: not tested)" and row[3] == "denoise_loss ×1.2 (1 seed: not tested)"
    # a leaderboard.csv written before (its other_metrics say "inconclusive") re-renders the same way
    old = data.table.copy()
    old["other_metrics"] = old["other_metrics"].str.replace("(1 seed: not tested)", "inconclusive", regex=False)
    (sec_old,) = sections(old, data.metrics, PageMeta(), {})
    (across_old,) = [t for t in sec_old.secondary if t.title == "Paired verdicts on every metric"]
    assert across_old.rows == across.rows
