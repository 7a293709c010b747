"""Seed-paired comparison of every setting with a reference method (FedAvg by default).

    python scripts/paired.py --runs results/cpu-aggregation/runs --out results/cpu-aggregation

Within a grid block (dataset, partition, budget; capacity tiers aside), runs with the same seed share the partition,
the initial model and the fixed noises, so most of the seed-to-seed spread is common to every
method. The leaderboard's per-setting t-intervals ignore that pairing and overlap at three seeds;
the per-seed difference to the reference removes the shared part. For each setting this writes
the differences seed by seed, how many seeds it beats the reference at, and the mean difference
with its 95 % Student-t interval over the shared seeds (`paired_vs_<reference>.md` / `.csv`).
The verdict is the leaderboard's (benchmark/report/verdicts.py): a positive metric compared as the
ratio of scores (`ratio` [low, high]), better / worse when the paired t-test rejects no difference,
equivalent when two one-sided tests put it inside +-10 % of the reference, else inconclusive, both
Holm-corrected over the block's comparisons. The leaderboard shows the same verdicts in its main
table; this file keeps the per-seed differences beside them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from dfbench.benchmark.metrics import table as metric_table
from dfbench.benchmark.report import verdicts as V
from dfbench.benchmark.report.study_tools import load_study, seed_differences, write_study
from dfbench.methods.registry import reference_method

BLOCK = ["dataset", "partition", "_pair_budget"]
# Capacity tiers configure the resource-aware methods (HeteroFL's widths, pruning keep ratios);
# FedAvg trains every client whole either way, so a tiered run is paired with the untiered FedAvg.
UNPAIRED_BUDGET_KEYS = ("capacity",)


def _pair_budget(budget_key: str) -> str:
    budget = json.loads(budget_key)
    return json.dumps({k: v for k, v in budget.items() if k not in UNPAIRED_BUDGET_KEYS}, sort_keys=True)
COLUMNS = ["dataset", "partition", "setting", "seeds", "differences", "wins", "mean", "low", "high", "ratio", "ratio_low",
           "ratio_high", "p_holm", "p_equivalence_holm", "verdict"]


def paired_table(runs: pd.DataFrame, metric: str, reference: str | None = None, higher_better: bool = False,
                 margin: float = V.MARGIN) -> pd.DataFrame:
    """One row per (block, setting) with a reference run at a shared seed.

    `runs` needs the columns dataset, partition, budget_key, setting, baseline, seed and `metric`;
    the reference is the setting named `reference` (a method without parameters, or the full
    setting label). Untrained baselines are skipped. Differences are setting minus reference; the
    verdict is the paired test of the module doc, Holm-corrected over the block.
    """
    reference = reference or reference_method()  # default: the method that declares itself the reference
    rows = []
    trained = runs[~runs["baseline"].astype(bool)] if "baseline" in runs else runs
    trained = trained.assign(_pair_budget=trained["budget_key"].map(_pair_budget))
    positive = metric_table.scale(metric) == "log" and bool((trained[metric].dropna() > 0).all())
    scale = "log" if positive else "difference"
    for key, block in trained.groupby(BLOCK, sort=True, dropna=False):
        ref = block[block["setting"] == reference].dropna(subset=[metric]).set_index("seed")[metric]
        if ref.empty:
            continue
        found, tests = [], []
        for setting, group in block[block["setting"] != reference].groupby("setting", sort=False):
            values = group.dropna(subset=[metric]).set_index("seed")[metric]
            seeds, diff, mean, low, high = seed_differences(values, ref)
            if not seeds:
                continue
            x, r = V.transform([values[s] for s in seeds], scale), V.transform([ref[s] for s in seeds], scale)
            t = V.paired_t(x - r)
            bounds = V.equivalence_bounds(scale, margin, float(np.mean([ref[s] for s in seeds])))
            tests.append((t.p, V.tost_p(x, r, bounds), t.mean))
            wins = int((diff > 0).sum() if higher_better else (diff < 0).sum())
            found.append({"dataset": key[0], "partition": key[1], "setting": setting,
                          "seeds": ",".join(str(int(s)) for s in seeds),
                          "differences": " / ".join(f"{d:+.1f}" for d in diff),
                          "wins": f"{wins}/{len(seeds)}", "mean": mean, "low": low, "high": high,
                          "ratio": V.back(t.mean, scale) if positive else math.nan,
                          "ratio_low": V.back(t.low, scale) if positive else math.nan,
                          "ratio_high": V.back(t.high, scale) if positive else math.nan})
        for row, p, q, (_, _, m) in zip(found, V.holm([t[0] for t in tests]), V.holm([t[1] for t in tests]), tests):
            row["p_holm"], row["p_equivalence_holm"] = p, q
            row["verdict"] = V.verdict(p, q, m, lower_better=not higher_better)
        rows += found
    table = pd.DataFrame(rows, columns=COLUMNS)
    return table.sort_values(["dataset", "partition", "mean"], ascending=[True, True, not higher_better],
                             kind="stable").reset_index(drop=True)


def to_markdown(table: pd.DataFrame, metric: str, reference: str, higher_better: bool) -> str:
    better = "higher" if higher_better else "lower"
    lines = [f"# {metric}: each setting minus {reference}, paired by seed",
             "",
             f"Same seed = same partition, initial model and fixed noises. `differences`: per shared seed "
             f"({better} {metric} is better, so a {'positive' if higher_better else 'negative'} difference "
             f"favours the setting); `wins`: seeds where the setting beats {reference}; mean difference with "
             f"its 95 % Student-t interval over the seeds; `verdict`: better / worse / equivalent (±10 %) / "
             f"inconclusive by the paired test on the ratio of scores (a positive metric) or the difference, "
             f"Holm-corrected over the block (the leaderboard's verdicts, benchmark/report/verdicts.py). "
             f"Written by `python scripts/paired.py`."]
    for (dataset, partition), block in table.groupby(["dataset", "partition"], sort=False):
        lines += ["", f"## {dataset} / {partition}", "",
                  f"| setting | seeds | {metric} − {reference} per seed | wins | mean [95% t] | verdict |",
                  "|---|---|---|---|---|---|"]
        for _, r in block.iterrows():
            ci = f" [{r['low']:+.1f}, {r['high']:+.1f}]" if math.isfinite(r["low"]) else ""
            lines.append(f"| {r['setting']} | {r['seeds']} | {r['differences']} | {r['wins']} | "
                         f"{r['mean']:+.1f}{ci} | {r['verdict']} |")
    return "\n".join(lines) + "\n"


def write(runs_dir: str | Path, out: str | Path, reference: str | None = None, metric: str | None = None) -> list[Path]:
    """paired_vs_<reference>.md / .csv in `out` from the runs under `runs_dir`; the paths written."""
    reference = reference or reference_method()  # default: the method that declares itself the reference
    study = load_study(runs_dir, metric, reference=reference)
    table = paired_table(study.data.runs, study.metric, reference, study.higher)
    return write_study(out, f"paired_vs_{reference}", to_markdown(table, study.metric, reference, study.higher), table)
