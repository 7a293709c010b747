"""TensorBoard: one log folder per run under <out>/trackers/tensorboard/, named like the run folder.

`tensorboard --logdir <out>/trackers/tensorboard` then shows every run under that root (a grid:
its cells side by side, named dataset/partition/method/run-id). Scalars are written as doubles
(so bit counts stay exact): round/<field> and curve/<metric> at their round, final/<metric> (with
_ci_low / _ci_high) and the sample grid (image samples/grid) at the last round; the config as text
and in the HPARAMS tab.

Resume: the same log folder with `purge_step` = the first step this process logs. The writer marks
its start with a SessionLog.START event at that step, and TensorBoard, reading the folder's event
files in order, drops the events an earlier (killed) process wrote at that step or later: the
rounds that are redone appear once. A fresh start marks step 0 (a run started over with --force,
or killed before its first checkpoint, starts clean; and TensorBoard ignores a folder's first START,
so the first process must write one for a resume's to count). Events are flushed after every call,
so a kill loses nothing that was logged. (Scalars are tensor summaries, which `tensorboard` and its
plugin_event_accumulator purge; the legacy event_accumulator.EventAccumulator purges only
simple-value scalars, so a reader built on it would still see both copies of a redone round.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from dfbench.benchmark.tracking.base import (RunInfo, curve_scalars, final_scalars, hyperparameters, round_scalars)

SUBDIR = "tensorboard"


def log_dir(info: RunInfo) -> Path:
    return info.tracker_dir / SUBDIR / info.rel


class Tracker:
    def __init__(self) -> None:
        self.writer: Any = None

    def start(self, info: RunInfo, config: Mapping[str, Any], start_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.info = info
        self.writer = SummaryWriter(log_dir=str(log_dir(info)), purge_step=start_step)
        if start_step == 0:  # a resumed run has these already (steps before the purge are kept)
            from torch.utils.tensorboard.summary import hparams

            experiment, session_start, _ = hparams(hyperparameters(config), {})  # (the end's status would say success)
            for summary in (experiment, session_start):  # the HPARAMS tab: this run's config beside its group's
                self.writer._get_file_writer().add_summary(summary, 0)
            text = json.dumps(dict(config), indent=2, sort_keys=True)
            self.writer.add_text("config", f"```json\n{text}\n```", 0)
            self.writer.add_text("dfbench/run", f"run id `{info.run_id}`, run folder `{info.run_dir}`, group "
                                                f"`{info.group}`", 0)
        self.writer.flush()

    def _scalars(self, scalars: Mapping[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step, new_style=True, double_precision=True)
        self.writer.flush()

    def log_round(self, step: int, row: Mapping[str, Any]) -> None:
        self._scalars(round_scalars(row), step)

    def log_curve(self, step: int, point: Mapping[str, Any]) -> None:
        self._scalars(curve_scalars(point), step)

    def log_final(self, metrics: Mapping[str, Any], grid: Path | None) -> None:
        if grid is not None:
            import numpy as np
            from PIL import Image

            with Image.open(grid) as im:
                pixels = np.asarray(im.convert("RGB"))
            self.writer.add_image("samples/grid", pixels, self.info.rounds, dataformats="HWC")
        self._scalars(final_scalars(metrics), self.info.rounds)

    def finish(self, state: str) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
