"""Batched clients (benchmark/engine/batched.py) against the sequential step, and the on-device samplers."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from dfbench import methods
from dfbench.benchmark.engine.batched import (
    ClientJob,
    FunctionalAdam,
    draw_batches,
    lockstep_groups,
    noised_inputs,
)
from dfbench.benchmark.core.config import ConfigError, RunConfig
from dfbench.benchmark.engine.resolve import apply_overrides
from dfbench.benchmark.engine.context import build_context
from dfbench.benchmark.engine.diffusion import DDPM, FlowMatching
from dfbench.benchmark.engine.training import train_round
from dfbench.benchmark.core.seeds import torch_gen
from dfbench.benchmark.engine.local_step import clip_rows_, draw_batch
from helpers import local_train_kw, lockstep_kw, tiny_config


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


# -- pieces on hand-built tensors --------------------------------------------------------------------

@pytest.mark.slow
def test_functional_adam_equals_torch_adam_row_by_row():
    # prepare: 3 clients x 7 parameters, a few steps of gradients, one coordinate never gets a gradient
    g = torch.Generator().manual_seed(0)
    start = torch.randn(3, 7, generator=g)
    grads = [torch.randn(3, 7, generator=g) for _ in range(4)]
    for gr in grads:
        gr[:, 2] = 0.0
    # execute
    theta = start.clone()
    adam = FunctionalAdam(theta, lr=1e-2)
    for gr in grads:
        adam.step(theta, gr)
    # assert: each row is what torch.optim.Adam does to that client alone
    for j in range(3):
        p = nn.Parameter(start[j].clone())
        opt = torch.optim.Adam([p], lr=1e-2)
        for gr in grads:
            p.grad = gr[j].clone()
            opt.step()
        torch.testing.assert_close(theta[j], p.detach(), rtol=1e-6, atol=1e-7)
    assert torch.equal(theta[:, 2], start[:, 2])  # an always-zero gradient never moves a weight


def test_clip_rows_equals_clip_grad_norm_per_client():
    g = torch.Generator().manual_seed(1)
    grad = torch.randn(3, 10, generator=g) * torch.tensor([[0.1], [1.0], [10.0]])
    rows = grad.clone()
    clip_rows_(rows, 1.0)
    for j in range(3):
        p = nn.Parameter(torch.zeros(10))
        p.grad = grad[j].clone()
        nn.utils.clip_grad_norm_([p], 1.0, foreach=True)
        torch.testing.assert_close(rows[j], p.grad, rtol=1e-6, atol=1e-7)


def _numbered_images(n: int) -> torch.Tensor:
    """Image i has every pixel equal to i (n <= 256), so a batch tells which images it holds."""
    return torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 1, 4, 4).contiguous()


def _ids(batch: torch.Tensor) -> set[int]:
    return set(torch.round((batch + 1) * 127.5).long().flatten().tolist())


def test_draw_batch_draws_only_the_clients_own_indices():
    images = _numbered_images(200)
    own = torch.tensor([3, 17, 42, 199])
    batch = draw_batch(images, own, 64, torch_gen(0, "t"))
    assert batch.shape == (64, 1, 4, 4)
    assert _ids(batch) <= set(own.tolist())
    assert len(_ids(batch)) > 1  # with replacement, but not stuck on one sample


def test_draw_batches_gives_each_client_its_own_indices_and_the_sequential_draws():
    # prepare: three clients with disjoint index sets of different sizes
    images = _numbered_images(200)
    indices = [torch.arange(0, 10), torch.arange(50, 53), torch.arange(100, 200)]
    gens = [torch_gen(0, "client", 1, k) for k in range(3)]
    # execute
    batches = draw_batches(images, indices, 16, gens)
    # assert: row k only from client k, and bitwise the batch the sequential sampler draws
    assert batches.shape == (3, 16, 1, 4, 4)
    for k in range(3):
        assert _ids(batches[k]) <= set(indices[k].tolist())
        assert torch.equal(batches[k], draw_batch(images, indices[k], 16, torch_gen(0, "client", 1, k)))
    # and the generators advanced exactly as the sequential sampler's would
    for k in range(3):
        ref = torch_gen(0, "client", 1, k)
        draw_batch(images, indices[k], 16, ref)
        assert torch.equal(gens[k].get_state(), ref.get_state())


@pytest.mark.parametrize("objective", [DDPM("cosine", 50), FlowMatching()], ids=["ddpm", "fm"])
def test_noised_inputs_reproduce_the_objectives_loss(objective):
    # prepare: a deterministic stand-in network and two clients' clean batches
    net = lambda x, t: 0.5 * x + t.view(-1, 1, 1, 1)  # noqa: E731
    x0 = torch.rand(2, 5, 1, 4, 4) * 2 - 1
    gens = [torch_gen(0, "c", k) for k in range(2)]
    # execute
    xt, tin, target = noised_inputs(objective, x0, gens)
    # assert: client k's loss is the objective's own loss with client k's generator
    for k in range(2):
        ours = (net(xt[k], tin[k]) - target[k]).square().mean()
        assert torch.equal(ours, objective.loss(net, x0[k], torch_gen(0, "c", k)))


def test_lockstep_groups_split_stragglers_objectives_and_chunks():
    groups = lockstep_groups([0, 1, 2, 3, 4, 5], [4, 2, 4, 4, 2, 4], [None, None, None, "fm", None, None], size=2)
    assert groups == [[0, 2], [5], [1, 4], [3]]
    assert lockstep_groups([7, 8], [3, 3], [None, None], size=0) == [[7, 8]]


# -- the lockstep step against local_train ------------------------------------------------------------

@pytest.mark.slow
def test_lockstep_equals_local_train_with_mask_prox_and_clipping(tiny_data):
    # prepare: three clients in one group: plain, pruned (masked), FedProx; clipping active.
    # small28, not tiny: tiny's 1-channel GroupNorm groups make some gradients exactly zero in
    # exact arithmetic, and Adam turns the float noise there into +-lr steps in either mode.
    cfg = tiny_config(over={"train.model": "small28"})
    ctx = build_context(cfg, data=tiny_data)
    obj = ctx.get_objective(None)
    mask = (torch.rand(ctx.layout.total, generator=torch.Generator().manual_seed(0)) < 0.5).float()
    specs = [dict(), dict(mask=mask), dict(prox_mu=0.5)]
    starts = [ctx.init_params, ctx.init_params * mask, ctx.init_params]
    kw = dict(steps=3, batch_size=8, lr=1e-3, grad_clip=0.05, probe_steps=3)
    # execute
    jobs = [ClientJob(start=s, indices=ctx.client_indices[k], gen=torch_gen(0, "client", 1, k), **sp)
            for k, (s, sp) in enumerate(zip(starts, specs))]
    batched = lockstep_kw(ctx.model, ctx.layout, jobs, ctx.images, obj, **kw)
    seq = [local_train_kw(ctx.model, ctx.flat, s, ctx.images, ctx.client_indices[k], obj, gen=torch_gen(0, "client", 1, k), **sp, **kw)
           for k, (s, sp) in enumerate(zip(starts, specs))]
    # assert: float tolerance. The FedProx client gets 1e-4: its gradient g + mu (w - w_start)
    # nearly cancels on some weights, and Adam's g / sqrt(v) turns float noise there into steps
    # of up to lr. The sequential step alone shows the same spread (1 vs 2 torch threads: ~8e-5).
    for b, s, tol in zip(batched, seq, [1e-5, 1e-5, 1e-4]):
        assert _rel(b.params, s.params) < tol
        assert b.loss == pytest.approx(s.loss, rel=1e-5)
        assert b.sigma1_sq == pytest.approx(s.sigma1_sq, rel=1e-4)
    assert torch.equal(batched[1].params * (1 - mask), torch.zeros_like(mask))  # pruned weights stay zero


# -- the acceptance: whole rounds through the loop ----------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("method", ["fedavg", "random_prune"])
def test_batched_rounds_equal_sequential_rounds(method, tiny_data):
    # prepare: 5 clients, 2 of them stragglers (1 step instead of 2), lockstep groups of at most 2
    over = {"train.model": "small28", "data.clients": 5, "system.stragglers": 0.4, "train.local_steps": 2}
    params = {"keep_ratio": 0.5} if method == "random_prune" else {}
    assert method in methods.list_methods("*"), f"{method} is not registered"
    rows, finals = {}, {}
    for mode in ("sequential", "batched"):
        cfg = tiny_config(method, params, {**over, "train.clients_mode": mode, "train.client_batch": 2})
        ctx = build_context(cfg, data=tiny_data)
        m = methods.create_method(cfg.method, **dict(cfg.method_params))
        state = m.init_state(ctx.init_params, ctx)
        # execute
        rows[mode], finals[mode] = [], []
        for r in (1, 2):
            state, row = train_round(m, state, ctx, r)
            rows[mode].append(row)
            finals[mode].append(state.params)
    # assert: after round 1 the global models agree within 1e-5 relative. Round 2 starts from
    # models that differ by float noise, which Adam's first, sign-like step amplifies where a
    # gradient is near 0; 1e-4 still catches any wrong draw or update (those differ by ~1e-2).
    assert _rel(finals["batched"][0], finals["sequential"][0]) < 1e-5
    assert _rel(finals["batched"][1], finals["sequential"][1]) < 1e-4
    for b, s in zip(rows["batched"], rows["sequential"]):
        assert b["clients"] == s["clients"] and b["steps"] == s["steps"] and len(set(s["steps"])) == 2
        assert b["uplink_bits"] == s["uplink_bits"] and b["downlink_bits"] == s["downlink_bits"] and b["gamma"] == s["gamma"]
        for key in ("loss", "sigma1_sq", "sigma2_sq", "w2"):
            assert b[key] == pytest.approx(s[key], rel=1e-4, abs=1e-12), key
        assert s["sigma1_sq"] is not None and math.isfinite(s["sigma1_sq"])  # 1-step stragglers give no estimate, not NaN


@pytest.mark.slow
def test_batched_fedprox_round_equals_sequential(tiny_data):
    finals = {}
    for mode in ("sequential", "batched"):
        cfg = tiny_config("fedprox", {"mu": 0.1}, {"train.model": "small28", "train.clients_mode": mode, "train.rounds": 1})
        ctx = build_context(cfg, data=tiny_data)
        m = methods.create_method("fedprox", mu=0.1)
        finals[mode], _ = train_round(m, m.init_state(ctx.init_params, ctx), ctx, 1)
    # 1e-4: FedProx's near-cancelling gradients (see the lockstep test above)
    assert _rel(finals["batched"].params, finals["sequential"].params) < 1e-4


# -- the speed knobs ----------------------------------------------------------------------------------

def test_speed_knobs_are_validated_and_keep_the_run_id():
    base = apply_overrides(RunConfig(), {})
    with pytest.raises(ConfigError, match="train.compile"):
        apply_overrides(base, {"train.compile": True})  # device cpu
    with pytest.raises(ConfigError, match="train.channels_last"):
        apply_overrides(base, {"train.clients_mode": "batched", "train.channels_last": True})
    with pytest.raises(ConfigError, match="train.clients_mode"):
        apply_overrides(base, {"train.clients_mode": "parallel"})
    with pytest.raises(ConfigError, match="train.amp"):
        apply_overrides(base, {"train.amp": "fp16"})
    same = apply_overrides(base, {"train.clients_mode": "batched", "train.client_batch": 4})
    assert same.run_id() == base.run_id() == apply_overrides(base, {"train.channels_last": True}).run_id()
    assert apply_overrides(base, {"train.amp": "bf16"}).run_id() != base.run_id()  # bf16 changes the numerics


def test_channels_last_and_bf16_train_the_same_model(tiny_data, monkeypatch):
    monkeypatch.setenv("DFBENCH_CPU_BF16", "emulate")  # bf16 itself, also on a CPU without native bfloat16
    # channels_last changes only the memory layout; bf16 autocast changes rounding, not the maths
    cfg = tiny_config(over={"train.model": "small28"})
    ctx = build_context(cfg, data=tiny_data)
    obj = ctx.get_objective(None)
    out = {}
    for name, kw in {"fp32": {}, "nhwc": {"channels_last": True}, "bf16": {"amp": "bf16"}}.items():
        out[name] = local_train_kw(ctx.model, ctx.flat, ctx.init_params, ctx.images, ctx.client_indices[0], obj, steps=2,
                                batch_size=8, lr=1e-3, gen=torch_gen(0, "client", 1, 0), **kw)
    delta = out["fp32"].params - ctx.init_params
    assert _rel(out["nhwc"].params, out["fp32"].params) < 1e-5
    assert out["bf16"].loss == pytest.approx(out["fp32"].loss, rel=0.05)
    assert float(((out["bf16"].params - ctx.init_params) - delta).norm() / delta.norm()) < 0.5


def test_batched_bf16_trains_like_sequential_bf16(tiny_data, monkeypatch):
    monkeypatch.setenv("DFBENCH_CPU_BF16", "emulate")
    # bf16 rounds differently in the vmapped and the plain forward: same draws, updates agree to bf16 precision
    cfg = tiny_config(over={"train.model": "small28"})
    ctx = build_context(cfg, data=tiny_data)
    obj = ctx.get_objective(None)
    kw = dict(steps=2, batch_size=8, lr=1e-3, amp="bf16")
    (b,) = lockstep_kw(ctx.model, ctx.layout, [ClientJob(start=ctx.init_params, indices=ctx.client_indices[0],
                                                            gen=torch_gen(0, "client", 1, 0))], ctx.images, obj, **kw)
    s = local_train_kw(ctx.model, ctx.flat, ctx.init_params, ctx.images, ctx.client_indices[0], obj, gen=torch_gen(0, "client", 1, 0), **kw)
    assert b.loss == pytest.approx(s.loss, rel=1e-2)
    delta = s.params - ctx.init_params
    assert float(((b.params - ctx.init_params) - delta).norm() / delta.norm()) < 0.5
