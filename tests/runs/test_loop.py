"""The shared round loop, FedAvg/FedProx, and the run folder."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dfbench import methods
from dfbench.benchmark.core.config import ConfigError
from dfbench.benchmark.engine.context import build_context
from dfbench.benchmark.engine.lifecycle import run
from dfbench.benchmark.core.seeds import torch_gen
from helpers import final_params, local_train_kw, tiny_config


def test_fedavg_one_client_equals_plain_local_training(tmp_path, tiny_data):
    # prepare: one client, one round == S plain Adam steps of the shared step from the same init
    cfg = tiny_config(over={"data.clients": 1, "train.rounds": 1, "train.local_steps": 5})
    # execute
    d = run(cfg, tmp_path, data=tiny_data, progress=False)
    ctx = build_context(cfg, data=tiny_data)
    obj = ctx.get_objective(None)
    plain = local_train_kw(ctx.model, ctx.flat, ctx.init_params, ctx.images, ctx.client_indices[0], obj, steps=5,
                        batch_size=cfg.train.batch_size, lr=cfg.train.lr, gen=torch_gen(cfg.seed, "client", 1, 0),
                        grad_clip=cfg.train.grad_clip, probe_steps=cfg.train.sigma1_probe_steps)
    # assert: bitwise
    assert torch.equal(final_params(d), plain.params)


def test_fedavg_one_client_equals_plain_training_without_library_step(tmp_path, tiny_data):
    # an independent reference: a hand-written Adam loop over the same batches (no grad clip, no probe)
    cfg = tiny_config(over={"data.clients": 1, "train.rounds": 1, "train.local_steps": 3, "train.grad_clip": 0.0,
                            "train.sigma1_probe_steps": 0})
    d = run(cfg, tmp_path, data=tiny_data, progress=False)
    ctx = build_context(cfg, data=tiny_data)
    obj = ctx.get_objective(None)
    ctx.flat.copy_(ctx.init_params)
    opt = torch.optim.Adam(ctx.model.parameters(), lr=cfg.train.lr, fused=True)  # same kernel as the library
    g = torch_gen(cfg.seed, "client", 1, 0)
    idx = ctx.client_indices[0]
    for _ in range(3):
        pick = torch.randint(0, idx.numel(), (cfg.train.batch_size,), generator=g)
        x0 = ctx.images[idx[pick]].float() / 127.5 - 1
        loss = obj.loss(ctx.model, x0, g)
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.testing.assert_close(final_params(d), ctx.flat, rtol=1e-5, atol=1e-6)


def test_fedavg_aggregation_equals_hand_computed_weighted_mean():
    # prepare: three clients with sizes 1, 2, 3 and constant models 1, 2, 4
    class Ctx:
        class layout:
            total = 4
        client_sizes = np.array([1, 2, 3])
        round_weight = 6.0

    m = methods.create_method("fedavg")
    state = methods.ServerState(params=torch.zeros(4))
    acc = m.new_accumulator(state, Ctx)
    for k, val in enumerate([1.0, 2.0, 4.0]):
        up = m.upload(torch.full((4,), val), methods.ClientPlan(start=state.params), k, state, Ctx)
        m.accumulate(acc, up, Ctx)
    # execute
    new = m.apply(state, acc, Ctx)
    # assert: (1*1 + 2*2 + 3*4) / 6 = 17/6
    assert torch.allclose(new.params, torch.full((4,), 17 / 6))


@pytest.mark.slow
def test_fedprox_mu_zero_equals_fedavg_and_mu_pulls_towards_global(tmp_path, tiny_data):
    base = final_params(run(tiny_config("fedavg"), tmp_path / "a", data=tiny_data, progress=False))
    prox0 = final_params(run(tiny_config("fedprox", {"mu": 0.0}), tmp_path / "b", data=tiny_data, progress=False))
    assert torch.equal(base, prox0)
    init = build_context(tiny_config(), data=tiny_data).init_params
    strong = final_params(run(tiny_config("fedprox", {"mu": 1e4}, {"train.grad_clip": 0.0}), tmp_path / "c", data=tiny_data, progress=False))
    assert (strong - init).norm() < (base - init).norm()


@pytest.mark.slow
def test_run_folder_contents_and_same_seed_same_grid(tmp_path, tiny_data):
    cfg = tiny_config()
    d1 = run(cfg, tmp_path / "a", data=tiny_data, progress=False)
    d2 = run(cfg, tmp_path / "b", data=tiny_data, progress=False)
    for name in ("config.json", "rounds.jsonl", "metrics.json", "grid.png", "status.json", "partition.json"):
        assert (d1 / name).exists(), name
    assert json.loads((d1 / "status.json").read_text())["state"] == "done"
    rows = [json.loads(x) for x in (d1 / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    for key in ("clients", "loss", "uplink_bits", "wall_seconds", "gamma", "w2", "sigma1_sq", "sigma2_sq"):
        assert key in rows[0]
    assert (d1 / "grid.png").read_bytes() == (d2 / "grid.png").read_bytes()
    assert d1.name == d2.name == cfg.run_id()
    other = run(tiny_config(over={"seed": 1}), tmp_path / "a", data=tiny_data, progress=False)
    assert other != d1


def test_fixed_noise_is_shared_across_methods_and_batch_sizes():
    from dfbench.benchmark.engine.diffusion import fixed_noise

    a = fixed_noise(10, (1, 4, 4), base=0)
    b = torch.cat([fixed_noise(4, (1, 4, 4), base=0), fixed_noise(6, (1, 4, 4), base=0, start=4)])
    assert torch.equal(a, b)
    assert not torch.equal(a, fixed_noise(10, (1, 4, 4), base=1))


@pytest.mark.slow
def test_samples_barely_depend_on_the_sampling_batch(tiny_data):
    # the sampling batch (eval.sample_batch) is a speed knob: an image's sample depends on its
    # batch neighbours only through the convolution kernel's choice of algorithm (float rounding)
    from dfbench.benchmark.engine.diffusion import fixed_noise

    cfg = tiny_config(over={"train.objective": "fm", "eval.sampler_steps": 2})
    ctx = build_context(cfg, data=tiny_data)
    params = ctx.init_params + 0.01 * torch.randn(ctx.layout.total, generator=torch.Generator().manual_seed(0))
    noise = fixed_noise(cfg.eval.sample_batch + 7, ctx.image_shape)
    whole = ctx.sample_single(params, noise, "fm", batch=noise.shape[0])
    for batch in (cfg.eval.sample_batch, 5):
        torch.testing.assert_close(ctx.sample_single(params, noise, "fm", batch=batch), whole, rtol=0, atol=1e-5)


def test_rounds_zero_evaluates_untrained_model(tmp_path, tiny_data):
    d = run(tiny_config(over={"train.rounds": 0}), tmp_path, data=tiny_data, progress=False)
    assert json.loads((d / "status.json").read_text())["state"] == "done"
    assert (d / "rounds.jsonl").exists() is False
    assert torch.equal(final_params(d), build_context(tiny_config(), data=tiny_data).init_params)


def test_fedavg_uplink_bits_are_32_per_parameter_per_participant(tmp_path, tiny_data):
    d = run(tiny_config(over={"system.participation": 0.5}), tmp_path, data=tiny_data, progress=False)
    P = build_context(tiny_config(), data=tiny_data).layout.total
    for row in map(json.loads, (d / "rounds.jsonl").read_text().splitlines()):
        assert len(row["clients"]) == 2
        assert row["uplink_bits"] == 32 * P * 2
        assert row["gamma"] == 2 and row["w2"] == 0.0


@pytest.mark.parametrize("name,kwargs,needle", [
    ("nope", {}, "registered methods:"),
    ("fedprox", {"mu_typo": 1}, "valid: method.mu"),
    ("fedprox", {"mu": -1}, "method.mu"),
])
def test_unknown_method_or_hyperparameter_is_a_clear_error(name, kwargs, needle):
    with pytest.raises((KeyError, ValueError)) as err:
        methods.create_method(name, **kwargs)
    assert needle in str(err.value)
    if name == "nope":
        assert "fedavg" in str(err.value) and "fedprox" in str(err.value)
    with pytest.raises(ConfigError, match=needle.split(":")[0]):
        tiny_config(name, kwargs)


def test_method_params_are_stored_resolved_so_run_ids_do_not_depend_on_spelling():
    a = tiny_config("fedprox", {"mu": "0.01"})
    b = tiny_config("fedprox", {"mu": 0.01})
    c = tiny_config("fedprox", {})
    assert dict(a.method_params) == {"mu": 0.01}
    assert a.run_id() == b.run_id() == c.run_id()


def test_duplicate_registration_is_an_error():
    with pytest.raises(ValueError, match="already registered"):
        methods.register_method("fedavg")(type("X", (methods.Method,), {}))
