"""Small config builders for tests."""

from __future__ import annotations

from typing import Any

from dfbench.benchmark.config import RunConfig, apply_overrides

TINY = {
    "data.clients": 4, "data.min_client_size": 4, "train.rounds": 2, "train.local_steps": 2, "train.batch_size": 8,
    "train.model": "tiny", "eval.samples": 16, "eval.grid": 4, "eval.sampler_steps": 3, "eval.metrics": "none",
}


def tiny_config(method: str = "fedavg", params: dict[str, Any] | None = None, over: dict[str, Any] | None = None) -> RunConfig:
    """A config small enough to train in about a second on one CPU core."""
    return apply_overrides(RunConfig(method=method, method_params=params or {}), {**TINY, **(over or {})})


def final_params(run_dir: Any) -> Any:
    from dfbench.benchmark.results import load_checkpoint

    ck = load_checkpoint(run_dir)
    assert ck is not None, f"no checkpoint in {run_dir}"
    return ck["params"]
