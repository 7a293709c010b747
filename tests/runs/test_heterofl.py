"""HeteroFL (Diao et al., ICLR 2021): the client's forward is a real narrow UNet (checked against
one built by hand), it reads only the kept channels, the measured FLOP fraction, the FedAvg
reduction at rate 1, masked aggregation with capacity tiers, refusals and resume."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from dfbench import methods
from dfbench.benchmark.engine.context import build_context
from dfbench.benchmark.engine.lifecycle import run
from dfbench.benchmark.core.presets import unet_spec
from dfbench.benchmark.engine.model import UNet, flatten_
from dfbench.methods.pruning import weight_macs
from dfbench.benchmark.core.config import ConfigError
from helpers import final_params, rows, sigkill_then_resume, tiny_config

# The tiny preset (channels 8, mults (1, 2), one block): the up-path ResBlocks read cat([h, skip]);
# (width of h, width of skip) worked out by hand from the architecture, full model.
TINY_CATS = {"up.0.0": (16, 16), "up.1.0": (16, 8), "up.3.0": (16, 8), "up.4.0": (8, 8)}


def _hand_narrow(full: torch.nn.Module, scaler: bool) -> UNet:
    """The rate-1/2 tiny UNet (channels 4) holding the leading channels of `full`, built by hand."""
    torch.manual_seed(0)
    narrow = UNet(1, replace(unet_spec("tiny"), channels=4))
    narrow.base, narrow.time[0] = 8, torch.nn.Linear(8, 16)  # the time features are an input: all 8 of them
    fp = dict(full.named_parameters())
    with torch.no_grad():
        for name, q in narrow.named_parameters():
            p = fp[name]
            module = name.rpartition(".")[0]
            owner = module.rpartition(".")[0]
            for d in range(p.dim()):
                n = q.shape[d]
                if p.shape[d] == n:
                    continue
                cat = owner in TINY_CATS and ((module.endswith(("conv1", "skip")) and d == 1) or module.endswith("norm1"))
                if cat:  # the first half of h and the first half of the skip connection
                    h, s = TINY_CATS[owner]
                    ix = torch.cat([torch.arange(h // 2), h + torch.arange(s // 2)])
                else:
                    ix = torch.arange(n)
                p = p.index_select(d, ix)
            if scaler and p.dim() >= 2 and q.shape[1] < fp[name].shape[1]:
                p = p * 2.0  # the Scaler: a sum over half the inputs, divided by 1/2
            q.copy_(p)
    return narrow


def _ctx(tiny_data, model: str = "tiny", **over):
    return build_context(tiny_config("heterofl", over={"train.model": model, **over}), data=tiny_data)


@pytest.mark.parametrize("scaler", [False, True])
def test_the_client_forward_is_the_narrow_network_with_the_same_weights(tiny_data, scaler):
    # prepare
    ctx = _ctx(tiny_data)
    sub = methods.create_method("heterofl", scaler=scaler).submodel(0.5, ctx)
    narrow = _hand_narrow(ctx.model, scaler)
    x, t = torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(1)), torch.tensor([0.1, 0.5, 0.9])
    # execute / assert
    with torch.no_grad():
        torch.testing.assert_close(sub.model(x, t), narrow(x, t), rtol=1e-5, atol=1e-6)
    assert sub.trained_params == sum(q.numel() for q in narrow.parameters())


@pytest.mark.slow
def test_the_client_reads_and_trains_only_the_kept_channels(tiny_data):
    # prepare: small28 (with the mid-block attention: its [q | k | v] blocks are cut separately)
    ctx = _ctx(tiny_data, "small28")
    sub = methods.create_method("heterofl").submodel(0.5, ctx)
    x, t = torch.randn(2, 1, 28, 28, generator=torch.Generator().manual_seed(2)), torch.tensor([0.2, 0.7])
    ref = sub.model(x, t).detach()
    # execute: poison every entry the sub-model does not hold
    dropped = sub.mask == 0
    ctx.flat[dropped] = float("nan")
    out = sub.model(x, t)
    out.square().mean().backward()
    # assert: same output, and the gradient reaches the kept entries only
    assert torch.equal(out.detach(), ref)
    grad = torch.cat([p.grad.reshape(-1) for p in ctx.model.parameters()])
    assert torch.all(grad[dropped] == 0) and grad[~dropped].abs().sum() > 0
    assert 0.2 < sub.flop_fraction < 0.3 and 0.2 < sub.trained_params / ctx.layout.total < 0.3


def test_flop_fraction_is_the_measured_one(tiny_data):
    # prepare: the conv/linear multiply-accumulates of the hand-built narrow net against the full one
    ctx = _ctx(tiny_data)
    sub = methods.create_method("heterofl").submodel(0.5, ctx)
    narrow = _hand_narrow(ctx.model, True)
    _, nlayout = flatten_(narrow)
    expected = weight_macs(narrow, nlayout, (1, 28, 28)).sum() / weight_macs(ctx.model, ctx.layout, (1, 28, 28)).sum()
    # assert: the tiny UNet has no attention, so FLOPs are exactly the conv/linear MACs (x2 on both sides)
    assert sub.flop_fraction == pytest.approx(expected, rel=1e-12)
    assert 0.24 < sub.flop_fraction < 0.27  # ~ r^2 = 0.25 (the first and last convs keep full inputs/outputs)


@pytest.mark.slow
@pytest.mark.parametrize("setting", [{"method.rate": 1.0}, {"system.capacity": "1.0:1.0"}])
def test_every_client_at_rate_1_is_fedavg_bitwise(tmp_path, tiny_data, setting):
    over = {"train.rounds": 2, "system.participation": 0.5}
    ref = final_params(run(tiny_config("fedavg", over=over), tmp_path / "a", data=tiny_data, progress=False))
    got = final_params(run(tiny_config("heterofl", over={**over, **setting}), tmp_path / "b", data=tiny_data, progress=False))
    assert torch.equal(got, ref)


@pytest.mark.slow
def test_tiers_give_rates_and_the_server_averages_over_holders(tmp_path, tiny_data):
    # rate 1/2 for everyone: entries nobody holds keep their initial value, held ones move
    ctx = _ctx(tiny_data)
    mask = methods.create_method("heterofl").submodel(0.5, ctx).mask.bool()
    d = run(tiny_config("heterofl", over={"train.rounds": 2}), tmp_path / "half", data=tiny_data, progress=False)
    p = final_params(d)
    assert torch.equal(p[~mask], ctx.init_params[~mask]) and not torch.equal(p[mask], ctx.init_params[mask])
    # tiers 1.0 and 0.5: two client sizes in the log, and the bits are 32 per held parameter
    d = run(tiny_config("heterofl", over={"train.rounds": 1, "system.capacity": "1.0:0.5,0.5:0.5"}), tmp_path / "tiers",
            data=tiny_data, progress=False)
    (row,) = rows(d)
    assert sorted(set(row["trained_params"])) == [int(mask.sum()), ctx.layout.total]
    assert row["client_uplink_bits"] == [32 * n for n in row["trained_params"]] == row["client_downlink_bits"]


def test_sampling_uses_the_largest_held_rate(tiny_data):
    # every client at rate 1/2: the samples must not read the never-trained channels
    ctx = _ctx(tiny_data, **{"eval.sampler_steps": 2})
    method = methods.create_method("heterofl")
    mask = method.submodel(0.5, ctx).mask.bool()
    noise = torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(3))
    a = method.sample(ctx.init_params, noise, ctx)
    poisoned = ctx.init_params.clone()
    poisoned[~mask] = float("nan")
    assert torch.equal(method.sample(poisoned, noise, ctx), a) and torch.isfinite(a).all()


def test_batched_mode_is_refused_before_any_data_when_a_client_is_narrow():
    # refused when the config is built (dfbench run, the API, grid --dry-run): no data is loaded
    with pytest.raises(ConfigError, match="narrowest rate 0.5.*clients_mode=sequential"):
        tiny_config("heterofl", over={"train.clients_mode": "batched"})
    with pytest.raises(ConfigError, match="narrowest rate 0.25"):  # capacity tiers give the rates
        tiny_config("heterofl", {"rate": 1.0}, {"train.clients_mode": "batched", "system.capacity": "1.0:0.5,0.25:0.5"})
    tiny_config("heterofl", {"rate": 1.0}, {"train.clients_mode": "batched"})  # rate 1 is FedAvg: allowed


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:took over the stale lock")  # the killed run left its lock behind
def test_heterofl_resumes_bitwise_after_sigkill(tmp_path, tiny_data):
    over = {"method": "heterofl", "train.rounds": 3, "checkpoint_every": 1, "system.capacity": "1.0:0.5,0.5:0.5"}
    ref, d = sigkill_then_resume(tmp_path, tiny_data, over)
    assert torch.equal(final_params(d), final_params(ref))
    assert rows(d) == rows(ref)
