"""The MLP presets (benchmark/core/presets.py `MLPSpec`, benchmark/engine/model.py `MLP`): a time-conditioned
residual MLP over the flattened sample, for vector data (the low-dimensional ground-truth mixtures, [1, 1, d])
where a UNet has no image to convolve; rebuildable at another width, so the width sub-models slice it."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from dfbench.benchmark.core import presets
from dfbench.benchmark.core.presets import MLPSpec
from dfbench.benchmark.engine import diffusion
from dfbench.benchmark.engine.model import MLP, UNet, build_model, build_network, flatten_, resolve_preset

TINY = "mlp-tiny"


def _unzeroed(net: nn.Module, seed: int = 1) -> nn.Module:
    """`net` with its read-out drawn again from a fixed seed (outputs that depend only on this seed's draw)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.out[2].parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return net


# -- the network -------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(1, 1, 8), (1, 16, 16), (3, 4, 5)])
def test_the_output_has_the_input_shape(shape):
    # prepare
    torch.manual_seed(0)
    net = _unzeroed(build_model(TINY, shape))
    x = torch.randn(4, *shape)
    # execute
    y = net(x, torch.rand(4))
    # assert: any [B, C, H, W] in, the same out; the input and output layers are C*H*W wide
    assert y.shape == x.shape and torch.isfinite(y).all()
    d = math.prod(shape)
    assert net.inp.in_features == d and net.out[2].out_features == d


def test_the_preset_specs_and_a_read_out_with_no_ties_at_zero():
    assert presets.mlp_spec("mlp") == MLPSpec(channels=128, blocks=3)
    assert presets.mlp_spec(TINY) == MLPSpec(channels=32, blocks=2)
    torch.manual_seed(0)
    net = build_model("mlp", (1, 1, 64))
    # (2 + 3b) w^2 + (5 + 7b) w + (2w + 1) D parameters, b blocks of width w, D inputs
    w, b, d = 128, 3, 64
    assert sum(p.numel() for p in net.parameters()) == (2 + 3 * b) * w * w + (5 + 7 * b) * w + (2 * w + 1) * d == 200_000
    assert all(spec.dropout == 0.0 for spec in (presets.mlp_spec(n) for n in presets.MLP))  # see presets.py: no dropout
    # no layer starts at zero: a magnitude mask (top-k) would tie all of it and train the same half forever
    assert all(bool((p != 0).any()) for name, p in net.named_parameters() if name.endswith("weight"))
    assert bool((net.out[2].weight != 0).all())
    x = torch.randn(5, 1, 1, 64)
    out = net(x, torch.rand(5))
    (out - x).square().mean().backward()
    assert net.out[2].weight.grad.abs().sum() > 0


def test_the_time_conditions_the_output():
    torch.manual_seed(0)
    net = _unzeroed(build_model(TINY, (1, 1, 8)))
    x = torch.randn(3, 1, 1, 8)
    with torch.no_grad():
        early, late, again = net(x, torch.full((3,), 0.1)), net(x, torch.full((3,), 0.9)), net(x, torch.full((3,), 0.1))
    assert torch.equal(early, again)
    assert (early - late).abs().max() > 1e-3


def test_a_few_training_steps_reduce_the_diffusion_loss():
    # prepare: a fixed batch of 8-d points and the suite's DDPM objective with fixed draws (a regression)
    torch.manual_seed(0)
    net = build_model(TINY, (1, 1, 8))
    obj = diffusion.make_objective("ddpm", "linear", 1000)
    x0 = 2.0 * torch.randn(64, 1, 1, 8).sign() + 0.1 * torch.randn(64, 1, 1, 8)  # two-sided mixture in [-3, 3]-ish
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)

    def loss() -> torch.Tensor:
        return obj.loss(net, x0, torch.Generator().manual_seed(7))

    with torch.no_grad():
        first = float(loss())
    # execute: three Adam steps
    for _ in range(3):
        opt.zero_grad()
        loss().backward()
        opt.step()
    # assert: the initial loss is near E||eps||^2 ~ 1 (a random read-out adds little); three steps take 5 % off it
    assert first == pytest.approx(1.0, abs=0.2)
    with torch.no_grad():
        assert float(loss()) < 0.95 * first


def test_the_network_runs_flat_and_batched_like_the_unet():
    # the flat parameter layout (flatten_) and torch.func.vmap over clients (train.clients_mode=batched)
    torch.manual_seed(0)
    net = _unzeroed(build_model(TINY, (1, 1, 8)))
    x, t = torch.randn(2, 1, 1, 8), torch.rand(2)
    with torch.no_grad():
        ref = net(x, t)
        flat, layout = flatten_(net)
        assert layout.total == flat.numel() == sum(p.numel() for p in net.parameters())
        assert torch.equal(net(x, t), ref)
        params = {n: torch.stack([v, v]) for n, v in layout.views(flat).items()}
        both = torch.func.vmap(lambda p, xx, tt: torch.func.functional_call(net, p, (xx, tt)))(params, torch.stack([x, x]), torch.stack([t, t]))
    torch.testing.assert_close(both[0], ref)


def test_the_unet_takes_sides_that_are_not_square():
    # the up path resizes to its skip connection along both sides (it compared the width only: 7x8 failed)
    torch.manual_seed(0)
    net = build_model("tiny", 1)
    for hw in ((7, 8), (8, 7), (5, 6)):
        assert net(torch.randn(2, 1, *hw), torch.rand(2)).shape == (2, 1, *hw)


def test_the_mlp_needs_the_whole_sample_shape():
    with pytest.raises(ValueError, match=r"whole shape \(C, H, W\)"):
        build_model(TINY, 1)


# -- at another width ---------------------------------------------------------------------------------

def _expected_half_shapes(d: int, w: int, h: int, blocks: int) -> dict[str, tuple[int, ...]]:
    """The slicing rule for the MLP at hidden width h of w: every hidden dimension w -> h, D kept, and the time
    MLP's first layer reads all w sinusoidal features (an input, as in the UNet)."""
    out = {"time.0.weight": (h, w), "time.0.bias": (h,), "time.2.weight": (h, h), "time.2.bias": (h,),
           "inp.weight": (h, d), "inp.bias": (h,)}
    for i in range(blocks):
        out |= {f"blocks.{i}.norm1.weight": (h,), f"blocks.{i}.norm1.bias": (h,), f"blocks.{i}.fc1.weight": (h, h),
                f"blocks.{i}.fc1.bias": (h,), f"blocks.{i}.temb.weight": (h, h), f"blocks.{i}.temb.bias": (h,),
                f"blocks.{i}.norm2.weight": (h,), f"blocks.{i}.norm2.bias": (h,), f"blocks.{i}.fc2.weight": (h, h),
                f"blocks.{i}.fc2.bias": (h,)}
    return out | {"out.0.weight": (h,), "out.0.bias": (h,), "out.2.weight": (d, h), "out.2.bias": (d,)}


def test_the_network_at_half_width_has_the_shapes_the_slicing_rule_predicts():
    from dfbench.methods.heterofl import narrow_width, slice_specs

    # prepare: the full network and the narrow one as a width sub-model builds it (heterofl.build_submodel)
    spec, shape = presets.network_spec(TINY), (1, 1, 8)
    full = build_network(spec, shape)
    half = narrow_width(spec.channels, 0.5)
    with torch.device("meta"):
        narrow = build_network(replace(spec, channels=half), shape)
        narrow.base = spec.channels
        narrow.time[0] = nn.Linear(spec.channels, narrow.time[0].out_features)
    # assert: the shapes are the rule's, name for name and in order
    expected = _expected_half_shapes(8, spec.channels, half, spec.blocks)
    assert [(n, tuple(p.shape)) for n, p in narrow.named_parameters()] == list(expected.items())
    assert [n for n, _ in full.named_parameters()] == list(expected)
    # and HeteroFL's slicing keeps the leading units of every hidden dimension, D whole, the Scaler on narrowed fan-ins
    specs = slice_specs(full, narrow, scaler=True)
    for name, p in full.named_parameters():
        sliced = [f if ix is None else len(ix) for ix, f in zip(specs[name].index, p.shape)]
        assert tuple(sliced) == expected[name], name
        for ix, f in zip(specs[name].index, p.shape):
            assert ix is None or torch.equal(ix, torch.arange(half)), name
    assert specs["inp.weight"].index[1] is None and specs["out.2.weight"].index[0] is None  # D is never narrowed
    assert specs["time.0.weight"].scale == 1.0 and specs["inp.weight"].scale == 1.0  # full inputs: no Scaler
    assert specs["blocks.0.fc1.weight"].scale == specs["out.2.weight"].scale == 0.5 and specs["out.2.bias"].scale == 1.0


def _fake_context(model_name: str, shape: tuple[int, int, int], clients: int = 2) -> SimpleNamespace:
    """What a width sub-model reads of the run's context (methods/context.py), with model_spec and
    network_at_width as engine/context.py should give them for any width-aware preset (see the lead's note)."""
    torch.manual_seed(0)
    spec = presets.network_spec(model_name)
    model = build_model(model_name, shape)
    flat, layout = flatten_(model)

    def network_at_width(channels: int) -> nn.Module:
        with torch.device("meta"):
            return build_network(replace(spec, channels=channels), shape)

    return SimpleNamespace(cfg=SimpleNamespace(train=SimpleNamespace(model=model_name)), model_spec=spec,
                           network_at_width=network_at_width, model=model, flat=flat, layout=layout,
                           image_shape=shape, device=torch.device("cpu"), capacity=None, num_clients=clients)


def test_a_heterofl_plan_builds_and_runs_on_the_mlp():
    from dfbench import methods

    # prepare
    ctx = _fake_context(TINY, (1, 1, 8))
    _unzeroed(ctx.model)  # (through the views of ctx.flat: a non-trivial read-out to compare)
    method = methods.create_method("heterofl", rate=0.5)
    state = method.init_state(ctx.flat.detach().clone(), ctx)
    # execute
    plan = method.client_view(state, 0, ctx)
    # assert: the narrow network's parameter count, its mask, its dense form (each kept entry once)
    spec, half = presets.network_spec(TINY), 16
    expected = _expected_half_shapes(8, spec.channels, half, spec.blocks)
    n_kept = sum(math.prod(s) for s in expected.values())
    assert plan.trained_params == n_kept == int(plan.step.mask.sum()) < ctx.layout.total
    assert torch.equal(torch.sort(plan.step.dense.index).values, plan.step.mask.bool().nonzero().flatten())
    assert 0.0 < plan.flop_fraction < 0.5
    # the sub-model computes the narrow MLP on the leading units, fan-in narrowed weights divided by 1/2
    narrow = build_network(replace(spec, channels=half), (1, 1, 8))
    narrow.base, narrow.time[0] = spec.channels, nn.Linear(spec.channels, half)
    full = dict(ctx.model.named_parameters())
    with torch.no_grad():
        for name, q in narrow.named_parameters():
            p = full[name][tuple(slice(0, n) for n in q.shape)]
            narrowed_in = p.dim() == 2 and q.shape[1] < full[name].shape[1]
            q.copy_(p / 0.5 if narrowed_in else p)
        x, t = torch.randn(3, 1, 1, 8), torch.rand(3)
        torch.testing.assert_close(plan.step.network(x, t), narrow(x, t))
    # a full-width client is FedAvg's plan
    assert methods.create_method("heterofl", rate=1.0).client_view(state, 0, ctx).trained_params == ctx.layout.total


# -- auto and the config's checks ------------------------------------------------------------------------

def test_auto_picks_the_mlp_for_vector_data():
    assert presets.auto_preset("gmm:dim8", 1) == "mlp" == resolve_preset("auto", "gmm:dim8?k=4")
    assert presets.auto_preset("gmm:fmnist16", 1) == presets.AUTO["fmnist"]
    assert presets.auto_preset("folder:/x", 1, (1, 1, 32)) == "mlp"  # data users bring: a side of 1 is a vector
    assert presets.auto_preset("folder:/x", 3, (3, 32, 32)) == "small32" and presets.auto_preset("cifar10", 3) == "small32"
    assert resolve_preset(TINY, "fmnist") == TINY


def test_the_families_and_what_they_take():
    assert presets.MLP == (TINY, "mlp") and set(presets.WIDTH_AWARE) == set(presets.BUILTIN) | set(presets.MLP)
    assert all(presets.family(n) == "mlp" and presets.width_aware(n) for n in presets.MLP)
    assert presets.min_side("mlp") == presets.side_multiple("mlp") == 1 and presets.min_side("small28") == 2
    assert presets.network_spec("tiny") == presets.unet_spec("tiny")
    with pytest.raises(KeyError, match="cannot be rebuilt at another width"):
        presets.network_spec("diffusers-tiny")
    with torch.device("meta"):
        assert isinstance(build_model("tiny", (1, 28, 28)), UNet) and isinstance(build_model("mlp", (1, 1, 2)), MLP)


def test_a_unet_on_vector_data_is_refused_naming_the_mlp():
    from dfbench.benchmark.core.config import ConfigError, RunConfig
    from dfbench.benchmark.engine.resolve import apply_overrides

    with pytest.raises(ConfigError, match=r"'train.model'.*small28.*gmm:dim8.*1x8 samples, e\.g\. mlp.*side of 1 is a vector"):
        apply_overrides(RunConfig(), {"data.dataset": "gmm:dim8", "train.model": "small28"})
    assert apply_overrides(RunConfig(), {"data.dataset": "gmm:dim8", "train.model": TINY}).train.model == TINY
    assert apply_overrides(RunConfig(), {"data.dataset": "gmm:dim8"}).train.model == "auto"
    # the width sub-models accept the MLP (it is width-aware)
    assert apply_overrides(RunConfig(), {"data.dataset": "gmm:dim8", "train.model": TINY, "method": "heterofl"}).method == "heterofl"
