"""FedRolex (Alam et al., NeurIPS 2022): the rolling window against hand-written channel lists (round 1, 2,
the wrap-around, within each block of [q | k | v] and cat([h, skip])), the client's forward against a
narrow UNet built by hand from the rolled channels, overlapping windows averaged by hand, rate 1 is
FedAvg bitwise, the window really rolls in training, the full model samples, batched mode is refused."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from dfbench import methods
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.core.config import ConfigError
from dfbench.benchmark.core.presets import unet_spec
from dfbench.benchmark.engine.context import build_context
from dfbench.benchmark.engine.model import UNet
from dfbench.benchmark.engine.training import train_round
from dfbench.methods.fedrolex import rolling
from dfbench.methods.heterofl import SliceSpec, kept_mask, slice_specs
from helpers import tiny_config

# The tiny preset (channels 8, mults (1, 2), one block): (width of h, width of skip) of each up-path
# ResBlock's cat([h, skip]) input, worked out by hand from the architecture (as tests/runs/test_heterofl.py).
TINY_CATS = {"up.0.0": (16, 16), "up.1.0": (16, 8), "up.3.0": (16, 8), "up.4.0": (8, 8)}
SMALL = {"data.clients": 2, "train.local_steps": 2, "train.rounds": 2}


def _window(full: int, kept: int, j: int) -> list[int]:
    """The paper's S_{n,j}, written out: k = j mod K, then k, k+1, ... wrapping past K - 1 to 0."""
    k = j % full
    return [k + i if k + i < full else k + i - full for i in range(kept)]


# -- the window ---------------------------------------------------------------------------------

@pytest.mark.parametrize("C,kept,round_,expected", [
    (8, 4, 1, [0, 1, 2, 3]),  # round 1 (j = 0): HeteroFL's leading channels
    (8, 4, 2, [1, 2, 3, 4]),  # one channel later each round
    (8, 4, 6, [5, 6, 7, 0]),  # wraps around
    (8, 4, 8, [7, 0, 1, 2]),
    (8, 4, 9, [0, 1, 2, 3]),  # after C rounds, back to the start
    (10, 3, 9, [8, 9, 0]),  # rate 0.3 of 10 channels: ceil(3) = 3 kept
    (10, 3, 25, [4, 5, 6]),  # j = 24, 24 mod 10 = 4
    (16, 8, 12, [11, 12, 13, 14, 15, 0, 1, 2]),
])
def test_the_window_of_round_r(C, kept, round_, expected):
    assert rolling(round_ - 1)(C, kept).tolist() == expected == _window(C, kept, round_ - 1)


def test_the_window_rolls_within_each_block_of_qkv_and_of_the_skip_concatenation():
    # prepare: the tiny UNet with a mid-block attention ([q | k | v] of 16 channels each) and its rate-1/2 architecture
    spec = replace(unet_spec("tiny"), mid_attn=True)
    torch.manual_seed(0)
    full = UNet(1, spec)
    with torch.device("meta"):
        narrow = UNet(1, replace(spec, channels=4))
        narrow.base, narrow.time[0] = 8, torch.nn.Linear(8, 16)  # the time features are an input: all 8 of them
    # execute: round 10 (j = 9)
    specs = slice_specs(full, narrow, scaler=False, choose=rolling(9))
    # assert: q, k and v each keep channels 9..15, 0 of their own 16 (offsets 0, 16, 32)
    q = [9, 10, 11, 12, 13, 14, 15, 0]
    assert specs["mid.1.qkv.weight"].index[0].tolist() == q + [16 + i for i in q] + [32 + i for i in q]
    assert specs["mid.1.qkv.weight"].index[1].tolist() == q  # its input: the 16-channel space
    # up.1.0 reads cat([h (16), skip (8)]): h keeps 9..15, 0; the skip 9 mod 8 = 1: 1..4, at offset 16
    assert specs["up.1.0.conv1.weight"].index[1].tolist() == q + [17, 18, 19, 20]
    assert specs["up.1.0.norm1.weight"].index[0].tolist() == q + [17, 18, 19, 20]
    assert specs["up.1.0.conv1.weight"].index[0].tolist() == q  # its output: 16 channels
    # the image channels and the sinusoidal time features stay whole; the time MLP's 32 roll: 9..24
    assert specs["inp.weight"].index[1] is None and specs["out.2.weight"].index[0] is None
    assert specs["time.0.weight"].index[1] is None
    assert specs["time.0.weight"].index[0].tolist() == list(range(9, 25))


# -- the client's forward ----------------------------------------------------------------------

def _hand_narrow(full: torch.nn.Module, j: int, scaler: bool) -> UNet:
    """The rate-1/2 tiny UNet (channels 4) holding round j's window of every layer of `full`, built by hand."""
    torch.manual_seed(0)
    narrow = UNet(1, replace(unet_spec("tiny"), channels=4))
    narrow.base, narrow.time[0] = 8, torch.nn.Linear(8, 16)
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
                if owner in TINY_CATS and ((module.endswith(("conv1", "skip")) and d == 1) or module.endswith("norm1")):
                    h, s = TINY_CATS[owner]  # a window in h, and one in the skip connection
                    ix = _window(h, h // 2, j) + [h + i for i in _window(s, s // 2, j)]
                else:
                    ix = _window(p.shape[d], n, j)
                p = p.index_select(d, torch.tensor(ix))
            if scaler and p.dim() >= 2 and q.shape[1] < fp[name].shape[1]:
                p = p * 2.0  # the Scaler: a sum over half the inputs, divided by 1/2
            q.copy_(p)
    return narrow


@pytest.mark.parametrize("scaler", [False, True])
def test_the_client_forward_is_the_narrow_network_of_the_rolled_channels(tiny_data, scaler):
    # prepare: round 7 (j = 6): 8 channels keep 6, 7, 0, 1 (wrapped), 16 keep 6..13, 32 keep 6..21
    ctx = build_context(tiny_config("fedrolex", {"scaler": scaler}, SMALL), data=tiny_data)
    method = methods.create_method("fedrolex", scaler=scaler)
    sub = method.window(0.5, 7, ctx)
    narrow = _hand_narrow(ctx.model, 6, scaler)
    x, t = torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(1)), torch.tensor([0.1, 0.5, 0.9])
    # execute / assert
    with torch.no_grad():
        torch.testing.assert_close(sub.model(x, t), narrow(x, t), rtol=1e-5, atol=1e-6)
    # as large as HeteroFL's sub-model of the same rate, with its measured FLOP fraction; another mask
    lead = methods.create_method("heterofl", scaler=scaler).submodel(0.5, ctx)
    assert sub.trained_params == lead.trained_params == sum(q.numel() for q in narrow.parameters())
    assert sub.flop_fraction == lead.flop_fraction and not torch.equal(sub.mask, lead.mask)
    assert torch.equal(method.window(0.5, 1, ctx).mask, lead.mask)  # round 1 is HeteroFL's window


# -- aggregation -------------------------------------------------------------------------------

def test_overlapping_windows_are_averaged_over_their_holders():
    # prepare: one parameter of 8 channels in round 7 (j = 6); client A at rate 1/2 holds {6, 7, 0, 1}
    # (n_A = 1), client B at rate 1/4 holds {6, 7} (n_B = 3); the global values are 0..7
    theta = torch.arange(8, dtype=torch.float32)
    masks = [kept_mask(("w",), ((8,),), {"w": SliceSpec([rolling(6)(8, kept)], 1.0)}) for kept in (4, 2)]
    assert masks[0].tolist() == [1, 1, 0, 0, 0, 0, 1, 1] and masks[1].tolist() == [0, 0, 0, 0, 0, 0, 1, 1]
    a, b = 10 + theta, 20 + theta  # the clients' models (only their held entries count)
    method = methods.create_method("fedrolex")
    ctx = SimpleNamespace(round_weight=4.0, layout=SimpleNamespace(total=8))
    state = methods.ServerState(params=theta.clone())
    acc = method.new_accumulator(state, ctx)
    # execute
    for params, weight, mask in ((a, 1.0, masks[0]), (b, 3.0, masks[1])):
        method.accumulate(acc, methods.Upload(params=params, weight=weight, uplink_bits=0, mask=mask), ctx)
    new = method.apply(state, acc, ctx).params
    # assert: 6, 7 = (1 * a + 3 * b) / 4; 0, 1 = a alone; 2..5 held by nobody, unchanged
    assert new.tolist() == [10.0, 11.0, 2.0, 3.0, 4.0, 5.0, (16 + 3 * 26) / 4, (17 + 3 * 27) / 4]


# -- runs ----------------------------------------------------------------------------------------

def _train(name: str, tiny_data, params=None, over=None, rounds: int = 2):
    ctx = build_context(tiny_config(name, params, {**SMALL, **(over or {})}), data=tiny_data)
    method = methods.create_method(name, **(params or {}))
    state, out = method.init_state(ctx.init_params, ctx), []
    for r in range(1, rounds + 1):
        state, row = train_round(method, state, ctx, r)
        out.append(row)
    return ctx, method, state.params, out


@pytest.mark.parametrize("params,over", [({"rate": 1.0}, {}), ({}, {"system.capacity": "1.0:1.0"})])
def test_every_client_at_rate_1_is_fedavg_bitwise(tiny_data, params, over):
    _, _, ref, ref_rows = _train("fedavg", tiny_data, over=over)
    _, _, got, got_rows = _train("fedrolex", tiny_data, params, over)
    assert torch.equal(got, ref)
    for a, b in zip(got_rows, ref_rows):
        assert runfolder.without_wall_clock(a) == runfolder.without_wall_clock(b)


def test_the_window_rolls_from_round_to_round_in_training(tiny_data):
    # every client at rate 1/2 for two rounds: entries of no window keep their value, round 2's new ones move
    ctx, method, params, out = _train("fedrolex", tiny_data)
    m1, m2 = method.window(0.5, 1, ctx).mask.bool(), method.window(0.5, 2, ctx).mask.bool()
    assert (m2 & ~m1).any() and (m1 & ~m2).any()
    assert torch.equal(params[~(m1 | m2)], ctx.init_params[~(m1 | m2)])
    assert not torch.equal(params[m2 & ~m1], ctx.init_params[m2 & ~m1])
    # each round's row: the sub-model's size and measured FLOP fraction, 32 bits per kept parameter each way
    lead = methods.create_method("heterofl").submodel(0.5, ctx)
    for row in out:
        assert row["trained_params"] == [lead.trained_params] * 2 and row["flop_fraction"] == [round(lead.flop_fraction, 6)] * 2
        assert row["client_uplink_bits"] == [32 * lead.trained_params] * 2 == row["client_downlink_bits"]


def test_sampling_uses_the_full_model(tiny_data):
    ctx = build_context(tiny_config("fedrolex", over={**SMALL, "eval.sampler_steps": 2}), data=tiny_data)
    noise = torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(3))
    got = methods.create_method("fedrolex").sample(ctx.init_params, noise, ctx)  # every client at rate 1/2
    assert torch.equal(got, methods.create_method("fedavg").sample(ctx.init_params, noise, ctx))


def test_batched_mode_is_refused_before_any_data_when_a_client_is_narrow():
    with pytest.raises(ConfigError, match="fedrolex.*narrowest rate 0.5.*clients_mode=sequential"):
        tiny_config("fedrolex", over={"train.clients_mode": "batched"})
    with pytest.raises(ConfigError, match="narrowest rate 0.25"):
        tiny_config("fedrolex", {"rate": 1.0}, {"train.clients_mode": "batched", "system.capacity": "1.0:0.5,0.25:0.5"})
    tiny_config("fedrolex", {"rate": 1.0}, {"train.clients_mode": "batched"})  # rate 1 is FedAvg: allowed
    with pytest.raises(ConfigError, match="method.rate"):
        tiny_config("fedrolex", {"rate": 0.0})
