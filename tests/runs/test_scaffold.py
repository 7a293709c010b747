"""SCAFFOLD (Karimireddy et al., ICML 2020, option II): the FedAvg reduction, the control-variate
algebra on one round by hand, the corrected local step, the ledger, refusals and resume."""

from __future__ import annotations

import json

import pytest
import torch

from dfbench import methods
from dfbench.benchmark.core.config import ConfigError
from dfbench.benchmark.engine.resolve import resolve
from dfbench.benchmark.engine.context import build_context
from dfbench.benchmark.engine.lifecycle import run
from helpers import final_params, local_train_kw, rows, sigkill_then_resume, tiny_config


@pytest.mark.slow
def test_one_client_with_zero_control_variates_is_fedavg_for_the_first_round(tmp_path, tiny_data):
    over = {"data.clients": 1, "train.rounds": 1}
    ref = run(tiny_config("fedavg", over=over), tmp_path / "a", data=tiny_data, progress=False)
    got = run(tiny_config("scaffold", over=over), tmp_path / "b", data=tiny_data, progress=False)
    assert torch.equal(final_params(got), final_params(ref))
    # the ledger: x and c down, Delta y and Delta c up — twice FedAvg on both links
    (r_ref,), (r_got,) = rows(ref), rows(got)
    assert r_got["uplink_bits"] == 2 * r_ref["uplink_bits"] and r_got["downlink_bits"] == 2 * r_ref["downlink_bits"]


def _one_round_by_hand(ctx, method, state, r):
    """The loop's sequential round, spelled out, keeping each client's plan and local model."""
    clients = list(range(ctx.num_clients))
    ctx = ctx.at_round(r, float(sum(ctx.client_sizes)))
    acc, plans, locals_ = method.new_accumulator(state, ctx), {}, {}
    for k in clients:
        plans[k] = plan = method.client_view(state, k, ctx)
        res = local_train_kw(ctx.model, ctx.flat, plan.start, ctx.images, ctx.client_indices[k], ctx.get_objective(None),
                          steps=int(ctx.local_steps[k]), batch_size=ctx.cfg.train.batch_size, lr=ctx.cfg.train.lr,
                          gen=ctx.gen("client", r, k), step_correction=plan.step.step_correction)
        locals_[k] = res.params
        method.accumulate(acc, method.upload(res.params, plan, k, state, ctx), ctx)
    return method.apply(state, acc, ctx), plans, locals_


@pytest.mark.slow
def test_control_variates_follow_option_ii(tiny_data):
    # prepare
    cfg = tiny_config("scaffold", over={"train.local_steps": 3, "train.lr": 1e-3})
    ctx = build_context(cfg, data=tiny_data)
    method = methods.create_method("scaffold")
    state = method.init_state(ctx.init_params, ctx)
    K, lr, N = 3, 1e-3, ctx.num_clients
    # execute: round 1 (c = c_i = 0)
    x1 = state.params.clone()
    state, plans, y = _one_round_by_hand(ctx, method, state, 1)
    # assert: no correction in round 1; c_i = (x - y_i) / (K lr); c = (1/N) sum_i c_i
    assert all(p.step.step_correction is None for p in plans.values())
    ci = {k: (x1.double() - y[k].double()) / (K * lr) for k in range(N)}
    for k in range(N):
        torch.testing.assert_close(state.extra["scaffold_ci"][k].double(), ci[k], rtol=1e-5, atol=1e-5)
    c = sum(ci.values()) / N
    torch.testing.assert_close(state.extra["scaffold_c"].double(), c, rtol=1e-5, atol=1e-5)
    # execute: round 2 corrects every step by c - c_i, and option II updates c_i from its own value
    x2 = state.params.clone()
    state, plans, y = _one_round_by_hand(ctx, method, state, 2)
    for k in range(N):
        torch.testing.assert_close(plans[k].step.step_correction.double(), c - ci[k], rtol=1e-5, atol=1e-5)
        new_ci = ci[k] - c + (x2.double() - y[k].double()) / (K * lr)  # c_i - c + (x - y_i) / (K lr)
        torch.testing.assert_close(state.extra["scaffold_ci"][k].double(), new_ci, rtol=1e-4, atol=1e-4)
    # c stays the mean of the c_i over all clients (every client took part)
    mean_ci = sum(state.extra["scaffold_ci"][k].double() for k in range(N)) / N
    torch.testing.assert_close(state.extra["scaffold_c"].double(), mean_ci, rtol=1e-4, atol=1e-4)


def test_the_step_correction_moves_every_local_step(tiny_data):
    # prepare: a zero mask freezes the gradient step, so only the correction moves the model
    cfg = tiny_config("scaffold")
    ctx = build_context(cfg, data=tiny_data)
    corr = torch.linspace(-1, 1, ctx.layout.total)
    # execute
    res = local_train_kw(ctx.model, ctx.flat, ctx.init_params, ctx.images, ctx.client_indices[0], ctx.get_objective(None),
                      steps=4, batch_size=4, lr=0.01, gen=ctx.gen("t"), mask=torch.zeros(ctx.layout.total), step_correction=corr)
    # assert: y = x - K lr (c - c_i)
    torch.testing.assert_close(res.params, ctx.init_params - 4 * 0.01 * corr, rtol=1e-6, atol=1e-6)


def test_batched_mode_and_several_processes_are_refused_before_any_data(tmp_path):
    # batched clients: refused when the config is built (dfbench run, the API, grid --dry-run), no data needed
    with pytest.raises(ConfigError, match="train.clients_mode=batched.*clients_mode=sequential"):
        tiny_config("scaffold", over={"train.clients_mode": "batched"})
    # several ranks: refused by the run's life cycle with the real world size, before the lock or any folder
    cfg = tiny_config("scaffold")
    with pytest.raises(ConfigError, match=r"world size 1, here 2"):
        resolve(cfg, 2)
    resolve(cfg, 1)  # one process is fine
    assert not any(tmp_path.iterdir())


def test_a_non_finite_client_keeps_its_control_variate(tiny_data):
    ctx = build_context(tiny_config("scaffold"), data=tiny_data)
    method = methods.create_method("scaffold")
    state = method.init_state(ctx.init_params, ctx)
    state.extra["scaffold_ci"] = {0: torch.ones(ctx.layout.total)}
    plan = method.client_view(state, 0, ctx)
    method.upload(torch.full_like(ctx.init_params, float("nan")), plan, 0, state, ctx)
    assert torch.equal(state.extra["scaffold_ci"][0], torch.ones(ctx.layout.total))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:took over the stale lock")  # the killed run left its lock behind
def test_scaffold_resumes_bitwise_after_sigkill(tmp_path, tiny_data):
    over = {"method": "scaffold", "train.rounds": 3, "checkpoint_every": 1, "system.participation": 0.5}
    ref, d = sigkill_then_resume(tmp_path, tiny_data, over)
    assert torch.equal(final_params(d), final_params(ref))
    from dfbench.benchmark.core import runfolder

    a, b = runfolder.load_checkpoint(d)["extra"], runfolder.load_checkpoint(ref)["extra"]
    assert torch.equal(a["scaffold_c"], b["scaffold_c"])
    assert a["scaffold_ci"].keys() == b["scaffold_ci"].keys()
    assert all(torch.equal(a["scaffold_ci"][k], b["scaffold_ci"][k]) for k in a["scaffold_ci"])
    assert rows(d) == rows(ref)
    assert json.loads((d / "status.json").read_text())["state"] == "done"
