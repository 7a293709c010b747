"""Layer 4: experiment trackers (`--log tensorboard,wandb,mlflow`, the API's `log=`): a run's rows, curve,
config, final metrics and sample grid, mirrored into TensorBoard, Weights & Biases or MLflow.

Tracking is a run option, like the progress bar: it is not in the config, so it changes no run id
and no result. Every tracker writes under <out>/trackers/ (never inside a run folder, which keeps
exactly the files a run without trackers has), is imported only when it is used, and is guarded:
one that fails is named in one warning and switched off, and the run goes on.

    base.py             the Tracker protocol, the guarded fan-out `Trackers`, what is logged
    tensorboard_log.py  <out>/trackers/tensorboard/<dataset>/<partition>/<method>/<run-id>/ (SummaryWriter)
    wandb_log.py        <out>/trackers/wandb/ (offline unless WANDB_MODE says otherwise)
    mlflow_log.py       sqlite:///<out>/trackers/mlflow.db (unless MLFLOW_TRACKING_URI is set)
"""

from dfbench.benchmark.tracking.base import (DEFAULT_GROUP, TRACKER_DIR, TRACKERS, RunInfo, Tracker, Trackers,
                                             parse_trackers)

__all__ = ["DEFAULT_GROUP", "TRACKER_DIR", "TRACKERS", "RunInfo", "Tracker", "Trackers", "parse_trackers"]
