"""FjORD (Horváth et al., NeurIPS 2021): the widths P_i a client may draw, the seeded per-step draws (same seed,
same widths; another round, other widths; only widths up to p_max; uniform by a chi-square bound), each step
runs the leading-channel sub-model of its width, nested prefixes averaged by hand, the plan's bits, size and
FLOP fraction, widths=1.0 is FedAvg bitwise, the sampled width, and the refusals."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dfbench import methods
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.core.config import ConfigError
from dfbench.benchmark.engine.context import build_context
from dfbench.benchmark.engine.training import train_round
from dfbench.methods.fjord import allowed_widths, draw_widths, parse_widths
from dfbench.methods.heterofl import SliceSpec, build_submodel, kept_mask, leading
from helpers import tiny_config

SMALL = {"data.clients": 2, "train.local_steps": 2, "train.rounds": 2}
UNIFORM5 = (0.2, 0.4, 0.6, 0.8, 1.0)


def _ctx(tiny_data, params=None, over=None):
    return build_context(tiny_config("fjord", params, {**SMALL, **(over or {})}), data=tiny_data)


def _drawn(method, ctx, round_: int, client: int) -> tuple[float, ...]:
    """The widths the client's plan of round `round_` drew, one per local step."""
    return method.client_view(method.init_state(ctx.init_params, ctx), client, ctx.at_round(round_, 1.0)).step.network.widths


# -- the widths ------------------------------------------------------------------------------------

def test_the_widths_are_the_set_P_and_a_client_draws_from_those_up_to_its_capacity():
    assert parse_widths("0.2,0.4,0.6,0.8,1.0") == UNIFORM5 == parse_widths("1.0,0.8,0.6,0.4,0.2")  # ascending
    assert allowed_widths(UNIFORM5, 1.0) == UNIFORM5
    assert allowed_widths(UNIFORM5, 0.6) == (0.2, 0.4, 0.6)
    assert allowed_widths(UNIFORM5, 0.5) == (0.2, 0.4)  # between two widths: the smaller one is its largest
    assert allowed_widths(UNIFORM5, 0.1) == ()
    for bad in ("0.2,0.2", "0,0.5", "0.5,1.5", "half", ""):
        with pytest.raises(ValueError, match="method.widths"):
            parse_widths(bad)


def test_the_draws_are_seeded_by_round_and_client_and_stay_up_to_p_max(tiny_data):
    # prepare: 40 local steps; capacities 1.0 (client 0) and 0.6 (client 1)
    ctx = _ctx(tiny_data, over={"train.local_steps": 40, "system.capacity": "1.0:0.5,0.6:0.5"})
    method = methods.create_method("fjord")
    caps = [float(ctx.capacity[k]) for k in range(2)]
    # execute / assert: one width per step; a fresh method instance draws the same; another round or client others
    first = {(r, k): _drawn(method, ctx, r, k) for r in (1, 2) for k in (0, 1)}
    assert all(len(w) == 40 for w in first.values())
    assert first == {(r, k): _drawn(methods.create_method("fjord"), ctx, r, k) for r in (1, 2) for k in (0, 1)}
    assert first[(1, 0)] != first[(2, 0)] and first[(1, 1)] != first[(2, 1)]
    for (r, k), widths in first.items():
        assert set(widths) <= set(allowed_widths(UNIFORM5, caps[k]))
    assert sorted(caps) == [0.6, 1.0] and max(first[(1, caps.index(0.6))]) == 0.6
    # another run seed draws other widths
    other = build_context(tiny_config("fjord", None, {**SMALL, "train.local_steps": 40, "seed": 1}), data=tiny_data)
    assert _drawn(method, other, 1, 0) != _drawn(method, _ctx(tiny_data, over={"train.local_steps": 40}), 1, 0)


@pytest.mark.parametrize("p_max,allowed", [(1.0, UNIFORM5), (0.6, (0.2, 0.4, 0.6))])
def test_the_draws_are_uniform_over_the_allowed_widths(tiny_data, p_max, allowed):
    # prepare: the run's generator for (round 1, client 0), as the method seeds it
    ctx = _ctx(tiny_data)
    n = 6000
    # execute
    counts = Counter(draw_widths(allowed_widths(UNIFORM5, p_max), n, ctx.rng("fjord", 1, 0)))
    # assert: every allowed width, nothing else, and a chi-square below its 0.1 % critical value
    assert set(counts) == set(allowed)
    expected = n / len(allowed)
    chi2 = sum((counts[p] - expected) ** 2 / expected for p in allowed)
    critical = {3: 13.82, 5: 18.47}[len(allowed)]  # chi-square, len - 1 degrees of freedom, p = 0.001
    assert chi2 < critical, (counts, chi2)
    # a draw that favours a width fails the same bound (the test can fail)
    skewed = Counter(allowed[min(int(i), len(allowed) - 1)] for i in np.random.default_rng(0).exponential(1.0, n))
    assert sum((skewed[p] - expected) ** 2 / expected for p in allowed) > critical


# -- the client's network and plan -----------------------------------------------------------------

def test_each_step_runs_the_leading_sub_model_of_its_drawn_width(tiny_data):
    # prepare: capacity 0.6, 6 local steps
    ctx = _ctx(tiny_data, {"rate": 0.6}, {"train.local_steps": 6})
    method = methods.create_method("fjord", rate=0.6)
    plan = method.client_view(method.init_state(ctx.init_params, ctx), 0, ctx.at_round(1, 1.0))
    net = plan.step.network
    x, t = torch.randn(2, 1, 28, 28, generator=torch.Generator().manual_seed(1)), torch.tensor([0.3, 0.8])
    # execute / assert: call s is HeteroFL's leading sub-model at width drawn[s], without the Scaler
    with torch.no_grad():
        for p in net.widths:
            assert torch.equal(net(x, t), build_submodel(ctx, p, scaler=False).model(x, t))
        with pytest.raises(RuntimeError, match="once per step"):
            net(x, t)
    # the parameters the shared local step trains are the full model's (views of ctx.flat)
    assert list(net.parameters())[0].data_ptr() == ctx.flat.data_ptr()
    # the client holds and sends the prefix of its largest width, 0.6; FLOPs: the mean over its steps
    top = build_submodel(ctx, 0.6, scaler=False)
    assert torch.equal(plan.step.mask, top.mask) and plan.trained_params == top.trained_params
    assert plan.downlink_bits == 32 * top.trained_params
    fractions = {p: build_submodel(ctx, p, scaler=False).flop_fraction for p in (0.2, 0.4, 0.6)}
    assert plan.flop_fraction == pytest.approx(float(np.mean([fractions[p] for p in net.widths])), rel=1e-12)
    assert fractions[0.2] < fractions[0.4] < fractions[0.6] < 1.0


def test_nested_prefixes_are_averaged_over_their_holders():
    # prepare: one parameter of 5 channels; client A with p_max 1.0 holds all 5 (n_A = 1), client B with
    # p_max 0.4 holds ceil(0.4 * 5) = 2, the first two (n_B = 3); the global values are 0..4
    theta = torch.arange(5, dtype=torch.float32)
    masks = [kept_mask(("w",), ((5,),), {"w": SliceSpec([leading(5, kept)], 1.0)}) for kept in (5, 2)]
    a, b = 10 + theta, 20 + theta
    method = methods.create_method("fjord")
    ctx = SimpleNamespace(round_weight=4.0, layout=SimpleNamespace(total=5))
    state = methods.ServerState(params=theta.clone())
    acc = method.new_accumulator(state, ctx)
    # execute
    for params, weight, mask in ((a, 1.0, masks[0]), (b, 3.0, masks[1])):
        method.accumulate(acc, methods.Upload(params=params, weight=weight, uplink_bits=0, mask=mask), ctx)
    new = method.apply(state, acc, ctx).params
    # assert: the first two = (1 * a + 3 * b) / 4, the rest A's alone
    assert new.tolist() == [(10 + 3 * 20) / 4, (11 + 3 * 21) / 4, 12.0, 13.0, 14.0]


# -- runs --------------------------------------------------------------------------------------------

def _train(name: str, tiny_data, params=None, over=None):
    ctx = build_context(tiny_config(name, params, {**SMALL, **(over or {})}), data=tiny_data)
    method = methods.create_method(name, **(params or {}))
    state, out = method.init_state(ctx.init_params, ctx), []
    for r in (1, 2):
        state, row = train_round(method, state, ctx, r)
        out.append(runfolder.without_wall_clock(row))
    return ctx, method, state.params, out


@pytest.mark.parametrize("over", [{}, {"system.capacity": "1.0:1.0"}])
def test_widths_1_is_fedavg_bitwise(tiny_data, over):
    _, _, ref, ref_rows = _train("fedavg", tiny_data, over=over)
    _, _, got, got_rows = _train("fjord", tiny_data, {"widths": "1.0"}, over)
    assert torch.equal(got, ref) and got_rows == ref_rows
    # ordered dropout over the default widths trains something else
    _, _, od, _ = _train("fjord", tiny_data, over=over)
    assert not torch.equal(od, ref)


def test_a_round_trains_inside_the_prefixes_and_logs_sizes_and_bits(tiny_data):
    # every client at capacity 0.6: entries outside the 0.6 prefix keep their value
    ctx, method, params, out = _train("fjord", tiny_data, {"rate": 0.6})
    top = build_submodel(ctx, 0.6, scaler=False)
    held = top.mask.bool()
    assert torch.equal(params[~held], ctx.init_params[~held]) and not torch.equal(params[held], ctx.init_params[held])
    for row in out:
        assert row["trained_params"] == [top.trained_params] * 2
        assert row["client_uplink_bits"] == [32 * top.trained_params] * 2 == row["client_downlink_bits"]
        assert all(0.0 < f < top.flop_fraction + 1e-6 for f in row["flop_fraction"])


def test_sampling_uses_the_largest_width_a_client_draws(tiny_data):
    noise = torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(3))
    # a capacity-1 client: the full model (p = 1)
    ctx = _ctx(tiny_data, over={"system.capacity": "1.0:0.5,0.6:0.5", "eval.sampler_steps": 2})
    method = methods.create_method("fjord")
    assert method.inference_rate(ctx) == 1.0
    assert torch.equal(method.sample(ctx.init_params, noise, ctx), methods.create_method("fedavg").sample(ctx.init_params, noise, ctx))
    # every client at 0.6: the 0.6 prefix, which never reads the outer channels
    ctx = _ctx(tiny_data, {"rate": 0.6}, {"eval.sampler_steps": 2})
    method = methods.create_method("fjord", rate=0.6)
    held = build_submodel(ctx, 0.6, scaler=False).mask.bool()
    poisoned = ctx.init_params.clone()
    poisoned[~held] = float("nan")
    a = method.sample(ctx.init_params, noise, ctx)
    assert torch.equal(method.sample(poisoned, noise, ctx), a) and torch.isfinite(a).all()


def test_refusals_before_any_data():
    with pytest.raises(ConfigError, match="fjord.*narrowest rate 0.2.*clients_mode=sequential"):
        tiny_config("fjord", over={"train.clients_mode": "batched"})
    tiny_config("fjord", {"widths": "1.0"}, {"train.clients_mode": "batched"})  # FedAvg: allowed
    with pytest.raises(ConfigError, match="capacity 0.1 can hold none of the widths.*add a width of at most 0.1"):
        tiny_config("fjord", over={"system.capacity": "1.0:0.5,0.1:0.5"})
    with pytest.raises(ConfigError, match="capacity 0.5 can hold none"):
        tiny_config("fjord", {"widths": "1.0"}, {"system.capacity": "1.0:0.5,0.5:0.5"})
    with pytest.raises(ConfigError, match="method.widths"):
        tiny_config("fjord", {"widths": "0.5,0.5"})
