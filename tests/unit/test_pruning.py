"""random_prune / topk_prune: masks, masked aggregation, bit and FLOP accounting, and the
loop's bound diagnostics (Gamma_r, Gamma*, uncovered fraction, w^2, sigma_2^2)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dfbench import methods
from dfbench.benchmark.engine import lifecycle
from dfbench.benchmark.core.config import ConfigError
from dfbench.benchmark.engine.context import build_context
from dfbench.benchmark.engine.model import Layout, flatten_
from dfbench.benchmark.core.seeds import torch_gen
from helpers import final_params, local_train_kw, tiny_config
from dfbench.methods.pruning import (INFERENCE_MODES, SEED_BITS, flop_fraction, keep_count, magnitude_mask, prunable_tensors, random_mask,
                             top_k_mask, weight_macs)

PRUNERS = ["random_prune", "topk_prune"]
# the defaults chosen from the measurements on docs/methods.md ("The inference rule")
DEFAULT_INFERENCE = {"random_prune": "scaled", "topk_prune": "submodel"}


def rows_of(d: Path) -> list[dict]:
    return [json.loads(x) for x in (d / "rounds.jsonl").read_text().splitlines()]


# -- keep ratio 1.0 is FedAvg --------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("inference", INFERENCE_MODES)
@pytest.mark.parametrize("name", PRUNERS)
def test_keep_ratio_one_equals_fedavg_bitwise(tmp_path, tiny_data, name, inference):
    base = run_tiny("fedavg", {}, tmp_path / "a", tiny_data)
    pruned = run_tiny(name, {"keep_ratio": 1.0, "inference": inference}, tmp_path / "b", tiny_data)
    assert torch.equal(final_params(base), final_params(pruned))
    # the samples too: every inference rule leaves a model nobody pruned untouched
    with np.load(base / "samples.npz") as a, np.load(pruned / "samples.npz") as b:
        assert np.array_equal(a["images"], b["images"])
    P = build_context(tiny_config(), data=tiny_data).layout.total
    for ra, rb in zip(rows_of(base), rows_of(pruned)):
        assert (ra["uplink_bits"], ra["downlink_bits"], ra["client_loss"]) == (rb["uplink_bits"], rb["downlink_bits"], rb["client_loss"])
        assert rb["gamma"] == 4 and rb["w2"] == 0.0 and rb["uncovered_fraction"] == 0.0
        assert rb["trained_params"] == [P] * 4


def run_tiny(name: str, params: dict, out: Path, data, over: dict | None = None) -> Path:
    return lifecycle.run(tiny_config(name, params, over), out, data=data, progress=False)


# -- masked aggregation on hand-built tensors ----------------------------------------------

class _AggCtx:
    class layout:
        total = 4

    client_sizes = np.array([1, 3])
    round_weight = 4.0


@pytest.mark.parametrize("mode,expected", [
    # p = (1/4, 3/4). covered: mean over the clients that trained each entry; entry 3 untrained keeps 40
    ("covered", [0.25 * 1 + 0.75 * 5, 2.0, 7.0, 40.0]),
    # zero_fill: theta + sum_k p_k m_k (theta_k - theta): a pruned entry counts as a zero update
    ("zero_fill", [10 + 0.25 * (1 - 10) + 0.75 * (5 - 10), 20 + 0.25 * (2 - 20), 30 + 0.75 * (7 - 30), 40.0]),
])
@pytest.mark.parametrize("name", PRUNERS)
def test_masked_aggregation_equals_hand_computed(name, mode, expected):
    # prepare: global (10, 20, 30, 40); client 0 (n=1) trained entries 0,1; client 1 (n=3) entries 0,2
    m = methods.create_method(name, keep_ratio=0.5, masked_mean=mode)
    state = methods.ServerState(params=torch.tensor([10.0, 20.0, 30.0, 40.0]))
    ups = [
        methods.Upload(params=torch.tensor([1.0, 2.0, 0.0, 0.0]), weight=1.0, uplink_bits=1, mask=torch.tensor([1.0, 1.0, 0.0, 0.0])),
        methods.Upload(params=torch.tensor([5.0, 0.0, 7.0, 0.0]), weight=3.0, uplink_bits=1, mask=torch.tensor([1.0, 0.0, 1.0, 0.0])),
    ]
    acc = m.new_accumulator(state, _AggCtx)
    # execute
    for up in ups:
        m.accumulate(acc, up, _AggCtx)
    new = m.apply(state, acc, _AggCtx)
    # assert: 0.25 + 3.75 = 4; 2; 7; 40 (covered) and 4; 15.5; 12.75; 40 (zero_fill)
    np.testing.assert_allclose(new.params.numpy(), np.array(expected), rtol=1e-6)


# -- mask construction -------------------------------------------------------------------

# a.weight [2,3], a.bias [3], b.weight [4,1]: 13 entries; biases are not prunable by default
LAYOUT = Layout(names=("a.weight", "a.bias", "b.weight"), shapes=((2, 3), (3,), (4, 1)), offsets=(0, 6, 9), total=13)
THETA = torch.tensor([0.5, -3.0, 1.0, 2.0, -0.1, 3.0, 9.0, 9.0, 9.0, 1.0, -1.0, 1.0, 0.2])


@pytest.mark.parametrize("keep,scope,biases,expected", [
    # layer: a.weight keeps 3 of 6 (|3| at 1 and 5, then 2 at 3); b.weight 2 of 4: ties at |1| -> indices 9, 10
    (0.5, "layer", False, [0, 1, 0, 1, 0, 1, 1, 1, 1, 1, 1, 0, 0]),
    # layer, keep 1/3: a.weight keeps 2 (the two |3|, tie kept in index order), b.weight keeps round(4/3) = 1
    (1 / 3, "layer", False, [0, 1, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0]),
    # global: pool of 10 weights keeps 5: 3, 3, 2, then the first two of the |1| ties (indices 2 and 9)
    (0.5, "global", False, [0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 0, 0]),
    # prune_biases: the bias (three 9s) keeps round(1.5) = 2, the first two by index
    (0.5, "layer", True, [0, 1, 0, 1, 0, 1, 1, 1, 0, 1, 1, 0, 0]),
])
def test_topk_keeps_the_k_largest_magnitudes_ties_by_index(keep, scope, biases, expected):
    mask = magnitude_mask(THETA, LAYOUT, keep, prunable_tensors(LAYOUT, biases), scope)
    assert mask.tolist() == [float(x) for x in expected]


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.floats(-100, 100, allow_nan=False, width=32), min_size=1, max_size=40),
       keep=st.floats(0.01, 1.0))
def test_top_k_mask_property(values, keep):
    scores = torch.tensor(values).abs()
    k = keep_count(len(values), keep)
    kept = top_k_mask(scores, k)
    assert int(kept.sum()) == k
    if k < len(values):  # every kept magnitude >= every pruned one
        assert scores[kept].min() >= scores[~kept].max()


def test_keep_count_rounds_half_up_and_keeps_at_least_one():
    assert [keep_count(n, k) for n, k in [(6, 0.5), (3, 0.5), (4, 1 / 3), (10, 0.01), (7, 1.0), (5, 0.3)]] == [3, 2, 1, 1, 7, 2]


def test_random_mask_exact_count_per_tensor_seeded_and_biases_kept():
    prunable = prunable_tensors(LAYOUT, False)
    a = random_mask(LAYOUT, 0.5, prunable, torch_gen(0, "mask", 1, 0))
    b = random_mask(LAYOUT, 0.5, prunable, torch_gen(0, "mask", 1, 0))
    assert torch.equal(a, b)
    assert a[0:6].sum() == 3 and a[9:13].sum() == 2 and a[6:9].tolist() == [1.0, 1.0, 1.0]
    draws = {tuple(random_mask(LAYOUT, 0.5, prunable, torch_gen(0, "mask", r, c)).tolist()) for r in range(4) for c in range(4)}
    assert len(draws) > 8  # 20 * 6 possible masks: 16 draws are not all the same


def test_random_masks_fresh_per_client_and_round_through_the_method(tiny_data):
    ctx = build_context(tiny_config("random_prune"), data=tiny_data)
    m = methods.create_method("random_prune", keep_ratio=0.5)
    state = methods.ServerState(params=ctx.init_params.clone())
    plans = {}
    for r in (1, 2):
        for k in (0, 1):
            plans[r, k] = m.client_view(state, k, ctx.at_round(r))
    masks = [p.step.mask for p in plans.values()]
    assert all(not torch.equal(masks[i], masks[j]) for i in range(4) for j in range(i))
    assert torch.equal(m.client_view(state, 0, ctx.at_round(1)).step.mask, plans[1, 0].step.mask)  # seeded by (seed, round, client)
    for p in plans.values():  # the client starts from theta * m
        assert torch.equal(p.start, state.params * p.step.mask)


def test_topk_global_one_mask_per_round_recomputed_from_new_weights(tiny_data):
    ctx = build_context(tiny_config("topk_prune"), data=tiny_data)
    m = methods.create_method("topk_prune", keep_ratio=0.3, scope="global")
    w = prunable_tensors(ctx.layout, False)
    pool = sum(n for n, p in zip(ctx.layout.numels, w) if p)
    state = methods.ServerState(params=ctx.init_params.clone())
    ctx = ctx.at_round(1)
    a, b = m.client_view(state, 0, ctx), m.client_view(state, 3, ctx)
    assert torch.equal(a.step.mask, b.step.mask) and a.trained_params == ctx.layout.total - pool + keep_count(pool, 0.3)
    # global scope: one threshold, so the smallest kept |weight| >= the largest pruned one across tensors
    prunable = torch.cat([torch.full((n,), p) for n, p in zip(ctx.layout.numels, w)])
    mag = state.params.abs()
    assert mag[prunable & (a.step.mask == 1)].min() >= mag[prunable & (a.step.mask == 0)].max()
    # next round's global weights: the mask follows them (no stale cache)
    new = methods.ServerState(params=state.params.flip(0))
    ctx = ctx.at_round(2)
    assert torch.equal(m.client_view(new, 0, ctx).step.mask, magnitude_mask(new.params, ctx.layout, 0.3, w, "global"))
    assert not torch.equal(m.client_view(new, 0, ctx).step.mask, a.step.mask)


def test_capacity_tiers_override_keep_ratio(tiny_data):
    ctx = build_context(tiny_config("topk_prune", over={"system.capacity": "1.0:0.5,0.5:0.5"}), data=tiny_data)
    m = methods.create_method("topk_prune", keep_ratio=0.2)
    state = methods.ServerState(params=ctx.init_params.clone())
    ctx = ctx.at_round(1)
    w = prunable_tensors(ctx.layout, False)
    fixed = sum(n for n, p in zip(ctx.layout.numels, w) if not p)
    half = fixed + sum(keep_count(n, 0.5) for n, p in zip(ctx.layout.numels, w) if p)
    for k in range(ctx.num_clients):
        plan = m.client_view(state, k, ctx)
        if ctx.capacity[k] == 1.0:
            assert plan.step.mask is None and plan.trained_params == ctx.layout.total
        else:
            assert plan.trained_params == half == int(plan.step.mask.sum())
    assert sorted(ctx.capacity.tolist()) == [0.5, 0.5, 1.0, 1.0]


@pytest.mark.parametrize("name,key,value", [
    ("random_prune", "keep_ratio", 0.0), ("random_prune", "keep_ratio", 1.5), ("topk_prune", "keep_ratio", float("nan")),
    ("topk_prune", "scope", "row"), ("random_prune", "masked_mean", "mean"), ("random_prune", "scope", "layer"),
])
def test_bad_hyperparameters_are_clear_errors(name, key, value):
    with pytest.raises((KeyError, ValueError), match=f"method.{key}"):
        methods.create_method(name, **{key: value})
    with pytest.raises(ConfigError, match=f"method.{key}"):
        tiny_config(name, {key: value})


def test_config_validate_checks_literals_built_directly():
    with pytest.raises(ValueError, match="method.scope"):
        methods.get_method_class("topk_prune").Config(scope="row").validate()
    with pytest.raises(ValueError, match="method.masked_mean"):
        methods.get_method_class("random_prune").Config(masked_mean="mean").validate()


# -- the client trains the smaller model ------------------------------------------------------

def test_pruned_weights_are_zero_in_forward_pass_and_get_no_update(tiny_data):
    # prepare: a random half-mask on the tiny UNet; record the pruned weights each module sees in forward
    ctx = build_context(tiny_config("random_prune"), data=tiny_data)
    mask = random_mask(ctx.layout, 0.5, prunable_tensors(ctx.layout, False), torch_gen(0, "m"))
    mviews = ctx.layout.views(mask)
    seen: list[float] = []
    hooks = []
    for name, mod in ctx.model.named_modules():
        if isinstance(mod, (nn.Conv2d, nn.Linear)):
            mv = mviews[f"{name}.weight"]
            hooks.append(mod.register_forward_pre_hook(lambda mod, inp, mv=mv: seen.append(float((mod.weight.detach() * (1 - mv)).abs().max()))))
    start = ctx.init_params * mask
    # execute: 3 Adam steps with gradient clipping and the sigma_1 probe on
    res = local_train_kw(ctx.model, ctx.flat, start, ctx.images, ctx.client_indices[0], ctx.get_objective(None), steps=3,
                      batch_size=8, lr=1e-2, gen=torch_gen(0, "c"), mask=mask, grad_clip=1.0, probe_steps=2)
    for h in hooks:
        h.remove()
    # assert: every forward saw zeros at pruned weights; pruned entries are exactly zero after training
    assert len(seen) >= 3 * 10 and max(seen) == 0.0
    assert torch.equal(res.params[mask == 0], torch.zeros(int((mask == 0).sum())))
    moved = (res.params != start) & (mask == 1)
    assert int(moved.sum()) > 0.5 * int((mask == 1).sum())  # and the kept ones did train


def test_weight_macs_and_flop_fraction_hand_computed():
    # prepare: conv 1->2 3x3 on 4x4 (16 positions), stride-2 conv 2->2 (2x2 = 4 positions), linear 1->4 once
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(1, 2, 3, padding=1)
            self.down = nn.Conv2d(2, 2, 3, stride=2, padding=1)
            self.lin = nn.Linear(1, 4)

        def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            return self.down(self.conv(x)).sum() + self.lin(t[:, None]).sum()

    net = Net()
    _, layout = flatten_(net)
    # execute
    macs = weight_macs(net, layout, (1, 4, 4))
    # assert: 18*16 = 288, 36*4 = 144, 4*1 = 4, biases 0
    expected = {"conv.weight": 288.0, "down.weight": 144.0, "lin.weight": 4.0, "conv.bias": 0.0, "down.bias": 0.0, "lin.bias": 0.0}
    assert dict(zip(layout.names, macs.tolist())) == expected
    mask = torch.ones(layout.total)
    views = layout.views(mask)
    views["conv.weight"].view(-1)[:9] = 0  # half of conv
    views["lin.weight"].zero_()  # none of lin
    assert flop_fraction(mask, layout, macs) == pytest.approx((288 * 0.5 + 144) / 436)


# -- the loop's diagnostics on constructed masks ---------------------------------------------

class FixedMasks(methods.Method):
    """Test method: given masks per (round, client); the client's model is start + a given delta."""

    def __init__(self, masks: dict[int, list[torch.Tensor]], deltas: list[torch.Tensor] | None = None) -> None:
        super().__init__(None)
        self.masks, self.deltas = masks, deltas

    def client_view(self, state, client, ctx):
        m = self.masks[ctx.round][client]
        return methods.ClientPlan(start=state.params * m, step=methods.LocalStep(mask=m))

    def upload(self, local, plan, client, state, ctx):
        up = super().upload(local, plan, client, state, ctx)
        if self.deltas is not None:
            up.params = plan.start + self.deltas[client]
        return up


def _one_pruned_each(P: int, k: int) -> np.ndarray:
    m = np.ones(P, dtype=np.float32)
    m[k::4] = 0  # every parameter is pruned by exactly one of the 4 clients
    return m


@pytest.mark.parametrize("kind", ["one_pruned_each", "random_0.6"])
def test_gamma_uncovered_w2_sigma2_equal_hand_computed(tiny_data, kind):
    # prepare
    cfg = tiny_config(over={"train.local_steps": 1})
    ctx = build_context(cfg, data=tiny_data)
    P = ctx.layout.total
    g = np.random.default_rng(5)
    if kind == "one_pruned_each":
        M = np.stack([_one_pruned_each(P, k) for k in range(4)])
    else:
        M = (g.random((4, P)) < 0.6).astype(np.float32)
    D = (0.01 * g.standard_normal((4, P))).astype(np.float32)
    theta = ctx.init_params.numpy()
    method = FixedMasks({1: [torch.from_numpy(m) for m in M]}, [torch.from_numpy(d) for d in D])
    # execute
    state, row = lifecycle.train_round(method, methods.ServerState(params=ctx.init_params.clone()), ctx, 1)
    # assert: Gamma_r = min_i sum_k m_k[i]; uncovered = share of count 0
    count = M.sum(0)
    assert row["gamma"] == int(count.min()) == (3 if kind == "one_pruned_each" else 0)
    assert row["uncovered_fraction"] == pytest.approx(float((count == 0).mean()), abs=1e-12)
    # w^2 = mean_k ||theta - theta*m_k||^2 / ||theta||^2 (float64)
    t64 = theta.astype(np.float64)
    w2 = np.mean([np.sum((t64 * (1 - m)) ** 2) / np.sum(t64 ** 2) for m in M])
    assert row["w2"] == pytest.approx(w2, rel=1e-9)
    # sigma_2^2 = mean_k ||u_k - mean(u)||^2 with u_k = ((theta*m + d) - theta*m) * m, as float32 arithmetic gives it
    start = theta * M
    U = (((start + D) - start) * M).astype(np.float64)
    assert row["sigma2_sq"] == pytest.approx(np.mean(np.sum((U - U.mean(0)) ** 2, axis=1)), rel=1e-4)
    # and the new global is the n_k-weighted mean over the clients that trained each entry
    p = ctx.client_sizes / ctx.client_sizes.sum()
    wsum, wcov = np.einsum("k,ki->i", p, M * (start + D)), np.einsum("k,ki->i", p, M)
    ref = np.where(wcov > 0, wsum / np.maximum(wcov, 1e-30), theta)
    np.testing.assert_allclose(state.params.numpy(), ref, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_gamma_star_is_the_running_minimum(tmp_path, tiny_data, monkeypatch):
    # prepare: rounds 1 and 3 full masks (Gamma = 4), round 2 every parameter pruned by one client (Gamma = 3)
    cfg = tiny_config(over={"train.rounds": 3, "train.local_steps": 1})
    P = build_context(cfg, data=tiny_data).layout.total
    full = [torch.ones(P)] * 4
    method = FixedMasks({1: full, 2: [torch.from_numpy(_one_pruned_each(P, k)) for k in range(4)], 3: full})
    monkeypatch.setattr(lifecycle.methods, "create_method", lambda name, **kw: method)
    # execute
    rows = rows_of(lifecycle.run(cfg, tmp_path, data=tiny_data, progress=False))
    # assert
    assert [r["gamma"] for r in rows] == [4, 3, 4]
    assert [r["gamma_star"] for r in rows] == [4, 3, 3]
    assert [r["w2"] == 0.0 for r in rows] == [True, False, True]


# -- whole runs at keep 0.5 ------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name", PRUNERS)
def test_pruned_run_completes_with_diagnostics_and_exact_bits(tmp_path, tiny_data, name):
    d = run_tiny(name, {"keep_ratio": 0.5}, tmp_path, tiny_data)
    assert json.loads((d / "status.json").read_text())["state"] == "done"
    layout = build_context(tiny_config(), data=tiny_data).layout
    w = prunable_tensors(layout, False)
    prunable = sum(n for n, p in zip(layout.numels, w) if p)
    kept = (layout.total - prunable) + sum(keep_count(n, 0.5) for n, p in zip(layout.numels, w) if p)
    rows = rows_of(d)
    assert len(rows) == 2
    for row in rows:
        assert row["trained_params"] == [kept] * 4
        assert all(0.45 < f < 0.55 for f in row["flop_fraction"])
        up, down = (32 * kept + SEED_BITS, 32 * kept + SEED_BITS) if name == "random_prune" else (32 * kept, 32 * kept + prunable)
        assert row["client_uplink_bits"] == [up] * 4 and row["client_downlink_bits"] == [down] * 4
        assert row["uplink_bits"] == 4 * up and row["downlink_bits"] == 4 * down
        assert 0.0 < row["w2"] < 1.0 and row["sigma1_sq"] > 0 and row["sigma2_sq"] > 0
        assert row["gamma_star"] == 0 and row["gamma"] == 0  # 4 clients at keep 0.5: some weight goes untrained
        if name == "topk_prune":  # one shared mask: exactly the pruned weights are uncovered
            assert row["uncovered_fraction"] == pytest.approx((layout.total - kept) / layout.total, abs=1e-12)
        else:  # independent masks: about 0.5^4 of the prunable weights
            assert 0.3 * 0.5 ** 4 < row["uncovered_fraction"] < 2 * 0.5 ** 4
    assert torch.isfinite(final_params(d)).all()


# -- inference rules ----------------------------------------------------------------------

class _LinearCtx:
    """What the inference rule reads: one Linear(3 -> 2) layer (weight 6 entries, bias 2)."""

    def __init__(self, sizes: list[int], keeps: list[float] | None) -> None:
        model = nn.Linear(3, 2)
        _, self.layout = flatten_(model)
        self.client_sizes = np.array(sizes)
        self.capacity = None if keeps is None else np.array(keeps)


def _all_masks(n: int, k: int) -> list[torch.Tensor]:
    out = []
    for kept in itertools.combinations(range(n), k):
        m = torch.zeros(n, dtype=torch.float64)
        m[list(kept)] = 1.0
        out.append(m)
    return out


@pytest.mark.parametrize("sizes,keeps,tiers", [
    ([5, 5], None, [(1.0, 0.5)]),  # no tiers: keep 0.5 of 6 weights = 3 kept, C(6,3) = 20 masks
    # tiers: client 0 (n=1) keeps 3 of 6, client 1 (n=3) keeps 2 of 6, client 2 (n=4) dense
    ([1, 3, 4], [0.5, 0.3, 1.0], [(1 / 8, 0.5), (3 / 8, 0.3), (4 / 8, 1.0)]),
])
def test_scaled_rule_is_the_expectation_of_submodel_outputs_for_a_linear_layer(sizes, keeps, tiers):
    # prepare: float64 weights, bias and inputs; the method's scaled parameters
    gen = torch.Generator().manual_seed(3)
    W, b, x = (torch.randn(2, 3, generator=gen, dtype=torch.float64), torch.randn(2, generator=gen, dtype=torch.float64),
               torch.randn(5, 3, generator=gen, dtype=torch.float64))
    ctx = _LinearCtx(sizes, keeps)
    method = methods.create_method("random_prune", keep_ratio=0.5, inference="scaled")
    # execute
    scaled = method.inference_params(torch.cat([W.reshape(-1), b]), ctx)
    y_rule = x @ scaled[:6].reshape(2, 3).T + scaled[6:]
    # assert: E over (client k with probability n_k/n, every mask with exactly round(p_k * 6) entries)
    expected = torch.zeros(5, 2, dtype=torch.float64)
    for p_client, keep in tiers:
        masks = _all_masks(6, keep_count(6, keep))
        expected += p_client * sum(x @ (W * m.reshape(2, 3)).T + b for m in masks) / len(masks)
    assert torch.allclose(y_rule, expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(scaled[6:], b)  # biases are not prunable, so not scaled


def _captured_sampling_params(method, ctx, params) -> torch.Tensor:
    seen = []
    with patch.object(type(ctx), "sample_single", lambda self, p, noise, objective: seen.append(p.clone()) or noise):
        method.sample(params, torch.zeros(2, *ctx.image_shape), ctx)  # (the context is frozen: patched on its class)
    return seen[0]


@pytest.mark.parametrize("keep,inference_keep,seed", [(0.5, 0.0, 0), (0.5, 0.25, 0), (0.5, 0.0, 7)])
def test_submodel_rule_samples_with_exactly_the_stated_random_mask(tiny_data, keep, inference_keep, seed):
    # prepare
    cfg = tiny_config("random_prune", {"keep_ratio": keep, "inference": "submodel", "inference_keep": inference_keep, "inference_seed": seed})
    ctx = build_context(cfg, data=tiny_data)
    method = methods.create_method("random_prune", **dict(cfg.method_params))
    params = torch.randn(ctx.layout.total, generator=torch.Generator().manual_seed(1)) + 3.0  # no zeros
    # execute
    used = _captured_sampling_params(method, ctx, params)
    # assert: params * the stated mask, rebuilt independently of the method
    target = inference_keep or keep
    prunable = prunable_tensors(ctx.layout, False)
    mask = random_mask(ctx.layout, target, prunable, torch_gen(cfg.seed, "inference_mask", seed))
    assert torch.equal(used, params * mask)
    for (_, sl, _), p in zip(ctx.layout.slices(), prunable):
        n = sl.stop - sl.start
        assert int(torch.count_nonzero(used[sl])) == (keep_count(n, target) if p else n)
    other = _captured_sampling_params(methods.create_method("random_prune", **{**dict(cfg.method_params), "inference_seed": seed + 1}), ctx, params)
    assert not torch.equal(other, used)  # the mask seed is a real choice


def test_submodel_rule_for_topk_keeps_the_largest_sampled_weights(tiny_data):
    cfg = tiny_config("topk_prune", {"keep_ratio": 0.25, "inference": "submodel"})
    ctx = build_context(cfg, data=tiny_data)
    params = torch.randn(ctx.layout.total, generator=torch.Generator().manual_seed(2))
    used = _captured_sampling_params(methods.create_method("topk_prune", **dict(cfg.method_params)), ctx, params)
    for (_, sl, _), p in zip(ctx.layout.slices(), prunable_tensors(ctx.layout, False)):
        if not p:
            assert torch.equal(used[sl], params[sl])
            continue
        k = keep_count(sl.stop - sl.start, 0.25)
        top = torch.topk(params[sl].abs(), k).indices
        expected = torch.zeros_like(params[sl])
        expected[top] = params[sl][top]
        assert torch.equal(used[sl], expected)


def test_full_rule_samples_the_global_model_and_scaled_multiplies_each_pruned_tensor(tiny_data):
    ctx = build_context(tiny_config("random_prune"), data=tiny_data)
    params = torch.randn(ctx.layout.total, generator=torch.Generator().manual_seed(4))
    full = _captured_sampling_params(methods.create_method("random_prune", keep_ratio=0.4, inference="full"), ctx, params)
    scaled = _captured_sampling_params(methods.create_method("random_prune", keep_ratio=0.4, inference="scaled"), ctx, params)
    assert torch.equal(full, params)
    for (_, sl, _), p in zip(ctx.layout.slices(), prunable_tensors(ctx.layout, False)):
        n = sl.stop - sl.start
        assert torch.equal(scaled[sl], params[sl] * (keep_count(n, 0.4) / n) if p else params[sl])


@pytest.mark.parametrize("name", PRUNERS)
def test_default_inference_rule_is_what_dfbench_methods_prints(name, capsys):
    from dfbench.benchmark.cli import main

    assert main(["methods", name]) == 0
    printed = capsys.readouterr().out
    default = methods.create_method(name).config.inference
    assert default == DEFAULT_INFERENCE[name]
    assert f"method.inference (full|scaled|submodel, default {default!r})" in printed


@pytest.mark.parametrize("key,value", [("inference", "dense"), ("inference_keep", 1.5), ("inference_keep", -0.1), ("inference_seed", -1)])
def test_bad_inference_hyperparameters_are_clear_errors(key, value):
    with pytest.raises(ValueError, match=f"method.{key}"):
        methods.create_method("random_prune", **{key: value})
