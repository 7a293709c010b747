"""The seed paper's bound quantities (Qiao et al.; docs/diagnostics.md) per method, against hand counts: Γ_r (the
fewest clients that trained one deployed parameter), its running minimum Γ*, the uncovered fraction and w², taken
over what the method deploys (`Method.deployed_mask`) and what each client trains (`ClientPlan.trained_mask`, else
its mask). FedPhD counts its pruned network only; FjORD the widths its clients drew, not the prefix they hold;
HeteroFL and FedRolex their windows (FedRolex: the round's); FedAvg and random pruning as before."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dfbench import methods
from dfbench.benchmark.engine.context import build_context
from dfbench.benchmark.engine.hierarchical import Hierarchical
from dfbench.benchmark.engine.lifecycle import run
from dfbench.benchmark.engine.training import coverage, pruning_extent, train_round
from dfbench.methods.fedrolex import rolling
from dfbench.methods.heterofl import build_submodel, leading, narrow_width
from helpers import tiny_config

EVAL = {"eval.samples": 4, "eval.grid": 2, "eval.sampler_steps": 2}


def _setup(name, params=None, over=None, data=None):
    cfg = tiny_config(name, params, over)
    ctx = build_context(cfg, data=data)
    method = methods.create_method(name, **(params or {}))
    return ctx, method, method.init_state(ctx.init_params, ctx)


def _first_conv(ctx, mask: torch.Tensor) -> torch.Tensor:
    """A flat mask's entries of the first conv's weight, one row per output channel (its inputs: the image's)."""
    sl = {n: sl for n, sl, _ in ctx.layout.slices()}["inp.weight"]
    return mask[sl].view(ctx.model.inp.out_channels, -1)


def _hand(theta: torch.Tensor, masks: list[torch.Tensor], live: torch.Tensor | None = None) -> tuple[int, float, float]:
    """(Γ, uncovered fraction, w²) by hand from the clients' trained masks (float 0/1 [P]) over `live` (None: all)."""
    live = torch.ones_like(theta, dtype=torch.bool) if live is None else live.bool()
    count = torch.stack(masks).sum(0)[live]
    least = int(torch.argmin(count))  # the least-covered deployed entry: how many clients trained it
    gamma = sum(int(m[live][least]) for m in masks)
    sq = theta.double().square()[live]
    w2 = sum(float((sq * (1 - m.double()[live])).sum() / sq.sum()) for m in masks) / len(masks)
    return gamma, float((count == 0).double().mean()), w2


# -- the two functions the round takes them with, on hand-made tensors ------------------------------------

def test_coverage_and_the_pruning_extent_are_taken_over_the_deployed_entries():
    theta = torch.tensor([3.0, 4.0, 1.0, 2.0])
    mask = torch.tensor([1.0, 0.0, 1.0, 0.0])
    live = torch.tensor([1.0, 1.0, 1.0, 0.0])  # entry 3 is no part of the deployed model
    assert pruning_extent(theta, mask, None) == pytest.approx((16 + 4) / 30)
    assert pruning_extent(theta, mask, live) == pytest.approx(16 / 26)  # the pruned entry counts in neither sum
    assert pruning_extent(theta, live, live) == 0.0  # a client that trains the whole deployed model prunes nothing
    count = torch.tensor([[2.0, 1.0, 0.0, 0.0]])
    active = torch.tensor([True])
    assert coverage(count, active, None) == (0, 0.5)
    assert coverage(count, active, torch.tensor([1, 1, 0, 0])) == (1, 0.0)
    assert coverage(count, active, torch.tensor([1, 1, 1, 0])) == (0, pytest.approx(1 / 3))


# -- FedPhD: its pruned network ---------------------------------------------------------------------------

def test_fedphd_counts_its_pruned_network_only(tmp_path, tiny_data):
    # prepare: two clients, the default pruning (prune_ratio 0.2 of the initial model)
    cfg = tiny_config("fedphd", over={"data.clients": 2, **EVAL})
    ctx, method, state = _setup("fedphd", over={"data.clients": 2}, data=tiny_data)
    plan = method.client_view(state, 0, ctx.at_round(1))
    live = method.deployed_mask(state, ctx)
    # the deployed model is the pruned network: what every client trains, fewer entries than the flat vector
    assert live is not None and torch.equal(live, plan.step.mask) and int(live.sum()) == plan.trained_params < ctx.layout.total
    # execute: a small run, through the life cycle (Γ* in rounds.jsonl and metrics.json)
    d = run(cfg, tmp_path, data=tiny_data, progress=False)
    rows = [json.loads(x) for x in (d / "rounds.jsonl").read_text().splitlines()]
    # assert: every client trains the whole pruned network: Γ = the clients, nothing uncovered, w² = 0
    assert len(rows) == 2
    for row in rows:
        assert row["clients"] == [0, 1]
        assert row["gamma"] == 2 and row["gamma_star"] == 2
        assert row["uncovered_fraction"] == 0.0 and row["w2"] == 0.0
    assert json.loads((d / "metrics.json").read_text())["gamma_star"] == 2
    # the same round counted over the flat vector would read Γ = 0 (the pruned channels are in it, untrained)
    assert _hand(state.params, [plan.step.mask] * 2)[0] == 0


def test_fedphd_under_edges_counts_every_update_of_the_cloud_round(tiny_data):
    # prepare: 4 clients, 2 edges, 2 edge rounds: 8 updates per cloud round, each of the whole pruned network
    ctx, method, state = _setup("fedphd", over={"system.edges": 2, "system.edge_rounds": 2}, data=tiny_data)
    # execute
    state, row = Hierarchical(method, ctx).step(state, 1)
    # assert
    assert len(row["clients"]) == 8
    assert row["gamma"] == 8 and row["uncovered_fraction"] == 0.0 and row["w2"] == 0.0


def test_fedphd_before_pruning_deploys_the_full_model(tiny_data):
    # prepare: prune after one round of the full model
    ctx, method, state = _setup("fedphd", {"prune_round": 1}, {"data.clients": 2}, tiny_data)
    assert method.deployed_mask(state, ctx) is None
    # execute / assert: round 1 trains (and counts) the full model, round 2 the pruned one
    state, row1 = train_round(method, state, ctx, 1)
    assert method.deployed_mask(state, ctx) is None
    assert (row1["gamma"], row1["uncovered_fraction"], row1["w2"]) == (2, 0.0, 0.0)
    state, row2 = train_round(method, state, ctx, 2)
    live = method.deployed_mask(state, ctx)
    assert live is not None and int(live.sum()) == row2["trained_params"][0] < ctx.layout.total
    assert (row2["gamma"], row2["uncovered_fraction"], row2["w2"]) == (2, 0.0, 0.0)


# -- FjORD: the widths its clients drew -------------------------------------------------------------------

def test_fjord_counts_the_widths_drawn_not_the_prefix_held(tiny_data):
    # prepare: two clients of capacity 1.0 (each holds the full model), P = uniform-5, 2 steps each;
    # a round in which neither drew width 1.0
    ctx, method, state = _setup("fjord", {"rate": 1.0}, {"data.clients": 2}, tiny_data)

    def widest(r: int, k: int) -> float:
        return max(method.client_view(state, k, ctx.at_round(r)).step.network.widths)

    r = next(r for r in range(1, 50) if widest(r, 0) < 1.0 and widest(r, 1) < 1.0)
    drawn = [widest(r, k) for k in (0, 1)]
    plans = [method.client_view(state, k, ctx.at_round(r)) for k in (0, 1)]
    assert all(p.step.mask is None for p in plans)  # each holds (and sends) the whole model
    assert method.deployed_mask(state, ctx) is None  # a capacity-1 client: FjORD deploys the full model
    # the hand masks: the leading channels of each client's widest drawn width (the drawn prefixes are nested)
    masks = [build_submodel(ctx, p, scaler=False, choose=leading).mask for p in drawn]
    for plan, m in zip(plans, masks):
        assert torch.equal(plan.trained_mask, m)
    gamma, uncovered, w2 = _hand(state.params, masks)
    # execute
    new, row = train_round(method, state, ctx, r)
    # assert: the outer units (beyond the widest drawn width) count as untrained, and were (no gradient reached them)
    outer = torch.stack(masks).sum(0) == 0
    torch.testing.assert_close(new.params[outer], state.params[outer], rtol=1e-6, atol=0.0)
    assert row["clients"] == [0, 1]
    assert gamma == 0 and row["gamma"] == 0
    assert uncovered > 0 and row["uncovered_fraction"] == pytest.approx(uncovered, rel=1e-12)
    assert row["uncovered_fraction"] == pytest.approx(1 - float(masks[drawn.index(max(drawn))].mean()), rel=1e-6)
    assert w2 > 0 and row["w2"] == pytest.approx(w2, rel=1e-9)
    # the first conv's outermost output channel is beyond every drawn width: neither client trained it
    assert all(not bool(_first_conv(ctx, m)[-1].any()) and bool(_first_conv(ctx, m)[0].all()) for m in masks)


def test_fjord_round_where_a_client_drew_the_full_width_covers_everything(tiny_data):
    ctx, method, state = _setup("fjord", {"rate": 1.0}, {"data.clients": 2}, tiny_data)
    r = next(r for r in range(1, 50) if any(max(method.client_view(state, k, ctx.at_round(r)).step.network.widths) >= 1.0
                                           for k in (0, 1)))
    full = [k for k in (0, 1) if max(method.client_view(state, k, ctx.at_round(r)).step.network.widths) >= 1.0]
    _, row = train_round(method, state, ctx, r)
    assert row["gamma"] == len(full) and row["uncovered_fraction"] == 0.0


# -- HeteroFL and FedRolex: their windows -----------------------------------------------------------------

@pytest.mark.parametrize("name", ["heterofl", "fedrolex"])
def test_width_sub_models_count_their_windows_with_a_full_tier(tiny_data, name):
    # prepare: tiers 1.0 and 0.5 (two clients each); round 2 (FedRolex's window starts one channel later)
    ctx, method, state = _setup(name, over={"system.capacity": "1.0:0.5,0.5:0.5"}, data=tiny_data)
    r = 2
    choose = rolling(r - 1) if name == "fedrolex" else leading
    window = build_submodel(ctx, 0.5, True, choose).mask
    rates = [float(ctx.capacity[k]) for k in range(4)]
    masks = [torch.ones_like(window) if p >= 1.0 else window for p in rates]
    assert method.deployed_mask(state, ctx) is None  # a rate-1 tier: the full model is deployed
    gamma, uncovered, w2 = _hand(state.params, masks)
    # execute
    _, row = train_round(method, state, ctx, r)
    # assert: the least-covered channel (outside the half window) is held by the rate-1 clients only
    assert row["clients"] == [0, 1, 2, 3]
    assert row["gamma"] == gamma == rates.count(1.0) == 2
    assert row["uncovered_fraction"] == uncovered == 0.0
    assert row["w2"] == pytest.approx(w2, rel=1e-9) and w2 > 0


def test_fedrolex_counts_the_window_of_the_round(tiny_data):
    # prepare: every client at rate 0.5 (FedRolex deploys the full model): the round's window by hand
    ctx, method, state = _setup("fedrolex", data=tiny_data)
    C = ctx.model.inp.out_channels
    assert C == ctx.model_spec.channels  # the first conv's outputs are the base width: c' = ceil(0.5 C)
    kept = narrow_width(C, 0.5)
    assert method.deployed_mask(state, ctx) is None
    for r in (1, 2):
        window = build_submodel(ctx, 0.5, True, rolling(r - 1)).mask
        # the first conv's output channels: (r - 1 + i) mod C, i < c' (the paper's rolling extraction)
        first = _first_conv(ctx, window)
        held = {o for o in range(C) if bool(first[o].all())}
        assert held == {(r - 1 + i) % C for i in range(kept)} and not any(bool(first[o].any()) for o in set(range(C)) - held)
        gamma, uncovered, w2 = _hand(state.params, [window] * 4)
        # execute
        new, row = train_round(method, state, ctx, r)
        # assert
        assert row["gamma"] == gamma == 0
        assert row["uncovered_fraction"] == pytest.approx(uncovered, rel=1e-12) and 0 < uncovered < 1
        assert row["w2"] == pytest.approx(w2, rel=1e-9)
        state = new
    # another round's window is another set of entries: round 2's w² is not round 1's window's
    w1 = _hand(state.params, [build_submodel(ctx, 0.5, True, rolling(0)).mask])[2]
    w2_ = _hand(state.params, [build_submodel(ctx, 0.5, True, rolling(1)).mask])[2]
    assert not math.isclose(w1, w2_, rel_tol=1e-6)


def test_heterofl_without_a_full_tier_deploys_its_widest_sub_model(tiny_data):
    # prepare: every client at rate 0.5: HeteroFL samples the rate-0.5 network, which every client trains
    ctx, method, state = _setup("heterofl", data=tiny_data)
    live = method.deployed_mask(state, ctx)
    assert live is not None and torch.equal(live, build_submodel(ctx, 0.5, True, leading).mask)
    # execute
    _, row = train_round(method, state, ctx, 1)
    # assert
    assert (row["gamma"], row["uncovered_fraction"], row["w2"]) == (4, 0.0, 0.0)


# -- FedAvg and random pruning: unchanged -----------------------------------------------------------------

def test_fedavg_counts_every_aggregated_client(tiny_data):
    ctx, method, state = _setup("fedavg", data=tiny_data)
    assert method.deployed_mask(state, ctx) is None
    _, row = train_round(method, state, ctx, 1)
    assert row["clients"] == [0, 1, 2, 3]
    assert (row["gamma"], row["uncovered_fraction"], row["w2"]) == (4, 0.0, 0.0)


def test_random_prune_matches_a_hand_count_from_its_masks(tiny_data):
    # prepare: keep 0.5; the round's masks as the clients' plans draw them (seeded by round and client)
    ctx, method, state = _setup("random_prune", {"keep_ratio": 0.5}, data=tiny_data)
    assert method.deployed_mask(state, ctx) is None
    masks = [method.client_view(state, k, ctx.at_round(1)).step.mask for k in range(4)]
    gamma, uncovered, w2 = _hand(state.params, masks)
    # execute
    _, row = train_round(method, state, ctx, 1)
    # assert
    assert row["clients"] == [0, 1, 2, 3]
    assert row["gamma"] == gamma
    assert row["uncovered_fraction"] == pytest.approx(uncovered, rel=1e-12) and uncovered > 0
    assert row["w2"] == pytest.approx(w2, rel=1e-9) and w2 > 0
