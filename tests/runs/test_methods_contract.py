"""One contract for every registered method (timm-style): a method is covered the moment
it is registered. One round on tiny synthetic data must give finite parameters of the
server state's shape, count its uplink bits, and be bitwise reproducible from the seed.

Methods from outside the package are covered too: the plugins of the installed entry points
(group "dfbench.methods") and of $DFBENCH_PLUGINS are loaded before the methods are listed, so
`DFBENCH_PLUGINS=mypkg.methods pytest tests/runs/test_methods_contract.py` checks a plugin's methods."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dfbench import methods
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.engine import privacy
from dfbench.benchmark.engine.context import build_context
from dfbench.benchmark.engine.lifecycle import run
from dfbench.methods.plugins import load_plugins
from helpers import final_params, tiny_config

pytestmark = pytest.mark.slow  # one whole run per registered method

load_plugins()  # entry points and $DFBENCH_PLUGINS, before the parametrizations list the methods

# Methods that by design send nothing during training; they must report exactly 0 uplink bits.
# experts (DDM): experts never communicate; intra-expert averaging is reported as intra_expert_bits
# (see methods/experts.py, "Communication").
NO_UPLINK_BY_DESIGN = {"experts"}


def _rows(d: Path) -> list[dict]:
    return [json.loads(x) for x in (d / "rounds.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name", methods.list_methods())
def test_every_method_one_round(tmp_path, tiny_data, name):
    # prepare: default hyperparameters, one round, the smallest evaluation
    cfg = tiny_config(name, over={"train.rounds": 1, "eval.samples": 4, "eval.grid": 2, "eval.sampler_steps": 2})
    ctx = build_context(cfg, data=tiny_data)
    init = methods.create_method(name).init_state(ctx.init_params, ctx).params
    # execute: the same config twice, in two folders
    d1 = run(cfg, tmp_path / "a", data=tiny_data, progress=False)
    d2 = run(cfg, tmp_path / "b", data=tiny_data, progress=False)
    # assert
    assert json.loads((d1 / "status.json").read_text())["state"] == "done"
    p1, p2 = final_params(d1), final_params(d2)
    assert p1.shape == init.shape
    assert torch.isfinite(p1).all()
    assert not torch.equal(p1, init)  # the round trained something
    (row,) = _rows(d1)
    if name in NO_UPLINK_BY_DESIGN:
        assert row["uplink_bits"] == 0
    else:
        assert row["uplink_bits"] > 0
    # same seed -> same model, same round log (but wall time), same samples
    assert torch.equal(p1, p2)
    (row2,) = _rows(d2)
    assert runfolder.without_wall_clock(row) == runfolder.without_wall_clock(row2)
    assert np.array_equal(np.load(d1 / "samples.npz")["images"], np.load(d2 / "samples.npz")["images"])


@pytest.mark.parametrize("name", methods.list_methods())
def test_batched_clients_are_refused_up_front_or_run(tmp_path, tiny_data, name):
    """What config validation accepts, the round runs: a method that cannot train in lockstep says
    so when the config is built (declared capability or its check), never mid-run."""
    from dfbench.benchmark.core.config import ConfigError

    over = {"train.rounds": 1, "train.clients_mode": "batched", "eval.samples": 4, "eval.grid": 2, "eval.sampler_steps": 2}
    try:
        cfg = tiny_config(name, over=over)
    except ConfigError as err:
        assert "train.clients_mode=batched" in str(err) and "sequential" in str(err)
        cls = methods.get_method_class(name)
        # refused by the declaration, or by a check of its own (e.g. heterofl: only narrow widths)
        assert not cls.capabilities.batched_clients or any("check" in vars(c) for c in cls.__mro__ if c is not methods.Method)
        return
    d = run(cfg, tmp_path, data=tiny_data, progress=False)
    assert json.loads((d / "status.json").read_text())["state"] == "done"


@pytest.mark.parametrize("name", methods.list_methods())
def test_differential_privacy_is_refused_up_front_or_clips_every_update(tiny_data, name):
    """DP (privacy.clip > 0) wraps every method from outside: a method whose server reads more than
    FedAvg's sums is refused when the config is built (its declaration); any other runs a round in
    which every update it accumulates is clipped to C and the model moves by the noisy mean."""
    from dfbench.benchmark.core.config import ConfigError
    from dfbench.benchmark.engine.training import train_round

    try:
        cfg = tiny_config(name, over={"privacy.clip": 1e-3, "privacy.noise": 0.5})
    except ConfigError as err:
        assert "differential privacy" in str(err)
        assert not methods.get_method_class(name).capabilities.mean_aggregation
        return
    assert methods.get_method_class(name).capabilities.mean_aggregation
    ctx = build_context(cfg, data=tiny_data)
    ctx = dataclasses.replace(ctx, mechanisms=tuple(privacy.mechanisms(cfg, ctx)))  # as the run's life cycle builds it
    method = methods.create_method(name)
    state = method.init_state(ctx.init_params, ctx)
    new, row = train_round(method, state, ctx, 1)
    assert row["dp_clipped_fraction"] == 1.0 and row["dp_epsilon"] > 0
    assert torch.isfinite(new.params).all() and not torch.equal(new.params, state.params)
