"""Weights & Biases: offline by default, under <out>/trackers/wandb/; no account needed.

Mode: $WANDB_MODE when the user set it (online, offline, disabled), else offline; project: $WANDB_PROJECT
or "dfbench"; group: the grid's name (a plain run: --log-group or "dfbench-run"); name: the setting
and the run id; id: derived from the run id and the run folder (`base.stable_id`), so every process
that works on a run folder writes to the same W&B run (resume="allow"). History: one row per call,
each with its round ("round", the x axis: `define_metric`): round/<field> (a rounds.jsonl row),
curve/<metric> (a curve point), samples/grid (the sample grid, at the last round); summary:
final/<metric> with _ci_low / _ci_high; config: config.json (+ run_dir); tags: the run id.
Console capture, system metrics, git and code saving are off. (Rows are not logged at an explicit
`step`: W&B holds a step's row open until a later step arrives, so a killed process would lose its
last round, and a resumed online run would drop the redone rounds as steps gone back.)

The .wandb file is written every FLUSH_SECONDS by W&B's service process: a process killed hard
(SIGKILL) loses at most what it logged in its last second (with W&B's default, 15 s).

Resume: offline, every process writes its own offline-run-<time>-<id> folder under the same run id
(W&B does not continue an offline run in place): the killed process's holds the rounds up to the
kill, the resumed one's the rounds from the checkpoint on (the redone ones again) and the end.
`wandb sync <out>/trackers/wandb/offline-run-*` uploads both to that one run id; the redone rounds
are then in its history twice (same round, equal values but wall time). That the server merges the
two folders into one run is W&B's documented resume behaviour and is not tested here (no account
or network in the tests). Online, resume="allow" continues the run on the server.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from dfbench.benchmark.tracking.base import RunInfo, curve_scalars, final_scalars, round_scalars, stable_id

PROJECT = "dfbench"
STEP = "round"  # every history row carries its round, the x axis of round/*, curve/* and samples/*
FLUSH_SECONDS = 1.0  # the .wandb file is written this often (W&B's default: 15 s, all lost to a SIGKILL before it)


class Tracker:
    def __init__(self) -> None:
        self.run: Any = None

    def start(self, info: RunInfo, config: Mapping[str, Any], start_step: int) -> None:
        import wandb

        self.info = info
        info.tracker_dir.mkdir(parents=True, exist_ok=True)
        wanted = {"silent": True, "console": "off", "x_disable_stats": True, "disable_git": True, "save_code": False,
                  "disable_job_creation": True, "x_transaction_log_flush_interval": FLUSH_SECONDS}
        known = getattr(wandb.Settings, "model_fields", wanted)  # (a setting this wandb lacks is left out)
        settings = wandb.Settings(**{k: v for k, v in wanted.items() if k in known})
        self.run = wandb.init(
            dir=str(info.tracker_dir), mode=os.environ.get("WANDB_MODE") or "offline",
            project=os.environ.get("WANDB_PROJECT") or PROJECT, group=info.group, name=info.name, id=stable_id(info),
            resume="allow", config={**dict(config), "run_dir": str(info.run_dir)}, tags=[info.run_id],
            notes=f"dfbench run folder {info.run_dir}", settings=settings,
            reinit="create_new",  # never finishes a run the caller has open (a notebook's own W&B run)
        )
        self.run.define_metric(STEP)
        for prefix in ("round/*", "curve/*", "samples/*"):
            self.run.define_metric(prefix, step_metric=STEP)

    def log_round(self, step: int, row: Mapping[str, Any]) -> None:
        self.run.log({STEP: step, **round_scalars(row)})

    def log_curve(self, step: int, point: Mapping[str, Any]) -> None:
        self.run.log({STEP: step, **curve_scalars(point)})

    def log_final(self, metrics: Mapping[str, Any], grid: Path | None) -> None:
        self.run.summary.update(final_scalars(metrics))
        if grid is not None:
            import wandb

            self.run.log({STEP: self.info.rounds, "samples/grid": wandb.Image(str(grid), caption=self.info.name)})

    def finish(self, state: str) -> None:
        if self.run is None:
            return
        run, self.run = self.run, None
        run.summary["dfbench/state"] = state
        run.finish(exit_code=0 if state in ("done", "diverged") else 1)
