"""The tracker protocol, the fan-out `Trackers` that guards every call, and what a run logs.

`Trackers` is what the life cycle (benchmark/engine/lifecycle.py) calls, on rank 0 only:

    start(start_step)   after config.json is written; reads config.json
    log_round(r, row)   after rounds.jsonl got round r's row
    log_curve(r, point) after curve.jsonl got the quality-curve point of round r
    log_final()         after evaluation; reads metrics.json and grid.png
    finish(state)       on every way out, with the state status.json says

Every call to a tracker is guarded: a tracker that cannot be imported, cannot start or raises later
is named in ONE `logging` warning (with the fix) and is off for the rest of the run. Nothing a
tracker does reaches the run: it reads the run folder's files after they are written, writes only
under <out>/trackers/, and its errors never leave `Trackers`.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Protocol

from dfbench.benchmark.core import runfolder
from dfbench.benchmark.core.parsing import ConfigError

log = logging.getLogger("dfbench.tracking")

TRACKER_DIR = "trackers"  # under the runs root (--out): never inside a run folder
DEFAULT_GROUP = "dfbench-run"  # the group of a plain `dfbench run` (a grid's is its name)


@dataclass(frozen=True)
class TrackerSpec:
    module: str  # the module holding `Tracker`, imported only when the tracker is used
    extra: str  # pip install 'dfbench[<extra>]'
    hint: str  # what to check when it fails after it was imported


TRACKERS: dict[str, TrackerSpec] = {
    "tensorboard": TrackerSpec("dfbench.benchmark.tracking.tensorboard_log", "tensorboard",
                               "check that <out>/trackers/tensorboard is writable"),
    "wandb": TrackerSpec("dfbench.benchmark.tracking.wandb_log", "wandb",
                         "W&B runs offline unless WANDB_MODE is set (online needs `wandb login`); check WANDB_MODE "
                         "and WANDB_PROJECT"),
    "mlflow": TrackerSpec("dfbench.benchmark.tracking.mlflow_log", "mlflow",
                          "check MLFLOW_TRACKING_URI (unset: the sqlite store <out>/trackers/mlflow.db)"),
}


def parse_trackers(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """Tracker names from `--log` values or the API's `log=`: a string or strings, each a name or
    comma-separated names; duplicates dropped, order kept. An unknown name raises ConfigError naming
    the valid ones (before any work: the CLI, the API and `lifecycle.run` call this first)."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else list(value)
    names: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"invalid tracker {item!r} for --log / log=; valid: {', '.join(TRACKERS)}")
        for name in (part.strip().lower() for part in item.split(",")):
            if not name:
                continue
            if name not in TRACKERS:
                raise ConfigError(f"unknown tracker {name!r} for --log / log=; valid: {', '.join(TRACKERS)} "
                                  "(several: repeat the flag or separate them with commas)")
            if name not in names:
                names.append(name)
    return tuple(names)


@dataclass(frozen=True)
class RunInfo:
    """What a tracker needs to know about the run it logs."""

    run_id: str
    run_dir: Path  # absolute
    out: Path  # the runs root (--out), absolute; trackers write under out / TRACKER_DIR
    rel: str  # the run folder relative to out (dataset/partition/method/run-id)
    group: str  # the grid's name, or --log-group, or DEFAULT_GROUP
    name: str  # readable: the setting and the run id
    rounds: int  # train.rounds: the step of the final metrics and the sample grid

    @property
    def tracker_dir(self) -> Path:
        return self.out / TRACKER_DIR


class Tracker(Protocol):
    """One experiment tracker. Steps are rounds (0 = the untrained model's curve point)."""

    def start(self, info: RunInfo, config: Mapping[str, Any], start_step: int) -> None:
        """Open (or continue) this run's tracker run. `start_step`: the first step this process
        logs; an earlier process of the run may have logged it and later ones (they are redone)."""

    def log_round(self, step: int, row: Mapping[str, Any]) -> None:
        """rounds.jsonl's row of round `step`."""

    def log_curve(self, step: int, point: Mapping[str, Any]) -> None:
        """curve.jsonl's point of round `step`."""

    def log_final(self, metrics: Mapping[str, Any], grid: Path | None) -> None:
        """metrics.json and the sample grid (None when the run folder has none)."""

    def finish(self, state: str) -> None:
        """Close; `state` is the run's (done, diverged, failed, interrupted, running)."""


# -- what is logged: the run folder's rows as scalars -------------------------------------------

def number(value: Any) -> float | None:
    """A JSON value as a scalar (booleans as 0/1), or None for what is not a number."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return None


def round_scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """A rounds.jsonl row -> {"round/<field>": value} for its numeric fields (lists, text and None left out)."""
    return {f"round/{k}": v for k, v in ((k, number(x)) for k, x in row.items() if k != "round") if v is not None}


def curve_scalars(point: Mapping[str, Any]) -> dict[str, float]:
    """A curve.jsonl point -> "curve/<metric>", "curve/<metric>_ci_low|_ci_high" and its other
    numeric fields ("curve/uplink_bits": cumulative at that round, "curve/sim_seconds", ...)."""
    metric = str(point.get("metric", "quality"))
    out: dict[str, float] = {}
    for k, x in point.items():
        v = number(x)
        if v is None or k in ("round", "metric"):
            continue
        key = metric if k == "value" else f"{metric}_{k}" if k in ("ci_low", "ci_high") else k
        out[f"curve/{key}"] = v
    return out


def final_scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """metrics.json -> "final/<metric>" with "final/<metric>_ci_low", "_ci_high" (and "_std_err") for
    every evaluation row (a sampling variant that is not the configured one: "final/<metric>/<label>"),
    and "final/<key>" for its other numbers (uplink_bits, wall_seconds, drift.pixel, privacy.epsilon, ...)."""
    out: dict[str, float] = {}
    for row in metrics.get("evaluations") or []:
        if not isinstance(row, Mapping) or not isinstance(row.get("metric"), str):
            continue
        base = f"final/{row['metric']}"
        if row.get("configured") is False and row.get("inference"):
            base += f"/{row['inference']}"
        if base in out:  # one row per metric (and variant); a repeated one keeps the first
            continue
        for field, suffix in (("value", ""), ("ci_low", "_ci_low"), ("ci_high", "_ci_high"), ("std_err", "_std_err")):
            if (v := number(row.get(field))) is not None:
                out[base + suffix] = v
    for key, v in flatten({k: x for k, x in metrics.items() if k not in ("evaluations", "environment")}).items():
        if (x := number(v)) is not None:
            out.setdefault(f"final/{key}", x)
    return out


def flatten(obj: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts -> dotted keys ({"train": {"lr": 1e-3}} -> {"train.lr": 1e-3}); other values kept."""
    out: dict[str, Any] = {}
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def hyperparameters(config: Mapping[str, Any]) -> dict[str, str | int | float | bool]:
    """config.json flattened to dotted keys with scalar values (lists, None and empty dicts as JSON text)."""
    return {k: v if isinstance(v, (str, int, float, bool)) else json.dumps(v, sort_keys=True, default=str)
            for k, v in flatten(config).items()}


def setting_name(config: Mapping[str, Any]) -> str:
    """dataset/partition/method?params run-id: a run's readable name in a tracker."""
    data = config.get("data") or {}
    params = config.get("method_params") or {}
    method = str(config.get("method", "?"))
    if params:
        method += "?" + "&".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in sorted(params.items()))
    return f"{data.get('dataset', '?')}/{data.get('partition', '?')}/{method} {config.get('run_id', '')}".strip()


def stable_id(info: RunInfo, limit: int = 64) -> str:
    """An id derived from the run id and the run folder ([A-Za-z0-9_-], at most `limit` characters):
    the same run folder gets the same tracker run in every process that works on it."""
    digest = hashlib.sha256(str(info.run_dir).encode()).hexdigest()[:12]
    text = re.sub(r"[^A-Za-z0-9_-]", "-", f"{info.run_id}-{digest}")
    return text[-limit:]


# -- the fan-out ---------------------------------------------------------------------------------

_import_warned: set[str] = set()  # a tracker that is not installed is said once per process, not per grid cell


class Trackers:
    """The trackers of one run (none: every call is a no-op). No call raises, none changes the run."""

    def __init__(self, names: Iterable[str] = (), out: str | Path = ".", run_dir: str | Path = ".",
                 group: str | None = None) -> None:
        self.names = parse_trackers(tuple(names))
        self.out = Path(out).absolute()
        self.run_dir = Path(run_dir).absolute()
        self.group = group or DEFAULT_GROUP
        self.active: list[tuple[str, Tracker]] = []
        self.info: RunInfo | None = None

    def __bool__(self) -> bool:
        return bool(self.names)

    def start(self, start_step: int) -> None:
        if not self.names:
            return
        try:
            config = runfolder.read_json(self.run_dir / runfolder.CONFIG)
        except (OSError, ValueError) as err:
            log.warning("dfbench: experiment trackers (%s) are off for this run: %s is unreadable (%s); the run "
                        "goes on, its results do not depend on them", ", ".join(self.names), runfolder.CONFIG, err)
            return
        try:
            rel = self.run_dir.relative_to(self.out).as_posix()
        except ValueError:
            rel = self.run_dir.name
        self.info = RunInfo(run_id=str(config.get("run_id", self.run_dir.name)), run_dir=self.run_dir, out=self.out,
                            rel=rel, group=self.group, name=setting_name(config),
                            rounds=int((config.get("train") or {}).get("rounds", 0)))
        for name in self.names:
            tracker = self._make(name)
            if tracker is None:
                continue
            if self._guard(name, tracker, "start", tracker.start, self.info, config, start_step):
                self.active.append((name, tracker))

    def log_round(self, step: int, row: Mapping[str, Any]) -> None:
        self._each("log_round", step, row)

    def log_curve(self, step: int, point: Mapping[str, Any]) -> None:
        self._each("log_curve", step, point)

    def log_final(self) -> None:
        if not self.active:
            return
        try:
            metrics = runfolder.read_json(self.run_dir / runfolder.METRICS)
        except (OSError, ValueError):
            metrics = {}
        grid = self.run_dir / runfolder.GRID
        self._each("log_final", metrics, grid if grid.is_file() else None)

    def finish(self, state: str | None = None) -> None:
        """Close every tracker; `state` defaults to what status.json says (running if it says nothing)."""
        if not self.active:
            return
        if state is None:
            try:
                state = (runfolder.read_status(self.run_dir) or {}).get("state") or runfolder.RUNNING
            except (OSError, ValueError):
                state = runfolder.RUNNING
        active, self.active = self.active, []
        for name, tracker in active:
            self._guard(name, tracker, "finish", tracker.finish, state, close=False)

    # -- guards --

    def _make(self, name: str) -> Tracker | None:
        spec = TRACKERS[name]
        try:
            return importlib.import_module(spec.module).Tracker()
        except ImportError as err:
            self._missing(name, err)
        except Exception as err:  # noqa: BLE001 - a broken install must not stop the run
            self._failed(name, "import", err)
        return None

    def _each(self, what: str, *args: Any) -> None:
        for name, tracker in list(self.active):
            if not self._guard(name, tracker, what, getattr(tracker, what), *args):
                self.active = [(n, t) for n, t in self.active if t is not tracker]

    def _guard(self, name: str, tracker: Tracker, what: str, fn: Any, *args: Any, close: bool = True) -> bool:
        try:
            fn(*args)
            return True
        except ImportError as err:  # the library is imported in start
            self._missing(name, err)
        except Exception as err:  # noqa: BLE001 - a tracker never fails the run
            self._failed(name, what, err)
        if close:  # best effort: let go of its files and processes; a second error is not said
            try:
                tracker.finish(runfolder.FAILED)
            except Exception:  # noqa: BLE001
                pass
        return False

    def _missing(self, name: str, err: BaseException) -> None:
        if name in _import_warned:
            return
        _import_warned.add(name)
        log.warning("dfbench: experiment tracker %r is off: it could not be imported (%s); install it with "
                    "pip install 'dfbench[%s]'. The run goes on; its results do not depend on it",
                    name, err, TRACKERS[name].extra)

    def _failed(self, name: str, what: str, err: BaseException) -> None:
        said = str(err).strip().splitlines()[0] if str(err).strip() else ""
        where = f" for {self.run_dir}" if self.info is None else f" for {self.info.rel}"
        log.warning("dfbench: experiment tracker %r failed in %s%s (%s%s) and is off for the rest of this run; %s. "
                    "The run goes on; its results do not depend on it",
                    name, what, where, type(err).__name__, f": {said}" if said else "", TRACKERS[name].hint)
