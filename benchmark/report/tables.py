"""Leaderboard writers: ``leaderboard.csv`` (machine-readable), ``.md`` and a self-contained ``.html``."""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from dfbench.benchmark.report.frames import ReportData, better, higher_is_better
from dfbench.benchmark.report.formatting import block_notes, block_title, block_view, blocks, interval_sentence, metric_notes, safe_name
from dfbench.benchmark.report.run_folders import RunFailure


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(_md_cell(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _failure_rows(failures: Sequence[RunFailure], root: Path) -> list[list[str]]:
    rows = []
    for f in sorted(failures, key=lambda f: (f.dataset, f.partition, f.method, f.run_id)):
        try:
            where = str(f.path.relative_to(root))
        except ValueError:
            where = str(f.path)
        rows.append([f.run_id, f.dataset, f.partition, f.method, f.state, f.reason, where])
    return rows


_FAILURE_HEADERS = ["run id", "dataset", "partition", "method", "state", "reason", "folder"]



CSV_LEAD = ["dataset", "partition", "method", "params", "baseline", "rank", "rank_tie", "primary_metric", "n", "seeds"]


def write_csv(table: pd.DataFrame, metrics: Sequence[str], path: Path) -> Path:
    """Flat, machine-readable leaderboard: one row per setting, numeric columns."""
    if table.empty:
        pd.DataFrame(columns=CSV_LEAD).to_csv(path, index=False)
        return path
    metric_cols = [f"{m}_{s}" for m in metrics for s in ("mean", "std", "n", "stderr", "ci_low", "ci_high", "ci_method")]
    cost_cols = ["uplink_mb_mean", "uplink_mb_std", "downlink_mb_mean", "compression_ratio", "compression_ref",
                 "wall_seconds_mean", "wall_seconds_std", "sim_seconds_mean", "time_to_target_mean", "time_to_target_reached",
                 "rounds_done_mean", "gamma_star_mean", "w2_mean_mean",
                 "drift_mean", "drift_pixel_mean",
                 "dropped_updates_mean", "epsilon_mean", "evaluation_notes"]
    param_cols = sorted(c for c in table.columns if c.startswith("param."))
    cfg_cols = sorted(c for c in table.columns if c.startswith("cfg."))
    cols = CSV_LEAD + param_cols + metric_cols + cost_cols + cfg_cols + ["run_ids"]
    out = table[[c for c in cols if c in table.columns]].copy()
    out["rank"] = out["rank"].astype("Int64")
    out.to_csv(path, index=False)
    return path


def write_inference_csv(frame: pd.DataFrame, path: Path) -> Path:
    """inference_rules.csv: one row per run x sampling rule x metric (`frames.inference_frame`), the
    result's rule (configured=True) and the other rules scored on the same model; never ranked."""
    frame.drop(columns=["group_key"]).to_csv(path, index=False)
    return path


def _md_image(label: str, target: Path, out_dir: Path) -> str:
    return f"![{label}]({target.relative_to(out_dir).as_posix()})"


def write_markdown(data: ReportData, out_dir: Path, root: Path, images: Mapping[str, Path], notes: Sequence[str]) -> Path:
    """leaderboard.md: one section per block, then failures, plots and skipped items."""
    n_done = len(data.runs)
    lines = [
        "# dfbench leaderboard",
        "",
        f"{n_done} finished run(s) in {len(data.table)} setting(s); {len(data.failures)} run(s) failed, diverged, "
        f"unfinished or unreadable (listed below). Seeds are aggregated as mean ± std (sample std) [95% interval]; "
        f"lower is better except for metrics marked ↑ (precision, recall, density, coverage). "
        f"`x4.0` = four times less uplink than fedavg in the same block "
        f"(`*`: fedavg ran another budget, compared per client upload).",
        "",
    ]
    if data.hardware:
        lines += ["Hardware: " + "; ".join(data.hardware) + ".", ""]
    for (dataset, partition), block in blocks(data.table):
        headers, rows, shared = block_view(block, data.metrics, higher_is_better(data.evaluations), data.target)
        primary = block["primary_metric"].iloc[0]
        lines += [f"## {block_title(dataset, partition)}", ""]
        lines.append(f"Ranked by **{primary}** ({better(primary, data.evaluations)} is better)." if primary
                     else "No ranking metric (fid / fd_*) recorded.")
        lines.append(interval_sentence(block, primary))
        if shared:
            lines.append("Shared settings: " + ", ".join(f"{k}={v}" for k, v in sorted(shared.items())) + ".")
        lines += ["", _md_table(headers, rows), ""]
        for note in metric_notes(data.evaluations, block["group_key"]):
            lines.append(f"- {note}")
        for note in block_notes(block):
            lines.append(f"- not computed: {note}")
        mosaic = images.get(f"mosaic_{safe_name(dataset)}_{safe_name(partition)}")
        if mosaic:
            lines += ["", _md_image(f"sample grids {dataset} {partition}", mosaic, out_dir)]
        lines.append("")
    lines += ["## Failed and diverged runs", ""]
    if data.failures:
        lines += [_md_table(_FAILURE_HEADERS, _failure_rows(data.failures, root)), ""]
    else:
        lines += ["None.", ""]
    plots = {k: v for k, v in images.items() if k.startswith("plot_")}
    lines += ["## Plots", ""]
    for key, path in plots.items():
        lines += [f"### {key[5:].replace('_', ' ')}", "", _md_image(key, path, out_dir), ""]
    if notes:
        lines += ["## Skipped", ""] + [f"- {n}" for n in notes] + [""]
    if data.warnings:
        lines += ["## Read warnings", ""] + [f"- {w}" for w in data.warnings] + [""]
    path = out_dir / "leaderboard.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em;color:#222;max-width:1400px}
table{border-collapse:collapse;margin:1em 0;font-size:14px}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f0f0f0}tr:nth-child(even) td{background:#fafafa}
td.num{text-align:right;font-variant-numeric:tabular-nums}
img{max-width:100%;border:1px solid #ddd;margin:.5em 0}
.note{color:#555;font-size:13px}.bad{color:#a00}
"""


def _html_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = "".join(
            f"<td class=\"num\">{html.escape(c)}</td>" if re.fullmatch(r"[x#]?[-0-9.e+ ±()s.n=*\[\],]+", c or "-") else f"<td>{html.escape(c)}</td>"
            for c in row
        )
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def write_html(data: ReportData, out_dir: Path, root: Path, images: Mapping[str, Path], notes: Sequence[str]) -> Path:
    """leaderboard.html: self-contained (inline CSS, images as base64 data URIs)."""
    esc = html.escape
    parts = [
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>dfbench leaderboard</title>",
        f"<style>{_CSS}</style></head><body><h1>dfbench leaderboard</h1>",
        f"<p>{len(data.runs)} finished run(s) in {len(data.table)} setting(s); {len(data.failures)} run(s) failed, "
        "diverged, unfinished or unreadable. Seeds aggregated as mean ± std [95% interval]; lower is better "
        "except for metrics marked ↑.</p>",
    ]
    for (dataset, partition), block in blocks(data.table):
        headers, rows, shared = block_view(block, data.metrics, higher_is_better(data.evaluations), data.target)
        primary = block["primary_metric"].iloc[0]
        parts.append(f"<h2>{esc(block_title(dataset, partition))}</h2>")
        parts.append(f"<p>Ranked by <b>{esc(primary)}</b> ({better(primary, data.evaluations)} is better).</p>" if primary
                     else "<p>No ranking metric.</p>")
        parts.append(f"<p class=\"note\">{esc(interval_sentence(block, primary))}</p>")
        if shared:
            parts.append("<p class=\"note\">Shared settings: " + esc(", ".join(f"{k}={v}" for k, v in sorted(shared.items()))) + "</p>")
        parts.append(_html_table(headers, rows))
        notes_here = metric_notes(data.evaluations, block["group_key"]) + [f"not computed: {n}" for n in block_notes(block)]
        if notes_here:
            parts.append("<ul class=\"note\">" + "".join(f"<li>{esc(n)}</li>" for n in notes_here) + "</ul>")
        mosaic = images.get(f"mosaic_{safe_name(dataset)}_{safe_name(partition)}")
        if mosaic:
            parts.append(f"<img alt=\"sample grids {esc(dataset)} {esc(partition)}\" src=\"{_data_uri(mosaic)}\">")
    parts.append("<h2>Failed and diverged runs</h2>")
    parts.append(_html_table(_FAILURE_HEADERS, _failure_rows(data.failures, root)) if data.failures else "<p>None.</p>")
    parts.append("<h2>Plots</h2>")
    for key, path in images.items():
        if key.startswith("plot_"):
            parts.append(f"<h3>{esc(key[5:].replace('_', ' '))}</h3><img alt=\"{esc(key)}\" src=\"{_data_uri(path)}\">")
    if notes:
        parts.append("<h2>Skipped</h2><ul class=\"note\">" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>")
    if data.warnings:
        parts.append("<h2>Read warnings</h2><ul class=\"note bad\">" + "".join(f"<li>{esc(w)}</li>" for w in data.warnings) + "</ul>")
    parts.append("</body></html>")
    path = out_dir / "leaderboard.html"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
