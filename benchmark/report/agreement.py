"""Do the quality metrics agree? Per block, how every other quality metric orders the settings
against the ranking metric.

For each block (dataset x partition) and each quality metric m other than the ranking metric p
(Frechet distances and KIDs in every feature space, the held-out denoising loss, the
per-client-average distance -- kinds ``QUALITY_KINDS`` of benchmark/metrics/table.py):

- Kendall's tau-b (scipy.stats.kendalltau) between the settings' seed means under p and under m (a
  distance or a loss averaged on its log, as the leaderboard ranks by the geometric mean),
  both signed so that larger is worse (tau = 1: m orders the settings exactly as p does); the means
  are over the seeds every setting ran under p, as the leaderboard's ranks are (all seeds when the
  settings share none), and each row says how many;
- its 95% interval from resampling the seeds: each replicate draws the block's seeds with
  replacement, the same draw for every setting (runs with the same seed share partition, initial
  model and noises, so the resampling keeps them paired), and recomputes both means and tau;
- the setting each metric puts first, so a reader sees whether the ranking metric's winner holds
  under the others: a winner that is best under the ranking metric only is labelled so.

The untrained baseline is left out: every metric puts it last, which would inflate tau without
saying anything about the methods. Pure pandas / numpy / scipy over the report's run frame; the
result is stored in report.json, so a page re-rendered from its CSV keeps it.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd

from dfbench.benchmark.metrics import table as metric_table

__all__ = ["QUALITY_KINDS", "REPLICATES", "block_agreement", "quality_metrics", "report_agreement"]

QUALITY_KINDS = ("frechet", "kid", "model", "client", "exact", "exact_diff")
REPLICATES = 500
_SEED = 0  # the resampling's own generator: the same report from the same runs, every time


def quality_metrics(metrics: Sequence[str], primary: str) -> list[str]:
    """The metrics compared with `primary`: known quality metrics other than it, in the report's order
    (``client_*_worst`` / ``expert_*_worst`` left out: a worst case is not an ordering of quality)."""
    out = []
    for m in metrics:
        entry = metric_table.get(m)
        if m == primary or entry is None or entry.kind not in QUALITY_KINDS:
            continue
        if entry.kind == "client" and not m.endswith("_mean"):
            continue
        out.append(m)
    return out


def _signed(values: np.ndarray, metric: str) -> np.ndarray:
    return -values if metric_table.better(metric) == "higher" else values


def _tau(x: np.ndarray, y: np.ndarray) -> float:
    from scipy import stats

    ok = ~(np.isnan(x) | np.isnan(y))
    if ok.sum() < 3 or np.ptp(x[ok]) == 0 or np.ptp(y[ok]) == 0:
        return math.nan
    return float(stats.kendalltau(x[ok], y[ok]).statistic)


def block_agreement(runs: pd.DataFrame, primary: str, metrics: Sequence[str], replicates: int = REPLICATES,
                    seed: int = _SEED) -> dict[str, Any]:
    """{"primary", "best": the setting (group_key) the ranking metric puts first, "rows": one per other
    quality metric with tau, tau_low, tau_high, settings, best, agrees_on_best} for one block's runs
    (columns group_key, seed, baseline and one per metric)."""
    runs = runs[~runs["baseline"].astype(bool)] if "baseline" in runs else runs
    others = [m for m in quality_metrics(metrics, primary) if m in runs and runs[m].notna().any()]
    if primary not in runs or runs[primary].notna().sum() == 0:
        return {"primary": primary, "best": None, "rows": []}
    settings = sorted(runs["group_key"].unique())
    seeds = sorted(runs["seed"].dropna().unique())
    # the seeds every setting ran (with a score under the ranking metric): settings compared on the same seeds
    scored = runs[runs[primary].notna()]
    common = sorted(set.intersection(*(set(g["seed"].dropna()) for _, g in scored.groupby("group_key"))))
    seeds = common or seeds

    def cube(metric: str) -> np.ndarray:  # [settings, seeds], NaN where a run is missing
        pivot = runs.pivot_table(index="group_key", columns="seed", values=metric, aggfunc="mean")
        values = pivot.reindex(index=settings, columns=seeds).to_numpy(dtype=float)
        if metric_table.scale(metric) == "log" and bool((values[~np.isnan(values)] > 0).all()):
            values = np.log(values)  # a distance or a loss: averaged on its log, as the leaderboard ranks it
        return _signed(values, metric)

    base = cube(primary)
    mean_p = np.nanmean(base, axis=1)
    best_p = settings[int(np.nanargmin(mean_p))]
    gen = np.random.default_rng(seed)
    draws = [gen.integers(0, len(seeds), len(seeds)) for _ in range(replicates)] if len(seeds) > 1 else []
    rows = []
    for metric in others:
        values = cube(metric)
        with np.errstate(all="ignore"), _quiet():
            mean_m = np.nanmean(values, axis=1)
        tau = _tau(mean_p, mean_m)
        boot = []
        for pick in draws:
            with np.errstate(all="ignore"), _quiet():
                boot.append(_tau(np.nanmean(base[:, pick], axis=1), np.nanmean(values[:, pick], axis=1)))
        boot_arr = np.array([b for b in boot if not math.isnan(b)])
        low, high = (np.quantile(boot_arr, [0.025, 0.975]) if boot_arr.size >= 20 else (math.nan, math.nan))
        scored = ~np.isnan(mean_m)
        best_m = settings[int(np.nanargmin(np.where(scored, mean_m, np.inf)))] if scored.any() else None
        rows.append({"metric": metric, "tau": tau, "tau_low": float(low), "tau_high": float(high),
                     "settings": int((scored & ~np.isnan(mean_p)).sum()), "seeds": len(seeds),
                     "best": best_m, "agrees_on_best": best_m == best_p if best_m is not None else None})
    return {"primary": primary, "best": best_p, "rows": rows}


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence numpy's "mean of empty slice" for settings a resample leaves without a value."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def report_agreement(runs: pd.DataFrame, table: pd.DataFrame, metrics: Sequence[str],
                     title: Any) -> dict[str, dict[str, Any]]:
    """block title -> `block_agreement` for every block of the report whose runs have a ranking metric.
    `title(dataset, partition)` names a block as the page does."""
    out: dict[str, dict[str, Any]] = {}
    if runs.empty or "primary_metric" not in table:
        return out
    for (dataset, partition), block in table.groupby(["dataset", "partition"], sort=False):
        primary = block["primary_metric"].iloc[0]
        if not isinstance(primary, str) or not primary:
            continue
        these = runs[(runs["dataset"] == dataset) & (runs["partition"] == partition)]
        result = block_agreement(these, primary, metrics)
        if result["rows"]:
            out[str(title(dataset, partition))] = result
    return out
