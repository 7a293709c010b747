"""Reading run folders into run records: one ``RunRecord`` per finished run, one ``RunFailure`` per anything else.

(Beside core/runfolder.py: that module is the run-folder *format*, its file names and status, written
by the engine; this one is the reporter's *reader*.)

The reporter only reads run folders (``config.json``, ``status.json``,
``metrics.json`` with ``rescored.json`` and ``drift.json`` beside it, ``rounds.jsonl``, ``grid.png``:
the names of core/runfolder.py); it never trains, computes a metric or writes into a run folder. Every run found under a root becomes either
a record or a failure with a reason, so nothing is dropped silently. Also the
small value helpers the tables share.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dfbench.benchmark.core import runfolder

logger = logging.getLogger(__name__)

_FINISHED_BAD_STATES = {runfolder.FAILED, runfolder.DIVERGED}
# stopped before the end, resumable: "running" while a live owner holds the lock, else "unfinished"
_UNFINISHED_STATES = (runfolder.RUNNING, runfolder.INTERRUPTED)  # interrupted: stopped by SIGTERM


@dataclass
class RunRecord:
    """A finished ("done") run, parsed."""

    path: Path
    config: dict[str, Any]
    metrics: dict[str, Any]
    rounds: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    curve: list[dict[str, Any]] = field(default_factory=list)  # curve.jsonl (eval.every), read by the same rule

    @property
    def run_id(self) -> str:
        return str(self.config.get("run_id") or self.path.name)

    @property
    def grid(self) -> Path | None:
        grid = self.path / runfolder.GRID
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
    """Every run folder at or under ``root``, sorted (`runfolder.iter_runs`: the one walk)."""
    return [run.path for run in runfolder.iter_runs(root)]


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
        for name, value in flatten_config(values).items():
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
        config = normalize_config(_read_json_dict(path / runfolder.CONFIG))
        missing = [k for k in ("dataset", "partition", "method") if k not in config]
        if missing:
            raise _Unreadable(f"{runfolder.CONFIG} lacks {', '.join(missing)}")
        status_path = path / runfolder.STATUS
        if not status_path.is_file():
            return failure("unfinished", f"no {runfolder.STATUS} (run never started or was killed early)")
        status = _read_json_dict(status_path)
        state = str(status.get("state", "")).lower()
        if state in _FINISHED_BAD_STATES:
            return failure(state, _status_reason(status))
        # the one reading rule of rounds.jsonl: a damaged line is skipped and named (a read warning)
        rounds, warnings = runfolder.read_rounds_checked(path)
        if state in _UNFINISHED_STATES:
            total = config.get("rounds", "?")
            done = max((int(r.get("round", 0)) for r in rounds if isinstance(r.get("round"), int)), default=0)
            return failure(*_running_or_unfinished(path, f"reached round {done} of {total}"))
        if state != runfolder.DONE:
            return failure("unfinished", f"unknown state {status.get('state')!r} in {runfolder.STATUS}")
        metrics_path = path / runfolder.METRICS
        if not metrics_path.is_file():
            return failure("unreadable", f"status is done but {runfolder.METRICS} is missing")
        metrics = _read_json_dict(metrics_path)
        evaluations = metrics.get("evaluations", [])
        if not isinstance(evaluations, list):
            raise _Unreadable(f"{runfolder.METRICS}: 'evaluations' is not a list")
        if (path / runfolder.RESCORED).is_file():  # rows `dfbench eval` added later: read beside the run's own
            rescored = _read_json_dict(path / runfolder.RESCORED)
            added = rescored.get("evaluations", [])
            if not isinstance(added, list):
                raise _Unreadable(f"{runfolder.RESCORED}: 'evaluations' is not a list")
            have = {(r.get("metric"), r.get("inference")) for r in evaluations}
            extra = [{**r, "rescored": True} for r in added if (r.get("metric"), r.get("inference")) not in have]
            metrics = {**metrics, "evaluations": [*evaluations, *extra]}
            if "pairing" not in metrics and isinstance(rescored.get("pairing"), dict):  # rebuilt by `dfbench eval`
                metrics["pairing"] = rescored["pairing"]
        if not isinstance(metrics.get("drift"), dict) and (path / runfolder.DRIFT).is_file():
            # drift recorded after the evaluation (its dense reference finished later): read beside the run's own
            try:
                metrics = {**metrics, "drift": _read_json_dict(path / runfolder.DRIFT)}
            except _Unreadable as exc:
                warnings.append(f"drift not shown: {exc}")
    except _Unreadable as exc:
        return failure("unreadable", f"failed to read: {exc}")
    curve, curve_warnings = runfolder.read_rounds_checked(path, runfolder.CURVE)
    return RunRecord(path=path, config=config, metrics=metrics, rounds=rounds, warnings=warnings + curve_warnings, curve=curve)


def _running_or_unfinished(path: Path, progress: str) -> tuple[str, str]:
    """A "running" (or "interrupted") status is "running" only while a live process holds the run's
    lock (benchmark/core/lock.py), else "unfinished" (killed, preempted or stopped by a signal)."""
    from dfbench.benchmark.core.lock import read_lock

    owner = read_lock(path)
    stale = owner.stale_reason() if owner is not None else "no lock"
    if owner is not None and stale is None:
        return "running", f"running on {owner.host} (pid {owner.pid}) since {owner.since}: {progress}"
    return "unfinished", f"unfinished, not running ({stale}: killed or preempted): {progress}; a rerun resumes it"


class DuplicateRuns(ValueError):
    """One run id in several run folders whose results differ: the reporter cannot tell which one to report."""


def load_runs(root: str | Path) -> tuple[list[RunRecord], list[RunFailure]]:
    """Read every run folder under ``root``; return (done runs, everything else).

    A run id in several folders (trees copied from two machines into one): copies with identical results are
    one run, the first by path order is kept and the others are named in its warnings; a copy that did not
    finish beside one that did is left out the same way. Finished copies whose results differ raise
    `DuplicateRuns`, naming the folders, since no rule can say which of them is the run: keep one of them."""
    done: list[RunRecord] = []
    failures: list[RunFailure] = []
    for run_dir in find_run_dirs(root):
        result = read_run(run_dir)
        if isinstance(result, RunRecord):
            done.append(result)
        else:
            failures.append(result)
    done, failures = _one_copy_per_run(done, failures)
    for result in failures:
        logger.info("run %s not in leaderboard: %s (%s)", result.run_id, result.state, result.reason)
    return done, failures


def _result_of(record: RunRecord) -> Any:
    """What two copies of one run (one run id: one config, up to paths and the device index) must share to be the
    same run: its scores and its rounds, measured wall-clock times and the machine that ran it aside."""
    metrics = {k: v for k, v in record.metrics.items() if k != "environment" and not k.endswith("wall_seconds")}
    return (json.dumps(metrics, sort_keys=True, default=str),
            [runfolder.without_wall_clock(r) for r in record.rounds])


def _one_copy_per_run(done: list[RunRecord], failures: list[RunFailure]) -> tuple[list[RunRecord], list[RunFailure]]:
    """`load_runs`' rule for a run id found in several folders (see there); the lists keep path order."""
    copies: dict[str, list[RunRecord]] = {}
    for rec in done:
        copies.setdefault(rec.run_id, []).append(rec)
    differing = {rid: recs for rid, recs in copies.items()
                 if len(recs) > 1 and any(_result_of(r) != _result_of(recs[0]) for r in recs[1:])}
    if differing:
        said = "; ".join(f"{rid} in {', '.join(str(r.path) for r in recs)}" for rid, recs in differing.items())
        raise DuplicateRuns(
            f"{len(differing)} run id(s) are in several run folders with different results (copied from different "
            f"machines?): {said}. A run id names one run: keep one folder of each (move the others out of the runs "
            f"tree), then report again; nothing was written")
    kept: list[RunRecord] = []
    for rec in done:
        first = copies[rec.run_id][0]
        if rec is first:
            kept.append(rec)
            continue
        note = f"{rec.path} is a second copy of run {rec.run_id} (identical results): the first, {first.path}, is reported"
        first.warnings.append(note)
        logger.warning("report: %s", note)
    left: list[RunFailure] = []
    failed_copies: dict[str, list[RunFailure]] = {}
    for fail in failures:
        if fail.run_id in copies:  # the same run finished in another folder: that one is the run
            note = (f"{fail.path} is another copy of run {fail.run_id} ({fail.state}), which finished in "
                    f"{copies[fail.run_id][0].path}: the finished one is reported")
            copies[fail.run_id][0].warnings.append(note)
            logger.warning("report: %s", note)
            continue
        failed_copies.setdefault(fail.run_id, []).append(fail)
        left.append(fail)
    for rid, fails in failed_copies.items():
        if len(fails) > 1:
            logger.warning("report: run %s is in %d unfinished folders: %s", rid, len(fails), ", ".join(str(f.path) for f in fails))
    return kept, left


# ---------------------------------------------------------------------------
# Values as table cells
# ---------------------------------------------------------------------------


def to_float(value: Any) -> float:
    """Numbers as float (numpy's too), anything else (None, pandas' NA, strings, bools) as NaN."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        return math.nan
    return float(value)


def cell_value(value: Any) -> Any:
    """A value that fits in one table cell: lists/dicts become compact JSON."""
    if isinstance(value, (list, dict)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return value


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config dicts as dotted keys (``eval.num_samples``)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, prefix=f"{name}."))
        else:
            flat[name] = cell_value(value)
    return flat


def format_params(params: Mapping[str, Any]) -> str:
    """Method hyperparameters as one readable string: ``keep_ratio=0.5, scope=layer``."""
    if not params:
        return ""
    return ", ".join(f"{k}={cell_value(v)}" for k, v in sorted(params.items()))


def parse_alpha(partition: str) -> float:
    """Dirichlet concentration from a partition spec ``dirichlet:A`` or Flower Datasets' ``flwr:dirichlet?...alpha=A...``;
    NaN for other partitions."""
    spec = str(partition).strip()
    match = re.fullmatch(r"dirichlet:([0-9.eE+-]+)", spec) or re.fullmatch(r"flwr:dirichlet\?(?:.*&)?alpha=([0-9.eE+-]+)(?:&.*)?", spec)
    if not match:
        return math.nan
    try:
        return float(match.group(1))
    except ValueError:
        return math.nan
