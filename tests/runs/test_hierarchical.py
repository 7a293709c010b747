"""Edge servers (system.edges, benchmark/engine/hierarchical.py): one edge and one edge round is the flat
round bit for bit; two edges of FedAvg are flat FedAvg to float rounding (FedAvg is linear, but each edge
rounds its mean to float32 before the cloud averages); the cloud's weighted, covered mean by hand; the
default assignment; bits per level in rounds.jsonl and metrics.json; FedProx and FedPhD under edges;
a resumed run; the refusals; run ids of existing configs unchanged."""

from __future__ import annotations

import json

import pytest
import torch

from dfbench import methods
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.core.config import ConfigError, RunConfig
from dfbench.benchmark.engine.context import build_context
from dfbench.benchmark.engine.hierarchical import Hierarchical, cloud_average
from dfbench.benchmark.engine.lifecycle import run
from dfbench.benchmark.engine.resolve import apply_overrides, config_from_dict, resolve
from dfbench.benchmark.engine.training import train_round
from helpers import final_params, tiny_config

FLAT_ONLY = ("client_edges", "client_edge_rounds", "edge_weights", "edge_uplink_bits", "edge_downlink_bits")
EVAL = {"eval.samples": 4, "eval.grid": 2, "eval.sampler_steps": 2}


def _train(cfg, data, rounds: int = 2):
    """(final state, rows without wall clock) of `rounds` rounds: the flat round, or the driver's cloud rounds."""
    ctx = build_context(cfg, data=data)
    m = methods.create_method(cfg.method, **dict(cfg.method_params))
    state = m.init_state(ctx.init_params, ctx)
    driver = Hierarchical(m, ctx) if cfg.system.edges else None
    rows = []
    for r in range(1, rounds + 1):
        state, row = driver.step(state, r) if driver is not None else train_round(m, state, ctx, r)
        rows.append(runfolder.without_wall_clock(row))
    return state, rows


def _rows(d) -> list[dict]:
    return [json.loads(x) for x in (d / "rounds.jsonl").read_text().splitlines()]


def test_one_edge_and_one_edge_round_is_the_flat_round_bit_for_bit(tiny_data):
    over = {"train.client_workers": 1, "system.participation": 0.75}
    flat, flat_rows = _train(tiny_config("fedavg", over=over), tiny_data)
    hier, hier_rows = _train(tiny_config("fedavg", over={**over, "system.edges": 1}), tiny_data)
    assert torch.equal(flat.params, hier.params)
    for f, h in zip(flat_rows, hier_rows):
        assert {k: v for k, v in h.items() if k not in FLAT_ONLY} == f  # every number of the flat row, in its order
        assert h["client_edges"] == [0] * 3 and h["edge_weights"] == [3 * 64.0]  # n_e: 3 clients of 256 / 4 images


def test_two_edges_of_fedavg_are_flat_fedavg_to_float_rounding(tiny_data):
    # FedAvg is linear: with edge weights n_e the cloud's mean is the flat mean. Not bit for bit: each
    # edge rounds its mean to float32 before the cloud averages (measured: 19 % of the entries differ
    # after one round, by at most 1.2e-7)
    flat, flat_rows = _train(tiny_config("fedavg", over={"train.client_workers": 1}), tiny_data, rounds=1)
    hier, hier_rows = _train(tiny_config("fedavg", over={"train.client_workers": 1, "system.edges": 2}), tiny_data, rounds=1)
    torch.testing.assert_close(hier.params, flat.params, rtol=1e-5, atol=1e-6)
    assert not torch.equal(hier.params, flat.params)
    (f,), (h,) = flat_rows, hier_rows
    assert h["clients"] == f["clients"] == [0, 1, 2, 3] and h["client_edges"] == [0, 0, 1, 1]
    assert h["client_loss"] == f["client_loss"] and h["uplink_bits"] == f["uplink_bits"]  # the same local training


def test_the_cloud_average_by_hand():
    cloud = torch.tensor([0.0, 0.0, 0.0])
    a, b = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([3.0, 4.0, 5.0])
    every = torch.ones(3, dtype=torch.bool)
    # weights 1 and 3: (1 a + 3 b) / 4
    assert cloud_average(cloud, [a, b], [1.0, 3.0], [every, every]).tolist() == [2.5, 3.5, 4.5]
    # edge b trained only entry 0 (its clients held nothing else): entries 1, 2 are a's alone
    assert cloud_average(cloud, [a, b], [1.0, 3.0], [every, torch.tensor([True, False, False])]).tolist() == [2.5, 2.0, 3.0]
    # an entry no edge trained keeps the cloud's value; weight 0 leaves an edge out
    none = torch.zeros(3, dtype=torch.bool)
    assert cloud_average(cloud, [a, b], [1.0, 3.0], [torch.tensor([True, True, False]), none]).tolist() == [1.0, 2.0, 0.0]
    assert cloud_average(cloud, [a, b], [0.0, 2.0], [every, every]).tolist() == [3.0, 4.0, 5.0]
    assert cloud_average(cloud, [a, b], [0.0, 0.0], [every, every]).tolist() == [0.0, 0.0, 0.0]


def test_the_default_assignment_is_contiguous_blocks_of_client_ids():
    ctx = type("Ctx", (), {"num_clients": 10})()
    loads = [methods.EdgeLoad()] * 3
    assert methods.Method(None).assign_edges(list(range(10)), loads, ctx) == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_bits_per_level_in_rounds_and_metrics(tmp_path, tiny_data):
    # prepare: 4 clients, 2 edges (clients 0, 1 -> edge 0; 2, 3 -> edge 1), 2 edge rounds per cloud round
    cfg = tiny_config("fedavg", over={"system.edges": 2, "system.edge_rounds": 2, **EVAL})
    # execute
    d = run(cfg, tmp_path, data=tiny_data, progress=False)
    # assert
    P = build_context(cfg, data=tiny_data).layout.total
    rows, metrics = _rows(d), json.loads((d / "metrics.json").read_text())
    assert [r["round"] for r in rows] == [1, 2]
    for row in rows:
        assert row["clients"] == [0, 1, 2, 3, 0, 1, 2, 3] and row["client_edges"] == [0, 0, 1, 1] * 2
        assert row["client_edge_rounds"] == [1, 1, 1, 1, 2, 2, 2, 2]
        assert row["uplink_bits"] == row["downlink_bits"] == 8 * 32 * P  # clients <-> edges: 8 updates
        assert row["edge_uplink_bits"] == row["edge_downlink_bits"] == 2 * 32 * P  # edges <-> cloud: 2 models
        assert row["client_uplink_bits"] == [32 * P] * 8 and row["edge_weights"] == [128.0, 128.0]  # 256 images / 4
    assert metrics["uplink_bits"] == 2 * 8 * 32 * P and metrics["edge_uplink_bits"] == metrics["edge_downlink_bits"] == 2 * 2 * 32 * P
    assert json.loads((d / "config.json").read_text())["system"]["edges"] == 2


def test_fedprox_runs_under_edges_and_differs_from_fedavg(tiny_data):
    over = {"train.client_workers": 1, "system.edges": 2, "system.edge_rounds": 2}
    avg, _ = _train(tiny_config("fedavg", over=over), tiny_data, rounds=1)
    prox, (row,) = _train(tiny_config("fedprox", {"mu": 1.0}, over), tiny_data, rounds=1)
    assert torch.isfinite(prox.params).all() and not torch.equal(prox.params, avg.params)
    assert row["client_edges"] == [0, 0, 1, 1] * 2 and row["loss"] is not None


def test_fedphd_under_edges_sends_its_pruned_model_on_both_levels(tmp_path, tiny_data):
    cfg = tiny_config("fedphd", over={"system.edges": 2, "system.edge_rounds": 2, **EVAL})
    d = run(cfg, tmp_path, data=tiny_data, progress=False)
    assert json.loads((d / "status.json").read_text())["state"] == "done"
    ctx, method = build_context(cfg, data=tiny_data), methods.create_method("fedphd")
    kept = method.model_bits(method.init_state(ctx.init_params, ctx), ctx)  # 32 bits x the pruned UNet's parameters
    assert kept < 32 * ctx.layout.total
    for row in _rows(d):
        assert len(row["clients"]) == 8 and set(row["client_edges"]) <= {0, 1}
        assert row["uplink_bits"] == 8 * kept and row["client_uplink_bits"] == [kept] * 8
        assert row["edge_downlink_bits"] == 2 * kept
        assert row["edge_uplink_bits"] == kept * len(set(row["client_edges"]))
        assert all(w > 0 for w, e in zip(row["edge_weights"], (0, 1)) if e in row["client_edges"])


@pytest.mark.slow
def test_an_interrupted_hierarchical_run_resumes_bitwise(tmp_path, tiny_data, monkeypatch):
    cfg = tiny_config("fedphd", over={"system.edges": 2, "train.rounds": 3, "checkpoint_every": 1, **EVAL})
    ref = run(cfg, tmp_path / "ref", data=tiny_data, progress=False)
    real = Hierarchical.step

    def step(self, state, r):
        if r == 3:
            raise KeyboardInterrupt
        return real(self, state, r)

    with monkeypatch.context() as m:
        m.setattr(Hierarchical, "step", step)
        with pytest.raises(KeyboardInterrupt):
            run(cfg, tmp_path / "cut", data=tiny_data, progress=False)
    d = runfolder.run_dir(tmp_path / "cut", cfg)
    run(cfg, tmp_path / "cut", data=tiny_data, progress=False)
    assert torch.equal(final_params(d), final_params(ref))
    assert [runfolder.without_wall_clock(r) for r in _rows(d)] == [runfolder.without_wall_clock(r) for r in _rows(ref)]


@pytest.mark.parametrize("method,over,needle", [
    ("fedavg", {"train.driver": "fedbuff"}, "train.driver"),
    ("fedavg", {"privacy.clip": 1.0}, "privacy.clip"),
    ("fedavg", {"system.edges": 5}, "at most data.clients"),
    ("fedavg", {"system.edge_rounds": 0}, "system.edge_rounds"),
    ("scaffold", {}, "cannot run under edge servers"),
    ("fedadam", {}, "cannot run under edge servers"),
    ("experts", {}, "cannot run under edge servers"),
])
def test_what_edges_cannot_run_is_refused_up_front(method, over, needle):
    with pytest.raises(ConfigError, match=needle):
        tiny_config(method, over={"system.edges": 2, **over})


def test_powersgd_factors_and_several_ranks_are_refused():
    with pytest.raises(ConfigError, match="method.downlink=factors"):
        tiny_config("powersgd", {"downlink": "factors"}, {"system.edges": 2})
    tiny_config("powersgd", over={"system.edges": 2})  # its full downlink runs (Q is per-client memory)
    with pytest.raises(ConfigError, match="under torchrun"):
        resolve(tiny_config(over={"system.edges": 2}), world=2)


def test_existing_run_ids_stay_and_the_edges_make_new_ones():
    default = "s0-207c7bc670"  # tests/results/test_run_ids.py pins it
    assert apply_overrides(RunConfig(), {"system.edges": 0}).run_id() == default
    assert apply_overrides(RunConfig(), {"system.edge_rounds": 4}).run_id() == default  # inactive without edges
    old = RunConfig().to_dict()
    for key in ("edges", "edge_rounds"):
        old["system"].pop(key)
    assert config_from_dict(old).run_id() == default  # a config.json from before the topology
    two = apply_overrides(RunConfig(), {"system.edges": 2}).run_id()
    assert two != default != apply_overrides(RunConfig(), {"system.edges": 2, "system.edge_rounds": 2}).run_id() != two


def test_edge_rounds_train_their_clients_side_by_side_or_in_lockstep_as_a_flat_round_does(tiny_data):
    # the edge rounds go through training.train_clients: parallel workers give the sequential model bit for bit
    over = {"system.edges": 2, "system.edge_rounds": 2, "data.clients": 6}
    seq, seq_rows = _train(tiny_config("fedphd", over={**over, "train.client_workers": 1}), tiny_data, rounds=1)
    par, par_rows = _train(tiny_config("fedphd", over={**over, "train.client_workers": 2}), tiny_data, rounds=1)
    assert torch.equal(seq.params, par.params) and seq_rows == par_rows
    batched, (row,) = _train(tiny_config("fedavg", over={**over, "train.clients_mode": "batched"}), tiny_data, rounds=1)
    assert torch.isfinite(batched.params).all() and len(row["clients"]) == 12


def test_the_planner_counts_every_edge_round():
    from dfbench.benchmark.grid.plan import estimate_cost

    flat = estimate_cost(tiny_config()).sample_grads
    assert estimate_cost(tiny_config(over={"system.edges": 2})).sample_grads == flat
    assert estimate_cost(tiny_config(over={"system.edges": 2, "system.edge_rounds": 3})).sample_grads == 3 * flat


def test_fedphd_prunes_at_the_cloud_after_prune_round_cloud_rounds(tiny_data):
    # prune_round=1 with 2 edge rounds per cloud round: cloud round 1 trains and sends the full model, cloud
    # round 2 the pruned one, chosen from the cloud model after round 1 (edge round 3 is the first to plan it)
    cfg = tiny_config("fedphd", {"prune_round": 1}, {"system.edges": 2, "system.edge_rounds": 2, "train.client_workers": 1})
    state, (one, two) = _train(cfg, tiny_data, rounds=2)
    P = build_context(cfg, data=tiny_data).layout.total
    kept = two["trained_params"][0]
    assert one["trained_params"] == [P] * 8 and one["edge_downlink_bits"] == 2 * 32 * P
    assert two["trained_params"] == [kept] * 8 and kept < P
    assert two["edge_downlink_bits"] == 2 * 32 * kept and two["edge_uplink_bits"] == 32 * kept * len(set(two["client_edges"]))
