"""MLflow: a local sqlite store under <out>/trackers/ unless MLFLOW_TRACKING_URI names another.

Store: $MLFLOW_TRACKING_URI, else sqlite:///<out>/trackers/mlflow.db with artifacts in
<out>/trackers/mlflow-artifacts/ (`mlflow ui --backend-store-uri sqlite:///<out>/trackers/mlflow.db`).
Experiment: the group (the grid's name; a plain run: --log-group or "dfbench-run"). Run name: the
setting and the run id; tags dfbench.run_id, dfbench.run_dir, dfbench.group and, at the end,
dfbench.state; params: config.json flattened (train.lr, method_params.mu, ...); metrics:
round/<field> and curve/<metric> at step = round, final/<metric> (with _ci_low / _ci_high) at the
last round; artifact: the sample grid (samples/grid.png). Status: FINISHED (done), FAILED (failed,
diverged), KILLED (interrupted, or stopped with Ctrl-C).

Resume: the run with tag dfbench.run_dir = this run folder in the experiment is continued (set
RUNNING again), not a second one started. MLflow keeps every value logged, so the rounds a resumed
process redoes (those after its checkpoint) are in the metric history twice at the same step, with
equal values (resume is bitwise; only round/wall_seconds differs).

Several processes (grid workers) share the sqlite file: creating the store and the experiment is
serialised by a lock file beside it. sqlite wants a local disk; on a cluster's shared filesystem
point MLFLOW_TRACKING_URI at an MLflow server instead.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

from dfbench.benchmark.tracking.base import RunInfo, curve_scalars, final_scalars, hyperparameters, round_scalars

DB = "mlflow.db"
ARTIFACTS = "mlflow-artifacts"
STATUS = {"done": "FINISHED", "failed": "FAILED", "diverged": "FAILED"}  # else KILLED (interrupted, running)
BATCH = 100  # MLflow's limit on params and tags per log_batch (1000 for metrics)
MAX_PARAM = 500  # characters of a param value kept (older servers' limit)


def local_uri(tracker_dir: Path) -> str:
    """The default store: sqlite:///<out>/trackers/mlflow.db (absolute)."""
    return f"sqlite:///{(tracker_dir / DB).absolute()}"


@contextmanager
def _store_lock(directory: Path) -> Iterator[None]:
    """An exclusive lock on <out>/trackers/mlflow.db.lock while the store and the experiment are made
    (two grid workers creating the tables or the experiment at once would collide), with MLflow's
    notes on creating the tables kept quiet."""
    directory.mkdir(parents=True, exist_ok=True)
    quiet = logging.getLogger("mlflow.store.db.utils")
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        import fcntl
    except ImportError:  # (no flock on this system: one process at a time is then the user's business)
        fcntl = None  # type: ignore[assignment]
    try:
        with open(directory / f"{DB}.lock", "a") as f:
            if fcntl is not None:
                fcntl.flock(f, fcntl.LOCK_EX)
            yield  # (closing the file releases the lock)
    finally:
        quiet.setLevel(level)


class Tracker:
    def __init__(self) -> None:
        self.client: Any = None
        self.run_id: str | None = None

    def start(self, info: RunInfo, config: Mapping[str, Any], start_step: int) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.info = info
        user_uri = os.environ.get("MLFLOW_TRACKING_URI")
        with (_store_lock(info.tracker_dir) if not user_uri else _no_lock()):
            self.client = MlflowClient(tracking_uri=user_uri or local_uri(info.tracker_dir))
            artifacts = None if user_uri else (info.tracker_dir / ARTIFACTS).absolute().as_uri()  # not ./mlruns
            experiment_id = self._experiment(info.group, artifacts)
        tags = {"dfbench.run_id": info.run_id, "dfbench.run_dir": str(info.run_dir), "dfbench.group": info.group}
        found = self.client.search_runs([experiment_id], filter_string=f"tags.`dfbench.run_id` = '{info.run_id}'",
                                        max_results=1000)
        mine = [r for r in found if r.data.tags.get("dfbench.run_dir") == str(info.run_dir)]
        if mine:  # a resumed (or started over) run continues its MLflow run
            self.run_id = mine[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            return
        self.run_id = self.client.create_run(experiment_id, run_name=info.name, tags=tags).info.run_id
        params = [Param(k, str(v)[:MAX_PARAM]) for k, v in hyperparameters(config).items()]
        for i in range(0, len(params), BATCH):
            self.client.log_batch(self.run_id, params=params[i:i + BATCH], synchronous=True)

    def _experiment(self, name: str, artifact_location: str | None) -> str:
        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            return self.client.create_experiment(name, artifact_location=artifact_location)
        if exp.lifecycle_stage == "deleted":  # deleted in the UI: its name is still taken; bring it back
            self.client.restore_experiment(exp.experiment_id)
        return exp.experiment_id

    def _metrics(self, scalars: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in scalars.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000], synchronous=True)

    def log_round(self, step: int, row: Mapping[str, Any]) -> None:
        self._metrics(round_scalars(row), step)

    def log_curve(self, step: int, point: Mapping[str, Any]) -> None:
        self._metrics(curve_scalars(point), step)

    def log_final(self, metrics: Mapping[str, Any], grid: Path | None) -> None:
        self._metrics(final_scalars(metrics), self.info.rounds)
        if grid is not None:
            self.client.log_artifact(self.run_id, str(grid), "samples")

    def finish(self, state: str) -> None:
        if self.client is None or self.run_id is None:
            return
        run_id, self.run_id = self.run_id, None
        self.client.set_tag(run_id, "dfbench.state", state)
        self.client.set_terminated(run_id, STATUS.get(state, "KILLED"))


@contextmanager
def _no_lock() -> Iterator[None]:
    yield
