"""Clients side by side in forked one-thread processes (benchmark/engine/parallel.py) against the
sequential loop: the same global model bit for bit, the same rounds.jsonl rows, failures named."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from dfbench import methods
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.core.config import ConfigError
from dfbench.benchmark.engine import parallel
from dfbench.benchmark.engine.context import build_context
from dfbench.benchmark.engine.local_step import LocalResult
from dfbench.benchmark.engine.training import train_round
from helpers import tiny_config


def _rounds(cfg, data, rounds: int = 2):
    ctx = build_context(cfg, data=data)
    m = methods.create_method(cfg.method, **dict(cfg.method_params))
    state = m.init_state(ctx.init_params, ctx)
    rows = []
    for r in range(1, rounds + 1):
        state, row = train_round(m, state, ctx, r)
        # each client's own training time, measured where it trained (a worker, or here)
        assert len(row["client_train_seconds"]) == len(row["clients"]) and all(t > 0 for t in row["client_train_seconds"])
        rows.append(runfolder.without_wall_clock(row))
    return state, rows


@pytest.mark.parametrize("method, params, over", [
    ("fedavg", {}, {}),
    ("fedprox", {"mu": 0.1}, {"system.stragglers": 0.5}),  # unequal local steps: the shared counter balances them
    ("scaffold", {}, {}),  # a step correction, per-client state updated at upload
    ("random_prune", {"keep_ratio": 0.5}, {}),
    ("heterofl", {}, {"system.capacity": "1.0:0.5,0.5:0.5"}),  # a sub-model network: a view of the worker's own buffer
])
def test_parallel_clients_give_the_sequential_model_bit_for_bit(method, params, over, tiny_data):
    # one thread for both (conftest): the sequential loop's clients and each worker's
    seq_cfg = tiny_config(method, params, {**over, "train.client_workers": 1, "data.clients": 5})
    par_cfg = tiny_config(method, params, {**over, "train.client_workers": 2, "data.clients": 5})
    assert seq_cfg.run_id() == par_cfg.run_id()  # an execution knob: the same run
    seq_state, seq_rows = _rounds(seq_cfg, tiny_data)
    par_state, par_rows = _rounds(par_cfg, tiny_data)
    assert torch.equal(seq_state.params, par_state.params)
    assert seq_rows == par_rows  # losses, bits, gamma, sigma terms: every recorded number


def test_more_workers_than_clients_and_a_single_client(tiny_data):
    # 2 clients, 4 workers: two processes; participation 0.5 of 2 clients: one client, trained here
    for over in ({"data.clients": 2}, {"data.clients": 2, "system.participation": 0.5}):
        a, rows_a = _rounds(tiny_config("fedavg", over={**over, "train.client_workers": 1}), tiny_data)
        b, rows_b = _rounds(tiny_config("fedavg", over={**over, "train.client_workers": 4}), tiny_data)
        assert torch.equal(a.params, b.params) and rows_a == rows_b


def test_workers_for_applies_only_where_forking_helps():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert parallel.workers_for(3, cpu, 1, batched=False) == 3
    assert parallel.workers_for(3, cuda, 1, batched=False) == 1  # a CUDA context does not survive a fork
    assert parallel.workers_for(3, cpu, 2, batched=False) == 1  # each rank is a process already
    assert parallel.workers_for(3, cpu, 1, batched=True) == 1
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert parallel.workers_for(0, cpu, 1, batched=False) == 2  # auto: one per thread
        torch.set_num_threads(1)
        assert parallel.workers_for(0, cpu, 1, batched=False) == 1  # a grid's one-thread cell
    finally:
        torch.set_num_threads(saved)


def _result(k: int) -> LocalResult:
    return LocalResult(params=torch.full((3,), float(k)), loss=float(k), sigma1_sq=None)


def test_train_clients_returns_every_client_and_one_thread_each():
    def train(k: int) -> LocalResult:
        r = _result(k)
        r.loss = float(torch.get_num_threads())  # what the worker ran with
        return r

    out = parallel.train_clients(train, [4, 1, 7], workers=2)
    assert sorted(out) == [1, 4, 7]
    assert all(torch.equal(out[k].params, torch.full((3,), float(k))) for k in out)
    assert {r.loss for r in out.values()} == {1.0}


def test_a_failing_client_is_named_with_its_traceback():
    def train(k: int) -> LocalResult:
        if k == 2:
            raise ValueError("client two broke")
        return _result(k)

    with pytest.raises(RuntimeError, match=r"(?s)a client failed in its worker process.*ValueError: client two broke"):
        parallel.train_clients(train, [0, 1, 2, 3], workers=2)


def test_a_killed_worker_is_reported_not_waited_for():
    def train(k: int) -> LocalResult:
        if k == 1:
            os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would
        return _result(k)

    with pytest.raises(RuntimeError, match=r"ended without its results, exit code -9.*train.client_workers=1"):
        parallel.train_clients(train, [0, 1, 2], workers=2)


def test_client_workers_must_not_be_negative():
    with pytest.raises(ConfigError, match="train.client_workers"):
        tiny_config(over={"train.client_workers": -1})
