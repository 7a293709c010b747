"""The leaderboard's page layout, shared by leaderboard.md and the HTML report.

A page is built from the aggregated table alone (one row per setting, the columns of
leaderboard.csv) plus :class:`PageMeta` (what the CSV cannot hold: hardware, failures, how
each metric was computed, notes), so a report can be re-rendered from a committed
``leaderboard.csv`` and ``report.json`` without its run folders (`dfbench report --from-csv`).

Per dataset/partition block (a "setting" is a method with its hyperparameters and config):

- a one-sentence headline: who ranks first, by how much, who ties;
- the main table, at most `MAX_MAIN_COLUMNS` columns: rank, method, what tells the setting apart
  (the hyperparameters `names.hyperparameters` names and the config keys off the block's usual
  value), the primary metric with its interval, the paired verdict against the reference, flags,
  seeds, then as many of the costs as fit (DP's epsilon, the time to a target, uplink against the
  reference method, wall time, the simulated clock, uplink MB); under it a one-line legend per flag
  and mark it uses, and the rules it was ranked by;
- secondary tables: other sample-quality metrics, per-client metrics, leakage, communication and
  time (the costs the main table had no room for), drift and diagnostics, each only where a run
  recorded them; the run folders of each setting (linked from the HTML page);
- how each metric was computed, once per block (metrics with the same provenance on one line),
  and the config every setting shares.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from dfbench.benchmark.metrics import table as metric_table
from dfbench.benchmark.report.formatting import (
    _fmt_reach, _fmt_seconds, block_notes, block_title, blocks, fmt_metric, fmt_number,
    interval_sentence, rank_text, safe_name,
)
from dfbench.benchmark.report.budget import BARELY
from dfbench.benchmark.report.formatting import MIXED
from dfbench.benchmark.report.frames import ONE_SEED
from dfbench.benchmark.report.names import anchor_role, hyperparameters, is_baseline, reference_method, setting_names, setting_parts
from dfbench.benchmark.report.names import shown as _shown
from dfbench.benchmark.report.names import usual_config, varying_config
from dfbench.benchmark.report.run_records import to_float

META_FILE = "report.json"
META_VERSION = 1


@dataclass
class PageMeta:
    """What a page needs beside leaderboard.csv; written as report.json next to it."""

    n_runs: int = 0
    n_failed: int = 0
    hardware: list[str] = field(default_factory=list)
    failures: list[list[str]] = field(default_factory=list)  # rows under FAILURE_HEADERS
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # skipped plots and mosaics
    provenance: dict[str, dict[str, str]] = field(default_factory=dict)  # block title -> metric -> how computed
    runs_dir: str | None = None  # the run folders, relative to the report folder (links), when known
    target: list[Any] | None = None  # [metric, value] of --target
    # block title -> how the other quality metrics order its settings (benchmark/report/agreement.py)
    agreement: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"version": META_VERSION, **dataclasses.asdict(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PageMeta:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def write(self, out_dir: Path) -> Path:
        path = out_dir / META_FILE
        path.write_text(json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
        return path


FAILURE_HEADERS = ["run id", "dataset", "partition", "method", "state", "reason", "folder"]


@dataclass
class Table:
    title: str | None
    headers: list[str]
    rows: list[list[str]]
    sort_keys: list[list[Any]]  # per cell: a number (sorted numerically) or a string; None sorts last
    note: str | None = None
    numeric: list[bool] = field(default_factory=list)  # per column: right-aligned numbers


@dataclass
class Section:
    dataset: str
    partition: str
    title: str
    anchor: str
    headline: str
    main: Table
    legend: list[str]  # short lines under the main table: what its flags, marks and unnamed config mean
    rules: str  # how the ranks, intervals and verdicts are computed (the HTML page folds it)
    secondary: list[Table]
    provenance: list[str]
    not_computed: list[str]
    shared: dict[str, str]
    mosaic: str | None  # image key
    runs: list[tuple[str, list[tuple[str, str]]]] = field(default_factory=list)  # (setting, [(seed label, run folder href)])


# ---------------------------------------------------------------------------------------------
# columns

def _kind(metric: str) -> str:
    entry = metric_table.get(metric)
    return entry.kind if entry is not None else "quality"


def _higher(metric: str) -> bool:
    return metric_table.better(metric) == "higher"


def _arrow(metric: str) -> str:
    return f"{metric} ↑" if _higher(metric) else f"{metric} ↓"


SECONDARY = (  # (title, metric kinds) in page order
    ("Exact error against the known mixture (ground truth)", ("exact", "exact_diff")),
    ("Sample quality beyond the ranking metric", ("frechet", "kid", "model", "prdc", "coverage", "quality")),
    ("Per client and per expert", ("client",)),
    ("Leakage: memorization and membership inference", ("leakage",)),
)
DIAGNOSTICS = (  # (column, header, formatter kind)
    ("drift_mean", "drift (features)", "num"), ("drift_pixel_mean", "drift (pixels)", "num"),
    ("gamma_star_mean", "γ*", "num"), ("w2_mean_mean", "W2 mean", "num"),
    ("downlink_mb_mean", "downlink MB", "num"), ("dropped_updates_mean", "dropped updates", "num"),
    ("rounds_done_mean", "rounds done", "num"),
    # the plateau rule (engine/plateau.py): the share of seeds that reached it, and the last doubling's relative gain
    ("plateau_reached_mean", "plateau reached (share of seeds)", "num"), ("plateau_gain_mean", "last doubling's gain", "num"),
)


def _number_key(value: Any) -> float | None:
    v = to_float(value)
    return None if math.isnan(v) else v


def _metric_key(row: pd.Series, metric: str) -> float | None:
    return _number_key(row.get(f"{metric}_mean"))


def _rank_cell(row: pd.Series) -> tuple[str, float | None]:
    if pd.isna(row["rank"]):
        return "", None
    return rank_text(row), float(row["rank"])


def one_seed(row: Mapping[str, Any]) -> bool:
    """An inconclusive contrast on a single paired seed: no spread, so nothing was tested (the CSV's
    verdict stays "inconclusive"; the page says "not tested")."""
    return row.get("verdict") == "inconclusive" and to_float(row.get("paired_seeds")) == 1


def verdict_text(row: Mapping[str, Any]) -> str:
    """The main table's paired-verdict cell: "worse ×1.52 [1.21, 1.91]" (a ratio for a positive metric,
    else a difference), "inconclusive … · 9 seeds to decide", "×0.97 (1 seed: not tested)" (one pair has
    no spread to test), "reference", or why there is none. The seeds paired are named only where they are
    fewer than the setting's own."""
    verdict = row.get("verdict")
    if not isinstance(verdict, str) or not verdict:
        return ""
    if verdict == "reference":
        return "reference"
    if verdict == "unpaired":
        return f"unpaired: {row.get('verdict_note')}"
    est, low, high = (to_float(row.get(k)) for k in ("estimate", "estimate_low", "estimate_high"))
    primary = row.get("primary_metric")
    ratio = isinstance(primary, str) and metric_table.scale(primary) == "log"
    n = to_float(row.get("paired_seeds"))
    value = ""
    if not math.isnan(est):
        value = f"×{fmt_number(est, 3)}" if ratio else f"{est:+.3g}"
        if not (math.isnan(low) or math.isnan(high)):
            value += f" [{fmt_number(low, 3)}, {fmt_number(high, 3)}]" if ratio else f" [{low:+.3g}, {high:+.3g}]"
    if one_seed(row):
        return f"{value} {ONE_SEED}".strip()
    text = f"{'undecidable (no spread)' if verdict == 'undecidable' else verdict} {value}".strip()
    if not math.isnan(n) and n != to_float(row.get("n")):
        text += f", {int(n)} paired seed{'s' if n != 1 else ''}"
    if verdict == "inconclusive":
        need = to_float(row.get("seeds_to_decide"))
        note = row.get("verdict_note")
        if not math.isnan(need):
            text += f" · {int(need)} seeds to decide"
        elif isinstance(note, str) and note:
            text += f" · {note}"
    return text


def flags_text(row: Mapping[str, Any]) -> str:
    """The main table's flags: seeds that collapsed (nearer the untrained model's score than the
    reference's) and a setting not shown better than the untrained model."""
    out = []
    k, n = to_float(row.get("collapsed")), to_float(row.get("collapse_seeds"))
    if not math.isnan(k) and k > 0:
        out.append(f"collapsed {int(k)}/{int(n)}" + (" (unstable)" if k < n else ""))
    if str(row.get("floor")).lower() == "true":
        out.append("not better than untrained")
    return "; ".join(out)


def flag_legend(block: pd.DataFrame, primary: str, reference: str) -> list[str]:
    """One line for each flag the block's main table uses, with the rule that raised it (verdicts.py)."""
    texts = [flags_text(r) for _, r in block.iterrows()]
    ratio = metric_table.scale(primary) == "log"
    nearer = (f"by ratio: |log(score / untrained)| < |log(score / {reference})|" if ratio
              else f"|score − untrained| < |score − {reference}|")
    out = []
    if any("collapsed" in t for t in texts):
        out.append(f"collapsed k/n: on k of the n seeds it shares with {reference} and the untrained model, its "
                   f"{primary} lies nearer the untrained model's than {reference}'s at that seed ({nearer}).")
    if any("(unstable)" in t for t in texts):
        out.append("unstable: some of its seeds collapsed and others did not.")
    if any("not better than untrained" in t for t in texts):
        out.append(f"not better than untrained: the one-sided paired t-test over seeds (Holm-corrected) does not "
                   f"show its {primary} better than the untrained model's (one seed: the two runs' own intervals "
                   "overlap); it ranks after every setting that is.")
    return out


_is_baseline = is_baseline


def _varying_config(block: pd.DataFrame) -> tuple[list[str], dict[str, str]]:
    """Config keys that tell the block's trained settings apart (`names.varying_config`), and the config they all share."""
    varying = varying_config(block)
    trained = block[~block.apply(is_baseline, axis=1)] if len(block) else block
    if trained.empty:
        trained = block
    shared = {c[4:]: _shown(trained[c].iloc[0]) for c in block.columns if c.startswith("cfg.") and c not in varying}
    return varying, shared


def setting_labels(block: pd.DataFrame, params: Mapping[int, str] | None = None,
                   shown_cfg: Sequence[str] | None = None) -> dict[int, str]:
    """Row index -> the setting's name in this dataset/partition block (`names.setting_names`, the one
    naming function), e.g. "fedavg" beside "fedavg (stragglers=0.3)"."""
    return setting_names(block, params, shown_cfg)  # type: ignore[return-value]


def _run_links(row: pd.Series, runs_dir: str | None) -> list[tuple[str, str]]:
    if not runs_dir or not isinstance(row.get("run_ids"), str):
        return []
    from dfbench.benchmark.core.runfolder import slug

    base = f"{runs_dir.rstrip('/')}/{row['dataset']}/{slug(str(row['partition']))}/{slug(str(row['method']))}"
    seeds = str(row.get("seeds", "")).split(";")
    ids = row["run_ids"].split(";")
    return [(f"s{seeds[i]}" if i < len(seeds) and seeds[i] else run_id, f"{base}/{run_id}/") for i, run_id in enumerate(ids)]


def _headline(block: pd.DataFrame, primary: str | None, labels: Mapping[int, str]) -> str:
    if not primary:
        return "No ranking metric (fid / fd_*) recorded in this block."
    ranked = block[block["rank"].notna()]
    if ranked.empty:
        return f"No setting has a {primary}."
    first = ranked.iloc[0]
    word = "higher" if _higher(primary) else "lower"
    score = f"{primary} {fmt_metric(first, primary, int(first['n']))} ({word} is better)"
    low, high = to_float(first.get("rank_low")), to_float(first.get("rank_high"))
    name = labels[ranked.index[0]]
    if "rank_low" not in block or "verdict" not in block:  # a leaderboard.csv from before the verdicts: its own rule
        return _headline_before_verdicts(block, primary, labels, score)
    # where settings ran different seeds, first place is decided on the seeds they all ran, and the score
    # shown (the setting's mean over its own seeds) is not what decided it: the sentence says both
    common = to_float(first.get("rank_seeds"))
    if _own_seeds_differ(block) and common > 0:
        n = int(first["n"])
        best = (f"ranks first on the {int(common)} seed{'s' if common != 1 else ''} every setting ran "
                f"({primary} {fmt_metric(first, primary, n)} over its own {n} seed{'s' if n != 1 else ''}, {word} is better)")
    else:
        best = f"has the best {score}"
    if low == 1 and high == 1:
        text = (f"**{name}** {best}; significantly better than every other setting, paired over the seeds each "
                "two share.")
    elif math.isnan(low):
        text = f"**{name}** {best}. With one seed per setting no rank is settled: the ranks are the order of single runs."
    else:
        also = [labels[i] for i, r in ranked.iloc[1:].iterrows() if to_float(r.get("rank_low")) == 1]
        text = (f"**{name}** {best}, but first place is not settled: the paired evidence puts it at "
                f"ranks {int(low)}–{int(high)}" + (f", and {_join(also)} can rank first too." if also else "."))
    verdict = block["verdict"].astype(str)
    untested = block.apply(one_seed, axis=1).astype(bool) if len(block) else verdict.eq("")
    counts = {v: int(((verdict == v) & ~untested).sum())
              for v in ("better", "worse", "equivalent", "inconclusive", "undecidable", "unpaired")}
    counts["not tested (one seed: no spread to test)"] = int(untested.sum())
    if sum(counts.values()):
        margin = to_float(block["margin"].dropna().iloc[0]) if block["margin"].notna().any() else math.nan
        within = f", equivalent within ±{margin:.0%}" if not math.isnan(margin) else ""
        parts = [f"{n} {v}" for v, n in counts.items() if n]
        tested = f" (Holm-corrected{within})" if untested.sum() < sum(counts.values()) else ""
        text += f" Against {_reference_label(block, labels)}, paired by seed{tested}: {', '.join(parts)}."
        if _references(block).nunique() > 1:
            text += (" A setting is compared with the reference setting of its own budget where the block has one "
                     "(named in the paired column), else with the main one.")
    floor = [labels[i] for i, r in ranked.iterrows() if str(r.get("floor")).lower() == "true"]
    if floor:
        text += f" Not shown better than the untrained model (ranked last): {_join(floor)}."
    unstable = [f"{labels[i]} ({int(r['collapsed'])}/{int(r['collapse_seeds'])})" for i, r in ranked.iterrows()
                if 0 < to_float(r.get("collapsed")) < to_float(r.get("collapse_seeds"))]
    if unstable:
        text += f" Collapsed on some seeds only: {_join(unstable)}."
    base = block[block.apply(_is_baseline, axis=1)]
    base = base[base[f"{primary}_mean"].notna()] if f"{primary}_mean" in base else base.iloc[0:0]
    anchors = base[[bool(anchor_role(str(m))) for m in base["method"]]] if "method" in base else base.iloc[0:0]
    base = base.drop(anchors.index)

    def shown_floor(row: pd.Series) -> str:
        floor = to_float(row.get(f"{primary}_gmean"))  # as the table shows it
        return fmt_number(row[f"{primary}_mean"] if math.isnan(floor) else floor)

    if len(base) == 1:
        text += f" Untrained: {shown_floor(base.iloc[0])}."
    elif len(base) > 1:  # one per width: each setting is tested against the one that pairs with it
        text += f" Untrained: {', '.join(f'{shown_floor(r)} ({labels[i]})' for i, r in base.iterrows())}."
    for i, r in anchors.iterrows():  # e.g. the exact score used as the network: what no model can beat
        text += f" {anchor_role(str(r['method'])).capitalize()}: {shown_floor(r)} ({labels[i]})."
    return text


def _headline_before_verdicts(block: pd.DataFrame, primary: str, labels: Mapping[int, str], score: str) -> str:
    """The headline of a leaderboard.csv written before the paired verdicts (re-rendered with --from-csv):
    its ranks are 1 + the settings whose interval lies wholly on the better side, ties marked."""
    ranked = block[block["rank"].notna()]
    first = ranked.iloc[0]
    text = f"**{labels[ranked.index[0]]}** ranks first: {score}."
    tied = [labels[i] for i, r in ranked.iloc[1:].iterrows() if r["rank"] == first["rank"]]
    if tied:
        text += f" {_join(tied)} {'shares' if len(tied) == 1 else 'share'} its rank: the intervals overlap."
    others = ranked[ranked["rank"] > first["rank"]]
    if len(others):
        gap = to_float(others.iloc[0][f"{primary}_mean"]) - to_float(first[f"{primary}_mean"])
        text += (f" The best setting outside the tie, {labels[others.index[0]]}, is {fmt_number(abs(gap), 3)} "
                 f"{'lower' if gap < 0 else 'higher'}.")
    base = block[block.apply(_is_baseline, axis=1)]
    if len(base) and not pd.isna(base.iloc[0].get(f"{primary}_mean")):
        text += f" Untrained: {fmt_number(base.iloc[0][f'{primary}_mean'])}."
    return text


def _join(items: Sequence[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def not_comparable_sentence(metric: str, prov: Mapping[str, str]) -> str:
    """"NOT COMPARABLE: ..." when the block's `metric` was computed under different settings (`formatting.MIXED`:
    another sampler, sample count, extractor or reference across its rows), said in the headline and above the main
    table; "" otherwise."""
    how = prov.get(metric, "")
    if MIXED not in how:
        return ""
    return (f"NOT COMPARABLE: the rows' {metric} was computed under different settings "
            f"({how.replace(MIXED, '').strip()}), so this ranking compares unlike things.")


def _provenance_lines(prov: Mapping[str, str], metrics: Sequence[str]) -> list[str]:
    """Metrics that were computed the same way share one line."""
    grouped: dict[str, list[str]] = {}
    for metric in metrics:
        if metric in prov:
            grouped.setdefault(prov[metric], []).append(metric)
    return [f"{', '.join(ms)}: {how}" for how, ms in grouped.items()]


MAX_MAIN_COLUMNS = 10  # a newcomer reads the main table at a glance; the rest goes to the secondary tables


@dataclass
class _Column:
    header: str
    cells: list[str]
    keys: list[Any]
    numeric: bool = True


def section(dataset: str, partition: str, block: pd.DataFrame, metrics: Sequence[str], meta: PageMeta,
            images: Mapping[str, Any]) -> Section:
    primary = block["primary_metric"].iloc[0] if "primary_metric" in block else None
    primary = primary if isinstance(primary, str) and primary else None
    present = [m for m in metrics if f"{m}_n" in block and pd.to_numeric(block[f"{m}_n"], errors="coerce").gt(0).any()]
    params = hyperparameters(block)
    shown_cfg, shared = _varying_config(block)
    labels = setting_labels(block, params, shown_cfg)
    parts = setting_parts(block, params, shown_cfg)
    target = tuple(meta.target) if meta.target else None
    plain = reference_method()  # the method the uplink column compares with (Method.reference)

    def has(col: str) -> bool:
        return col in block and pd.to_numeric(block[col], errors="coerce").notna().any()

    rows = list(block.iterrows())

    def column(header: str, cell: Any, key: Any, numeric: bool = True) -> _Column:
        return _Column(header, [cell(r) for _, r in rows], [key(r) for _, r in rows], numeric)

    verdicts_shown = primary is not None and "verdict" in block and block["verdict"].astype(str).isin(
        ["better", "worse", "equivalent", "inconclusive", "undecidable", "unpaired"]).any()
    flags_shown = primary is not None and block.apply(lambda r: bool(flags_text(r)), axis=1).any()
    reference_label = _reference_label(block, labels)

    # -- the main table: what names and scores a setting, then the costs in order of priority while they fit
    told = [", ".join(parts[i][1]) for i, _ in rows]
    lead = [_Column("rank", [_rank_cell(r)[0] for _, r in rows], [_rank_cell(r)[1] for _, r in rows]),
            _Column("method", [parts[i][0] for i, _ in rows], [parts[i][0] for i, _ in rows], False)]
    if any(told):
        lead.append(_Column("hyperparameters and config" if shown_cfg else "hyperparameters", told, told, False))
    if primary:
        lead.append(column(_arrow(primary), lambda r: fmt_metric(r, primary, int(r["n"])), lambda r: _metric_key(r, primary)))
    if verdicts_shown:
        def verdict_cell(r: pd.Series) -> str:
            text = verdict_text(r)
            own = str(r.get("reference"))
            if text and r.get("verdict") != "reference" and own in labels.values() and own != reference_label:
                text += f" (vs {own})"  # compared with the reference setting of its own budget
            if text and _cell(r, "metrics_agree") == "metric-dependent":
                text += " · metric-dependent"  # the independent checks do not all agree (the table below)
            if text and _cell(r, "budget").startswith("unequal"):
                text += " · unequal budget"
            if text and BARELY in _cell(r, "budget"):
                text += f" · {BARELY}"  # the reference is above budget.BARELY_TRAINED of the untrained model's score
            return text
        lead.append(column(f"vs {reference_label} (paired)", verdict_cell, verdict_cell, False))
    if flags_shown:
        lead.append(column("flags", flags_text, flags_text, False))
    lead.append(column("seeds", lambda r: str(int(r["n"])), lambda r: int(r["n"])))

    def compression(r: pd.Series) -> str:
        ratio = to_float(r.get("compression_ratio"))
        return _ratio_cell(ratio) + ("*" if not math.isnan(ratio) and r.get("compression_ref") == "per upload" else "")

    def epsilon(r: pd.Series) -> str:
        e = to_float(r.get("epsilon_mean"))
        return "∞" if math.isnan(e) else fmt_number(e)

    costs: list[_Column] = []  # in order of priority
    if has("epsilon_mean"):
        costs.append(column("ε (DP)", epsilon, lambda r: math.inf if math.isnan(to_float(r.get("epsilon_mean"))) else to_float(r.get("epsilon_mean"))))
    if target is not None and "time_to_target_mean" in block:
        costs.append(column(f"sim time to {target[0]} {'≥' if _higher(str(target[0])) else '≤'} {to_float(target[1]):g}",
                            _fmt_reach, lambda r: _number_key(r.get("time_to_target_mean"))))
    costs.append(column(f"uplink vs {plain}", compression,
                        lambda r: None if math.isnan(to_float(r.get("compression_ratio"))) else to_float(r.get("compression_ratio"))))
    costs.append(column("wall time", lambda r: _fmt_seconds(r.get("wall_seconds_mean")), lambda r: _number_key(r.get("wall_seconds_mean"))))
    if has("sim_seconds_mean"):
        costs.append(column("sim time", lambda r: _fmt_seconds(r.get("sim_seconds_mean")), lambda r: _number_key(r.get("sim_seconds_mean"))))
    costs.append(column("uplink MB", lambda r: fmt_number(r.get("uplink_mb_mean")), lambda r: _number_key(r.get("uplink_mb_mean"))))
    room = max(0, MAX_MAIN_COLUMNS - len(lead))
    fits, rest = costs[:room], costs[room:]
    page_order = ["uplink MB", f"uplink vs {plain}", "wall time", "sim time", "ε (DP)"]  # the costs as the page lists them
    fits.sort(key=lambda c: page_order.index(c.header) if c.header in page_order else len(page_order))
    chosen = lead + fits
    main = Table(None, [c.header for c in chosen], [list(r) for r in zip(*[c.cells for c in chosen])] if rows else [],
                 [list(k) for k in zip(*[c.keys for c in chosen])] if rows else [], numeric=[c.numeric for c in chosen])

    # -- under it: a line per flag and mark the table uses, and the block's usual config
    legend: list[str] = []
    if verdicts_shown:
        margin = to_float(block["margin"].dropna().iloc[0]) if "margin" in block and block["margin"].notna().any() else math.nan
        scale = "ratio" if primary and metric_table.scale(primary) == "log" else "difference"
        legend.append(f"vs {reference_label}: the {scale} of the {primary} scores on the seeds both ran [95% paired interval]; "
                      "better / worse / equivalent" + (f" (within ±{margin:.0%})" if not math.isnan(margin) else "")
                      + " by Holm-corrected paired tests, else inconclusive; undecidable (no spread): the same "
                      "difference at every seed, e.g. a score at its bound; one seed: not tested (no spread to test).")
    if primary and "rank_low" in block and pd.to_numeric(block["rank_low"], errors="coerce").notna().any():
        legend.append("rank (a–b): a = 1 + the settings significantly better, b = the settings not significantly "
                      "worse, by paired t-tests over the seeds each two share, Holm-corrected over all pairs: the "
                      "ranks the evidence allows (jointly 95 %), wide with few seeds.")
    if primary and _own_seeds_differ(block):
        legend.append(f"{_arrow(primary)}: each setting's own mean over its own seeds (the seeds column); the rank "
                      "and the paired column compare settings only on the seeds they share.")
    if primary:
        legend += flag_legend(block, primary, reference_label)
    if any(c.header == f"uplink vs {plain}" for c in fits):
        star = any(t.endswith("*") for t in costs[[c.header for c in costs].index(f"uplink vs {plain}")].cells)
        legend.append(f"uplink vs {plain}: how many times less (or more) uplink than {plain} in this block"
                      + (f" (*: {plain} ran another budget, compared per client upload)." if star else "."))
    if shown_cfg:
        usual = usual_config(block, shown_cfg)
        legend.append("A setting's name gives its config only where it differs from the block's usual "
                      f"{', '.join(f'{k}={v}' for k, v in usual.items())}.")

    secondary = []
    for title, kinds in SECONDARY:
        cols = [m for m in present if m != primary and _kind(m) in kinds]
        if cols:
            secondary.append(_metric_table(title, block, labels, cols))
    spent = [c for c in rest]
    if has("downlink_mb_mean") and pd.to_numeric(block["downlink_mb_mean"], errors="coerce").fillna(0).ne(0).any():
        spent.append(column("downlink MB", lambda r: fmt_number(r.get("downlink_mb_mean")), lambda r: _number_key(r.get("downlink_mb_mean"))))
    if spent:
        secondary.append(_columns_table("Communication and time", block, labels, spent,
                                        "means over seeds; the costs the main table has no room for."))
    diag = [(c, h) for c, h, _ in DIAGNOSTICS if has(c) and (pd.to_numeric(block[c], errors="coerce").fillna(0).ne(0).any()
                                                         or (c == "plateau_reached_mean" and block[c].notna().any()))]
    if diag:
        secondary.append(_plain_table("Drift and diagnostics", block, labels, diag,
                                      f"drift: distance of the final model's samples from {plain}'s on the same noise; "
                                      "γ*, W2: the bound terms of the pruning study; means over seeds."))

    if verdicts_shown and primary and block.apply(lambda r: bool(_cell(r, "metrics_agree") or _cell(r, "budget")),
                                                  axis=1).any():
        secondary.append(_across_table(block, labels, primary, reference_label))

    agreed = meta.agreement.get(block_title(dataset, partition))
    suffix = ""
    if agreed and agreed.get("rows"):
        table, suffix = _agreement_table(agreed)
        secondary.append(table)

    prov = meta.provenance.get(block_title(dataset, partition), {})
    name = f"mosaic_{safe_name(dataset)}_{safe_name(partition)}"
    rules = ((f"Ranked by {primary}. " if primary else "")
             + (interval_sentence(block, primary, verdicts="rank_low" in block) if primary else ""))
    if primary and (unlike := not_comparable_sentence(primary, prov)):  # where it is read, not only in the provenance
        suffix += f" {unlike}"
        rules = f"{unlike} {rules}"
    return Section(
        dataset=dataset, partition=partition, title=block_title(dataset, partition), anchor=safe_name(f"{dataset}-{partition}"),
        headline=_headline(block, primary, labels) + suffix, main=main, legend=legend, rules=rules.strip(),
        secondary=secondary, provenance=_provenance_lines(prov, present),
        not_computed=block_notes(block) if "evaluation_notes" in block else [],
        shared=shared, mosaic=name if name in images else None,
        runs=[(labels[i], links) for i, r in rows if (links := _run_links(r, meta.runs_dir))],
    )


def _own_seeds_differ(block: pd.DataFrame) -> bool:
    """Whether the block's trained settings ran different seeds (then a mean over a setting's own seeds is
    not what the comparisons use, and the page says so)."""
    if "seeds" not in block:
        return False
    trained = block[~block.apply(_is_baseline, axis=1)] if len(block) else block
    return trained["seeds"].astype(str).nunique() > 1


def _references(block: pd.DataFrame) -> pd.Series:
    """The block's `reference` cells that name one (a leaderboard.csv read back gives "" or NaN for none)."""
    keys = block["reference"].dropna().astype(str) if "reference" in block else pd.Series(dtype=str)
    return keys[(keys != "") & (keys != "nan")]


def _reference_label(block: pd.DataFrame, labels: Mapping[int, str]) -> str:
    """The page's name of the block's main reference setting: of the verdicts' `reference` column (a page
    name; a setting label in a leaderboard.csv written before names went there), the one most settings
    are compared with (of equals, the shortest name: the block's plain reference)."""
    keys = _references(block)
    if len(keys):
        counts = keys.value_counts()
        main = min((k for k in counts.index if counts[k] == counts.max()), key=lambda k: (len(k), k))  # a tie: the plainest name
        if main in labels.values():
            return main
        hit = block.index[block["setting"].astype(str) == main] if "setting" in block else []
        if len(hit):
            return labels[hit[0]]
    return "reference"


def labels_by_key(block: pd.DataFrame) -> dict[str, str]:
    """group_key -> the page's name of each setting of a block (the aggregated table with its group_key)."""
    labels = setting_names(block)
    return {str(block.at[i, "group_key"]): labels[i] for i in block.index}


def _cell(row: Mapping[str, Any], col: str) -> str:
    """A text column of leaderboard.csv as text ("" for none: a CSV read back gives NaN)."""
    value = row.get(col)
    return value if isinstance(value, str) else ""


def _across_table(block: pd.DataFrame, labels: Mapping[int, str], primary: str, reference: str) -> Table:
    """"Paired verdicts on every metric": each contrast of the paired column re-decided on the declared independent
    checks (frames.ACROSS_COLUMNS), whether the metrics agree, and whether the two settings had the same budget."""
    rows, keys = [], []
    for idx, r in block.iterrows():
        agree, budget = _cell(r, "metrics_agree"), _cell(r, "budget")
        if not (agree or budget):
            continue
        rank, rank_key = _rank_cell(r)
        verdict = str(r.get("verdict") or "")
        checks = _cell(r, "other_metrics")
        if one_seed(r):  # as the main table's paired column says it (a CSV written before it said so, too)
            verdict = ONE_SEED
            checks = re.sub(r"\binconclusive\b", ONE_SEED, checks)
        est = to_float(r.get("estimate"))
        ratio = metric_table.scale(primary) == "log"
        shown = "" if math.isnan(est) else (f"×{fmt_number(est, 3)}" if ratio else f"{est:+.3g}")
        cells = [rank, labels[idx], f"{primary} {shown} {verdict}".replace("  ", " ").strip(),
                 checks, agree or "–", budget or "–"]
        rows.append(cells)
        keys.append([rank_key, *cells[1:]])
    note = (f"Each setting's contrast with {reference} (the paired column) tested the same way on each independent "
            "check of the ranking metric (declared once: benchmark/metrics/table.py INDEPENDENT_CHECKS), Holm over the "
            "block per metric. agree: every metric decides it the same way; metric-dependent: only some decide it, "
            "or their estimates point different ways (the paired column then says so); undecided: none decides it; "
            "not tested: one paired seed, no spread to test. "
            "budget: the client work (images trained on by clients, in full-model units) and the rounds of the two "
            "settings; a contrast of unequal budgets compares recipes, not methods at equal cost.")
    return Table("Paired verdicts on every metric", ["rank", "setting", "ranking metric", "independent checks",
                                                     "metrics agree", "budget"], rows, keys, note=note,
                 numeric=[True, False, False, False, False, False])


def _agreement_table(agreed: Mapping[str, Any]) -> tuple[Table, str]:
    """(the "Metric agreement" table, the headline's label when the ranking metric's winner is best under it alone)."""
    name_of = {str(k): str(v) for k, v in (agreed.get("labels") or {}).items()}  # written with the runs at hand
    primary = str(agreed["primary"])
    rows, keys = [], []
    for r in agreed["rows"]:
        tau, low, high = (to_float(r.get(k)) for k in ("tau", "tau_low", "tau_high"))
        interval = "" if math.isnan(low) else f" [{low:.2f}, {high:.2f}]"
        best = name_of.get(str(r.get("best")), "–") if r.get("best") is not None else "–"
        same = {True: "yes", False: "no"}.get(r.get("agrees_on_best"), "–")
        rows.append([str(r["metric"]), ("–" if math.isnan(tau) else f"{tau:.2f}") + interval,
                     str(r.get("settings", "")), best, same])
        keys.append([str(r["metric"]), None if math.isnan(tau) else tau, r.get("settings"), best, same])
    winner = name_of.get(str(agreed.get("best")), str(agreed.get("best")))
    holds = [r["metric"] for r in agreed["rows"] if r.get("agrees_on_best")]
    fails = [r["metric"] for r in agreed["rows"] if r.get("agrees_on_best") is False]
    if holds:
        said = f"{winner}, first by {primary}, is also first by {_join(holds)}" + (f"; not by {_join(fails)}" if fails else "") + "."
        suffix = "" if not fails else f" First place holds under {_join([primary, *holds])}; not under {_join(fails)}."
    else:
        said = f"{winner} is first by {primary} only: every other quality metric puts another setting first."
        suffix = f" This first place holds under {primary} only (see Metric agreement)."
    note = (f"Kendall τ between each metric's and {primary}'s ordering of the settings (seed means, untrained "
            f"baseline left out; 1 = the same order), 95% interval from resampling the seeds (paired across "
            f"settings). {said}")
    table = Table("Metric agreement", ["metric", f"Kendall τ vs {primary}", "settings", "first under it",
                                       f"same first as {primary}"], rows, keys, note=note,
                  numeric=[False, True, True, False, False])
    return table, suffix


def _ratio_cell(ratio: float) -> str:
    if math.isnan(ratio):
        return ""
    if round(ratio, 1) == 1.0:
        return "same"
    return f"{ratio:.1f}× less" if ratio > 1 else f"{1 / ratio:.1f}× more"


def _mean_std(row: pd.Series, metric: str) -> str:
    """A secondary table's cell: mean ± std over seeds (the interval is in leaderboard.csv)."""
    mean, std, n = to_float(row.get(f"{metric}_mean")), to_float(row.get(f"{metric}_std")), to_float(row.get(f"{metric}_n"))
    if math.isnan(mean):
        return ""
    text = fmt_number(mean)
    se = to_float(row.get(f"{metric}_stderr"))
    if n > 1 and not math.isnan(std):
        text += f" ± {fmt_number(std, 2)}"
    elif n == 1 and not math.isnan(se):  # one seed: the estimator's own standard error (KID reports one)
        text += f" ± {fmt_number(se, 2)} (s.e.)"
    if not math.isnan(n) and n != to_float(row["n"]):
        text += f" (n={int(n)})"
    return text


def _metric_table(title: str, block: pd.DataFrame, labels: Mapping[int, str], metrics: Sequence[str]) -> Table:
    headers = ["rank", "setting", *[_arrow(m) for m in metrics]]
    rows, keys = [], []
    for idx, row in block.iterrows():
        rank, rank_key = _rank_cell(row)
        rows.append([rank, labels[idx], *[_mean_std(row, m) for m in metrics]])
        keys.append([rank_key, labels[idx], *[_metric_key(row, m) for m in metrics]])
    return Table(title, headers, rows, keys, note="mean ± std over each setting's own seeds (one seed: ± its standard "
                 "error where the metric has one); rank: the main table's. The intervals are in leaderboard.csv.",
                 numeric=[True, False, *[True] * len(metrics)])


def _plain_table(title: str, block: pd.DataFrame, labels: Mapping[int, str], cols: Sequence[tuple[str, str]],
                 note: str | None = None) -> Table:
    headers = ["rank", "setting", *[h for _, h in cols]]
    rows, keys = [], []
    for idx, row in block.iterrows():
        rank, rank_key = _rank_cell(row)
        rows.append([rank, labels[idx], *[fmt_number(row[c]) for c, _ in cols]])
        keys.append([rank_key, labels[idx], *[_number_key(row[c]) for c, _ in cols]])
    return Table(title, headers, rows, keys, note=note, numeric=[True, False, *[True] * len(cols)])


def _columns_table(title: str, block: pd.DataFrame, labels: Mapping[int, str], cols: Sequence[_Column],
                   note: str | None = None) -> Table:
    """A secondary table of ready-made columns (the costs the main table had no room for)."""
    rows, keys = [], []
    for j, (idx, row) in enumerate(block.iterrows()):
        rank, rank_key = _rank_cell(row)
        rows.append([rank, labels[idx], *[c.cells[j] for c in cols]])
        keys.append([rank_key, labels[idx], *[c.keys[j] for c in cols]])
    return Table(title, ["rank", "setting", *[c.header for c in cols]], rows, keys, note=note,
                 numeric=[True, False, *[c.numeric for c in cols]])


def sections(table: pd.DataFrame, metrics: Sequence[str], meta: PageMeta, images: Mapping[str, Any]) -> list[Section]:
    return [section(d, p, block, metrics, meta, images) for (d, p), block in blocks(table)]


def failures_table(meta: PageMeta) -> Table:
    return Table("Failed and diverged runs", FAILURE_HEADERS, [list(map(str, r)) for r in meta.failures],
                 [list(map(str, r)) for r in meta.failures], numeric=[False] * len(FAILURE_HEADERS))


def summary(table: pd.DataFrame, meta: PageMeta) -> str:
    if any(c.endswith("_gmean") for c in table.columns):
        how = ("The ranking metric is aggregated over seeds as a geometric mean [95% interval] when it is a positive "
               "score (a distance, a loss), else as mean ± std (sample std) [95% interval]; the other tables show "
               "mean ± std; ")
    else:  # a leaderboard.csv written before the verdicts (re-rendered with --from-csv)
        how = "Seeds are aggregated as mean ± std (sample std) [95% interval]; "
    return (f"{meta.n_runs} finished run(s) in {len(table)} setting(s); {meta.n_failed} run(s) failed, diverged, "
            f"unfinished or unreadable (listed below). {how}↓ lower is better, ↑ higher is better.")


def metrics_of(table: pd.DataFrame) -> list[str]:
    """The metric names of a leaderboard.csv, in its column order (every `<m>_mean` with a `<m>_ci_method`)."""
    return [c[: -len("_mean")] for c in table.columns
            if c.endswith("_mean") and f"{c[: -len('_mean')]}_ci_method" in table.columns]
