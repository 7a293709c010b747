"""FedPhD (Long et al. 2025): the homogeneity score, the edge selection and the cloud weights against
hand-computed numbers, the seeded draws of a round's clients from the loads at its start, the channel
spaces of the tiny UNet traced by hand, the pruned channel choice on hand-made weights (and a channel
with no weight left pruned in every layer it couples), the pruned network's forward against a narrow
UNet loaded by hand, bits and sizes, prune_ratio 0 == FedAvg bitwise, pruning after a round, refusals."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dfbench import methods
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.core.config import ConfigError
from dfbench.benchmark.core.presets import unet_spec
from dfbench.benchmark.core.seeds import np_rng
from dfbench.benchmark.engine.context import build_context
from dfbench.benchmark.engine.model import UNet
from dfbench.benchmark.engine.training import train_round
from dfbench.datasets import Partition
from dfbench.methods.fedphd import (KEEP_KEY, ChannelSpace, channel_importance, channel_spaces, cloud_weight,
                                    homogeneity, keep_most_important, pruned_specs, pruned_width, selection_probabilities)
from helpers import tiny_config

SMALL = {"data.clients": 2, "train.local_steps": 2, "train.rounds": 2}


# -- homogeneity, selection, cloud weights ----------------------------------------------------------

def test_the_homogeneity_score_is_two_minus_the_l2_distance_to_uniform():
    q = np.full(4, 0.25)
    # [.5, .5, 0, 0] - .25 = [.25, .25, -.25, -.25]: norm sqrt(4 / 16) = 0.5
    assert homogeneity(np.array([0.5, 0.5, 0.0, 0.0]), q) == pytest.approx(1.5, abs=1e-12)
    assert homogeneity(q, q) == 2.0  # balanced
    assert homogeneity(np.array([1.0, 0, 0, 0]), q) == pytest.approx(2 - math.sqrt(0.75 ** 2 + 3 * 0.25 ** 2), abs=1e-12)
    assert homogeneity(np.array([[1.0, 0.0], [0.5, 0.5]]), np.full(2, 0.5)).tolist() == pytest.approx([2 - math.sqrt(0.5), 2.0])


def test_selection_weighs_the_edge_mix_if_the_client_joined_against_the_edge_load():
    # prepare: two classes; edge 0 aggregated 10 images of class 0, edge 1 nothing; the client holds 10 of class 1
    edges, client = np.array([[10.0, 0.0], [0.0, 0.0]]), np.array([0.0, 10.0])
    # execute
    p = selection_probabilities(edges, client, select_a=100.0)
    # assert: edge 0 with the client is [.5, .5]: SH 2, score 100 * 2 - 10 = 190; edge 1 is [0, 1]:
    # SH 2 - sqrt(.5), score 100 SH - 0
    s = np.array([190.0, 100 * (2 - math.sqrt(0.5))]) + 1e-8
    np.testing.assert_allclose(p, s / s.sum(), rtol=1e-12)
    assert p[0] > p[1]  # homogeneity attracts
    # a loaded edge is repelled: its score is floored at 0 (+ 1e-8)
    p = selection_probabilities(np.array([[500.0, 500.0], [0.0, 0.0]]), client, select_a=100.0)
    assert p[0] == pytest.approx(1e-8 / (1e-8 + 100 * (2 - math.sqrt(0.5)) + 1e-8), rel=1e-9)


def test_the_cloud_weight_is_relu_of_size_plus_a_times_homogeneity_plus_b():
    # counts [3, 1]: P = [.75, .25], ||P - [.5, .5]|| = sqrt(2) / 4, SH = 2 - 0.35355339...
    sh = 2 - math.sqrt(2) / 4
    assert cloud_weight(100.0, np.array([3, 1]), a=10.0, b=-5.0) == pytest.approx(100 + 10 * sh - 5, abs=1e-12)
    assert cloud_weight(0.0, np.array([3, 1]), a=1.0, b=-10.0) == 0.0  # the ReLU
    assert cloud_weight(50.0, np.array([0, 0]), a=1.0, b=0.0) == 0.0  # an edge that aggregated nothing


def _hand_ctx(round_: int = 3) -> SimpleNamespace:
    """Four clients over two classes: client 0 holds labels (0, 0), 1 (1, 1, 1), 2 (0, 1), 3 (1,)."""
    labels = np.array([0, 0, 1, 1, 1, 0, 1, 1])
    part = Partition(indices=(np.array([0, 1]), np.array([2, 3, 4]), np.array([5, 6]), np.array([7])),
                     cluster_of_client=None, spec="hand")
    return SimpleNamespace(labels=labels, partition=part, client_sizes=np.array([2, 3, 2, 1]), num_clients=4,
                           round=round_, rng=lambda *keys: np_rng(7, *keys))


def test_the_cloud_weights_of_the_edges_by_hand():
    # prepare: edge 0 aggregated clients (0, 1) then (0,); edge 1 aggregated (2, 3); edge 2 nothing
    method = methods.create_method("fedphd", agg_a=10.0, agg_b=1.0)
    loads = [methods.EdgeLoad(rounds=((0, 1), (0,))), methods.EdgeLoad(rounds=((2, 3),)), methods.EdgeLoad()]
    # execute
    w = method.cloud_weights(loads, _hand_ctx())
    # assert: edge 0: labels of clients 0, 1, 0 = [4, 3] (per participation), n_e = client 0's 2 (its last
    # aggregation); edge 1: [1, 2], n_e = 3; edge 2: 0
    sh0 = 2 - math.sqrt((4 / 7 - 0.5) ** 2 * 2)
    sh1 = 2 - math.sqrt((1 / 3 - 0.5) ** 2 * 2)
    assert w == pytest.approx([2 + 10 * sh0 + 1, 3 + 10 * sh1 + 1, 0.0], abs=1e-12)


def test_a_rounds_clients_draw_their_edges_from_the_loads_at_its_start():
    # prepare: edge 0 holds client 1's three images of class 1, edge 1 nothing
    method = methods.create_method("fedphd", select_a=10.0)
    ctx = _hand_ctx(round_=3)
    loads = [methods.EdgeLoad(rounds=((1,),)), methods.EdgeLoad()]
    # execute
    got = method.assign_edges([0, 2, 3], loads, ctx)
    # assert: every client's probabilities from the same loads, drawn in client order from ("fedphd", "edges", 3)
    rng = np_rng(7, "fedphd", "edges", 3)
    hist = {0: [2, 0], 2: [1, 1], 3: [0, 1]}
    expected = [int(rng.choice(2, p=selection_probabilities(np.array([[0.0, 3.0], [0.0, 0.0]]), np.array(hist[k]), 10.0)))
                for k in (0, 2, 3)]
    assert got == expected
    assert got == method.assign_edges([0, 2, 3], loads, ctx)  # seeded: the same draws again
    # client 0 (class 0) joining edge 0 balances it: [2, 3] / 5, SH = 2 - sqrt(2) / 10, score 10 SH - 3;
    # edge 1 alone: [1, 0], SH 2 - sqrt(.5), score 10 SH
    p = selection_probabilities(np.array([[0.0, 3.0], [0.0, 0.0]]), np.array([2.0, 0.0]), 10.0)
    s = np.array([10 * (2 - math.sqrt(2) / 10) - 3, 10 * (2 - math.sqrt(0.5))]) + 1e-8
    np.testing.assert_allclose(p, s / s.sum(), rtol=1e-12)


# -- the channel spaces and the pruned choice ------------------------------------------------------------

def test_the_tiny_unets_channel_spaces_by_hand(tiny_data):
    # The tiny preset (channels 8, mults (1, 2), one block, no attention), traced by hand: the time MLP's two
    # spaces (32), then S0 = inp's output = down.0's (identity skip) output, down.0's inner space, the
    # downsample's output, down.2's inner and output spaces (16), mid.0's and mid.2's inner spaces (their
    # outputs: down.2's, identity skips), then per up block its inner space and its output.
    ctx = build_context(tiny_config("fedphd", over=SMALL), data=tiny_data)
    spaces = channel_spaces(ctx.model)
    assert [s.size for s in spaces] == [32, 32, 8, 8, 8, 16, 16, 16, 16, 16, 16, 16, 16, 16, 8, 8, 8, 8]
    s0 = {(n, d, o) for n, d, o in spaces[2].slices}
    # the residual stream of level 0 and the skips it feeds: up.3 and up.4 read it after 16 and 8 channels of h
    assert {("inp.weight", 0, 0), ("down.0.0.conv2.weight", 0, 0), ("down.0.0.conv1.weight", 1, 0),
            ("down.1.0.weight", 1, 0), ("up.3.0.conv1.weight", 1, 16), ("up.3.0.skip.weight", 1, 16),
            ("up.4.0.norm1.weight", 0, 8), ("up.4.0.conv1.weight", 1, 8)} <= s0
    # every parameter dim of the UNet is in a space, or whole (the image channels, the sinusoidal features)
    covered = {(n, d) for s in spaces for n, d, _ in s.slices}
    whole = {(n, d) for n, p in ctx.model.named_parameters() for d in range(p.dim()) if (n, d) not in covered}
    assert whole == {("inp.weight", 1), ("time.0.weight", 1), ("out.2.weight", 0), ("out.2.bias", 0)} | {
        (n, d) for n, p in ctx.model.named_parameters() if p.dim() == 4 for d in (2, 3)}


def test_the_importance_of_a_channel_is_the_sum_of_its_weights_squares():
    # prepare: a space of 3 channels: the outputs of a conv w [3, 2, 1, 1], the inputs of a linear v [2, 3],
    # a GroupNorm scale g [3] and the conv's bias b [3] (not a weight: ignored)
    w = torch.tensor([[1.0, 1.0], [2.0, 0.0], [0.0, 0.5]]).reshape(3, 2, 1, 1)
    v = torch.tensor([[1.0, 0.0, 3.0], [1.0, 1.0, 0.0]])
    g, b = torch.tensor([1.0, 1.0, 0.5]), torch.tensor([100.0, 100.0, 100.0])
    space = ChannelSpace(size=3, slices=[("conv.weight", 0, 0), ("lin.weight", 1, 0), ("norm.weight", 0, 0), ("conv.bias", 0, 0)])
    # execute
    imp = channel_importance({"conv.weight": w, "lin.weight": v, "norm.weight": g, "conv.bias": b}, space)
    # assert: channel 0: 1 + 1 + 1 + 1 + 1 = 5; channel 1: 4 + 0 + 1 + 1 = 6; channel 2: 0.25 + 9 + 0 + 0.25
    assert imp.tolist() == [5.0, 6.0, 9.5]
    assert keep_most_important(imp, 2).tolist() == [1, 2]
    assert keep_most_important(torch.tensor([1.0, 3.0, 1.0, 2.0]), 3).tolist() == [0, 1, 3]  # a tie: the lower index
    # a space at an offset inside a wider dim (the second block of a cat([h, skip]) input): rows 2..3 of x
    x = torch.tensor([[9.0, 9.0, 9.0], [9.0, 9.0, 9.0], [1.0, 2.0, 0.0], [0.0, 0.0, 0.5]])
    assert channel_importance({"x.weight": x}, ChannelSpace(size=2, slices=[("x.weight", 0, 2)])).tolist() == [5.0, 0.25]


def test_a_channel_without_weight_is_pruned_in_every_layer_it_couples(tiny_data):
    # prepare: channel 5 of S0 (inp's outputs, level 0's residual stream and skips) gets zero weights
    # everywhere it appears; the other weights are the seeded initial ones
    ctx = build_context(tiny_config("fedphd", over=SMALL), data=tiny_data)
    params = ctx.init_params.clone()
    views = {n: params[sl].view(s) for n, sl, s in ctx.layout.slices()}
    s0 = channel_spaces(ctx.model)[2]
    for name, dim, offset in s0.slices:
        if name.endswith("weight"):
            views[name].narrow(dim, offset + 5, 1).zero_()
    method = methods.create_method("fedphd")
    # execute
    keep = method.choose_channels(params, ctx)
    # assert: tiny at ratio 0.2 has base width ceil(6.4) = 7: each 8-channel space keeps 7, each 16 keeps 14
    assert pruned_width(8, 0.2) == 7 and [len(k) for k in keep] == [s.size // 8 * 7 for s in channel_spaces(ctx.model)]
    assert keep[2].tolist() == [0, 1, 2, 3, 4, 6, 7]
    with torch.device("meta"):
        narrow = UNet(1, replace(unet_spec("tiny"), channels=7))
        narrow.time[0] = torch.nn.Linear(8, 28)
    specs = pruned_specs(ctx.model, narrow, channel_spaces(ctx.model), keep)
    assert specs["inp.weight"].index[0].tolist() == [0, 1, 2, 3, 4, 6, 7] and specs["inp.weight"].index[1] is None
    assert specs["down.0.0.conv2.bias"].index[0].tolist() == [0, 1, 2, 3, 4, 6, 7]
    assert specs["up.3.0.conv1.weight"].index[1][14:].tolist() == [16, 17, 18, 19, 20, 22, 23]  # h's 14 kept, then S0
    assert all(s.scale == 1.0 for s in specs.values())  # pruning does not rescale


def _hand_pruned(full: torch.nn.Module, specs: dict) -> UNet:
    """The pruned tiny UNet (base width 7) as a real network, loaded by hand from the kept slices."""
    torch.manual_seed(0)
    narrow = UNet(1, replace(unet_spec("tiny"), channels=7))
    narrow.base, narrow.time[0] = 8, torch.nn.Linear(8, 28)
    fp = dict(full.named_parameters())
    with torch.no_grad():
        for name, q in narrow.named_parameters():
            p = fp[name]
            for d, ix in enumerate(specs[name].index):
                if ix is not None:
                    p = p.index_select(d, ix)
            q.copy_(p)
    return narrow


def test_the_clients_train_the_pruned_network(tiny_data):
    # prepare
    ctx = build_context(tiny_config("fedphd", over=SMALL), data=tiny_data)
    method = methods.create_method("fedphd")
    state = method.init_state(ctx.init_params, ctx)
    plan = method.client_view(state, 0, ctx.at_round(1))
    sub = method.pruned(state, ctx.at_round(1))
    narrow = _hand_pruned(ctx.model, sub.model.specs)
    x, t = torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(1)), torch.tensor([0.1, 0.5, 0.9])
    # execute / assert: the client's network is the dense narrow UNet on the kept slices
    ctx.flat.copy_(state.params)
    with torch.no_grad():
        torch.testing.assert_close(sub.model(x, t), narrow(x, t), rtol=1e-5, atol=1e-6)
    kept = sum(q.numel() for q in narrow.parameters())
    assert plan.step.network is sub.model and plan.trained_params == kept == int(plan.step.mask.sum()) < ctx.layout.total
    assert plan.downlink_bits == 32 * kept and method.model_bits(state, ctx) == 32 * kept
    assert 0.5 < plan.flop_fraction < 0.9  # measured: about 0.77 of the full tiny UNet
    new, row = train_round(method, state, ctx, 1)
    assert row["uplink_bits"] == 2 * 32 * kept and row["trained_params"] == [kept, kept]
    # pruned entries are never trained
    assert torch.equal(new.params[plan.step.mask == 0], state.params[plan.step.mask == 0])
    assert not torch.equal(new.params, state.params)


def test_prune_ratio_zero_is_fedavg_bitwise(tiny_data):
    out = {}
    for name, params in (("fedavg", {}), ("fedphd", {"prune_ratio": 0.0})):
        cfg = tiny_config(name, params, SMALL)
        ctx = build_context(cfg, data=tiny_data)
        m = methods.create_method(name, **params)
        state = m.init_state(ctx.init_params, ctx)
        for r in (1, 2):
            state, row = train_round(m, state, ctx, r)
        out[name] = (state.params, runfolder.without_wall_clock(row))
    assert torch.equal(out["fedavg"][0], out["fedphd"][0]) and out["fedavg"][1] == out["fedphd"][1]


def test_prune_round_trains_the_full_model_first_then_prunes_the_model_it_reached(tiny_data):
    ctx = build_context(tiny_config("fedphd", {"prune_round": 1}, SMALL), data=tiny_data)
    method = methods.create_method("fedphd", prune_round=1)
    state = method.init_state(ctx.init_params, ctx)
    assert KEEP_KEY not in state.extra
    state, row1 = train_round(method, state, ctx, 1)
    assert row1["trained_params"] == [ctx.layout.total] * 2 and KEEP_KEY not in state.extra
    expected = method.choose_channels(state.params, ctx)  # by the model after round 1
    state, row2 = train_round(method, state, ctx, 2)
    assert all(torch.equal(a, b) for a, b in zip(state.extra[KEEP_KEY], expected))
    assert row2["trained_params"][0] < ctx.layout.total


@pytest.mark.parametrize("over,params,needle", [
    ({"train.model": "diffusers-tiny"}, {}, "width-aware network"),
    ({"train.clients_mode": "batched"}, {}, "train.clients_mode=batched"),
    ({}, {"prune_ratio": 1.0}, "method.prune_ratio"),
    ({}, {"select_a": 0.0}, "method.select_a"),
])
def test_refusals(over, params, needle):
    with pytest.raises(ConfigError, match=needle):
        tiny_config("fedphd", params, over)
    tiny_config("fedphd", {"prune_ratio": 0.0}, {"train.clients_mode": "batched"})  # no pruning: FedAvg, batched
