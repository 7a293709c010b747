"""Structured sub-models train at their own size (methods/base.DenseNetwork): the local step gathers the
kept entries, trains the narrow network in a flat buffer of its own and scatters the result back. The
reference is the sliced path (`LocalStep(mask, network=SubModel)`, which trains the full flat vector with
a masked gradient): the same update to kernel rounding without clipping (bitwise on AVX-512 CPUs, a few ulps
elsewhere: the narrow convolutions are other kernel calls), and to float rounding with clipping (its
norm sums the same entries in another order), for HeteroFL (Scaler on and off), FedRolex's rolled
window and FedPhD's pruned channels."""

from __future__ import annotations

import pytest
import torch

from dfbench import methods
from dfbench.benchmark.engine.context import build_context
from dfbench.benchmark.engine.local_step import StepSettings, dense_network, local_train
from dfbench.methods import LocalStep
from helpers import tiny_config

SMALL = {"data.clients": 2, "train.local_steps": 3, "train.rounds": 2}


def _plan(name: str, params: dict, tiny_data, round_: int = 1):
    ctx = build_context(tiny_config(name, params, SMALL), data=tiny_data)
    method = methods.create_method(name, **params)
    state = method.init_state(ctx.init_params, ctx)
    state.params = state.params + 0.01 * torch.randn(state.params.shape, generator=torch.Generator().manual_seed(3))
    return ctx, method.client_view(state, 0, ctx.at_round(round_)), state


def _train(ctx, plan, step: LocalStep, *, clip: float, prox: float = 0.0, correction: torch.Tensor | None = None):
    step.proximal_mu, step.step_correction = prox, correction
    settings = StepSettings(batch_size=4, lr=1e-2, grad_clip=clip, probe_steps=3)
    return local_train(ctx.model, ctx.flat, plan.start, ctx.images, ctx.client_indices[0], ctx.get_objective(None), step, settings,
                       steps=3, gen=torch.Generator().manual_seed(11))


UPDATE_RTOL = 1e-4  # relative difference of two updates computed by different (equally exact) kernels
CASES = [("heterofl", {"rate": 0.5}, 1), ("heterofl", {"rate": 0.5, "scaler": False}, 1), ("fedrolex", {"rate": 0.5}, 3),
         ("fedphd", {}, 1)]


@pytest.mark.parametrize("name,params,round_", CASES)
def test_the_dense_step_is_the_sliced_step(tiny_data, name, params, round_):
    # prepare: the method's plan (dense) and the same plan without its dense form (the sliced reference)
    ctx, plan, _ = _plan(name, params, tiny_data, round_)
    dense = plan.step.dense
    assert dense is not None and plan.step.network is not None and not plan.step.lockstep
    kept = plan.step.mask.bool()
    assert dense.index.numel() == int(kept.sum()) == plan.trained_params
    assert torch.equal(torch.sort(dense.index).values, kept.nonzero().flatten())  # each kept entry exactly once
    # execute
    got = _train(ctx, plan, LocalStep(mask=plan.step.mask, network=plan.step.network, dense=dense), clip=0.0)
    ref = _train(ctx, plan, LocalStep(mask=plan.step.mask, network=plan.step.network), clip=0.0)
    # assert: the same update to kernel rounding, kept entries moved, the others are the start's bit for bit.
    # The narrow network's convolutions are other kernel calls than the full one's (other shapes), and
    # their accumulation order depends on the CPU: AVX-512 kernels happen to agree bit for bit, AVX2 ones
    # (AMD Zen 3) differ in the last bits, which Adam's g / (|g| + eps) can amplify where a gradient is near
    # eps. A wrong slice, a missing entry or a wrong scale moves the update by O(1) of its norm.
    d_got, d_ref = got.params[kept] - plan.start[kept], ref.params[kept] - plan.start[kept]
    assert float((d_got - d_ref).norm() / d_ref.norm()) < UPDATE_RTOL
    assert got.loss == pytest.approx(ref.loss, rel=1e-5)
    assert torch.equal(got.params[~kept], plan.start[~kept]) and not torch.equal(got.params[kept], plan.start[kept])
    assert got.sigma1_sq == pytest.approx(ref.sigma1_sq, rel=1e-4)


@pytest.mark.parametrize("name,params,round_", CASES[:1] + CASES[2:])
def test_clipping_a_proximal_term_and_a_step_correction_agree_to_float_rounding(tiny_data, name, params, round_):
    ctx, plan, state = _plan(name, params, tiny_data, round_)
    corr = 1e-3 * torch.randn(state.params.shape, generator=torch.Generator().manual_seed(5))
    kw = {"clip": 0.05, "prox": 0.1, "correction": corr}  # a small clip norm: every step is clipped
    got = _train(ctx, plan, LocalStep(mask=plan.step.mask, network=plan.step.network, dense=plan.step.dense), **kw)
    ref = _train(ctx, plan, LocalStep(mask=plan.step.mask, network=plan.step.network), **kw)
    kept = plan.step.mask.bool()
    # the clip norms differ in their last bit (4.0845928 vs 4.0845933 here), and Adam amplifies that where
    # a gradient is near its eps (g / (|g| + eps)): scaling the reference's clipped gradient by one ulp
    # (1 + 1.2e-7) alone moves its update by 6e-4 of its norm. A wrong scale or a missing term is off by O(1).
    d_got, d_ref = got.params[kept] - plan.start[kept], ref.params[kept] - plan.start[kept]
    assert float((d_got - d_ref).norm() / d_ref.norm()) < 1e-2
    # entries outside the sub-model: the dense step never touches them (the sliced one moved them by the
    # unmasked correction alone, and the masked aggregate ignores them either way)
    assert torch.equal(got.params[~kept], plan.start[~kept])


def test_the_narrow_network_is_built_once_and_really_narrow(tiny_data):
    ctx, plan, _ = _plan("heterofl", {"rate": 0.5}, tiny_data)
    net, nflat = dense_network(plan.step.dense, ctx.flat.device)
    assert dense_network(plan.step.dense, ctx.flat.device)[1] is nflat  # cached
    assert nflat.numel() == plan.trained_params < ctx.layout.total
    widths = [m.out_channels for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    full = [m.out_channels for m in ctx.model.modules() if isinstance(m, torch.nn.Conv2d)]
    # every conv but the last (image channels out) has half the full one's output channels
    assert widths[:-1] == [c // 2 for c in full[:-1]] and widths[-1] == full[-1]
