"""Formatting shared by the Markdown and HTML leaderboards and the mosaic captions.

Numbers as short strings, one block's display rows (:func:`block_view`), and
the per-block note on how each metric was computed (:func:`metric_notes`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd

from dfbench.benchmark.report.frames import ordered_metrics
from dfbench.benchmark.report.run_folders import to_float

# Budget columns always shown in the block tables (others only when they vary).
ALWAYS_SHOWN_CONFIG: tuple[str, ...] = ("rounds",)


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
    mean, std, n, se = (row[f"{metric}_{s}"] for s in ("mean", "std", "n", "stderr"))
    if n == 0 or pd.isna(mean):
        return ""
    text = fmt_number(mean)
    if n > 1 and not pd.isna(std):
        text += f" ± {fmt_number(std, 2)}"
    elif n == 1 and not pd.isna(se):
        text += f" ± {fmt_number(se, 2)} (s.e.)"
    low, high = row.get(f"{metric}_ci_low", math.nan), row.get(f"{metric}_ci_high", math.nan)
    if not (pd.isna(low) or pd.isna(high)):
        text += f" [{fmt_number(low, 3)}, {fmt_number(high, 3)}]"
    if n != group_n:
        text += f" (n={n})"
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


def block_view(block: pd.DataFrame, metrics: Sequence[str], higher: Iterable[str] = (),
               target: tuple[str, float] | None = None) -> tuple[list[str], list[list[str]], dict[str, str]]:
    """Headers, display rows and shared settings of one dataset/partition block.

    Metrics in `higher` (better when higher) get " ↑" in their header; a rank shared with
    another setting (overlapping intervals) is written "1=". "sim time" (the simulated clock)
    appears when a run of the block recorded one, "ε (DP)" when a run ran under DP with noise
    (∞ for the block's other settings: no guarantee); with `target` (metric, value) a column gives
    the simulated time to first reach it on the quality curve: the mean over the seeds that
    do, and "(k/n)" when not all of them do ("not reached" when none).
    """
    higher = set(higher)
    present = [m for m in metrics if block[f"{m}_n"].gt(0).any()]
    cfg_cols = [c for c in block.columns if c.startswith("cfg.")]
    varying = [c for c in cfg_cols if block[c].astype(str).nunique(dropna=False) > 1]
    shown_cfg = [f"cfg.{c}" for c in ALWAYS_SHOWN_CONFIG if f"cfg.{c}" in block.columns]
    shown_cfg += [c for c in varying if c not in shown_cfg]
    shared = {c[4:]: str(block[c].iloc[0]) for c in cfg_cols if c not in shown_cfg and c not in varying}
    drift = block["drift_mean"].notna().any() if "drift_mean" in block else False  # same-noise drift, when any run has it
    sim = bool(block["sim_seconds_mean"].notna().any()) if "sim_seconds_mean" in block else False
    eps = bool(block["epsilon_mean"].notna().any()) if "epsilon_mean" in block else False  # a DP run with noise
    reach = target is not None and "time_to_target_mean" in block
    reach_header = [f"sim time to {target[0]} {'≥' if target[0] in higher else '≤'} {target[1]:g}"] if reach and target else []
    headers = ["rank", "method", "params", *[f"{m} ↑" if m in higher else m for m in present], *(["drift"] if drift else []), "n", "uplink MB", "compression", "wall time",
               *(["sim time"] if sim else []), *(["ε (DP)"] if eps else []), *reach_header, *[c[4:] for c in shown_cfg]]
    rows: list[list[str]] = []
    for _, row in block.iterrows():
        ratio = row["compression_ratio"]
        compression = "" if pd.isna(ratio) else f"x{ratio:.1f}" + ("*" if row["compression_ref"] == "per upload" else "")
        rank = "" if pd.isna(row["rank"]) else str(int(row["rank"])) + ("=" if row.get("rank_tie") else "")
        method = f"untrained ({row['method']})" if row["baseline"] else str(row["method"])
        rows.append(
            [rank, method, str(row["params"]), *[fmt_metric(row, m, int(row["n"])) for m in present],
             *([fmt_number(row["drift_mean"]) if not pd.isna(row["drift_mean"]) else ""] if drift else []),
             str(int(row["n"])), fmt_number(row["uplink_mb_mean"]), compression, _fmt_seconds(row["wall_seconds_mean"]),
             *([_fmt_seconds(row["sim_seconds_mean"])] if sim else []),
             *([fmt_number(row["epsilon_mean"]) if not pd.isna(row["epsilon_mean"]) else "∞"] if eps else []),
             *([_fmt_reach(row)] if reach else []),
             *[fmt_number(row[c]) if isinstance(row[c], (int, float)) and not isinstance(row[c], bool) else str(row[c])
               for c in shown_cfg]]
        )
    return headers, rows, shared


def _fmt_reach(row: pd.Series) -> str:
    """The time-to-target cell: mean over the seeds that reached it, '(k/n)' if not all did."""
    k, n = int(row.get("time_to_target_reached", 0) or 0), int(row["n"])
    if k == 0:
        return "not reached"
    return _fmt_seconds(row["time_to_target_mean"]) + ("" if k == n else f" ({k}/{n})")


def interval_sentence(block: pd.DataFrame, primary: str | None) -> str:
    """What the intervals in a block are and how ties are ranked (the leaderboard's own words)."""
    by_kind: dict[str, list[str]] = {}  # interval kind -> the metrics that carry it
    for col in sorted(c for c in block.columns if c.endswith("_ci_method")):
        for kind in sorted({str(k) for k in block[col].dropna()}):
            by_kind.setdefault(kind, []).append(col[: -len("_ci_method")])
    if not by_kind:
        return "No intervals recorded: ranks follow the values alone."
    # one kind: said once; several (e.g. the Frechet distance's and mode coverage's bootstraps):
    # each with the metrics it belongs to
    parts = list(by_kind) if len(by_kind) == 1 else [f"{', '.join(ms)}: {kind}" for kind, ms in by_kind.items()]
    text = "Intervals [low, high]: " + "; ".join(parts) + "."
    if primary:
        text += (f" Settings whose {primary} intervals overlap share a rank (`=` marks a tie): "
                 "the difference between them is inside the uncertainty.")
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


def metric_notes(evals: pd.DataFrame, group_keys: Iterable[str]) -> list[str]:
    """How each metric was computed in this block (extractor, backend, samples, sampler, reference)."""
    sub = evals[evals["group_key"].isin(list(group_keys))]
    notes: list[str] = []
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
        notes.append(f"{metric}: {', '.join(parts) or 'no metadata'}" + (" (MIXED settings: not comparable)" if mixed else ""))
    return notes


def blocks(table: pd.DataFrame) -> list[tuple[tuple[str, str], pd.DataFrame]]:
    """The dataset/partition blocks of the leaderboard, in table order (none when no run finished)."""
    if table.empty:
        return []
    return [((str(d), str(p)), block) for (d, p), block in table.groupby(["dataset", "partition"], sort=False)]


def block_title(dataset: str, partition: str) -> str:
    return f"{dataset} / {partition}"


def safe_name(text: str) -> str:
    """File-name-safe: ':' and anything unusual become '-'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "unnamed"
