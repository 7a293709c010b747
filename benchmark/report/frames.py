"""From parsed runs to the reporter's tables: per run, per evaluation, per round, per setting.

:func:`collect` is the one call: it reads every run folder under a root and
returns a :class:`ReportData` with the long frames and the aggregated,
ranked leaderboard table that the writers, mosaics and plots draw from.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dfbench.benchmark.core import runfolder
from dfbench.benchmark.core import schema
from dfbench.benchmark.core.config import SECTIONS, experiment_schema
from dfbench.benchmark.metrics import table as metric_table
from dfbench.benchmark.metrics.drift import recorded_drift
from dfbench.benchmark.metrics.uncertainty import FRECHET_WHAT, centred_method, recentre, t_interval
from dfbench.benchmark.report import budget as budget_rule
from dfbench.benchmark.report import verdicts
from dfbench.benchmark.report.names import _present as present
from dfbench.benchmark.report.names import CONFIG_DEFAULTS, anchor_role, baseline_name, reference_method, run_names, setting_names  # noqa: F401  (CONFIG_DEFAULTS re-exported)
from dfbench.benchmark.report.run_records import (
    RunFailure,
    RunRecord,
    cell_value,
    flatten_config,
    format_params,
    load_runs,
    normalize_config,
    parse_alpha,
    to_float,
)

# Ranking metric per dataset/partition block: the first one present wins (benchmark/metrics/table.py).
PRIMARY_METRICS: tuple[str, ...] = metric_table.PRIMARY

# Keys of hand-written or foreign config.json files that are no RunConfig field: bookkeeping, never grouped.
FOREIGN_BOOKKEEPING: frozenset[str] = frozenset({"out_dir", "output_dir", "runs_dir", "data_dir", "resume", "notes"})


def not_grouped() -> frozenset[str]:
    """Config keys (as `normalize_config` names them) that identify a single run or its bookkeeping rather
    than the experiment, derived from the schema (core/schema.py): the seed, config.json's bookkeeping and
    every execution-only field. Everything else in config.json is part of the group key, so runs that differ
    only in these are seeds of one setting."""
    names = {e.name for e in experiment_schema() if e.spec.role == "execution" or e.spec.seed}
    return frozenset(names | set(schema.BOOKKEEPING) | FOREIGN_BOOKKEEPING)


def later_neutral() -> dict[str, Any]:
    """Leaf name -> neutral value of the fields added after runs were published (the schema's later
    fields): a run folder without the key and one with it at that value are the same setting, so the
    group key leaves it out."""
    return {key.rpartition(".")[2]: value for key, value in schema.later_fields(experiment_schema()).items()}


# The two as they are now (derived, read-only; `runs_frame` asks the functions, so a declared field counts at once).
NOT_GROUPED: frozenset[str] = not_grouped()
LATER_NEUTRAL: Mapping[str, Any] = types.MappingProxyType(later_neutral())


def _flat_key(cfg: Mapping[str, Any], dotted: str) -> str:
    """The key `normalize_config` gives a dotted field in this run's flat config: its leaf name, or the
    dotted name where two sections share the leaf."""
    return dotted if dotted in cfg else dotted.rpartition(".")[2]


def _flat_getter(cfg: Mapping[str, Any], entries: Sequence[schema.Entry]) -> schema.Getter:
    """`schema.Getter` over a flat stored config: a field the run did not record ran with its neutral
    value (a later field) or its default."""
    fallback = {e.key: (e.spec.neutral if e.spec.later else e.default) for e in entries}

    def get(dotted: str) -> Any:
        key = _flat_key(cfg, dotted)
        return cfg[key] if key in cfg else fallback.get(dotted)
    return get


def grouped_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """What a run's flat config says about its setting: everything but `not_grouped()`, the fields the
    schema declares inactive for this run (the driver's knobs in synchronous rounds, ...), and later fields at
    their neutral value; a field with a canonical form (train.time_sampling=auto) as the run id hashes it."""
    entries = experiment_schema()
    get = _flat_getter(cfg, entries)
    skip, canonical = set(not_grouped()), {}
    for e in entries:
        if e.spec.role != "result":
            continue
        key = _flat_key(cfg, e.key)
        if e.spec.active is not None and not e.spec.active(get):
            skip.add(key)
        elif e.spec.canonical is not None and key in cfg:
            canonical[key] = e.spec.canonical(get)
    neutral = later_neutral()
    out = {}
    for k, v in cfg.items():
        v = canonical.get(k, v)
        if k not in skip and not (k in neutral and v == neutral[k]):
            out[k] = v
    return out


# Keys that say *what* is compared inside a block rather than under which budget.
METHOD_KEYS: frozenset[str] = frozenset({"dataset", "partition", "method", "method_params"})




def _canonical(mapping: Mapping[str, Any]) -> str:
    return json.dumps(mapping, sort_keys=True, default=str)


def _metric_keys(evaluations: Iterable[Any], warnings: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """(column key, evaluation) pairs; a metric computed twice in a run gets its backend appended."""
    seen: set[str] = set()
    keyed: list[tuple[str, dict[str, Any]]] = []
    for entry in evaluations:
        if not isinstance(entry, dict) or not isinstance(entry.get("metric"), str):
            warnings.append(f"{runfolder.METRICS}: evaluation entry without a metric name skipped: {entry!r}")
            continue
        key = entry["metric"]
        if key in seen:
            key = f"{key} ({entry.get('backend') or entry.get('extractor') or len(seen)})"
        seen.add(key)
        keyed.append((key, entry))
    return keyed


def _partition_digest(path: Path) -> str | None:
    """partition.json's indices_sha256 (the partition's digest), or None when the file or key is missing."""
    try:
        digest = runfolder.read_json(Path(path) / runfolder.PARTITION).get("indices_sha256")
    except Exception:  # noqa: BLE001 - a run without a readable partition.json is simply not checked
        return None
    return digest if isinstance(digest, str) else None


def is_variant(entry: Any) -> bool:
    """An evaluation row of one of the run's other sampling rules (metrics.json ``configured: false``,
    benchmark/engine/evaluate.py), not its result: never ranked, averaged or shown in the leaderboard."""
    return isinstance(entry, dict) and entry.get("configured") is False


def non_negative(metric: str) -> bool:
    """Whether `metric` is >= 0 in truth, so that no interval of it may go below 0: every metric of the
    metric table is (distances, KID, losses, rates, AUCs, counts, precision/recall); a name the table
    does not know is left as recorded."""
    return metric_table.get(metric) is not None


def run_interval(metric: str, entry: Mapping[str, Any]) -> tuple[float, float, str | None]:
    """(low, high, method) of a run's own interval of `metric` as the report shows it: as `entry` (a
    metrics.json row) records it, except that

    - a Frechet interval recorded as a basic bootstrap (an interval of the bias-corrected distance, which
      with few samples in many dimensions lies wholly below the value it accompanies) is shown as the
      centred interval of the same replicates, the value -+ half its width (`uncertainty.recentre`:
      exact, what scoring records today); one clipped at 0 lost its width and is dropped;
    - the interval of a metric that is >= 0 (`non_negative`) is clipped at 0, and says so."""
    value, low, high = (to_float(entry.get(k)) for k in ("value", "ci_low", "ci_high"))
    method = entry.get("ci_method") if isinstance(entry.get("ci_method"), str) else None
    level = to_float(entry.get("ci_level"))
    basic = f"{(0.95 if math.isnan(level) else level):.0%} basic bootstrap {FRECHET_WHAT}"
    if method == basic and not math.isnan(value):
        low, high = recentre(value, low, high)
        method = centred_method(0.95 if math.isnan(level) else level, FRECHET_WHAT)
    elif method == basic + ", clipped at 0":
        return math.nan, math.nan, None
    if non_negative(metric) and low < 0:
        low, high = 0.0, max(high, 0.0)
        method = (method or "interval") + f", clipped at 0 ({metric} >= 0)"
    return low, high, method


def init_label(init: Mapping[str, Any]) -> str:
    """How a row names the weights its run started from (metrics.json "init", train.init): "from <run id>" for a
    finished run's final model, else the file or folder's name and the weights' digest, short."""
    if init.get("run_id"):
        return f"from {init['run_id']}"
    return f"{Path(str(init.get('path', ''))).name} {str(init.get('sha256', ''))[:12]}".strip()


def runs_frame(records: Sequence[RunRecord]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Long tables from parsed runs: (one row per run, one row per evaluation, one row per round).

    The evaluations are the run's result only: rows of its other sampling rules are in
    `inference_frame`."""
    run_rows: list[dict[str, Any]] = []
    eval_rows: list[dict[str, Any]] = []
    round_rows: list[dict[str, Any]] = []
    hidden, neutral = METHOD_KEYS | not_grouped(), later_neutral()
    for rec in records:
        cfg = rec.config
        params = cfg.get("method_params") or {}
        if not isinstance(params, dict):
            params = {"value": params}
        grouped = grouped_config(cfg)
        budget = {k: v for k, v in grouped.items() if k not in METHOD_KEYS}
        config_rounds = to_float(cfg.get("rounds", rec.metrics.get("rounds")))
        baseline = config_rounds == 0
        method = str(cfg["method"])
        params_text = format_params(params)
        setting = baseline_name(method) if baseline else method
        if params_text:
            setting = f"{setting} [{params_text}]"
        metrics = rec.metrics
        uploads = sum(len(r.get("clients") or []) for r in rec.rounds)
        uplink_bits = to_float(metrics.get("uplink_bits"))
        if math.isnan(uplink_bits) and rec.rounds:
            uplink_bits = float(sum(to_float(r.get("uplink_bits")) for r in rec.rounds))
        w2_mean = to_float(metrics.get("w2_mean"))
        if math.isnan(w2_mean) and rec.rounds:
            w2_mean = float(np.nanmean([to_float(r.get("w2")) for r in rec.rounds] or [math.nan]))
        # same-noise drift from the dense reference (benchmark/metrics/drift.py), as metrics.json records it
        drift_rec = recorded_drift(metrics) or {}
        drift_feats = list((drift_rec.get("features") or {}).values())
        pairing = metrics.get("pairing") if isinstance(metrics.get("pairing"), dict) else {}
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
            "downlink_mb": to_float(metrics.get("downlink_bits")) / 8 / 1e6,
            "wall_seconds": to_float(metrics.get("wall_seconds")),
            "sim_seconds": to_float(metrics.get("sim_seconds")),  # the simulated clock (absent before it: NaN)
            "client_images": to_float(metrics.get("client_images")),  # reported client work, full-model images
            "rounds_done": to_float(metrics.get("rounds")),
            "num_parameters": to_float(metrics.get("num_parameters")),  # the trained network's (metrics.json)
            "gamma_star": to_float(metrics.get("gamma_star")),
            "w2_mean": w2_mean,
            "drift": to_float(drift_feats[0]) if drift_feats else math.nan,  # the run's first extractor's features
            "drift_pixel": to_float(drift_rec.get("pixel")),
            "dropped_updates": to_float(metrics.get("dropped_updates")),
            # user-level DP's epsilon at its delta after the last round (NaN: no DP, or no noise: epsilon infinite)
            "epsilon": to_float((metrics.get("privacy") or {}).get("epsilon")),
            "uploads": float(uploads) if rec.rounds else math.nan,
            "grid": str(rec.grid) if rec.grid else None,
            # what runs at the same seed must share to be paired (benchmark/report/verdicts.py); None: not recorded
            "partition_sha256": _partition_digest(rec.path),
            "init_sha256": pairing.get("init_sha256"),
            "eval_noise_sha256": pairing.get("eval_noise_sha256"),
            # metrics that could not be computed: absent from the evaluations, said here
            "evaluation_notes": " ".join(str(n) for n in metrics.get("evaluation_notes") or []),
        }
        if isinstance(metrics.get("plateau"), dict):  # the plateau rule (engine/plateau.py): only runs that used it
            row["plateau_reached"] = 1.0 if metrics["plateau"].get("reached") else 0.0
            row["plateau_gain"] = to_float(metrics["plateau"].get("last_improvement"))
        for key, value in params.items():
            row[f"param.{key}"] = cell_value(value)
        for key, value in flatten_config({k: v for k, v in cfg.items() if k not in hidden}).items():
            if not (key in neutral and value == neutral[key]):  # a later field at its neutral value: as before it
                row[f"cfg.{key}"] = value
        if row.get("cfg.init_sha256") and isinstance(metrics.get("init"), dict):  # started from trained weights
            row["cfg.init_sha256"] = init_label(metrics["init"])
        run_rows.append(row)
        result = [e for e in metrics.get("evaluations", []) if not is_variant(e)]
        for key, entry in _metric_keys(result, rec.warnings):
            low, high, how = run_interval(key, entry)
            eval_rows.append(
                {
                    "run_id": rec.run_id,
                    "group_key": row["group_key"],
                    "metric": key,
                    "value": to_float(entry.get("value")),
                    "std_err": to_float(entry.get("std_err")),
                    "ci_low": low,
                    "ci_high": high,
                    "ci_method": how,
                    "better": entry.get("better") or "lower",
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
                    "round": to_float(r.get("round")),
                    "loss": to_float(r.get("loss")),
                    "gamma_star": to_float(r.get("gamma_star")),
                    "w2": to_float(r.get("w2")),
                }
            )
    runs = pd.DataFrame(run_rows)
    for key, value in neutral.items():  # runs without a later field ran with its neutral value
        if f"cfg.{key}" in runs:
            runs[f"cfg.{key}"] = runs[f"cfg.{key}"].astype(object).where(runs[f"cfg.{key}"].notna(), value)
    evals = pd.DataFrame(
        eval_rows, columns=["run_id", "group_key", "metric", "value", "std_err", "ci_low", "ci_high", "ci_method", "better",
                            "extractor", "extractor_sha256",
                            "backend", "num_samples", "sampler", "sampler_steps", "reference", "resize"]
    )
    rounds = pd.DataFrame(round_rows, columns=["run_id", "dataset", "partition", "setting", "method", "round",
                                                "loss", "gamma_star", "w2"])
    # One column per metric on the run table, so plots and aggregation read one frame.
    for metric in ordered_metrics(evals["metric"].unique() if len(evals) else []):
        sub = evals[evals["metric"] == metric].set_index("run_id")
        if len(runs):
            runs[metric] = runs["run_id"].map(sub["value"]).astype(float)
            runs[f"{metric}__stderr"] = runs["run_id"].map(sub["std_err"]).astype(float)
            runs[f"{metric}__lo"] = runs["run_id"].map(sub["ci_low"]).astype(float)
            runs[f"{metric}__hi"] = runs["run_id"].map(sub["ci_high"]).astype(float)
            runs[f"{metric}__ci"] = runs["run_id"].map(sub["ci_method"])
    return runs, evals, rounds


INFERENCE_COLUMNS = ["dataset", "partition", "method", "params", "setting", "seed", "run_id", "inference", "configured",
                     "metric", "value", "std_err", "ci_low", "ci_high", "seed_mean", "seed_std", "seed_n", "group_key"]


def inference_frame(records: Sequence[RunRecord], runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run x sampling rule x metric, for the runs whose evaluation rows name their rule
    (``inference``: pruning's inference rules): the result's rule (``configured`` true) and the others
    alike, with the mean, std (ddof=1) and count over the seeds of the setting under that rule
    (``seed_*``), so a study compares the rules on the same trained models. In run-folder order, the
    result's rule first. Empty for runs that sample one way or were evaluated before rules were tagged.
    `runs` is `runs_frame`'s run table of the same records (one row per record, in order)."""
    rows: list[dict[str, Any]] = []
    for i, rec in enumerate(records):
        tagged = [e for e in rec.metrics.get("evaluations", []) if isinstance(e, dict) and "inference" in e]
        run = runs.iloc[i]
        for rule, configured in dict.fromkeys((str(e["inference"]), not is_variant(e)) for e in tagged):
            same = [e for e in tagged if (str(e["inference"]), not is_variant(e)) == (rule, configured)]
            for key, entry in _metric_keys(same, []):  # (a bad row is warned about once, by runs_frame)
                low, high, _ = run_interval(key, entry)
                rows.append({
                    **{k: run[k] for k in ("dataset", "partition", "method", "params", "setting", "seed", "group_key")},
                    "run_id": rec.run_id, "inference": rule, "configured": configured, "metric": key,
                    **{k: to_float(entry.get(k)) for k in ("value", "std_err")}, "ci_low": low, "ci_high": high,
                })
    frame = pd.DataFrame(rows, columns=[c for c in INFERENCE_COLUMNS if not c.startswith("seed_")])
    if frame.empty:
        return pd.DataFrame(columns=INFERENCE_COLUMNS)
    seeds = frame.groupby(["group_key", "inference", "metric"], sort=False)["value"]
    frame["seed_mean"] = seeds.transform("mean")
    frame["seed_std"] = seeds.transform(lambda v: v.std(ddof=1))  # NaN for one seed
    frame["seed_n"] = seeds.transform("count").astype(int)
    return frame[INFERENCE_COLUMNS]


def ordered_metrics(names: Iterable[str]) -> list[str]:
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


def aggregate(runs: pd.DataFrame, metrics: Sequence[str], *, reference: str | None = None,
              margin: float = verdicts.MARGIN) -> pd.DataFrame:
    """One row per setting (config minus seed/run_id): seeds as mean, std (ddof=1) and count n; per
    dataset/partition block the paired verdicts against `reference` (None: the method that declares itself
    the reference, `names.reference_method`) within +-`margin` and the ranks (benchmark/report/verdicts.py)."""
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
        if "evaluation_notes" in grp:
            row["evaluation_notes"] = " ".join(sorted({str(n) for n in grp["evaluation_notes"] if n}))
        for metric in metrics:
            values = grp[metric].dropna() if metric in grp else pd.Series(dtype=float)
            row[f"{metric}_mean"] = float(values.mean()) if len(values) else math.nan
            row[f"{metric}_std"] = float(values.std(ddof=1)) if len(values) > 1 else math.nan
            row[f"{metric}_n"] = int(len(values))
            # With a single seed there is no spread; the estimator's own standard error
            # (KID reports one) is the only uncertainty we can show.
            stderr = grp.loc[values.index, f"{metric}__stderr"].dropna() if len(values) == 1 else []
            row[f"{metric}_stderr"] = float(stderr.iloc[0]) if len(stderr) else math.nan
            _interval_columns(row, grp, metric, values)
        for col in ("uplink_mb", "downlink_mb", "wall_seconds", "sim_seconds", "time_to_target", "gamma_star", "w2_mean", "drift", "drift_pixel", "dropped_updates", "uploads", "rounds_done", "epsilon",
                    "plateau_reached", "plateau_gain"):
            if col not in grp:  # time_to_target: only with a --target
                continue
            values = grp[col].dropna()
            row[f"{col}_mean"] = float(values.mean()) if len(values) else math.nan
            row[f"{col}_std"] = float(values.std(ddof=1)) if len(values) > 1 else math.nan
        if "time_to_target" in grp:  # seeds whose curve reached the target (the mean is over those)
            row["time_to_target_reached"] = int(grp["time_to_target"].notna().sum())
        grids = grp["grid"].dropna()
        row["grid"] = grids.iloc[0] if len(grids) else None
        row["grid_seed"] = grp.loc[grids.index[0], "seed"] if len(grids) else None
        rows.append(row)
    table = pd.DataFrame(rows)
    return _rank_and_compress(table, metrics, runs, reference=reference, margin=margin)


def _interval_columns(row: dict[str, Any], grp: pd.DataFrame, metric: str, values: pd.Series) -> None:
    """{metric}_ci_low / _ci_high / _ci_method (and _gmean): across >= 2 seeds, a Student-t interval of
    the mean, taken on the log of a positive metric (`metrics.table.scale`) and mapped back: the interval
    of the geometric mean, never below 0; of any other metric that is >= 0 (`non_negative`: KID, rates,
    precision) the t-interval clipped at 0 (its true value is >= 0, so the clipped interval covers as
    often), and a mean below 0 (KID's unbiased estimate near 0) is said so, never logged; else the one
    run's own interval (`run_interval`); else none (NaN: never a zero-width interval)."""
    low = high = gmean = math.nan
    method = None
    positive = metric_table.scale(metric) == "log" and len(values) and bool((values > 0).all())
    if positive:
        gmean = float(np.exp(np.log(values.to_numpy(dtype=float)).mean()))
    if len(values) >= 2:
        if positive:
            _, interval = t_interval(np.log(values.to_numpy(dtype=float)).tolist())
            low, high = math.exp(interval.low), math.exp(interval.high)  # type: ignore[union-attr]
            method = f"95% t-interval of the geometric mean (on log values) across {len(values)} seeds"
        else:
            mean, interval = t_interval(values.tolist())
            low, high, method = interval.low, interval.high, interval.method  # type: ignore[union-attr]
            if non_negative(metric) and low < 0:
                low, high = 0.0, max(high, 0.0)
                method += f", clipped at 0 ({metric} >= 0)"
            if non_negative(metric) and mean < 0:
                method += "; the mean is below 0: an unbiased estimate of a value >= 0, at 0 within its noise"
    elif len(values) == 1 and f"{metric}__lo" in grp:
        idx = values.index[0]
        low, high, method = float(grp.loc[idx, f"{metric}__lo"]), float(grp.loc[idx, f"{metric}__hi"]), grp.loc[idx, f"{metric}__ci"]
        method = method if isinstance(method, str) and not math.isnan(low) else None
    row[f"{metric}_ci_low"], row[f"{metric}_ci_high"], row[f"{metric}_ci_method"] = low, high, method
    row[f"{metric}_gmean"] = gmean


def better(metric: str, evals: pd.DataFrame | None = None) -> str:
    """"lower" or "higher": the metric table's direction; for a name it does not know (a metric
    computed twice gets its backend appended), what the metric's rows say, else "lower"."""
    known = metric_table.better(metric)
    if known is not None:
        return known
    if evals is not None and not evals.empty and "better" in evals:
        said = evals.loc[evals["metric"] == metric, "better"]
        if (said == "higher").any():
            return "higher"
    return "lower"


def higher_is_better(evals: pd.DataFrame) -> set[str]:
    """Metrics better when higher (precision, recall, density, coverage), by `better`."""
    if evals.empty:
        return set()
    return {m for m in evals["metric"].unique() if better(m, evals) == "higher"}


def is_reference(row: Mapping[str, Any], reference: str, name: str | None = None) -> bool:
    """Whether an aggregated row is a reference setting of its block: its setting label or its page name
    (`names.setting_names`, e.g. "experts (mixing=full)") is `reference`, it is the method of that name
    without hyperparameters, or `reference` is a claims-file spec ("experts?mixing=full") that it matches
    (an untrained baseline never is)."""
    if bool(row.get("baseline")):
        return False
    if "?" in reference and not reference.startswith("?"):  # a claims-file spec: "experts?mixing=full", "fedavg?train.lr=0.003"
        from dfbench.benchmark.report.claims import matches_spec

        return matches_spec(row, reference)
    return (str(row.get("setting")) == reference or (name is not None and name == reference)
            or (str(row.get("method")) == reference and not present(row.get("params"))))


def check_reference(table: pd.DataFrame, reference: str) -> None:
    """ValueError unless `reference` (`--reference`) is a setting of at least one block of `table` (`is_reference`):
    a misspelt one would silently fall back to the reference method everywhere. The message names the
    settings there are, the closest to `reference` first."""
    import difflib

    known: list[str] = []
    for _, block in table.groupby(["dataset", "partition"], sort=False):
        names = setting_names(block)
        for idx in block.index:
            if is_reference(block.loc[idx], reference, names.get(idx)):
                return
            if not bool(block.at[idx, "baseline"]):
                known += [names[idx], str(block.at[idx, "setting"])]
                if not present(block.at[idx, "params"]):
                    known.append(str(block.at[idx, "method"]))
    known = list(dict.fromkeys(known))
    close = difflib.get_close_matches(reference, known, n=len(known), cutoff=0.0)
    order = close + [k for k in known if k not in close]
    hint = f" (did you mean {close[0]!r}?)" if close and difflib.get_close_matches(reference, known, n=1) else ""
    raise ValueError(f"--reference {reference!r} is no setting of these runs{hint}; the settings there are, closest "
                     f"first: {', '.join(repr(k) for k in order) or 'none (only untrained baselines)'} (a method without "
                     f"hyperparameters, a setting's label or page name, or a claims-file spec such as 'fedavg?train.lr=0.003')")


def block_settings(block: pd.DataFrame, runs: pd.DataFrame, metric: str, reference: str,
                   names: Mapping[Any, str] | None = None) -> list[verdicts.Setting]:
    """The block's settings as the verdicts see them: per seed the metric, the run's own interval and
    its pairing records (partition, initial model, evaluation noises). Every untrained baseline is there,
    the reference method's first: a setting's floor is the first that pairs with it (`verdicts.untrained_of`),
    so a block of two widths tests each against its own width's untrained model. A block without a setting
    `reference` names (a study whose blocks hold different methods) is compared with the reference method."""
    out: list[verdicts.Setting] = []
    names = setting_names(block) if names is None else names  # row -> page name (the caller's, when it has them)
    if not any(is_reference(block.loc[i], reference, names.get(i)) for i in block.index):
        reference = reference_method()  # the named reference is not in this block: its blocks meet the plain one
    # the reference method's untrained models first: a setting is tested against the first that pairs with it
    order = sorted(block.index, key=lambda i: not (bool(block.at[i, "baseline"]) and block.at[i, "method"] == reference))
    for idx in order:
        row = block.loc[idx]
        if anchor_role(str(row["method"])):  # an anchor (the exact score) is shown, never tested or a floor
            continue
        ref = is_reference(row, reference, names.get(idx))
        out.append(verdicts.setting_of_runs(runs[runs["group_key"] == row["group_key"]], metric, str(row["group_key"]),
                                            budget=str(row["budget_key"]), baseline=bool(row["baseline"]),
                                            is_reference=ref, primary=ref and names.get(idx) == reference))
    return out


def _block_verdicts(block: pd.DataFrame, runs: pd.DataFrame, metric: str, reference: str, names: Mapping[Any, str],
                    margin: float) -> tuple[dict[str, dict[str, Any]], str]:
    """(group_key -> the verdict columns against the reference on `metric`, the comparison scale used): a positive
    metric by ratios, unless some score is at or below 0 (a foreign row), then by differences."""
    settings = block_settings(block, runs, metric, reference, names)
    scale = metric_table.scale(metric)
    if scale == "log" and not all(v > 0 for s in settings for v in s.values.values()):
        scale = "difference"
    return verdicts.block_verdicts(settings, scale=scale, lower_better=better(metric) != "higher", margin=margin), scale


DECIDED = ("better", "worse", "equivalent")  # a paired verdict that decides a contrast
# what the paired column adds (issue 54, items 1 and 4): the same contrast on each independent check of the ranking
# metric (`metrics.table.independent_checks`), whether they agree, and whether the two settings had the same budget
ACROSS_COLUMNS = ("other_metrics", "metrics_agree", "budget")
#: what the page says of a contrast on a single paired seed (no spread: nothing was tested), wherever it shows one:
#: the main table's paired column and the "Paired verdicts on every metric" table (leaderboard.csv keeps the
#: verdict "inconclusive" beside paired_seeds = 1)
ONE_SEED = "(1 seed: not tested)"


def _lean(metric: str, estimate: float, scale: str) -> str | None:
    """Which way a paired estimate points, decided or not: the setting better or worse than its reference."""
    if not math.isfinite(estimate) or estimate == (1.0 if scale == "log" else 0.0):
        return None
    lower = (estimate < 1.0) if scale == "log" else (estimate < 0.0)
    return "better" if lower == (better(metric) != "higher") else "worse"


def _across_metrics(block: pd.DataFrame, runs: pd.DataFrame, primary: str, primary_scale: str, checks: Sequence[str],
                    found: Mapping[str, Mapping[str, Any]], reference: str, names: Mapping[Any, str],
                    margin: float) -> dict[str, dict[str, str]]:
    """group_key -> `ACROSS_COLUMNS` for each setting with a paired verdict on `primary` (`found`): its contrast with
    the same reference re-decided on every metric of `checks` (Holm over the block per metric, as the primary),
    "agree" when every metric decides it the same way, "metric-dependent" when only some decide it or their
    estimates point different ways, "undecided" when none decides it, "not tested (one seed)" on a single paired
    seed; and the budget of the two settings
    (`budget.compare`), flagged when the reference is barely trained against the block's untrained model
    (`budget.barely_trained`)."""
    per_metric: dict[str, dict[str, Mapping[str, Any]]] = {}
    for m in checks:
        found_m, scale = _block_verdicts(block, runs, m, reference, names, margin)
        per_metric[m] = {k: {**v, "_scale": scale} for k, v in found_m.items()}
    out: dict[str, dict[str, str]] = {}
    # the block's untrained models (never an anchor): a contrast whose reference is barely trained is flagged
    floors = block[block["baseline"].astype(bool) & ~block["method"].astype(str).map(lambda m: bool(anchor_role(m)))]
    untrained = runs[runs["group_key"].isin(floors["group_key"])]
    for key, row in found.items():
        verdict, ref = row.get("verdict"), row.get("reference")
        if verdict not in DECIDED + ("inconclusive", "undecidable") or not ref or ref == key:
            continue
        said, verdicts_seen, leans = [], [verdict], [_lean(primary, float(row.get("estimate", math.nan)), primary_scale)]
        for m in checks:
            other = per_metric[m].get(key)
            if not other or other.get("reference") != ref or other.get("verdict") in (None, "", "reference"):
                said.append(f"{m} not recorded")
                continue
            est, v = float(other.get("estimate", math.nan)), str(other["verdict"])
            ratio = other["_scale"] == "log"
            shown = (f"×{est:.3g}" if ratio else f"{est:+.3g}") if math.isfinite(est) else ""
            word = ("undecidable (no spread)" if v == "undecidable" else
                    ONE_SEED if v == "inconclusive" and not float(other.get("paired_seeds") or 0) > 1 else v)
            said.append(" ".join(x for x in (m, shown, word) if x))
            verdicts_seen.append(v)
            leans.append(_lean(m, est, other["_scale"]))
        if not checks:
            agree = ""
        elif not float(row.get("paired_seeds") or 0) > 1:
            agree = "not tested (one seed)"  # no spread, no test: which way single runs point decides nothing
        elif all(v in DECIDED for v in verdicts_seen) and len(set(verdicts_seen)) == 1 and len(verdicts_seen) > 1:
            agree = "agree"
        elif any(v in DECIDED for v in verdicts_seen) or len({x for x in leans if x is not None}) > 1:
            agree = "metric-dependent"
        else:
            agree = "undecided"
        sides = [runs[runs["group_key"] == k] for k in (key, ref)]
        out[key] = {"other_metrics": "; ".join(said), "metrics_agree": agree,
                    "budget": (budget_rule.compare(sides) + budget_rule.barely_trained(sides[1], untrained, primary)
                               if all(len(s) for s in sides) else "")}
    return out


def _rank_and_compress(table: pd.DataFrame, metrics: Sequence[str], runs: pd.DataFrame | None = None, *,
                       reference: str | None = None, margin: float = verdicts.MARGIN) -> pd.DataFrame:
    """Per dataset/partition block: primary metric, paired verdicts against `reference` (None: the reference
    method), ranks over the seeds the settings share with intervals from the paired contrasts
    (verdicts.block_verdicts) and the uplink ratio vs the
    reference method (`names.reference_method`, FedAvg)."""
    plain = reference_method()
    if reference is not None:
        check_reference(table, reference)
    reference = plain if reference is None else reference
    table = table.copy()
    table["primary_metric"] = None
    for col, default in verdicts.COLUMNS.items():
        table[col] = pd.Series([default] * len(table), index=table.index, dtype=object)
    table["compression_ratio"] = math.nan
    table["compression_ref"] = None
    for col in ACROSS_COLUMNS:
        table[col] = ""
    for _, block in table.groupby(["dataset", "partition"], sort=False):
        present = [m for m in metrics if block[f"{m}_n"].gt(0).any()]
        primary = primary_metric(present)
        table.loc[block.index, "primary_metric"] = primary
        if primary is not None and runs is not None and len(runs):
            # Baselines are references, not contenders: they get no rank (verdicts.block_verdicts).
            names = setting_names(block)  # the reference by its page name: unique in the block, unlike its label
            found, scale = _block_verdicts(block, runs, primary, reference, names, margin)
            setting_of = {str(block.at[i, "group_key"]): names[i] for i in block.index}
            checks = [m for m in metric_table.independent_checks(str(block["dataset"].iloc[0]))
                      if m != primary and m in present]
            across = _across_metrics(block, runs, primary, scale, checks, found, reference, names, margin)
            for idx, row in block.iterrows():
                for col, value in found.get(str(row["group_key"]), {}).items():
                    table.at[idx, col] = setting_of.get(value, value) if col == "reference" else value
                for col, value in across.get(str(row["group_key"]), {}).items():
                    table.at[idx, col] = value
        plain_rows = block[(block["method"] == plain) & ~block["baseline"]]  # the reference method's trained settings
        for idx, row in block.iterrows():
            if row["baseline"] or plain_rows.empty or not row["uplink_mb_mean"] > 0:
                continue
            same = plain_rows[plain_rows["budget_key"] == row["budget_key"]]
            if len(same) and same["uplink_mb_mean"].notna().any():
                table.loc[idx, "compression_ratio"] = float(same["uplink_mb_mean"].mean()) / row["uplink_mb_mean"]
                table.loc[idx, "compression_ref"] = "same budget"
            elif row["uploads_mean"] > 0 and (plain_rows["uploads_mean"] > 0).any():
                # Different budgets: compare bits per client upload instead of totals.
                ref = plain_rows[plain_rows["uploads_mean"] > 0]
                per_upload = float((ref["uplink_mb_mean"] / ref["uploads_mean"]).mean())
                table.loc[idx, "compression_ratio"] = per_upload / (row["uplink_mb_mean"] / row["uploads_mean"])
                table.loc[idx, "compression_ref"] = "per upload"
    for col in ("rank", "rank_low", "rank_high", "rank_seeds", "estimate", "estimate_low", "estimate_high", "p", "p_holm",
                "p_equivalence", "p_equivalence_holm", "margin", "wins", "p_untrained_holm", "collapsed", "collapse_seeds",
                "paired_seeds", "seeds_to_decide"):
        table[col] = pd.to_numeric(table[col], errors="coerce")
    # Best first inside each block; baselines and unscored settings at the bottom.
    order = table.assign(_rank=table["rank"].fillna(np.inf))
    order["_value"] = [_sign(row["primary_metric"]) * row.get(f"{row['primary_metric']}_mean", math.nan)
                       if row["primary_metric"] else math.nan for _, row in order.iterrows()]
    order = order.sort_values(["dataset", "partition", "baseline", "_rank", "_value", "setting"], kind="stable")
    order = order.drop(columns=["_value"])
    return order.drop(columns=["_rank"]).reset_index(drop=True)


def _sign(metric: str) -> float:
    """+1 for a lower-is-better metric, -1 for a higher-is-better one: best first when sorted ascending."""
    return -1.0 if better(metric) == "higher" else 1.0


CURVE_COLUMNS = ["run_id", "dataset", "partition", "setting", "label", "group_key", "seed", "round", "metric", "value",
                 "uplink_mb", "client_images", "sim_seconds", "num_samples"]


def curve_labels(runs: pd.DataFrame) -> dict[str, str]:
    """run_id -> its setting's human name (`names.setting_names`, the one naming function: the method,
    the hyperparameters worth reading and the config keys where it differs from its block's usual
    value), e.g. "fedavg" beside "fedavg (driver=fedbuff, buffer=2)"."""
    return run_names(runs) if len(runs) else {}


def curve_frame(records: Sequence[RunRecord], runs: pd.DataFrame) -> pd.DataFrame:
    """One row per quality-curve point (curve.jsonl, eval.every) of every run that has one; `label`
    names its setting apart from the block's others, `group_key` is the setting (seeds pooled)."""
    rows: list[dict[str, Any]] = []
    with_curve = runs[runs["run_id"].isin({rec.run_id for rec in records if rec.curve})] if len(runs) else runs
    labels = curve_labels(with_curve)
    setting = dict(zip(runs["run_id"], runs["setting"])) if len(runs) else {}
    group = dict(zip(runs["run_id"], runs["group_key"])) if len(runs) else {}
    for rec in records:
        cfg = rec.config
        for p in rec.curve:
            rows.append({"run_id": rec.run_id, "dataset": str(cfg["dataset"]), "partition": str(cfg["partition"]),
                         "setting": setting.get(rec.run_id, str(cfg["method"])),
                         "label": labels.get(rec.run_id, setting.get(rec.run_id, str(cfg["method"]))),
                         "group_key": group.get(rec.run_id, rec.run_id), "seed": cfg.get("seed"),
                         "round": to_float(p.get("round")), "metric": p.get("metric"), "value": to_float(p.get("value")),
                         "uplink_mb": to_float(p.get("uplink_bits")) / 8 / 1e6, "client_images": to_float(p.get("client_images")),
                         "sim_seconds": to_float(p.get("sim_seconds")), "num_samples": to_float(p.get("num_samples"))})
    return pd.DataFrame(rows, columns=CURVE_COLUMNS)


def parse_target(text: str) -> tuple[str, float]:
    """`dfbench report --target fd_fmnist=300` -> ("fd_fmnist", 300.0); ValueError naming the fix."""
    metric, sep, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not sep or not metric or not math.isfinite(number):
        raise ValueError(f"--target {text!r}: write METRIC=VALUE, e.g. fd_fmnist=300 (the quality whose simulated "
                         "time to reach each run's curve reports)")
    return metric.strip(), number


def time_to_target(curves: pd.DataFrame, metric: str, value: float) -> dict[str, float]:
    """run_id -> the simulated seconds of its first curve point at least as good as `value` on
    `metric` (no interpolation between points); runs that never reach it are absent."""
    higher = better(metric) == "higher"
    out: dict[str, float] = {}
    sub = curves[curves["metric"] == metric].sort_values("round")
    for run_id, grp in sub.groupby("run_id", sort=False):
        ok = grp[grp["value"] >= value] if higher else grp[grp["value"] <= value]
        if len(ok):
            out[str(run_id)] = float(ok["sim_seconds"].iloc[0])
    return out


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
    # per run x sampling rule x metric, the result's rule and the others (`inference_frame`); never ranked
    inference: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=INFERENCE_COLUMNS))
    curves: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=CURVE_COLUMNS))  # `curve_frame`
    target: tuple[str, float] | None = None  # --target: the quality whose time to reach the table reports


def collect(runs_dir: str | Path, target: tuple[str, float] | None = None, *, reference: str | None = None,
            margin: float = verdicts.MARGIN) -> ReportData:
    """Read all runs under ``runs_dir`` and build the per-run and per-setting tables.

    `target` (metric, value): each run's simulated time to first reach that quality on its
    curve (`time_to_target`), averaged over the seeds that reach it (and how many do).
    `reference`, `margin`: what every setting is compared with, seed-paired (None: the reference method,
    `names.reference_method`), and the equivalence margin (a fraction of the reference's score; verdicts.py)."""
    records, failures = load_runs(runs_dir)
    runs, evals, rounds = runs_frame(records)
    curves = curve_frame(records, runs)
    if target is not None and len(runs):
        runs["time_to_target"] = runs["run_id"].map(time_to_target(curves, *target)).astype(float)
    metrics = ordered_metrics(evals["metric"].unique()) if len(evals) else []
    table = aggregate(runs, metrics, reference=reference, margin=margin)
    warnings = [f"{rec.run_id}: {w}" for rec in records for w in rec.warnings]
    hardware = sorted({str(rec.metrics["environment"].get("hardware")) for rec in records
                       if isinstance(rec.metrics.get("environment"), dict)})
    return ReportData(runs=runs, evaluations=evals, rounds=rounds, table=table, metrics=metrics,
                      failures=failures, warnings=warnings, hardware=hardware, inference=inference_frame(records, runs),
                      curves=curves, target=target)
