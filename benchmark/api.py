"""The notebook API behind ``dfbench.run`` / ``dfbench.make_config`` / ``dfbench.run_grid`` / ``dfbench.load_runs``.

Thin, like the CLI: it builds the same validated ``RunConfig`` as ``dfbench run`` (through the
same flag table, benchmark/run_flags.py) and calls the same library functions, so a notebook run
and a command-line run of one config share a folder; ``run_grid`` is ``dfbench grid``.

It is also the one door a committed study's own scripts go through (results/<study>/*.py, scripts/*.py:
outside the package, they import nothing of dfbench but this module). Beside the functions defined here it
re-exports, by area:

- run folders: ``runfolder`` (the format: file names, states, readers), ``RunFolder`` and ``iter_runs`` (the
  one walk over a tree of run folders: no script globs for config.json itself), ``run_drift`` and
  ``load_samples`` (a run's drift record and its samples);
- the runs frame: ``collect`` (the reporter's ``ReportData``: runs, evaluations, curves), ``load_runs`` (one row
  per evaluation), ``primary_metric``, ``higher_is_better``, ``better``, ``curve_labels``, ``CONFIG_DEFAULTS``,
  ``setting_names`` and ``is_baseline`` (how pages name settings), ``reference_method``, ``load_grid``;
- metrics and verdicts: ``metric_table`` (the one metrics table: scale, direction), ``t_interval``,
  ``seed_interval``, ``chance_band``, ``verdicts`` (paired t, TOST, Holm, the four verdicts),
  ``seed_differences``, ``paired_table`` / ``write_paired_table`` (each setting minus a reference, per seed);
- claims: ``claims`` (a claims file decided from runs.csv, written as claims.md / .csv and quoted in a README),
  ``REGISTRATION_SAID`` (where claims.md states how the claims were registered);
- sizing a study's seeds from an earlier study's runs.csv: ``size_seeds`` (``Sizing`` per claim),
  ``seeds_per_setting``, ``MIN_SEEDS``, ``SEED_CAP``; a confirmatory re-run's checks and seeds:
  ``ConfirmatoryStudy`` and ``size_confirmatory_study`` (benchmark/report/confirm_sizing.py);
- study tables: ``load_study``, ``write_study``, ``study_main`` (the runs and metric a study compares, its
  table written as .md/.csv/.png, its command line), ``run_speeds`` / ``speeds`` / ``speed_table`` /
  ``write_speed_table`` (training speed per run and per setting);
- scoring images as a run's samples are scored: ``evaluate_samples`` and ``ScoreOptions`` (loaded on first use),
  ``derive_seed`` (the seeding every run uses);
- the pruning methods' inference rules, ``INFERENCE_MODES``.

``dfbench.datasets`` and ``dfbench.methods`` (the registry, the method protocol) are public packages of their own.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import pandas as pd

from dfbench.benchmark.core.config import ConfigError, RunConfig
from dfbench.benchmark.engine.resolve import apply_overrides
from dfbench.benchmark.run_flags import FLAG_KEYS, config_from_flags

# What a study's scripts use, re-exported (module doc); `X as X` marks each as this module's public name.
from dfbench.benchmark.core import runfolder as runfolder
from dfbench.benchmark.core.runfolder import RunFolder as RunFolder, iter_runs as iter_runs
from dfbench.benchmark.core.seeds import derive_seed as derive_seed
from dfbench.benchmark.grid.spec import load_grid as load_grid
from dfbench.benchmark.metrics import table as metric_table
from dfbench.benchmark.metrics.drift import load_samples as load_samples, run_drift as run_drift
from dfbench.benchmark.metrics.uncertainty import seed_interval as seed_interval, t_interval as t_interval
from dfbench.benchmark.report import claims as claims
from dfbench.benchmark.report import verdicts as verdicts
from dfbench.benchmark.report.frames import (CONFIG_DEFAULTS as CONFIG_DEFAULTS, ReportData as ReportData,
                                             better as better, collect as collect, curve_labels as curve_labels,
                                             higher_is_better as higher_is_better, primary_metric as primary_metric)
from dfbench.benchmark.report.names import is_baseline as is_baseline, setting_names as setting_names
from dfbench.benchmark.report.confirm_sizing import Study as ConfirmatoryStudy, main as size_confirmatory_study
from dfbench.benchmark.report.paired import paired_table as paired_table, write as write_paired_table
from dfbench.benchmark.report.preregistration import REGISTRATION_SAID as REGISTRATION_SAID, check_preregistration as check_preregistration
from dfbench.benchmark.report.sizing import (MIN_SEEDS as MIN_SEEDS, SEED_CAP as SEED_CAP, Sizing as Sizing,
                                             seeds_per_setting as seeds_per_setting, size_seeds as size_seeds)
from dfbench.benchmark.report.speed import (run_speeds as run_speeds, speeds as speeds, summarize as speed_table,
                                            write as write_speed_table)
from dfbench.benchmark.report.study_tools import (StudyRuns as StudyRuns, load_study as load_study,
                                                  seed_differences as seed_differences, study_main as study_main,
                                                  write_study as write_study)
from dfbench.methods.pruning import INFERENCE_MODES as INFERENCE_MODES
from dfbench.methods.registry import reference_method as reference_method

# Re-exported on first use: their modules import scipy and the feature networks' code (seconds), which
# `dfbench.run` does not need at import.
_LAZY = {"chance_band": "dfbench.benchmark.metrics.membership",
         "evaluate_samples": "dfbench.benchmark.metrics.scoring", "ScoreOptions": "dfbench.benchmark.metrics.scoring"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

if TYPE_CHECKING:  # pragma: no cover
    from dfbench.benchmark.grid.runner import GridSummary


def _dotted(settings: dict[str, Any], *, method_key: bool = False) -> dict[str, Any]:
    """Plain ``dfbench run`` flag keywords -> their config keys; dotted keys pass as they are."""
    unknown = [k for k in settings if "." not in k and k not in FLAG_KEYS and not (method_key and k == "method")]
    if unknown:
        raise ConfigError(f"unknown setting(s) {sorted(unknown)}: use one of {sorted(FLAG_KEYS)} or 'method', "
                          "or a dotted config key such as 'train.objective' or 'method.mu'")
    return {FLAG_KEYS.get(k, k): v for k, v in settings.items()}


def make_config(config: RunConfig | None = None, **settings: Any) -> RunConfig:
    """``config`` (default: the ``dfbench run`` defaults) with ``settings`` applied and validated."""
    method = settings.pop("method", None)
    dotted = _dotted(settings)
    if config is None:
        return config_from_flags(dotted, method or "fedavg")
    if method is not None and method != config.method:
        dotted = {"method": method, **dotted}  # a new method starts from its defaults; validated once, as a whole
    return apply_overrides(config, dotted)


def run(config: RunConfig | None = None, *, out: str | Path = "results/runs", force: bool = False,
        progress: bool = False, download: bool = False, data: Any = None, log: str | Sequence[str] = (),
        log_group: str | None = None, plugins: str | Sequence[str] = (), **settings: Any) -> Path:
    """Train and evaluate one run (resume or skip it when its folder exists); return the folder.

    ``data``: an already loaded training set (a ``dfbench.datasets.ImageSet``) to use instead of
    loading ``data.dataset`` -- for tests and custom data; evaluation still compares against the
    configured dataset's reference split. ``log``: experiment trackers (``"tensorboard"``,
    ``"wandb"``, ``"mlflow"``, a list or a comma-separated string; ``--log``) writing under
    ``out``/trackers/ in the group ``log_group`` (``--log-group``, default ``"dfbench-run"``).
    ``plugins``: modules that register methods from outside dfbench (``--plugin``), loaded first
    with $DFBENCH_PLUGINS and the installed entry points (methods/plugins.py).
    """
    from dfbench.benchmark.engine.evaluate import check_device
    from dfbench.benchmark.engine.lifecycle import OutOfMemory, free_gpu_memory, run as run_loop
    from dfbench.benchmark.tracking import parse_trackers
    from dfbench.methods.plugins import load_plugins

    load_plugins([plugins] if isinstance(plugins, str) else plugins)  # before the config names their methods
    trackers = parse_trackers(log)  # an unknown tracker: refused before any work
    cfg = make_config(config, **settings) if (settings or config is None) else config
    # a device this machine lacks: one ConfigError before any work (not CUDA's error deep inside)
    check_device(cfg.device, fix="pass device='cpu', or run on a machine with that GPU")
    if download:
        from dfbench.benchmark.grid.fetch import fetch_for_configs

        fetch_for_configs([cfg])
    try:
        return run_loop(cfg, out, force=force, progress=progress, data=data, log=trackers, log_group=log_group)
    except OutOfMemory as err:  # the notebook goes on (and keeps the error): free the failed frames' tensors now
        free_gpu_memory(err)
        raise


def run_grid(grid: str | Path, *, out: str | Path = "results/runs", workers: int = 1, only: str | Sequence[str] = (),
             shard: str | tuple[int, int] | None = None, retry_failed: bool = False, force: bool = False,
             device: str | None = None, progress: bool = False, download: bool = False, data: Any = None,
             log: str | Sequence[str] = (), log_group: str | None = None, plugins: str | Sequence[str] = (),
             **settings: Any) -> GridSummary:
    """Run a grid (``dfbench grid``): its missing and unfinished cells, resumable; return the summary.

    ``grid``: a shipped grid's name or a path to a .toml file. ``settings``: overrides for every
    cell (``--set``; they change the run ids): the plain keywords of :func:`make_config`
    (``rounds=1``), ``method`` (``"fedprox?mu=0.1"``) or dotted keys (``**{"train.lr": 2e-3}``);
    ``device`` (``--device``): its type is in the run ids (cpu vs cuda), its index is not. ``workers``:
    cooperating processes on this machine (this one and ``workers - 1`` more, ``--workers``; on
    ``device="cuda"`` spread over the visible GPUs); ``data``: one loaded training
    set for every cell (one worker only); ``log``: experiment trackers for every cell (``--log``),
    grouped under ``log_group`` (default: the grid's name). A bad grid, key or value, or an unknown
    tracker, raises ``ConfigError`` (a ``GridError`` lists every problem) and missing inputs
    ``MissingInputsError``, before any work. ``plugins``: as in :func:`run` (``--plugin``); the other
    workers load them too.
    """
    from dfbench.benchmark.grid.plan import parse_shard
    from dfbench.benchmark.grid.workers import run_with_workers
    from dfbench.benchmark.tracking import parse_trackers
    from dfbench.methods.plugins import load_plugins

    trackers = parse_trackers(log)
    load_plugins([plugins] if isinstance(plugins, str) else plugins)

    extra = _dotted(settings, method_key=True) | ({"device": device} if device is not None else {})
    loaded = load_grid(grid, extra=extra)
    patterns = [only] if isinstance(only, str) else list(only)
    return run_with_workers(loaded, out, workers=workers, shard=parse_shard(shard) if isinstance(shard, str) else shard,
                            only=patterns, retry_failed=retry_failed, force=force, progress=progress, download=download,
                            data=data, log=trackers, log_group=log_group)


def load_runs(root: str | Path = "results/runs") -> pd.DataFrame:
    """Finished runs under ``root`` as one frame: one row per evaluation.

    Columns: the evaluation (``metric``, ``value``, ``std_err``, ``extractor``, ``num_samples``,
    ``sampler``, ``reference``, ...) beside its run (``run_id``, ``dataset``, ``partition``,
    ``method``, ``seed``, ``param.*`` method hyperparameters, ``cfg.*`` config keys, uplink and
    diagnostics) -- the reporter's own tables, joined. A finished run without a score
    (``eval.metrics=none``, or evaluation pending) keeps one row with an empty ``metric``.
    Failed, diverged and unfinished runs are not in it (``dfbench report`` lists them with the reason).
    """
    data = collect(root)
    evals = data.evaluations.drop(columns=["group_key"])
    if data.runs.empty:
        return pd.DataFrame(columns=["run_id", "dataset", "partition", "method", "seed", *evals.columns[1:]])
    # The run table also carries one wide column per metric; the long rows replace them.
    wide = [c for m in data.metrics for c in (m, f"{m}__stderr") if c in data.runs]
    runs = data.runs.drop(columns=wide)
    frame = runs.merge(evals, on="run_id", how="left")
    lead = ["run_id", "dataset", "partition", "method", "params", "seed", *evals.columns[1:]]
    return frame[lead + [c for c in frame.columns if c not in lead]]
