"""Leaderboard writers: ``leaderboard.csv`` (machine-readable, every column) and ``leaderboard.md``.

The page layout (what each table holds) is ``layout``'s; the self-contained HTML report is ``html``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from dfbench.benchmark.report.layout import PageMeta, Section, Table, failures_table, sections, summary
from dfbench.benchmark.report.run_records import RunFailure


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(_md_cell(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def failure_rows(failures: Sequence[RunFailure], root: Path) -> list[list[str]]:
    """The failed runs as rows of the page's failure table (report.json keeps them)."""
    rows = []
    for f in sorted(failures, key=lambda f: (f.dataset, f.partition, f.method, f.run_id)):
        try:
            where = str(f.path.relative_to(root))
        except ValueError:
            where = str(f.path)
        rows.append([f.run_id, f.dataset, f.partition, f.method, f.state, f.reason, where])
    return rows



CSV_LEAD = ["dataset", "partition", "method", "params", "setting", "baseline", "rank", "rank_low", "rank_high", "rank_seeds",
            "primary_metric", "n", "seeds"]
# the paired verdicts of each setting against the block's reference (benchmark/report/verdicts.py)
VERDICT_COLS = ["reference", "verdict", "estimate", "estimate_low", "estimate_high", "paired_seeds", "wins", "p", "p_holm",
                "p_equivalence", "p_equivalence_holm", "margin", "seeds_to_decide", "verdict_note", "floor",
                "p_untrained_holm", "floor_note", "collapsed", "collapse_seeds", "other_metrics", "metrics_agree", "budget"]


def write_csv(table: pd.DataFrame, metrics: Sequence[str], path: Path) -> Path:
    """Flat, machine-readable leaderboard: one row per setting, numeric columns."""
    if table.empty:
        pd.DataFrame(columns=CSV_LEAD).to_csv(path, index=False)
        return path
    metric_cols = [f"{m}_{s}" for m in metrics for s in ("mean", "gmean", "std", "n", "stderr", "ci_low", "ci_high", "ci_method")]
    cost_cols = ["uplink_mb_mean", "uplink_mb_std", "downlink_mb_mean", "compression_ratio", "compression_ref",
                 "wall_seconds_mean", "wall_seconds_std", "sim_seconds_mean", "time_to_target_mean", "time_to_target_reached",
                 "rounds_done_mean", "plateau_reached_mean", "plateau_gain_mean", "gamma_star_mean", "w2_mean_mean",
                 "drift_mean", "drift_pixel_mean",
                 "dropped_updates_mean", "epsilon_mean", "evaluation_notes"]
    param_cols = sorted(c for c in table.columns if c.startswith("param."))
    cfg_cols = sorted(c for c in table.columns if c.startswith("cfg."))
    cols = CSV_LEAD + VERDICT_COLS + param_cols + metric_cols + cost_cols + cfg_cols + ["run_ids"]
    out = table[[c for c in cols if c in table.columns]].copy()
    for col in ("rank", "rank_low", "rank_high", "rank_seeds", "paired_seeds", "seeds_to_decide", "wins", "collapsed", "collapse_seeds"):
        if col in out:
            out[col] = pd.to_numeric(out[col], errors="coerce").astype("Int64")
    out.to_csv(path, index=False)
    return path


def write_inference_csv(frame: pd.DataFrame, path: Path) -> Path:
    """inference_rules.csv: one row per run x sampling rule x metric (`frames.inference_frame`), the
    result's rule (configured=True) and the other rules scored on the same model; never ranked."""
    frame.drop(columns=["group_key"]).to_csv(path, index=False)
    return path




def _md_image(label: str, target: str) -> str:
    return f"![{label}]({target})"


def _md_section_table(t: Table) -> list[str]:
    lines = [f"### {t.title}", ""] if t.title else []
    lines += [_md_table(t.headers, t.rows), ""]
    if t.note:
        lines += [t.note, ""]
    return lines


def hardware_line(hardware: Sequence[str]) -> str:
    """The page's hardware sentence; runs from several machines are said to be so, since a CPU's
    kernels set the last bits of a run and training amplifies them (compare scores from one machine)."""
    if len(hardware) <= 1:
        return "Hardware: " + "; ".join(hardware) + "."
    return (f"Hardware: these runs come from {len(hardware)} machines ({'; '.join(hardware)}); another CPU rounds "
            "differently and training amplifies it, so compare scores from one machine only.")


def write_markdown(table: pd.DataFrame, metrics: Sequence[str], meta: PageMeta, out_dir: Path,
                   images: Mapping[str, str]) -> Path:
    """leaderboard.md: per dataset/partition block the headline, the main table, the secondary tables,
    then how the metrics were computed; failures, plots and skipped items at the end.
    `images`: key (mosaic_*, plot_*) -> path relative to `out_dir`."""
    lines = ["# dfbench leaderboard", "", summary(table, meta), ""]
    if meta.hardware:
        lines += [hardware_line(meta.hardware), ""]
    secs: list[Section] = sections(table, metrics, meta, images)
    if len(secs) > 1:
        lines += ["Settings: " + " · ".join(f"[{s.title}](#{_md_anchor(s.title)})" for s in secs), ""]
    for s in secs:
        lines += [f"## {s.title}", "", s.headline, "", _md_table(s.main.headers, s.main.rows), ""]
        if s.legend:
            lines += [f"- {line}" for line in s.legend] + [""]
        if s.rules:  # folded where the markdown renders HTML (GitHub), a plain paragraph elsewhere
            lines += ["<details><summary>How the ranks, intervals and verdicts are computed</summary>", "",
                      s.rules, "", "</details>", ""]
        for t in s.secondary:
            lines += _md_section_table(t)
        if s.provenance or s.not_computed:
            lines += ["How the metrics were computed (every setting of this block):", ""]
            lines += [f"- {p}" for p in s.provenance] + [f"- not computed: {n}" for n in s.not_computed] + [""]
        if s.shared:
            lines += ["Config every setting shares: " + ", ".join(f"{k}={v}" for k, v in sorted(s.shared.items())) + ".", ""]
        if s.mosaic:
            lines += [_md_image(f"sample grids {s.dataset} {s.partition}", images[s.mosaic]), ""]
    lines += ["## Failed and diverged runs", ""]
    lines += [_md_table(failures_table(meta).headers, failures_table(meta).rows), ""] if meta.failures else ["None.", ""]
    plots = {k: v for k, v in images.items() if k.startswith("plot_")}
    if plots:
        lines += ["## Plots", ""]
        for key, target in plots.items():
            lines += [f"### {key[5:].replace('_', ' ')}", "", _md_image(key, target), ""]
    if meta.notes:
        lines += ["## Skipped", ""] + [f"- {n}" for n in meta.notes] + [""]
    if meta.warnings:
        lines += ["## Read warnings", ""] + [f"- {w}" for w in meta.warnings] + [""]
    path = out_dir / "leaderboard.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _md_anchor(title: str) -> str:
    """GitHub's heading anchor: lower case, spaces to '-', punctuation other than '-' and '_' dropped."""
    import re

    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
