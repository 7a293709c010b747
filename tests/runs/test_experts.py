"""Decentralized expert mixtures (DDM): velocity conversion, router, mixing, compute matching."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from dfbench import methods
from dfbench.benchmark.core.config import ConfigError
from dfbench.benchmark.engine.context import build_context
from dfbench.benchmark.engine.diffusion import DDPM, FlowMatching, fixed_noise
from dfbench.benchmark.engine.lifecycle import run
from dfbench.benchmark.core.runfolder import load_checkpoint, read_rounds
from dfbench.benchmark.engine.diffusion import (
    ddpm_abar_at, ddpm_velocity, eps_to_velocity, fm_time_of_step, match_ddpm_index, sample_ode,
)
from dfbench.methods.router import Router, RouterData, init_router_, mixing_weights, router_accuracy, train_router
from helpers import final_params, tiny_config

ROUTER = {"router_steps": 20, "router_batch": 16}


# -- exact Gaussian posteriors (x0 ~ N(mu, s^2 I)), float64 --------------------------------------

def exact_fm_velocity(x: torch.Tensor, t: torch.Tensor, mu: torch.Tensor, s: float) -> torch.Tensor:
    """E[eps - x0 | x_t] on x_t = (1-t) x0 + t eps: linear-Gaussian regression on r = x_t - (1-t) mu."""
    t = t[:, None]
    var = (1 - t) ** 2 * s**2 + t**2
    r = x - (1 - t) * mu
    return t * r / var - (mu + (1 - t) * s**2 * r / var)


def exact_ddpm_eps(y: torch.Tensor, a: torch.Tensor, mu: torch.Tensor, s: float) -> torch.Tensor:
    """E[eps | y] on y = sqrt(a) x0 + sqrt(1-a) eps."""
    a = a[:, None]
    return (1 - a).sqrt() * (y - a.sqrt() * mu) / (a * s**2 + 1 - a)


def fm_states(t: torch.Tensor, mu: torch.Tensor, s: float, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x0 = mu + s * torch.randn((t.numel(), mu.numel()), generator=g, dtype=torch.float64)
    eps = torch.randn(x0.shape, generator=g, dtype=torch.float64)
    return (1 - t[:, None]) * x0 + t[:, None] * eps


MU = torch.tensor([0.3, -0.5, 0.1, 0.7], dtype=torch.float64)
S = 0.4


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_ddpm_epsilon_at_matched_step_is_the_exact_fm_velocity(schedule):
    # prepare: the DDPM schedule's own steps, and the FM times with the same SNR
    abar = DDPM(schedule, 1000).abar64
    T = abar.numel()
    t = fm_time_of_step(abar)
    x = fm_states(t, MU, S)

    def ddpm_oracle_discrete(y, tau):  # knows only the T trained steps
        return exact_ddpm_eps(y, abar[(tau * T).round().long()], MU, S)

    # execute
    v = ddpm_velocity(ddpm_oracle_discrete, x, t, abar, clamp=False)
    # assert: float64 precision at every step of the schedule
    torch.testing.assert_close(v, exact_fm_velocity(x, t, MU, S), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_conversion_is_exact_at_any_t_with_continuous_abar(schedule):
    # prepare: random t inside the SNR range the schedule covers; a continuous-time DDPM oracle
    abar = DDPM(schedule, 1000).abar64
    T = abar.numel()
    t_lo, t_hi = fm_time_of_step(abar)[[0, -1]].tolist()
    t = t_lo + (t_hi - t_lo) * torch.rand(400, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    x = fm_states(t, MU, S, seed=2)

    def ddpm_oracle(y, tau):
        return exact_ddpm_eps(y, ddpm_abar_at(tau * T, abar), MU, S)

    v = ddpm_velocity(ddpm_oracle, x, t, abar, clamp=False)
    torch.testing.assert_close(v, exact_fm_velocity(x, t, MU, S), rtol=1e-9, atol=1e-9)


def test_discretisation_error_of_a_step_only_oracle_shrinks_with_T():
    # an expert that only knows integer steps, queried at the nearest one: the SNR mismatch (half a step at
    # most) is the only error, first order in 1/T (measured: 0.15 at T = 50, 0.009 at T = 1000)
    t = torch.linspace(0.05, 0.95, 200, dtype=torch.float64)
    x = fm_states(t, MU, S, seed=3)
    exact = exact_fm_velocity(x, t, MU, S)
    errs = []
    for T in (50, 1000):
        abar = DDPM("cosine", T).abar64
        v = ddpm_velocity(lambda y, tau: exact_ddpm_eps(y, abar[(tau * T).round().long()], MU, S), x, t, abar, clamp=False)
        errs.append(float((v - exact).abs().max()))
    assert errs[1] < errs[0] / 10
    assert errs[1] < 0.02


def test_snr_matching_maps_steps_to_themselves_and_clamps_the_ends():
    abar = DDPM("cosine", 1000).abar64
    steps = match_ddpm_index(fm_time_of_step(abar), abar)
    torch.testing.assert_close(steps, torch.arange(1000, dtype=torch.float64), rtol=0, atol=1e-8)
    torch.testing.assert_close(ddpm_abar_at(torch.arange(1000, dtype=torch.float64), abar), abar, rtol=1e-12, atol=0)
    ends = match_ddpm_index(torch.tensor([0.0, 1e-12, 1.0], dtype=torch.float64), abar)
    assert ends.tolist() == [0.0, 0.0, 999.0]
    # independent check of one matched point: SNR(abar(s)) == (1-t)^2 / t^2
    t = torch.tensor([0.37], dtype=torch.float64)
    a = ddpm_abar_at(match_ddpm_index(t, abar), abar)
    torch.testing.assert_close(a / (1 - a), (1 - t) ** 2 / t**2, rtol=1e-12, atol=0)


def test_x0_clamp_changes_velocity_only_where_x0_hat_leaves_the_data_range():
    g = torch.Generator().manual_seed(0)
    x, eps = 2 * torch.randn(64, 8, generator=g, dtype=torch.float64), torch.randn(64, 8, generator=g, dtype=torch.float64)
    t = torch.rand(64, generator=g, dtype=torch.float64) * 0.9
    x0_hat = (x - t[:, None] * eps) / (1 - t[:, None])
    changed = eps_to_velocity(eps, x, t, clamp=True) != eps_to_velocity(eps, x, t, clamp=False)
    assert torch.equal(changed, x0_hat.abs() > 1)
    assert changed.any() and not changed.all()


@pytest.mark.parametrize("method", ["euler", "heun"])
def test_velocity_ode_sampler_equals_the_flow_matching_sampler(method):
    net = lambda x, t: 0.3 * x - t.view(-1, 1, 1, 1)  # noqa: E731
    noise = torch.randn(3, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    ref = FlowMatching().sample(net, noise, 7, method)
    ours = sample_ode(lambda x, t: net(x, torch.full((x.shape[0],), t)), noise, 7, method)
    assert torch.equal(ours, ref)


def test_mixing_weights_on_hand_built_posteriors():
    p = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.2, 0.7]])
    assert torch.equal(mixing_weights(p, "full"), p)
    assert torch.equal(mixing_weights(p, "top1"), torch.tensor([[1.0, 0, 0], [0, 0, 1.0]]))
    torch.testing.assert_close(mixing_weights(p, "topk", 2), torch.tensor([[0.625, 0.375, 0], [0, 2 / 9, 7 / 9]]))
    torch.testing.assert_close(mixing_weights(p, "topk", 3), p)


@pytest.mark.parametrize("params,needle", [
    ({"mixing": "top2"}, "method.mixing"),
    ({"mixing": "topk:3", "num_experts": 2}, "method.mixing"),
    ({"objectives": "ddpm,fm,fm", "num_experts": 2}, "method.objectives"),
    ({"objectives": "eps"}, "method.objectives"),
    ({"num_experts": -1}, "method.num_experts"),
    ({"router_steps": 0}, "method.router_steps"),
])
def test_invalid_hyperparameters_are_clear_errors(params, needle):
    with pytest.raises(ValueError, match=needle):
        methods.create_method("experts", **params)
    with pytest.raises(ConfigError, match=needle):
        tiny_config("experts", params)


def test_impossible_expert_counts_and_samplers_are_refused_before_any_data():
    with pytest.raises(ConfigError, match="method.num_experts.*allowed: 2 or 0"):
        tiny_config("experts", {"num_experts": 3}, {"data.partition": "clusters:2"})
    with pytest.raises(ConfigError, match="method.num_experts.*clusters:K"):
        tiny_config("experts", {"num_experts": 0})
    with pytest.raises(ConfigError, match="at most data.clients=4"):
        tiny_config("experts", {"num_experts": 5})
    with pytest.raises(ConfigError, match="method.mixing"):  # topk:3 of clusters:2's two experts
        tiny_config("experts", {"num_experts": 0, "mixing": "topk:3"}, {"data.partition": "clusters:2"})
    with pytest.raises(ConfigError, match="'eval.sampler' with method 'experts': 'ddim'"):
        tiny_config("experts", over={"train.objective": "ddpm", "eval.sampler": "ddim"})


def test_client_groups_and_sampler_label_need_no_state(tiny_data):
    # the hooks evaluation calls (dfbench eval has no trained method at hand)
    cfg = tiny_config("experts", {"num_experts": 0}, {"data.partition": "clusters:2"})
    ctx = build_context(cfg, data=tiny_data)
    fresh = methods.create_method("experts", num_experts=0)
    assert np.array_equal(fresh.client_groups(cfg, ctx.partition.cluster_of_client), ctx.partition.cluster_of_client)
    assert fresh.sampler_label(cfg) == "heun"
    assert methods.create_method("fedavg").client_groups(cfg, ctx.partition.cluster_of_client) is None
    assert methods.create_method("fedavg").sampler_label(cfg) is None


def test_clients_follow_the_clusters_of_a_cluster_partition(tiny_data):
    cfg = tiny_config("experts", {"num_experts": 0}, {"data.partition": "clusters:2"})
    ctx = build_context(cfg, data=tiny_data)
    m = methods.create_method("experts", num_experts=0)
    state = m.init_state(ctx.init_params, ctx)
    assert state.params.shape == (2, ctx.layout.total)
    assert np.array_equal(m.expert_of_client, ctx.partition.cluster_of_client)
    for c in range(ctx.num_clients):
        plan = m.client_view(state, c, ctx)
        assert plan.group == ctx.partition.cluster_of_client[c] and plan.downlink_bits == 0 and plan.step.objective == cfg.train.objective
    with pytest.raises(ValueError, match="method.num_experts.*allowed: 2 or 0"):
        methods.create_method("experts", num_experts=3).init_state(ctx.init_params, ctx)
    iid = build_context(tiny_config("experts"), data=tiny_data)
    with pytest.raises(ValueError, match="method.num_experts.*clusters:K"):
        methods.create_method("experts", num_experts=0).init_state(iid.init_params, iid)
    with pytest.raises(ValueError, match="at most data.clients=4"):
        methods.create_method("experts", num_experts=5).init_state(iid.init_params, iid)
    m3 = methods.create_method("experts", num_experts=3, objectives="alternate")
    m3.init_state(iid.init_params, iid)
    assert m3.expert_of_client.tolist() == [0, 1, 2, 0] and m3.objectives == ["ddpm", "fm", "ddpm"]


# -- whole runs (tiny preset, synthetic data) -----------------------------------------------------

@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_data):
    """fedavg (fm), experts K=1 (fm) and experts K=2 (ddpm + fm, full mixture), same grid cell."""
    out = tmp_path_factory.mktemp("experts_runs")
    fm = {"train.objective": "fm", "data.clients": 3}
    return {
        "fedavg": run(tiny_config("fedavg", over=fm), out, data=tiny_data, progress=False),
        "k1": run(tiny_config("experts", {"num_experts": 1}, fm), out, data=tiny_data, progress=False),
        "k2": run(tiny_config("experts", {"num_experts": 2, "objectives": "ddpm,fm", "mixing": "full", **ROUTER}, fm),
                  out, data=tiny_data, progress=False),
    }


@pytest.mark.slow
def test_one_expert_is_fedavg_bit_for_bit(runs):
    # training: the one expert's parameters equal FedAvg's global model
    assert torch.equal(final_params(runs["k1"])[0], final_params(runs["fedavg"]))
    # sampling: the velocity sampler with weight 1 equals the FM sampler
    a, b = (np.load(runs[k] / "samples.npz")["images"] for k in ("k1", "fedavg"))
    assert np.array_equal(a, b)


@pytest.mark.slow
def test_compute_matches_fedavg_and_nothing_crosses_between_experts(runs):
    fed, exp = read_rounds(runs["fedavg"]), read_rounds(runs["k2"])
    assert [r["clients"] for r in exp] == [r["clients"] for r in fed]
    assert [r["steps"] for r in exp] == [r["steps"] for r in fed]
    batch = 8  # helpers.TINY's train.batch_size
    grads = lambda rows: sum(sum(r["steps"]) * batch for r in rows)  # noqa: E731
    assert grads(exp) == grads(fed) == 2 * 3 * 2 * 8  # rounds x clients x local steps x batch
    assert all(r["uplink_bits"] == 0 and r["downlink_bits"] == 0 for r in exp)
    m = json.loads((runs["k2"] / "metrics.json").read_text())
    assert m["uplink_bits"] == 0 and m["downlink_bits"] == 0
    # clients 0, 2 train expert 0, client 1 trains expert 1: only expert 0 needs an intra-cluster sync
    P = final_params(runs["fedavg"]).numel()
    assert m["intra_expert_bits"] == 2 * 32 * P * 2 * 2  # up+down x 32 bits x P x 2 members x 2 rounds
    assert m["experts"]["clients_per_expert"] == [2, 1] and m["experts"]["objectives"] == ["ddpm", "fm"]


@pytest.mark.slow
def test_mixed_run_writes_grid_metrics_and_checkpoints_the_router(runs, tiny_data, monkeypatch):
    d = runs["k2"]
    assert json.loads((d / "status.json").read_text())["state"] == "done"
    assert (d / "grid.png").exists()
    m = json.loads((d / "metrics.json").read_text())
    assert set(m["router_accuracy"]) == {"t=0.0-0.2", "t=0.2-0.4", "t=0.4-0.6", "t=0.6-0.8", "t=0.8-1.0", "chance"}
    ck = load_checkpoint(d)
    assert ck["params"].shape[0] == 2 and "router" in ck["extra"]
    samples = np.load(d / "samples.npz")["images"]
    assert samples.std() > 0
    # a crash during evaluation: the rerun restores the router from the checkpoint (no retraining)
    for name in ("status.json", "metrics.json", "samples.npz"):
        (d / name).unlink()

    def no_training(*a, **k):
        raise AssertionError("router retrained")

    monkeypatch.setattr("dfbench.methods.experts.train_router", no_training)
    cfg = tiny_config("experts", {"num_experts": 2, "objectives": "ddpm,fm", "mixing": "full", **ROUTER},
                      {"train.objective": "fm", "data.clients": 3})
    assert run(cfg, d.parents[3], data=tiny_data, progress=False) == d
    assert np.array_equal(np.load(d / "samples.npz")["images"], samples)
    assert json.loads((d / "metrics.json").read_text())["router_accuracy"] == m["router_accuracy"]


# -- a sure router reproduces one expert ------------------------------------------------------------

class SureRouter(nn.Module):
    """Stub router: a large logit for expert j whatever the input."""

    def __init__(self, j: int, k: int) -> None:
        super().__init__()
        self.j, self.k = j, k

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(x.shape[0], self.k)
        out[:, self.j] = 50.0
        return out


@pytest.mark.parametrize("mixing", ["top1", "topk:1", "oracle", "full"])
@pytest.mark.parametrize("j", [0, 1])
def test_sure_router_samples_expert_j_alone(tiny_data, mixing, j):
    # prepare: two different experts (ddpm, fm) and a router that always answers j
    cfg = tiny_config("experts", {"num_experts": 2, "objectives": "ddpm,fm", "mixing": mixing})
    ctx = build_context(cfg, data=tiny_data)
    m = methods.create_method("experts", num_experts=2, objectives="ddpm,fm", mixing=mixing)
    params = m.init_state(ctx.init_params, ctx).params
    params[1] += 0.05 * torch.randn(params.shape[1], generator=torch.Generator().manual_seed(0))
    m.router = SureRouter(j, 2)
    noise = fixed_noise(4, ctx.image_shape)
    # execute
    mixed = m.sample(params, noise, ctx)
    # assert: the same as sampling expert j by itself (FM: the library's own FM sampler)
    if j == 1:
        alone = ctx.sample_single(params[1], noise, "fm")
    else:
        ctx.flat.copy_(params[0])
        abar = ctx.get_objective("ddpm").abar64
        with torch.no_grad():
            alone = sample_ode(lambda x, t: ddpm_velocity(ctx.model, x, torch.full((x.shape[0],), t), abar), noise,
                               cfg.eval.sampler_steps)
    if mixing == "full":  # the other expert keeps a weight of e^-50
        torch.testing.assert_close(mixed, alone, rtol=0, atol=1e-5)
    else:
        assert torch.equal(mixed, alone)


# -- the router ---------------------------------------------------------------------------------

def test_router_beats_chance_on_well_separated_clusters():
    # prepare: cluster 0 is bright on the left half, cluster 1 on the right half
    g = torch.Generator().manual_seed(0)
    n = 200
    y = torch.arange(n) % 2
    img = torch.randint(0, 40, (n, 1, 16, 16), generator=g)
    img[y == 0, :, :, :8] += 200
    img[y == 1, :, :, 8:] += 200
    perm = torch.randperm(n, generator=g)
    data = RouterData(img.clamp(0, 255).to(torch.uint8), perm[:160], y[perm[:160]], perm[160:], y[perm[160:]])
    router = Router(1, 2)
    init_router_(router, torch.Generator().manual_seed(1))
    # execute
    train_router(router, data, steps=150, batch_size=32, lr=3e-3, gen=torch.Generator().manual_seed(2))
    acc = router_accuracy(router, data, torch.Generator().manual_seed(3))
    # assert: chance is 0.5; low noise is nearly perfect
    assert acc["t=0.0-0.2"] > 0.9
    assert acc["t=0.0-0.2"] >= acc["t=0.8-1.0"]


def test_grid_file_cells_are_valid_configs():
    import itertools
    import tomllib
    from pathlib import Path

    from dfbench.benchmark.core.config import RunConfig
    from dfbench.benchmark.engine.resolve import apply_overrides

    grid = tomllib.loads((Path(__file__).parents[2] / "benchmark" / "grid" / "builtin" / "experts.toml").read_text())
    axes = grid["axes"]
    cells = list(itertools.product(*axes.values()))
    assert len(cells) == 13 * 3 * 3
    for values in cells:
        over = {**grid["base"], **dict(zip(axes, values))}
        name, _, query = over.pop("method").partition("?")
        params = dict(kv.split("=", 1) for kv in query.split("&")) if query else {}
        cfg = apply_overrides(RunConfig(), {"method": name, **{f"method.{k}": v for k, v in params.items()}, **over})
        assert cfg.data.clients % int(cfg.data.partition.split(":")[1]) == 0
