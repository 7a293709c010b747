"""The method protocol grows instead of leaking: toy methods and mechanisms exercise each hook.

- declared capabilities and `check` refuse a run before any data is loaded;
- per-client state (ServerState.client_state) survives the rounds a client sits out and a
  resume from the checkpoint, bitwise;
- a Mechanism wraps the accumulation of any method from outside (it sees every upload and
  the summed accumulator), without the method knowing.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from dfbench import methods
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.core.config import ConfigError
from dfbench.benchmark.engine.resolve import resolve
from dfbench.benchmark.engine import lifecycle
from dfbench.benchmark.engine.context import build_context
from dfbench.benchmark.engine.training import train_round
from dfbench.methods.registry import _REGISTRY
from helpers import final_params, tiny_config


class _Memory(methods.Method):
    """FedAvg whose clients keep a memory across rounds: how often they took part, and their last update."""

    capabilities = methods.Capabilities(batched_clients=False, several_ranks=False, needs="it keeps a memory per client")

    @dataclass(frozen=True)
    class Config:
        pass

    def upload(self, local, plan, client, state, ctx):
        seen = state.client_state("toy_seen", client)
        state.set_client_state("toy_seen", client, 1 if seen is None else seen + 1)
        state.set_client_state("toy_last", client, (local - plan.start).clone())
        return super().upload(local, plan, client, state, ctx)


@pytest.fixture
def memory_method():
    methods.register_method("toy_memory")(_Memory)
    try:
        yield "toy_memory"
    finally:
        _REGISTRY.pop("toy_memory", None)


def test_declared_capabilities_are_refused_when_the_config_is_built(memory_method):
    with pytest.raises(ConfigError, match="'toy_memory' cannot run with train.clients_mode=batched \\(it keeps a memory"):
        tiny_config(memory_method, over={"train.clients_mode": "batched"})
    cfg = tiny_config(memory_method)
    with pytest.raises(ConfigError, match="needs a single process \\(world size 1, here 3\\)"):
        resolve(cfg, 3)


def test_a_refused_run_writes_no_folder(tmp_path, memory_method, monkeypatch):
    cfg = tiny_config(memory_method)
    monkeypatch.setattr(lifecycle.distributed, "rank_world", lambda: (0, 2))  # as under torchrun with 2 ranks
    with pytest.raises(ConfigError, match="single process"):
        lifecycle.run(cfg, tmp_path, progress=False)  # no data given: it would have to load it
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_per_client_state_survives_sitting_out_and_a_resume_bitwise(tmp_path, tiny_data, memory_method, monkeypatch):
    # prepare: 4 clients, half of them per round, a checkpoint every round
    over = {"train.rounds": 4, "checkpoint_every": 1, "system.participation": 0.5}
    cfg = tiny_config(memory_method, over=over)
    ref = lifecycle.run(cfg, tmp_path / "ref", data=tiny_data, progress=False)
    # execute: the same run stopped (as by Ctrl-C) in round 3, after round 2's checkpoint, then resumed
    real = lifecycle.train_round

    def stop_in_round_3(method, state, ctx, r, *a, **k):
        if r == 3:
            raise KeyboardInterrupt
        return real(method, state, ctx, r, *a, **k)

    monkeypatch.setattr(lifecycle, "train_round", stop_in_round_3)
    with pytest.raises(KeyboardInterrupt):
        lifecycle.run(cfg, tmp_path / "cut", data=tiny_data, progress=False)
    d = runfolder.run_dir(tmp_path / "cut", cfg)
    assert runfolder.load_checkpoint(d)["round"] == 2
    monkeypatch.setattr(lifecycle, "train_round", real)
    lifecycle.run(cfg, tmp_path / "cut", data=tiny_data, progress=False)
    # assert: the memory counts every participation (clients sat out), and resumed == uninterrupted
    a, b = runfolder.load_checkpoint(d)["extra"], runfolder.load_checkpoint(ref)["extra"]
    rows = runfolder.read_rounds(ref)
    taken = {k: sum(k in r["clients"] for r in rows) for k in range(4)}
    assert b["toy_seen"] == {k: n for k, n in taken.items() if n} and sum(taken.values()) == 4 * 2
    assert min(taken.values()) < 4  # someone sat out a round
    assert a["toy_seen"] == b["toy_seen"]
    assert a["toy_last"].keys() == b["toy_last"].keys()
    assert all(torch.equal(a["toy_last"][k], b["toy_last"][k]) for k in a["toy_last"])
    assert torch.equal(final_params(d), final_params(ref))


class _Recorder(methods.Mechanism):
    """Sees every upload and the summed accumulator; optionally cancels every client's update."""

    def __init__(self, cancel: bool) -> None:
        self.cancel, self.uploads, self.aggregates = cancel, [], 0

    def new_sums(self, state, ctx):
        return {"recorder_n": torch.zeros(1, dtype=torch.float64)}  # its own sum, all-reduced with the round's

    def on_upload(self, up, plan, acc, ctx):
        acc["recorder_n"] += 1
        self.uploads.append((up.group, up.staleness, plan.version))
        if self.cancel:  # the client's model becomes its start point: an update of zero
            up.params = plan.start.clone()
        return up

    def on_aggregate(self, acc, state, ctx):
        assert "wsum" in acc  # after every client was accumulated (and all-reduced)
        assert state.params.shape == ctx.init_params.shape  # the state before the server step
        self.aggregates += 1
        return {"recorder_uploads": int(acc["recorder_n"][0])}  # a field of the round's row


@pytest.mark.parametrize("name,params", [("fedavg", {}), ("random_prune", {"keep_ratio": 0.5}), ("fedadam", {})])
def test_a_mechanism_wraps_the_accumulation_of_any_method(tiny_data, name, params):
    cfg = tiny_config(name, params, {"system.participation": 0.5})
    ctx = build_context(cfg, data=tiny_data)
    method = methods.create_method(name, **params)
    state = method.init_state(ctx.init_params, ctx)
    seen, cancel = _Recorder(cancel=False), _Recorder(cancel=True)
    # execute
    _, row = train_round(method, state, ctx, 1, mechanisms=[seen])
    new, _ = train_round(method, method.init_state(ctx.init_params, ctx), ctx, 1, mechanisms=[cancel])
    # assert: every participating client passed through once, in the synchronous round at staleness 0
    assert seen.uploads == [(0, 0, 0)] * len(row["clients"]) and seen.aggregates == 1
    assert row["recorder_uploads"] == len(row["clients"])
    # cancelling every update leaves the global model where it was (for the server optimizer too:
    # a zero pseudo-gradient moves nothing on its first step); pruned coordinates keep their value
    assert torch.equal(new.params, ctx.init_params)


def test_grid_dry_run_lists_every_incompatible_cell_before_any_data(monkeypatch, capsys, tmp_path):
    """`dfbench grid demo --set train.clients_mode=batched --dry-run`: every refused cell with its reason, exit 2."""
    from dfbench import datasets
    from dfbench.benchmark import cli

    def no_data(*a, **k):
        raise AssertionError("data was loaded")

    monkeypatch.setattr(datasets, "load", no_data)
    # execute
    code = cli.main(["grid", "demo", "--set", "train.clients_mode=batched", "--dry-run", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    # assert: the two methods that cannot train in lockstep, each with why and the fix; nothing else
    assert code == 2
    assert "2 problem(s), nothing was run" in err
    assert "fmnist/iid/scaffold/0): method 'scaffold' cannot run with train.clients_mode=batched (it corrects" in err
    assert "fmnist/iid/heterofl/0): method 'heterofl' cannot run with train.clients_mode=batched" in err
    assert err.count("use --set train.clients_mode=sequential") == 2
    assert list(tmp_path.iterdir()) == []
    # the same refusal for a single run, with no folder written
    code = cli.main(["run", "--method", "scaffold", "--set", "train.clients_mode=batched", "--out", str(tmp_path)])
    assert code == 2 and "cannot run with train.clients_mode=batched" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# -- the context a method sees is the methods' own protocol ---------------------------------------------

def _protocol_members(proto: type) -> set[str]:
    """The names a typing.Protocol declares (its properties, methods and annotated attributes)."""
    own = {n for n in vars(proto) if not n.startswith("_")} | set(getattr(proto, "__annotations__", {}))
    return own - {"register"}


def test_the_engines_run_context_is_a_method_context(tiny_data):
    from dfbench.benchmark.engine.context import RunContext
    from dfbench.benchmark.engine.model import Layout
    from dfbench.methods.context import MethodContext, ParamLayout

    fields = {f for f in RunContext.__dataclass_fields__}
    missing = {n for n in _protocol_members(MethodContext) if n not in fields and not hasattr(RunContext, n)}
    assert not missing, f"RunContext lacks what MethodContext promises the methods: {sorted(missing)}"
    assert {"cfg", "layout", "round", "gen", "sample_single"} <= _protocol_members(MethodContext)  # a real reading
    layout_fields = set(Layout.__dataclass_fields__)
    assert {n for n in _protocol_members(ParamLayout) if n not in layout_fields and not hasattr(Layout, n)} == set()
    ctx = build_context(tiny_config(), data=tiny_data)
    assert isinstance(ctx, MethodContext) and isinstance(ctx.layout, ParamLayout)
