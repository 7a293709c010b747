"""The notebook API behind ``dfbench.run`` / ``dfbench.make_config`` / ``dfbench.load_runs``.

Thin, like the CLI: it builds the same validated ``RunConfig`` as ``dfbench run`` and calls the
same library functions, so a notebook run and a command-line run of one config share a folder.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pandas as pd

from .config import ConfigError, RunConfig, apply_overrides

# `dfbench run` flags that make_config accepts as plain keywords, with their config keys.
FLAG_KEYS: dict[str, str] = {
    "dataset": "data.dataset", "clients": "data.clients", "partition": "data.partition", "data_root": "data.root",
    "rounds": "train.rounds", "local_steps": "train.local_steps", "batch_size": "train.batch_size", "lr": "train.lr",
    "eval_samples": "eval.samples", "sampler_steps": "eval.sampler_steps", "seed": "seed", "device": "device",
}


def make_config(config: RunConfig | None = None, **settings: Any) -> RunConfig:
    """``config`` (default: the ``dfbench run`` defaults) with ``settings`` applied and validated."""
    from .cli import add_run_args, config_from_args

    method = settings.pop("method", None)
    unknown = [k for k in settings if "." not in k and k not in FLAG_KEYS]
    if unknown:
        raise ConfigError(f"unknown setting(s) {sorted(unknown)}: use one of {sorted(FLAG_KEYS)} or 'method', "
                          "or a dotted config key such as 'train.objective' or 'method.mu'")
    dotted = {FLAG_KEYS.get(k, k): v for k, v in settings.items()}
    if config is None:
        parser = argparse.ArgumentParser()
        add_run_args(parser)
        args = parser.parse_args([])
        args.method = method or "fedavg"
        args.overrides = list(dotted.items())
        return config_from_args(args)
    if method is not None and method != config.method:
        config = apply_overrides(RunConfig(**{**{k: getattr(config, k) for k in (
            "seed", "data", "train", "system", "eval", "checkpoint_every", "device")}, "method": method,
            "method_params": {}}), {})
    return apply_overrides(config, dotted)


def run(config: RunConfig | None = None, *, out: str | Path = "results/runs", force: bool = False,
        progress: bool = False, download: bool = False, data: Any = None, **settings: Any) -> Path:
    """Train and evaluate one run (resume or skip it when its folder exists); return the folder.

    ``data``: an already loaded training set (a ``dfbench.datasets.ImageSet``) to use instead of
    loading ``data.dataset`` -- for tests and custom data; evaluation still compares against the
    configured dataset's reference split.
    """
    from .loop import run as run_loop

    cfg = make_config(config, **settings) if (settings or config is None) else config
    if download:
        from .fetch import fetch_for_configs

        fetch_for_configs([cfg])
    return run_loop(cfg, out, force=force, progress=progress, data=data)


def load_runs(root: str | Path = "results/runs") -> pd.DataFrame:
    """Finished runs under ``root`` as one frame: one row per evaluation.

    Columns: the evaluation (``metric``, ``value``, ``std_err``, ``extractor``, ``num_samples``,
    ``sampler``, ``reference``, ...) beside its run (``run_id``, ``dataset``, ``partition``,
    ``method``, ``seed``, ``param.*`` method hyperparameters, ``cfg.*`` config keys, uplink and
    diagnostics) -- the reporter's own tables, joined. A finished run without a score
    (``eval.metrics=none``, or evaluation pending) keeps one row with an empty ``metric``.
    Failed, diverged and unfinished runs are not in it (``dfbench report`` lists them with the reason).
    """
    from .report_data import collect

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
