"""Reporter: turn finished run folders into a leaderboard, plots and grid mosaics.

The reporter only reads run folders (``config.json``, ``status.json``,
``metrics.json``, ``rounds.jsonl``, ``grid.png``); it never trains. Every run it
finds ends up either in the leaderboard or in the "Failed and diverged runs"
list with a reason -- nothing is dropped silently.

Entry point: :func:`build_report`. :func:`collect` gives the same tables as
pandas frames for notebooks and tests.
"""

from __future__ import annotations

import base64
import html
import json
import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from PIL import Image, ImageDraw, ImageFont

logger = logging.getLogger(__name__)

# Ranking metric per dataset/partition block: the first one present wins; lower is better.
PRIMARY_METRICS: tuple[str, ...] = ("fid", "fd_fmnist")

# Config keys that identify a single run or its bookkeeping rather than the
# experiment; everything else in config.json is part of the group key, so runs
# that differ only in these are seeds of one setting.
NOT_GROUPED: frozenset[str] = frozenset(
    {"seed", "run_id", "version", "device", "root", "checkpoint_every", "out_dir", "output_dir", "runs_dir",
     "data_dir", "resume", "notes"}
)
# Keys that say *what* is compared inside a block rather than under which budget.
METHOD_KEYS: frozenset[str] = frozenset({"dataset", "partition", "method", "method_params"})
# Budget columns always shown in the block tables (others only when they vary).
ALWAYS_SHOWN_CONFIG: tuple[str, ...] = ("rounds",)

_FINISHED_BAD_STATES = {"failed", "diverged"}


# ---------------------------------------------------------------------------
# Reading run folders
# ---------------------------------------------------------------------------


@dataclass
class RunRecord:
    """A finished ("done") run, parsed."""

    path: Path
    config: dict[str, Any]
    metrics: dict[str, Any]
    rounds: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return str(self.config.get("run_id") or self.path.name)

    @property
    def grid(self) -> Path | None:
        grid = self.path / "grid.png"
        return grid if grid.is_file() else None


@dataclass(frozen=True)
class RunFailure:
    """A run that cannot enter the leaderboard, with the reason why."""

    path: Path
    run_id: str
    dataset: str
    partition: str
    method: str
    state: str  # failed | diverged | running | unfinished | unreadable
    reason: str


class _Unreadable(Exception):
    """A run file exists but cannot be parsed into what the reporter needs."""


def find_run_dirs(root: str | Path) -> list[Path]:
    """Every directory under ``root`` (recursively) that holds a ``config.json``."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"runs directory {root} does not exist")
    return sorted(p.parent for p in root.rglob("config.json") if p.is_file())


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _Unreadable(f"{path.name}: {exc}") from exc


def _read_json_dict(path: Path) -> dict[str, Any]:
    data = _read_json(path)
    if not isinstance(data, dict):
        raise _Unreadable(f"{path.name}: expected a JSON object, got {type(data).__name__}")
    return data


def _read_rounds(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Parse rounds.jsonl; bad lines are skipped with a warning (they only feed plots)."""
    if not path.is_file():
        return [], []
    rows: list[dict[str, Any]] = []
    warnings: list[str] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        return [], [f"rounds.jsonl unreadable: {exc}"]
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            warnings.append(f"rounds.jsonl line {number} skipped: {exc}")
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            warnings.append(f"rounds.jsonl line {number} skipped: not a JSON object")
    return rows, warnings


def normalize_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A flat view of config.json: nested sections (``data``, ``train``, ...) are lifted to the top.

    Runs may store the config flat (``dataset``, ``rounds`` at the top) or as
    sections (``data.dataset``, ``train.rounds``); the reporter reads both. A
    leaf name used by two sections keeps its dotted name so nothing collides.
    """
    flat = {k: v for k, v in config.items() if not isinstance(v, Mapping) or k == "method_params"}
    leaves: dict[str, list[tuple[str, Any]]] = {}
    for section, values in config.items():
        if section == "method_params" or not isinstance(values, Mapping):
            continue
        for name, value in _flatten(values).items():
            leaves.setdefault(name, []).append((section, value))
    for name, found in leaves.items():
        if len(found) == 1 and name not in flat:
            flat[name] = found[0][1]
        else:
            flat.update({f"{section}.{name}": value for section, value in found})
    return flat


def _status_reason(status: dict[str, Any]) -> str:
    error = str(status.get("error") or status.get("reason") or status.get("message") or "").strip()
    if not error:
        # Fall back to the exception line at the end of the traceback.
        lines = [ln for ln in str(status.get("traceback") or "").strip().splitlines() if ln.strip()]
        error = lines[-1].strip() if lines else "no error message recorded"
    return error


def read_run(path: str | Path) -> RunRecord | RunFailure:
    """Read one run folder; anything that keeps it out of the leaderboard becomes a RunFailure."""
    path = Path(path)
    config: dict[str, Any] = {}

    def failure(state: str, reason: str) -> RunFailure:
        return RunFailure(
            path=path,
            run_id=str(config.get("run_id") or path.name),
            dataset=str(config.get("dataset", "?")),
            partition=str(config.get("partition", "?")),
            method=str(config.get("method", "?")),
            state=state,
            reason=reason,
        )

    try:
        config = normalize_config(_read_json_dict(path / "config.json"))
        missing = [k for k in ("dataset", "partition", "method") if k not in config]
        if missing:
            raise _Unreadable(f"config.json lacks {', '.join(missing)}")
        status_path = path / "status.json"
        if not status_path.is_file():
            return failure("unfinished", "no status.json (run never started or was killed early)")
        status = _read_json_dict(status_path)
        state = str(status.get("state", "")).lower()
        if state in _FINISHED_BAD_STATES:
            return failure(state, _status_reason(status))
        rounds, warnings = _read_rounds(path / "rounds.jsonl")
        if state == "running":
            total = config.get("rounds", "?")
            done = max((int(r.get("round", 0)) for r in rounds if isinstance(r.get("round"), int)), default=0)
            return failure("running", f"unfinished: reached round {done} of {total}")
        if state != "done":
            return failure("unfinished", f"unknown state {status.get('state')!r} in status.json")
        metrics_path = path / "metrics.json"
        if not metrics_path.is_file():
            return failure("unreadable", "status is done but metrics.json is missing")
        metrics = _read_json_dict(metrics_path)
        evaluations = metrics.get("evaluations", [])
        if not isinstance(evaluations, list):
            raise _Unreadable("metrics.json: 'evaluations' is not a list")
    except _Unreadable as exc:
        return failure("unreadable", f"failed to read: {exc}")
    return RunRecord(path=path, config=config, metrics=metrics, rounds=rounds, warnings=warnings)


def load_runs(root: str | Path) -> tuple[list[RunRecord], list[RunFailure]]:
    """Read every run folder under ``root``; return (done runs, everything else)."""
    done: list[RunRecord] = []
    failures: list[RunFailure] = []
    for run_dir in find_run_dirs(root):
        result = read_run(run_dir)
        if isinstance(result, RunRecord):
            done.append(result)
        else:
            logger.info("run %s not in leaderboard: %s (%s)", result.run_id, result.state, result.reason)
            failures.append(result)
    return done, failures


# ---------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------


def _to_float(value: Any) -> float:
    """Numbers as float, anything else (None, strings, bools) as NaN."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)


def _scalar(value: Any) -> Any:
    """A value that fits in one table cell: lists/dicts become compact JSON."""
    if isinstance(value, (list, dict)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return value


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config dicts as dotted keys (``eval.num_samples``)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, prefix=f"{name}."))
        else:
            flat[name] = _scalar(value)
    return flat


def format_params(params: Mapping[str, Any]) -> str:
    """Method hyperparameters as one readable string: ``keep_ratio=0.5, scope=layer``."""
    if not params:
        return ""
    return ", ".join(f"{k}={_scalar(v)}" for k, v in sorted(params.items()))


def parse_alpha(partition: str) -> float:
    """Dirichlet concentration from a partition spec ``dirichlet:A``; NaN for other partitions."""
    match = re.fullmatch(r"dirichlet:([0-9.eE+-]+)", str(partition).strip())
    if not match:
        return math.nan
    try:
        return float(match.group(1))
    except ValueError:
        return math.nan


def _canonical(mapping: Mapping[str, Any]) -> str:
    return json.dumps(mapping, sort_keys=True, default=str)


def _metric_keys(evaluations: Iterable[Any], warnings: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """(column key, evaluation) pairs; a metric computed twice in a run gets its backend appended."""
    seen: set[str] = set()
    keyed: list[tuple[str, dict[str, Any]]] = []
    for entry in evaluations:
        if not isinstance(entry, dict) or not isinstance(entry.get("metric"), str):
            warnings.append(f"metrics.json: evaluation entry without a metric name skipped: {entry!r}")
            continue
        key = entry["metric"]
        if key in seen:
            key = f"{key} ({entry.get('backend') or entry.get('extractor') or len(seen)})"
        seen.add(key)
        keyed.append((key, entry))
    return keyed


def runs_frame(records: Sequence[RunRecord]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Long tables from parsed runs: (one row per run, one row per evaluation, one row per round)."""
    run_rows: list[dict[str, Any]] = []
    eval_rows: list[dict[str, Any]] = []
    round_rows: list[dict[str, Any]] = []
    for rec in records:
        cfg = rec.config
        params = cfg.get("method_params") or {}
        if not isinstance(params, dict):
            params = {"value": params}
        grouped = {k: v for k, v in cfg.items() if k not in NOT_GROUPED}
        budget = {k: v for k, v in grouped.items() if k not in METHOD_KEYS}
        config_rounds = _to_float(cfg.get("rounds", rec.metrics.get("rounds")))
        baseline = config_rounds == 0
        method = str(cfg["method"])
        params_text = format_params(params)
        setting = f"untrained ({method})" if baseline else method
        if params_text:
            setting = f"{setting} [{params_text}]"
        metrics = rec.metrics
        uploads = sum(len(r.get("clients") or []) for r in rec.rounds)
        uplink_bits = _to_float(metrics.get("uplink_bits"))
        if math.isnan(uplink_bits) and rec.rounds:
            uplink_bits = float(sum(_to_float(r.get("uplink_bits")) for r in rec.rounds))
        w2_mean = _to_float(metrics.get("w2_mean"))
        if math.isnan(w2_mean) and rec.rounds:
            w2_mean = float(np.nanmean([_to_float(r.get("w2")) for r in rec.rounds] or [math.nan]))
        row: dict[str, Any] = {
            "run_id": rec.run_id,
            "path": str(rec.path),
            "dataset": str(cfg["dataset"]),
            "partition": str(cfg["partition"]),
            "method": method,
            "params": params_text,
            "setting": setting,
            "baseline": baseline,
            "seed": cfg.get("seed"),
            "alpha": parse_alpha(cfg["partition"]),
            "group_key": _canonical(grouped),
            "budget_key": _canonical(budget),
            "uplink_mb": uplink_bits / 8 / 1e6,
            "downlink_mb": _to_float(metrics.get("downlink_bits")) / 8 / 1e6,
            "wall_seconds": _to_float(metrics.get("wall_seconds")),
            "rounds_done": _to_float(metrics.get("rounds")),
            "gamma_star": _to_float(metrics.get("gamma_star")),
            "w2_mean": w2_mean,
            "dropped_updates": _to_float(metrics.get("dropped_updates")),
            "uploads": float(uploads) if rec.rounds else math.nan,
            "grid": str(rec.grid) if rec.grid else None,
        }
        for key, value in params.items():
            row[f"param.{key}"] = _scalar(value)
        for key, value in _flatten({k: v for k, v in cfg.items() if k not in METHOD_KEYS | NOT_GROUPED}).items():
            row[f"cfg.{key}"] = value
        run_rows.append(row)
        for key, entry in _metric_keys(metrics.get("evaluations", []), rec.warnings):
            eval_rows.append(
                {
                    "run_id": rec.run_id,
                    "group_key": row["group_key"],
                    "metric": key,
                    "value": _to_float(entry.get("value")),
                    "std_err": _to_float(entry.get("std_err")),
                    **{
                        k: entry.get(k)
                        for k in ("extractor", "extractor_sha256", "backend", "num_samples", "sampler", "sampler_steps", "reference", "resize")
                    },
                }
            )
        for r in rec.rounds:
            round_rows.append(
                {
                    "run_id": rec.run_id,
                    "dataset": row["dataset"],
                    "partition": row["partition"],
                    "setting": setting,
                    "method": method,
                    "round": _to_float(r.get("round")),
                    "loss": _to_float(r.get("loss")),
                    "gamma_star": _to_float(r.get("gamma_star")),
                    "w2": _to_float(r.get("w2")),
                }
            )
    runs = pd.DataFrame(run_rows)
    evals = pd.DataFrame(
        eval_rows, columns=["run_id", "group_key", "metric", "value", "std_err", "extractor", "extractor_sha256",
                            "backend", "num_samples", "sampler", "sampler_steps", "reference", "resize"]
    )
    rounds = pd.DataFrame(round_rows, columns=["run_id", "dataset", "partition", "setting", "method", "round",
                                                "loss", "gamma_star", "w2"])
    # One column per metric on the run table, so plots and aggregation read one frame.
    for metric in _ordered_metrics(evals["metric"].unique() if len(evals) else []):
        sub = evals[evals["metric"] == metric].set_index("run_id")
        if len(runs):
            runs[metric] = runs["run_id"].map(sub["value"]).astype(float)
            runs[f"{metric}__stderr"] = runs["run_id"].map(sub["std_err"]).astype(float)
    return runs, evals, rounds


def _ordered_metrics(names: Iterable[str]) -> list[str]:
    """Primary metrics first, then the rest alphabetically."""
    names = list(dict.fromkeys(str(n) for n in names))
    head = [m for m in PRIMARY_METRICS if m in names]
    return head + sorted(n for n in names if n not in head)


def primary_metric(metric_names: Iterable[str]) -> str | None:
    """The ranking metric among those present: fid, else fd_fmnist, else any other Frechet distance."""
    names = set(metric_names)
    for metric in PRIMARY_METRICS:
        if metric in names:
            return metric
    fds = sorted(n for n in names if n.startswith("fd_"))
    return fds[0] if fds else None


def aggregate(runs: pd.DataFrame, metrics: Sequence[str]) -> pd.DataFrame:
    """One row per setting (config minus seed/run_id): seeds as mean, std (ddof=1) and count n."""
    rows: list[dict[str, Any]] = []
    if runs.empty:
        return pd.DataFrame()
    descriptive = [c for c in runs.columns if c.startswith(("param.", "cfg."))]
    for group_key, grp in runs.groupby("group_key", sort=False):
        grp = grp.sort_values("seed", key=lambda s: pd.to_numeric(s, errors="coerce"))
        first = grp.iloc[0]
        row: dict[str, Any] = {
            "dataset": first["dataset"],
            "partition": first["partition"],
            "method": first["method"],
            "params": first["params"],
            "setting": first["setting"],
            "baseline": bool(first["baseline"]),
            "n": len(grp),
            "seeds": ";".join(str(s) for s in grp["seed"]),
            "run_ids": ";".join(grp["run_id"]),
            "group_key": group_key,
            "budget_key": first["budget_key"],
            "alpha": first["alpha"],
        }
        for col in descriptive:
            row[col] = first[col]
        for metric in metrics:
            values = grp[metric].dropna() if metric in grp else pd.Series(dtype=float)
            row[f"{metric}_mean"] = float(values.mean()) if len(values) else math.nan
            row[f"{metric}_std"] = float(values.std(ddof=1)) if len(values) > 1 else math.nan
            row[f"{metric}_n"] = int(len(values))
            # With a single seed there is no spread; the estimator's own standard error
            # (KID reports one) is the only uncertainty we can show.
            stderr = grp.loc[values.index, f"{metric}__stderr"].dropna() if len(values) == 1 else []
            row[f"{metric}_stderr"] = float(stderr.iloc[0]) if len(stderr) else math.nan
        for col in ("uplink_mb", "downlink_mb", "wall_seconds", "gamma_star", "w2_mean", "dropped_updates", "uploads", "rounds_done"):
            values = grp[col].dropna()
            row[f"{col}_mean"] = float(values.mean()) if len(values) else math.nan
            row[f"{col}_std"] = float(values.std(ddof=1)) if len(values) > 1 else math.nan
        grids = grp["grid"].dropna()
        row["grid"] = grids.iloc[0] if len(grids) else None
        row["grid_seed"] = grp.loc[grids.index[0], "seed"] if len(grids) else None
        rows.append(row)
    table = pd.DataFrame(rows)
    return _rank_and_compress(table, metrics)


def _rank_and_compress(table: pd.DataFrame, metrics: Sequence[str]) -> pd.DataFrame:
    """Per dataset/partition block: primary metric, rank (1 = best) and uplink ratio vs fedavg."""
    table = table.copy()
    table["primary_metric"] = None
    table["rank"] = math.nan
    table["compression_ratio"] = math.nan
    table["compression_ref"] = None
    for _, block in table.groupby(["dataset", "partition"], sort=False):
        present = [m for m in metrics if block[f"{m}_n"].gt(0).any()]
        primary = primary_metric(present)
        table.loc[block.index, "primary_metric"] = primary
        if primary is not None:
            scored = block[~block["baseline"] & block[f"{primary}_mean"].notna()]
            # Baselines are references, not contenders: they get no rank.
            table.loc[scored.index, "rank"] = scored[f"{primary}_mean"].rank(method="min", ascending=True)
        fedavg = block[(block["method"] == "fedavg") & ~block["baseline"]]
        for idx, row in block.iterrows():
            if row["baseline"] or fedavg.empty or not row["uplink_mb_mean"] > 0:
                continue
            same = fedavg[fedavg["budget_key"] == row["budget_key"]]
            if len(same) and same["uplink_mb_mean"].notna().any():
                table.loc[idx, "compression_ratio"] = float(same["uplink_mb_mean"].mean()) / row["uplink_mb_mean"]
                table.loc[idx, "compression_ref"] = "same budget"
            elif row["uploads_mean"] > 0 and (fedavg["uploads_mean"] > 0).any():
                # Different budgets: compare bits per client upload instead of totals.
                ref = fedavg[fedavg["uploads_mean"] > 0]
                per_upload = float((ref["uplink_mb_mean"] / ref["uploads_mean"]).mean())
                table.loc[idx, "compression_ratio"] = per_upload / (row["uplink_mb_mean"] / row["uploads_mean"])
                table.loc[idx, "compression_ref"] = "per upload"
    # Best first inside each block; baselines and unscored settings at the bottom.
    order = table.assign(_rank=table["rank"].fillna(np.inf))
    order = order.sort_values(["dataset", "partition", "baseline", "_rank", "setting"], kind="stable")
    return order.drop(columns=["_rank"]).reset_index(drop=True)


@dataclass
class ReportData:
    """Everything the writers need, as frames."""

    runs: pd.DataFrame
    evaluations: pd.DataFrame
    rounds: pd.DataFrame
    table: pd.DataFrame
    metrics: list[str]
    failures: list[RunFailure]
    warnings: list[str]
    hardware: list[str] = field(default_factory=list)  # distinct metrics.json environment.hardware


def collect(runs_dir: str | Path) -> ReportData:
    """Read all runs under ``runs_dir`` and build the per-run and per-setting tables."""
    records, failures = load_runs(runs_dir)
    runs, evals, rounds = runs_frame(records)
    metrics = _ordered_metrics(evals["metric"].unique()) if len(evals) else []
    table = aggregate(runs, metrics)
    warnings = [f"{rec.run_id}: {w}" for rec in records for w in rec.warnings]
    hardware = sorted({str(rec.metrics["environment"].get("hardware")) for rec in records
                       if isinstance(rec.metrics.get("environment"), dict)})
    return ReportData(runs=runs, evaluations=evals, rounds=rounds, table=table, metrics=metrics,
                      failures=failures, warnings=warnings, hardware=hardware)


# ---------------------------------------------------------------------------
# Formatting shared by the Markdown and HTML writers
# ---------------------------------------------------------------------------


def _fmt(value: Any, digits: int = 4) -> str:
    value = _to_float(value)
    if math.isnan(value):
        return ""
    if math.isinf(value):
        return "inf"
    if abs(value) >= 10 ** digits:
        return f"{value:.0f}"
    return f"{value:.{digits}g}"


def _fmt_metric(row: pd.Series, metric: str, group_n: int) -> str:
    mean, std, n, se = (row[f"{metric}_{s}"] for s in ("mean", "std", "n", "stderr"))
    if n == 0 or pd.isna(mean):
        return ""
    text = _fmt(mean)
    if n > 1 and not pd.isna(std):
        text += f" ± {_fmt(std, 2)}"
    elif n == 1 and not pd.isna(se):
        text += f" ± {_fmt(se, 2)} (s.e.)"
    if n != group_n:
        text += f" (n={n})"
    return text


def _fmt_seconds(seconds: Any) -> str:
    seconds = _to_float(seconds)
    if math.isnan(seconds):
        return ""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _block_view(block: pd.DataFrame, metrics: Sequence[str]) -> tuple[list[str], list[list[str]], dict[str, str]]:
    """Headers, display rows and shared settings of one dataset/partition block."""
    present = [m for m in metrics if block[f"{m}_n"].gt(0).any()]
    cfg_cols = [c for c in block.columns if c.startswith("cfg.")]
    varying = [c for c in cfg_cols if block[c].astype(str).nunique(dropna=False) > 1]
    shown_cfg = [f"cfg.{c}" for c in ALWAYS_SHOWN_CONFIG if f"cfg.{c}" in block.columns]
    shown_cfg += [c for c in varying if c not in shown_cfg]
    shared = {c[4:]: str(block[c].iloc[0]) for c in cfg_cols if c not in shown_cfg and c not in varying}
    headers = ["rank", "method", "params", *present, "n", "uplink MB", "compression", "wall time",
               *[c[4:] for c in shown_cfg]]
    rows: list[list[str]] = []
    for _, row in block.iterrows():
        ratio = row["compression_ratio"]
        compression = "" if pd.isna(ratio) else f"x{ratio:.1f}" + ("*" if row["compression_ref"] == "per upload" else "")
        rank = "" if pd.isna(row["rank"]) else str(int(row["rank"]))
        method = f"untrained ({row['method']})" if row["baseline"] else str(row["method"])
        rows.append(
            [rank, method, str(row["params"]), *[_fmt_metric(row, m, int(row["n"])) for m in present],
             str(int(row["n"])), _fmt(row["uplink_mb_mean"]), compression, _fmt_seconds(row["wall_seconds_mean"]),
             *[_fmt(row[c]) if isinstance(row[c], (int, float)) and not isinstance(row[c], bool) else str(row[c])
               for c in shown_cfg]]
        )
    return headers, rows, shared


def _fmt_meta(value: Any) -> str:
    # pandas turns int columns with gaps into floats: print 1000.0 back as 1000.
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _metric_notes(evals: pd.DataFrame, group_keys: Iterable[str]) -> list[str]:
    """How each metric was computed in this block (extractor, backend, samples, sampler, reference)."""
    sub = evals[evals["group_key"].isin(list(group_keys))]
    notes: list[str] = []
    for metric in _ordered_metrics(sub["metric"].unique()):
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


def _blocks(table: pd.DataFrame) -> list[tuple[tuple[str, str], pd.DataFrame]]:
    """The dataset/partition blocks of the leaderboard, in table order (none when no run finished)."""
    if table.empty:
        return []
    return [((str(d), str(p)), block) for (d, p), block in table.groupby(["dataset", "partition"], sort=False)]


def _block_title(dataset: str, partition: str) -> str:
    return f"{dataset} / {partition}"


def _safe_name(text: str) -> str:
    """File-name-safe: ':' and anything unusual become '-'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "unnamed"


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


# ---------------------------------------------------------------------------
# Mosaics
# ---------------------------------------------------------------------------


def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1 has no sized default font
        return ImageFont.load_default()


def _wrap(text: str, draw: ImageDraw.ImageDraw, font: Any, width: int) -> list[str]:
    """Greedy word wrap to a pixel width (params strings can be long)."""
    lines: list[str] = []
    current = ""
    for word in text.split(" "):
        trial = f"{current} {word}".strip()
        if current and draw.textlength(trial, font=font) > width:
            lines.append(current)
            current = word
        else:
            current = trial
    if current:
        lines.append(current)
    return lines or [""]


def make_mosaic(block: pd.DataFrame, title: str, out_path: Path, min_tile: int = 192) -> tuple[Path | None, list[str]]:
    """Side-by-side grids of one block (first seed per setting), captioned with method, params and score."""
    notes: list[str] = []
    tiles: list[tuple[Image.Image, list[str]]] = []
    for _, row in block.iterrows():
        if not row["grid"]:
            notes.append(f"{row['setting']}: no grid.png")
            continue
        try:
            with Image.open(row["grid"]) as img:
                tile = img.convert("RGB")
        except (OSError, ValueError) as exc:
            notes.append(f"{row['setting']}: grid.png unreadable ({exc})")
            continue
        primary = row["primary_metric"]
        score = f"{primary} {_fmt_metric(row, primary, int(row['n']))}" if primary and row[f"{primary}_n"] else "no score"
        method = f"untrained ({row['method']})" if row["baseline"] else str(row["method"])
        rank = "" if pd.isna(row["rank"]) else f"#{int(row['rank'])} "
        caption = [f"{rank}{method}", str(row["params"]), score, f"seed {row['grid_seed']}"]
        tiles.append((tile, [c for c in caption if c]))
    if not tiles:
        return None, notes + [f"{title}: no readable grid.png, mosaic skipped"]
    # Grids are small (32x32 cells); upscale with NEAREST so pixels stay crisp and captions fit.
    side = max(min_tile, max(max(t.size) for t, _ in tiles))
    font, title_font = _font(13), _font(18)
    scratch = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    line_h = 16
    pad = 10
    wrapped = [[ln for c in caption for ln in _wrap(c, scratch, font, side)] for _, caption in tiles]
    caption_h = line_h * max(len(w) for w in wrapped) + pad
    cols = min(len(tiles), 6)
    rows = math.ceil(len(tiles) / cols)
    title_h = 34
    width = pad + cols * (side + pad)
    height = title_h + rows * (side + caption_h + pad)
    canvas = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(canvas)
    draw.text((pad, 8), title, fill="black", font=title_font)
    for i, ((tile, _), lines) in enumerate(zip(tiles, wrapped)):
        x = pad + (i % cols) * (side + pad)
        y = title_h + (i // cols) * (side + caption_h + pad)
        scale = side / max(tile.size)
        resized = tile.resize((max(1, round(tile.width * scale)), max(1, round(tile.height * scale))), Image.NEAREST)
        canvas.paste(resized, (x, y))
        for j, line in enumerate(lines):
            draw.text((x, y + side + 4 + j * line_h), line, fill="black", font=font)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(out_path)
    return out_path, notes


# ---------------------------------------------------------------------------
# Writers
# ---------------------------------------------------------------------------


CSV_LEAD = ["dataset", "partition", "method", "params", "baseline", "rank", "primary_metric", "n", "seeds"]


def write_csv(table: pd.DataFrame, metrics: Sequence[str], path: Path) -> Path:
    """Flat, machine-readable leaderboard: one row per setting, numeric columns."""
    if table.empty:
        pd.DataFrame(columns=CSV_LEAD).to_csv(path, index=False)
        return path
    metric_cols = [f"{m}_{s}" for m in metrics for s in ("mean", "std", "n", "stderr")]
    cost_cols = ["uplink_mb_mean", "uplink_mb_std", "downlink_mb_mean", "compression_ratio", "compression_ref",
                 "wall_seconds_mean", "wall_seconds_std", "rounds_done_mean", "gamma_star_mean", "w2_mean_mean",
                 "dropped_updates_mean"]
    param_cols = sorted(c for c in table.columns if c.startswith("param."))
    cfg_cols = sorted(c for c in table.columns if c.startswith("cfg."))
    cols = CSV_LEAD + param_cols + metric_cols + cost_cols + cfg_cols + ["run_ids"]
    out = table[[c for c in cols if c in table.columns]].copy()
    out["rank"] = out["rank"].astype("Int64")
    out.to_csv(path, index=False)
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
        f"unfinished or unreadable (listed below). Seeds are aggregated as mean ± std (sample std); "
        f"lower is better for every metric. `x4.0` = four times less uplink than fedavg in the same block "
        f"(`*`: fedavg ran another budget, compared per client upload).",
        "",
    ]
    if data.hardware:
        lines += ["Hardware: " + "; ".join(data.hardware) + ".", ""]
    for (dataset, partition), block in _blocks(data.table):
        headers, rows, shared = _block_view(block, data.metrics)
        primary = block["primary_metric"].iloc[0]
        lines += [f"## {_block_title(dataset, partition)}", ""]
        lines.append(f"Ranked by **{primary}** (lower is better)." if primary else "No ranking metric (fid / fd_*) recorded.")
        if shared:
            lines.append("Shared settings: " + ", ".join(f"{k}={v}" for k, v in sorted(shared.items())) + ".")
        lines += ["", _md_table(headers, rows), ""]
        for note in _metric_notes(data.evaluations, block["group_key"]):
            lines.append(f"- {note}")
        mosaic = images.get(f"mosaic_{_safe_name(dataset)}_{_safe_name(partition)}")
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
            f"<td class=\"num\">{html.escape(c)}</td>" if re.fullmatch(r"[x#]?[-0-9.e+ ±()s.n=*]+", c or "-") else f"<td>{html.escape(c)}</td>"
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
        "diverged, unfinished or unreadable. Seeds aggregated as mean ± std; lower is better.</p>",
    ]
    for (dataset, partition), block in _blocks(data.table):
        headers, rows, shared = _block_view(block, data.metrics)
        primary = block["primary_metric"].iloc[0]
        parts.append(f"<h2>{esc(_block_title(dataset, partition))}</h2>")
        parts.append(f"<p>Ranked by <b>{esc(primary)}</b> (lower is better).</p>" if primary else "<p>No ranking metric.</p>")
        if shared:
            parts.append("<p class=\"note\">Shared settings: " + esc(", ".join(f"{k}={v}" for k, v in sorted(shared.items()))) + "</p>")
        parts.append(_html_table(headers, rows))
        metric_notes = _metric_notes(data.evaluations, block["group_key"])
        if metric_notes:
            parts.append("<ul class=\"note\">" + "".join(f"<li>{esc(n)}</li>" for n in metric_notes) + "</ul>")
        mosaic = images.get(f"mosaic_{_safe_name(dataset)}_{_safe_name(partition)}")
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


def build_report(runs_dir: str | Path, out_dir: str | Path) -> dict[str, Path]:
    """Read every run under ``runs_dir`` and write the leaderboard, plots and mosaics to ``out_dir``.

    Returns the written files by name: ``leaderboard_md``, ``leaderboard_csv``,
    ``leaderboard_html``, ``plot_<name>``, ``mosaic_<dataset>_<partition>``, and
    ``skipped`` (a text file listing every plot or mosaic that was skipped and why)
    when anything was skipped.
    """
    from dfbench.benchmark.plots import make_plots  # matplotlib is heavy; import only when drawing

    root = Path(runs_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = collect(root)
    images: dict[str, Path] = {}
    notes: list[str] = []

    for (dataset, partition), block in _blocks(data.table):
        name = f"mosaic_{_safe_name(dataset)}_{_safe_name(partition)}"
        path, mosaic_notes = make_mosaic(block, f"{_block_title(dataset, partition)}: fixed-noise sample grids", out / f"{name}.png")
        notes += [f"mosaic {dataset}/{partition}: {n}" for n in mosaic_notes]
        if path is not None:
            images[name] = path

    plots, plot_notes = make_plots(data.runs, data.rounds, data.table, data.metrics, out / "plots")
    images.update({f"plot_{k}": v for k, v in plots.items()})
    notes += [f"plot {k}: {v}" for k, v in plot_notes.items()]
    for note in notes:
        logger.warning("report: %s", note)

    written: dict[str, Path] = {
        "leaderboard_md": write_markdown(data, out, root, images, notes),
        "leaderboard_csv": write_csv(data.table, data.metrics, out / "leaderboard.csv"),
        "leaderboard_html": write_html(data, out, root, images, notes),
    }
    written.update(images)
    if notes:
        skipped = out / "skipped.txt"
        skipped.write_text("\n".join(notes) + "\n", encoding="utf-8")
        written["skipped"] = skipped
    return written
