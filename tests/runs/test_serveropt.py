"""Server optimizers (Reddi et al., ICLR 2021): closed forms on hand-built tensors, the FedAvg
reduction, and bitwise resume after SIGKILL (optimizer state in the checkpoint)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dfbench import methods
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.engine.lifecycle import run
from helpers import final_params, rows, sigkill_then_resume, tiny_config



def _fake_ctx(p: int, sizes: list[int]) -> SimpleNamespace:
    """What the aggregation hooks read: the layout size, the round's weight and the client sizes."""
    return SimpleNamespace(layout=SimpleNamespace(total=p), round_weight=float(sum(sizes)), client_sizes=np.array(sizes))


def _server_round(method: methods.Method, state: methods.ServerState, clients: list[torch.Tensor], sizes: list[int]) -> methods.ServerState:
    ctx = _fake_ctx(state.params.numel(), sizes)
    acc = method.new_accumulator(state, ctx)
    for k, local in enumerate(clients):
        method.accumulate(acc, methods.Upload(params=local, weight=float(sizes[k]), uplink_bits=0), ctx)
    return method.apply(state, acc, ctx)


# prepare: a global model and two clients (sample sizes 1 and 3) on hand-built tensors
X0 = torch.tensor([0.5, -1.0, 2.0, 0.0, 1e-4], dtype=torch.float32)
CLIENTS = [X0 + torch.tensor([0.1, -0.2, 0.0, 0.3, 1e-5]), X0 + torch.tensor([-0.05, 0.4, 0.02, 0.3, -3e-5])]
SIZES = [1, 3]


def _delta64(x: torch.Tensor) -> torch.Tensor:
    """Reference pseudo-gradient in float64: the sample-weighted mean of the client models minus x."""
    mean = (1 * CLIENTS[0].double() + 3 * CLIENTS[1].double()) / 4
    return mean - x.double()


def test_fedadam_first_step_is_the_papers_closed_form():
    # prepare
    eta, b1, b2, tau = 0.03, 0.9, 0.99, 1e-3
    m = methods.create_method("fedadam", server_lr=eta, beta1=b1, beta2=b2, tau=tau)
    # execute
    new = _server_round(m, methods.ServerState(params=X0.clone()), CLIENTS, SIZES)
    # assert: m_0 = (1 - b1) D, v_0 = b2 tau^2 + (1 - b2) D^2 (v_{-1} = tau^2), x_1 = x_0 + eta m_0 / (sqrt(v_0) + tau)
    d = _delta64(X0)
    expected = X0.double() + eta * (1 - b1) * d / (torch.sqrt(b2 * tau**2 + (1 - b2) * d**2) + tau)
    assert torch.equal(new.params, expected.float())
    assert torch.allclose(new.extra["server_m"].double(), (1 - b1) * d, rtol=1e-6, atol=0)


def _reference_adaptive(kind: str, rounds: list[list[torch.Tensor]], eta: float, b1: float, b2: float, tau: float) -> np.ndarray:
    """Reddi et al. Algorithm 2 in float64 numpy, written independently of the method."""
    x = X0.double().numpy().copy()
    m, v = np.zeros_like(x), np.full_like(x, tau**2)
    for clients in rounds:
        d = (1 * clients[0].double().numpy() + 3 * clients[1].double().numpy()) / 4 - x
        m = b1 * m + (1 - b1) * d
        if kind == "fedadagrad":
            v = v + d**2
        elif kind == "fedyogi":
            v = v - (1 - b2) * d**2 * np.sign(v - d**2)
        else:
            v = b2 * v + (1 - b2) * d**2
        x = x + eta * m / (np.sqrt(v) + tau)
    return x


@pytest.mark.parametrize("kind", ["fedadagrad", "fedyogi", "fedadam"])
def test_two_adaptive_rounds_match_algorithm_2(kind):
    # prepare: round 2's clients move from the new model by other amounts
    m = methods.create_method(kind, server_lr=0.05)
    state = methods.ServerState(params=X0.clone())
    # execute
    state = _server_round(m, state, CLIENTS, SIZES)
    second = [state.params + torch.tensor([0.2, 0.0, -0.1, 0.05, 0.0]), state.params + torch.tensor([0.0, -0.3, 0.1, 0.05, 2e-5])]
    state = _server_round(m, state, second, SIZES)
    # assert (float32 state between rounds: a float32 tolerance)
    ref = _reference_adaptive(kind, [CLIENTS, [c.double() for c in second]], 0.05, 0.9, 0.99, 1e-3)
    assert np.allclose(state.params.double().numpy(), ref, rtol=1e-5, atol=1e-6)


def test_fedavgm_two_rounds_are_heavy_ball_momentum():
    m = methods.create_method("fedavgm", server_lr=0.5, momentum=0.9)
    s1 = _server_round(m, methods.ServerState(params=X0.clone()), CLIENTS, SIZES)
    d1 = _delta64(X0)
    assert torch.allclose(s1.params.double(), X0.double() + 0.5 * d1, atol=1e-7)
    s2 = _server_round(m, s1, CLIENTS, SIZES)  # the same client models again: D2 = mean - x_1
    d2 = (1 * CLIENTS[0].double() + 3 * CLIENTS[1].double()) / 4 - s1.params.double()
    assert torch.allclose(s2.params.double(), s1.params.double() + 0.5 * (0.9 * d1 + d2), atol=1e-7)


def test_a_round_without_reports_leaves_model_and_optimizer_state_alone():
    m = methods.create_method("fedadam")
    s1 = _server_round(m, methods.ServerState(params=X0.clone()), CLIENTS, SIZES)
    m_before = s1.extra["server_m"].clone()
    s2 = _server_round(m, s1, [], [])
    assert torch.equal(s2.params, s1.params) and torch.equal(s2.extra["server_m"], m_before)


@pytest.mark.slow
def test_fedavgm_without_momentum_and_server_lr_1_is_fedavg_bitwise(tmp_path, tiny_data):
    over = {"train.rounds": 3, "system.participation": 0.5}
    ref = final_params(run(tiny_config("fedavg", over=over), tmp_path / "a", data=tiny_data, progress=False))
    got = final_params(run(tiny_config("fedavgm", {"momentum": 0.0, "server_lr": 1.0}, over), tmp_path / "b", data=tiny_data, progress=False))
    assert torch.equal(got, ref)
    # and the default momentum does change the model (the test above could not pass by accident)
    mom = final_params(run(tiny_config("fedavgm", over=over), tmp_path / "c", data=tiny_data, progress=False))
    assert not torch.equal(mom, ref)


@pytest.mark.parametrize("name,params,match", [
    ("fedadam", {"beta1": 1.0}, "method.beta1"), ("fedyogi", {"tau": 0.0}, "method.tau"),
    ("fedavgm", {"momentum": -0.1}, "method.momentum"), ("fedadagrad", {"server_lr": 0.0}, "method.server_lr"),
])
def test_bad_hyperparameters_are_refused_with_the_key(name, params, match):
    with pytest.raises(ValueError, match=match):
        methods.create_method(name, **params)


@pytest.mark.slow
def test_batched_clients_give_the_same_server_step(tmp_path, tiny_data):
    over = {"train.rounds": 2}
    seq = final_params(run(tiny_config("fedyogi", over=over), tmp_path / "s", data=tiny_data, progress=False))
    bat = final_params(run(tiny_config("fedyogi", over={**over, "train.clients_mode": "batched"}), tmp_path / "b", data=tiny_data, progress=False))
    # float noise between the two modes grows through local Adam: fedavg's own gap here is ~4e-4
    assert torch.allclose(seq, bat, atol=2e-3)


# -- SIGKILL mid-run, then resume: bitwise equal to the uninterrupted run (helpers.sigkill_then_resume) --

@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:took over the stale lock")  # the killed run left its lock behind
def test_fedadam_resumes_bitwise_after_sigkill(tmp_path, tiny_data):
    over = {"method": "fedadam", "train.rounds": 3, "checkpoint_every": 1}
    ref, d = sigkill_then_resume(tmp_path, tiny_data, over)
    assert torch.equal(final_params(d), final_params(ref))
    a, b = runfolder.load_checkpoint(d)["extra"], runfolder.load_checkpoint(ref)["extra"]
    assert torch.equal(a["server_m"], b["server_m"]) and torch.equal(a["server_v"], b["server_v"])
    assert rows(d) == rows(ref)


def test_fedadagrad_refuses_a_beta2_it_never_uses_and_keeps_its_published_run_ids():
    # issue 61: fedadagrad took method.beta2, ignored it in training, and still hashed it into a new run id
    from dfbench.benchmark.core.config import ConfigError
    from dfbench.benchmark.engine.resolve import config_from_dict
    from dfbench.benchmark.run_flags import config_from_flags

    with pytest.raises(ValueError, match=r"'method\.beta2' is not a hyperparameter of 'fedadagrad'"):
        methods.create_method("fedadagrad", beta2=0.5)
    with pytest.raises(ConfigError, match=r"method\.beta2.*fedadagrad.*fedadam / fedyogi"):
        config_from_flags({"method.beta2": 0.9}, "fedadagrad")
    for name in ("fedadam", "fedyogi"):  # theirs uses it
        assert methods.create_method(name, beta2=0.5).config.beta2 == 0.5
    # the default stays a field, so every committed fedadagrad config.json (which records beta2 = 0.99) reads back
    # to its own run id, and a plain fedadagrad run has the id it always had
    committed = sorted((Path(__file__).resolve().parents[2] / "results").glob("**/fedadagrad/*/config.json"))
    assert committed, "the committed studies have fedadagrad runs"
    for path in committed[:3]:
        stored = json.loads(path.read_text())
        assert stored["method_params"]["beta2"] == 0.99
        assert config_from_dict(stored).run_id() == stored["run_id"] == path.parent.name
    assert config_from_flags({}, "fedadagrad").run_id() == config_from_flags({"method.beta2": 0.99}, "fedadagrad").run_id()
