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
        progress: bool = False, download: bool = False, **settings: Any) -> Path:
    """Train and evaluate one run (resume or skip it when its folder exists); return the folder."""
    from .loop import run as run_loop

    cfg = make_config(config, **settings) if (settings or config is None) else config
    if download:
        from .fetch import fetch_for_configs

        fetch_for_configs([cfg])
    return run_loop(cfg, out, force=force, progress=progress)


def load_runs(root: str | Path = "results/runs") -> pd.DataFrame:
    """Finished runs under ``root``: one row per evaluation (metric, value, extractor, ...),
    with the run's columns (dataset, partition, method, seed, ``param.*``, ``cfg.*`` config keys,
    uplink, diagnostics) beside it -- the reporter's own tables, joined."""
    from .report_data import collect

    data = collect(root)
    if data.evaluations.empty:
        return data.runs.assign(metric=pd.Series(dtype=object), value=pd.Series(dtype=float))
    evals = data.evaluations.drop(columns=["group_key"])
    runs = data.runs.drop(columns=[c for c in data.metrics if c in data.runs] +
                          [f"{c}__stderr" for c in data.metrics if f"{c}__stderr" in data.runs])
    return evals.merge(runs, on="run_id", how="left")
