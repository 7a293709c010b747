"""Formatting shared by the Markdown and HTML leaderboards and the mosaic captions.

Numbers as short strings, the sentence on a block's intervals, and how each metric was
computed (:func:`metric_provenance`); what the page shows is ``layout``'s.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from dfbench.benchmark.report.frames import ordered_metrics
# Config keys listed after the other varying ones in a block's main table (shown only when they vary).
from dfbench.benchmark.report.names import ALWAYS_SHOWN_CONFIG  # noqa: F401  (re-exported)
from dfbench.benchmark.report.run_records import to_float


def fmt_number(value: Any, digits: int = 4) -> str:
    value = to_float(value)
    if math.isnan(value):
        return ""
    if math.isinf(value):
        return "inf"
    if abs(value) >= 10 ** digits:
        return f"{value:.0f}"
    return f"{value:.{digits}g}"


def fmt_metric(row: pd.Series, metric: str, group_n: int) -> str:
    """A setting's score: over seeds of a positive metric its geometric mean [interval], of any other
    its mean ± std [interval]; one seed: the value ± its standard error where the metric has one."""
    mean, std, n, se = (row[f"{metric}_{s}"] for s in ("mean", "std", "n", "stderr"))
    if n == 0 or pd.isna(mean):
        return ""
    gmean = to_float(row.get(f"{metric}_gmean", math.nan))
    text = fmt_number(mean)
    if n > 1 and not math.isnan(gmean):
        text = fmt_number(gmean)
    elif n > 1 and not pd.isna(std):
        text += f" ± {fmt_number(std, 2)}"
    elif n == 1 and not pd.isna(se):
        text += f" ± {fmt_number(se, 2)} (s.e.)"
    low, high = row.get(f"{metric}_ci_low", math.nan), row.get(f"{metric}_ci_high", math.nan)
    if not (pd.isna(low) or pd.isna(high)):
        text += f" [{fmt_number(low, 3)}, {fmt_number(high, 3)}]"
    if n != group_n:
        text += f" (n={n})"
    return text


def rank_text(row: Mapping[str, Any]) -> str:
    """"2 (1–4)": the point rank and, in brackets, the ranks the paired contrasts leave it (verdicts.py:
    1 + the settings significantly better, to the settings not significantly worse; none with one seed).
    A page re-rendered from an older leaderboard.csv writes its shared ranks as it did ("1=")."""
    if pd.isna(row.get("rank")):
        return ""
    text = str(int(row["rank"]))
    low, high = to_float(row.get("rank_low")), to_float(row.get("rank_high"))
    if not (math.isnan(low) or math.isnan(high)):
        text += f" ({int(low)})" if low == high else f" ({int(low)}–{int(high)})"
    elif str(row.get("rank_tie")).lower() == "true":
        text += "="
    return text


def _fmt_seconds(seconds: Any) -> str:
    seconds = to_float(seconds)
    if math.isnan(seconds):
        return ""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _fmt_reach(row: pd.Series) -> str:
    """The time-to-target cell: mean over the seeds that reached it, '(k/n)' if not all did."""
    k, n = int(row.get("time_to_target_reached", 0) or 0), int(row["n"])
    if k == 0:
        return "not reached"
    return _fmt_seconds(row["time_to_target_mean"]) + ("" if k == n else f" ({k}/{n})")


def interval_sentence(block: pd.DataFrame, primary: str | None, verdicts: bool = True) -> str:
    """What the intervals in a block are and how ties are ranked (the leaderboard's own words)."""
    by_kind: dict[str, list[str]] = {}  # interval kind -> the metrics that carry it
    for col in sorted(c for c in block.columns if c.endswith("_ci_method")):
        # "across 16 seeds" and "across 3 seeds" are one kind: each setting's own count is in the table
        kinds = {re.sub(r"across \d+ seeds", "across a setting's seeds", str(k)) for k in block[col].dropna()}
        for kind in sorted(kinds):
            by_kind.setdefault(kind, []).append(col[: -len("_ci_method")])
    if not by_kind:
        return "No intervals recorded: ranks follow the values alone."
    # one kind: said once; several (e.g. the Frechet distance's and mode coverage's bootstraps):
    # each with the metrics it belongs to
    parts = list(by_kind) if len(by_kind) == 1 else [f"{', '.join(ms)}: {kind}" for kind, ms in by_kind.items()]
    text = "Intervals [low, high]: " + "; ".join(parts) + "."
    if primary and not verdicts:  # a leaderboard.csv from before the verdicts: the rule its ranks were made by
        text += (f" Rank = 1 + the number of settings whose {primary} interval lies wholly on the better side of "
                 "this one's (clearly better); `=` marks a rank that several settings share: the differences between "
                 "them are inside the uncertainty. Two settings whose intervals overlap can still rank apart when a "
                 "third is clearly better than one of them only.")
    elif primary:
        seeds = pd.to_numeric(block.get("rank_seeds", pd.Series(dtype=float)), errors="coerce").dropna()
        over = ("over the seeds every setting ran" if seeds.empty else
                "over each setting's own seeds (the settings share no seed)" if seeds.iloc[0] == 0 else
                f"over the {int(seeds.iloc[0])} seed{'s' if seeds.iloc[0] != 1 else ''} every setting ran")
        text += (f" Rank: the order of the {primary} means {over} (a geometric mean for a positive metric), "
                 "settings not shown better than the untrained model last; in brackets the ranks the paired "
                 "evidence leaves it: 1 + the settings significantly better, to the settings not significantly "
                 "worse (paired t-tests over the seeds each two share, Holm-corrected over all pairs of the block: "
                 "the brackets hold jointly at 95 %, conservative with few seeds). Paired column: each setting "
                 "against the reference on the seeds they share "
                 "(same partition, initial model and noises): the ratio of scores (or the difference, for a metric "
                 "that can be 0) with its 95 % paired t-interval; better / worse when the Holm-corrected paired "
                 "t-test rejects no difference, equivalent when the Holm-corrected two one-sided tests put it "
                 "inside the margin, undecidable when the difference is the same at every seed (no spread to "
                 "test), else inconclusive, with the seeds that would decide it at power 0.8. "
                 "Collapsed: seeds whose score lies nearer the untrained model's than the reference's.")
    return text


def block_notes(block: pd.DataFrame) -> list[str]:
    """Metrics the runs of a block could not compute, as their metrics.json says (absent, never zero)."""
    if "evaluation_notes" not in block:
        return []
    return sorted({n for n in block["evaluation_notes"].dropna() if n})


def _fmt_meta(value: Any) -> str:
    # pandas turns int columns with gaps into floats: print 1000.0 back as 1000.
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


MIXED = "(MIXED settings: not comparable)"  # a metric computed under different settings in one block


def metric_provenance(evals: pd.DataFrame, group_keys: Iterable[str]) -> dict[str, str]:
    """metric -> how it was computed in this block (extractor, backend, samples, sampler, reference),
    "(MIXED settings: not comparable)" when the block's runs disagree."""
    sub = evals[evals["group_key"].isin(list(group_keys))]
    out: dict[str, str] = {}
    for metric in ordered_metrics(sub["metric"].unique()):
        m = sub[sub["metric"] == metric]
        parts: list[str] = []
        mixed = False
        for col in ("extractor", "extractor_sha256", "backend", "num_samples", "sampler", "sampler_steps", "reference", "resize"):
            values = sorted({_fmt_meta(v) for v in m[col] if v is not None and not (isinstance(v, float) and math.isnan(v))})
            if col == "extractor_sha256":
                values = [v[:12] for v in values]
            mixed |= len(values) > 1  # (a single value may itself contain "/", e.g. reference=fmnist/train)
            if values:
                parts.append(f"{col}={' | '.join(values)}")
        out[metric] = (", ".join(parts) or "no metadata") + (f" {MIXED}" if mixed else "")
    return out


def metric_notes(evals: pd.DataFrame, group_keys: Iterable[str]) -> list[str]:
    """How each metric was computed in this block, one line per metric."""
    return [f"{metric}: {how}" for metric, how in metric_provenance(evals, group_keys).items()]


def blocks(table: pd.DataFrame) -> list[tuple[tuple[str, str], pd.DataFrame]]:
    """The dataset/partition blocks of the leaderboard, in table order (none when no run finished)."""
    if table.empty:
        return []
    return [((str(d), str(p)), block) for (d, p), block in table.groupby(["dataset", "partition"], sort=False)]


def block_title(dataset: str, partition: str) -> str:
    """"dataset / partition"; a spec's options (a gmm: mixture's ?k=8&rank=2&...) are shown as a spaced list, so a
    long spec wraps on a narrow screen: "gmm:dim8 (k=8, rank=2, ...) / iid"."""
    name, sep, options = dataset.partition("?")
    if sep and options:
        dataset = f"{name} ({options.replace('&', ', ')})"
    return f"{dataset} / {partition}"


def safe_name(text: str) -> str:
    """File-name-safe: ':' and anything unusual become '-'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "unnamed"
