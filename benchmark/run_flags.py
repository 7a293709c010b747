"""The `dfbench run` flags that are config keys: one table for the command line and the notebook API.

`dfbench run --rounds 3 --set method.mu=0.1` (benchmark/cli.py) and
`dfbench.make_config(rounds=3, **{"method.mu": 0.1})` (benchmark/api.py) both map a flag to its
dotted config key through `FLAG_KEYS` and build the config with `config_from_flags`, so the two
give one config, hence one run folder. The flags' defaults are the `RunConfig` defaults.
"""

from __future__ import annotations

from typing import Any, Mapping

from dfbench.benchmark.core.config import RunConfig
from dfbench.benchmark.engine.resolve import apply_overrides

# `dfbench run` flag (its argparse dest; a plain make_config keyword) -> dotted config key.
# --method is not here: the method is set last, with its hyperparameters (see config_from_flags).
FLAG_KEYS: dict[str, str] = {
    "dataset": "data.dataset", "clients": "data.clients", "partition": "data.partition", "data_root": "data.root",
    "rounds": "train.rounds", "local_steps": "train.local_steps", "batch_size": "train.batch_size", "lr": "train.lr",
    "eval_samples": "eval.samples", "sampler_steps": "eval.sampler_steps", "seed": "seed", "device": "device",
}


def config_from_flags(items: Mapping[str, Any], method: str = "fedavg") -> RunConfig:
    """Dotted items (`FLAG_KEYS` values, `--set` keys) -> a validated RunConfig running `method`.

    Everything but the method's hyperparameters is validated first, with the default method;
    then the method and its `method.<hp>` items are set in one step and validated as a whole
    (hyperparameters, and the method's check against the rest of the config).
    """
    method_items = {k: v for k, v in items.items() if k.startswith("method.")}
    other = {k: v for k, v in items.items() if not k.startswith("method.")}
    cfg = apply_overrides(RunConfig(method="fedavg"), other)
    return apply_overrides(cfg, {"method": method, **method_items})


def with_method(cfg: RunConfig, method: str) -> RunConfig:
    """`cfg` running `method` with its default hyperparameters (the old method's are dropped)."""
    return apply_overrides(cfg, {"method": method})
