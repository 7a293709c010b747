"""FedDM-quant: the quantiser (against float64 numpy), error feedback, and the bit ledger."""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qsl

import numpy as np
import pytest
import torch

from dfbench import methods
from dfbench.benchmark.engine import lifecycle
from dfbench.benchmark.engine import training
from dfbench.benchmark.core.config import ConfigError
from dfbench.benchmark.engine.context import build_context
from dfbench.benchmark.engine.lifecycle import run
from dfbench.benchmark.engine.model import Layout
from dfbench.benchmark.core.runfolder import load_checkpoint
from dfbench.benchmark.core.seeds import torch_gen
from helpers import final_params, tiny_config
from dfbench.methods.minmax_codec import dequantize, message_bits, quantize, segment_ids

EPS32 = float(np.finfo(np.float32).eps)


def _segmented(shapes: list[tuple[int, ...]], seed: int = 0, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """A flat float32 vector of normal values and its segment ids for the given tensor shapes."""
    numels = [math.prod(s) for s in shapes]
    g = torch.Generator().manual_seed(seed)
    return torch.randn(sum(numels), generator=g) * scale, segment_ids(numels)


def _np_grid(x: np.ndarray, seg: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Independent float64 reference: per-element (lo, step) of the min-max grid."""
    lo = np.array([x[seg == s].min() for s in range(seg.max() + 1)])
    hi = np.array([x[seg == s].max() for s in range(seg.max() + 1)])
    return lo[seg], ((hi - lo) / (2**bits - 1))[seg]


def _fake_ctx(shapes: list[tuple[int, ...]], sizes: list[int]) -> SimpleNamespace:
    """The few RunContext fields `Quantized.upload` reads."""
    numels = [math.prod(s) for s in shapes]
    offsets = tuple(int(o) for o in np.cumsum([0, *numels[:-1]]))
    layout = Layout(names=tuple(f"p{i}" for i in range(len(shapes))), shapes=tuple(shapes), offsets=offsets, total=sum(numels))
    return SimpleNamespace(layout=layout, client_sizes=np.array(sizes), round=1, world=1,
                           gen=lambda *keys: torch_gen(0, *keys))


SHAPES = [(7,), (3, 5), (2, 3, 2, 2)]


# -- the quantiser ---------------------------------------------------------------------------

@pytest.mark.parametrize("bits", [1, 2, 4, 8, 16])
def test_deterministic_error_is_at_most_half_a_step(bits):
    # prepare
    x, seg = _segmented(SHAPES, seed=bits)
    lo, step = _np_grid(x.double().numpy(), seg.numpy(), bits)
    # execute
    msg = quantize(x, seg, bits, "deterministic")
    xhat = dequantize(msg, seg).double().numpy()
    # assert: half a step, plus a few float32 roundings of the decode
    err = np.abs(xhat - x.double().numpy())
    slack = 4 * EPS32 * np.abs(x.numpy()).max()
    assert np.all(err <= step / 2 + slack)
    assert msg.codes.min() >= 0 and msg.codes.max() <= 2**bits - 1
    np.testing.assert_allclose(msg.lo.numpy(), [x[seg == s].min() for s in range(3)], rtol=0)
    if bits == 1:  # two levels: every value decodes to its tensor's min or max
        hi = lo + step
        assert np.all(np.isclose(xhat, lo, rtol=0, atol=slack) | np.isclose(xhat, hi, rtol=0, atol=slack))


def test_stochastic_rounding_is_unbiased_and_deterministic_is_not():
    # prepare: one fixed tensor, 500 independent stochastic quantisations at 2 bits
    x, seg = _segmented([(400,)], seed=1)
    xd = x.double().numpy()
    lo, step = _np_grid(xd, seg.numpy(), 2)
    frac = (xd - lo) / step - np.floor((xd - lo) / step)
    # the standard error of a 500-sample mean of lo + step * floor(t + u): step * sqrt(f(1-f)/500)
    se = step * np.sqrt(frac * (1 - frac) / 500)
    g = torch.Generator().manual_seed(123)
    # execute
    draws = np.stack([dequantize(quantize(x, seg, 2, "stochastic", g), seg).double().numpy() for _ in range(500)])
    det = dequantize(quantize(x, seg, 2, "deterministic"), seg).double().numpy()
    # assert: every element's mean is within 4 standard errors (plus float32 decode noise)
    slack = 4 * EPS32 * np.abs(xd).max()
    assert np.all(np.abs(draws.mean(0) - xd) <= 4 * se + slack)
    # the variance is step^2 f (1 - f), averaged over elements (one element's estimate is too noisy)
    assert draws.var(0, ddof=1).mean() == pytest.approx((step**2 * frac * (1 - frac)).mean(), rel=0.05)
    # ... a test that could fail: deterministic rounding is biased by far more than that
    assert np.mean(np.abs(det - xd) > 4 * se + slack) > 0.5


def test_stochastic_rounding_is_reproducible_from_its_seed():
    # prepare
    x, seg = _segmented(SHAPES)
    # execute
    a = quantize(x, seg, 3, "stochastic", torch_gen(0, "quant", 1, 2)).codes
    b = quantize(x, seg, 3, "stochastic", torch_gen(0, "quant", 1, 2)).codes
    c = quantize(x, seg, 3, "stochastic", torch_gen(0, "quant", 1, 3)).codes
    # assert
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("rounding", ["deterministic", "stochastic"])
def test_zero_constant_and_single_element_tensors_decode_exactly(rounding):
    # prepare: all-zero, constant, single-element and an ordinary tensor side by side
    x = torch.cat([torch.zeros(5), torch.full((4,), -2.5), torch.tensor([3.25]), torch.tensor([0.0, 1.0, 3.0])])
    seg = segment_ids([5, 4, 1, 3])
    # execute
    msg = quantize(x, seg, 4, rounding, torch.Generator().manual_seed(0))
    xhat = dequantize(msg, seg)
    # assert: scale 0, decode bitwise equal, nothing non-finite; the ordinary tensor keeps its ends
    assert torch.equal(msg.scale[:3], torch.zeros(3))
    assert torch.equal(xhat[:10], x[:10])
    assert torch.isfinite(xhat).all()
    assert xhat[10] == 0.0 and abs(float(xhat[12]) - 3.0) < 1e-6


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_input_is_a_clear_error(bad):
    # prepare
    x = torch.tensor([0.0, bad, 1.0])
    # execute / assert
    with pytest.raises(ValueError, match="non-finite"):
        quantize(x, segment_ids([3]), 4)


def test_sixteen_bits_is_within_float16_error():
    # prepare: float16's unit roundoff 2^-11, relative to each tensor's largest magnitude
    x, seg = _segmented(SHAPES, seed=5, scale=1e-3)
    # execute
    xhat = dequantize(quantize(x, seg, 16, "stochastic", torch.Generator().manual_seed(0)), seg)
    # assert
    for s in range(len(SHAPES)):
        xs = x[seg == s].double()
        assert (xhat[seg == s].double() - xs).abs().max() <= 2.0**-11 * xs.abs().max()


@pytest.mark.parametrize("bits", [1, 3, 8, 16])
def test_bit_count_is_the_documented_formula(bits):
    # prepare: per tensor b * numel code bits + lo and scale as two float32, no header
    shapes = [(1,), (10,), (4, 3), (8, 4, 3, 3)]
    expected = sum(bits * math.prod(s) + 2 * 32 for s in shapes)
    # execute
    got = message_bits([math.prod(s) for s in shapes], bits)
    # assert
    assert got == expected


@pytest.mark.parametrize("params,needle", [
    ({"bits": 0}, "method.bits"),
    ({"bits": 17}, "method.bits"),
    ({"rounding": "nearest"}, "method.rounding"),
    ({"bits": 1, "error_feedback": True}, "1-bit error feedback"),
])
def test_invalid_hyperparameters_are_clear_errors(params, needle):
    with pytest.raises(ValueError, match=needle):
        methods.create_method("quantized", **params)
    with pytest.raises(ConfigError, match=needle):
        tiny_config("quantized", params)


# -- error feedback -------------------------------------------------------------------------

@pytest.mark.parametrize("bits,rounding", [(2, "deterministic"), (2, "stochastic"), (4, "stochastic")])
def test_error_feedback_residual_stays_bounded_and_corrects_the_mean(bits, rounding):
    # prepare: the same update every round from the same start
    ctx = _fake_ctx(SHAPES, [5])
    m = methods.create_method("quantized", bits=bits, rounding=rounding, error_feedback=True)
    start = torch.zeros(ctx.layout.total)
    delta, _ = _segmented(SHAPES, seed=7, scale=1e-2)
    state = m.init_state(start, ctx)
    D = float(delta.abs().max())
    bound = D / (2**bits - 2) if rounding == "deterministic" else 2 * D / (2**bits - 3)
    sent, worst = torch.zeros_like(delta, dtype=torch.float64), 0.0
    # execute: 50 rounds
    for r in range(1, 51):
        ctx.round = r
        up = m.upload(start + delta, methods.ClientPlan(start=start), 0, state, ctx)
        sent += (up.params - start).double()
        worst = max(worst, float(state.extra["ef_residual"][0].abs().max()))
    # assert: the bound of the module docstring, and sum of what was sent = 50 delta - e_50
    e50 = state.extra["ef_residual"][0].double()
    assert worst <= bound * (1 + 1e-4)
    torch.testing.assert_close(sent, 50 * delta.double() - e50, rtol=0, atol=1e-5 * D)
    assert (sent / 50 - delta.double()).abs().max() <= bound / 50 + 1e-6 * D
    # ... which plain quantisation does not achieve (the same error every round, deterministic)
    plain = methods.create_method("quantized", bits=bits, rounding="deterministic")
    once = plain.upload(start + delta, methods.ClientPlan(start=start), 0, plain.init_state(start, ctx), ctx).params
    assert (once - delta).abs().max() > bound / 50 + 1e-6 * D


def test_upload_without_error_feedback_leaves_the_state_untouched():
    ctx = _fake_ctx(SHAPES, [5])
    m = methods.create_method("quantized", bits=4)
    state = m.init_state(torch.zeros(ctx.layout.total), ctx)
    m.upload(torch.ones(ctx.layout.total), methods.ClientPlan(start=state.params), 0, state, ctx)
    assert state.extra == {}


# -- end to end: the ledger, non-finite clients, resume --------------------------------------

def _rows(d: Path) -> list[dict]:
    return [json.loads(x) for x in (d / "rounds.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("method,params", [("fedavg", {}), ("quantized", {"bits": 4, "rounding": "stochastic"})])
def test_ledger_counts_exact_bits_per_client_and_round(tmp_path, tiny_data, method, params):
    # prepare: 2 of 4 clients per round
    cfg = tiny_config(method, params, {"system.participation": 0.5})
    shapes = build_context(cfg, data=tiny_data).layout.shapes
    P = sum(math.prod(s) for s in shapes)
    per_client = 32 * P if method == "fedavg" else sum(4 * math.prod(s) + 64 for s in shapes)
    # execute
    d = run(cfg, tmp_path, data=tiny_data, progress=False)
    # assert: per client and per round, and the totals in metrics.json
    rows = _rows(d)
    for row in rows:
        assert row["client_uplink_bits"] == [per_client, per_client]
        assert row["uplink_bits"] == 2 * per_client
        assert row["client_downlink_bits"] == [32 * P, 32 * P] and row["downlink_bits"] == 2 * 32 * P
    metrics = json.loads((d / "metrics.json").read_text())
    assert metrics["uplink_bits"] == len(rows) * 2 * per_client
    assert metrics["downlink_bits"] == len(rows) * 2 * 32 * P


@pytest.mark.slow
def test_sixteen_bit_run_matches_fedavg_within_float16_error(tmp_path, tiny_data):
    # prepare: one round, so both start from the same model and train identically
    over = {"train.rounds": 1}
    init = build_context(tiny_config(over=over), data=tiny_data).init_params
    # execute
    ref = final_params(run(tiny_config("fedavg", over=over), tmp_path / "a", data=tiny_data, progress=False))
    q16 = final_params(run(tiny_config("quantized", {"bits": 16}, over), tmp_path / "b", data=tiny_data, progress=False))
    # assert
    assert (q16 - ref).abs().max() <= 2.0**-11 * (ref - init).abs().max()


@pytest.mark.slow
def test_nan_client_is_dropped_and_never_reaches_the_global_model(tmp_path, tiny_data, monkeypatch):
    # prepare: client 0's local training (recognised by its sample indices) returns NaN every round
    cfg = tiny_config("quantized", {"bits": 4, "error_feedback": True}, {"train.rounds": 3})
    client0 = build_context(cfg, data=tiny_data).client_indices[0]
    real = training.local_train

    def poisoned(model, flat, start, images, indices, *args, **kwargs):
        res = real(model, flat, start, images, indices, *args, **kwargs)
        if torch.equal(indices, client0):
            res.params.fill_(float("nan"))
        return res

    monkeypatch.setattr(training, "local_train", poisoned)
    # execute
    d = run(cfg, tmp_path, data=tiny_data, progress=False)
    # assert: the run finished, one update dropped per round, the model and residuals finite
    assert json.loads((d / "status.json").read_text())["state"] == "done"
    assert [r["dropped_updates"] for r in _rows(d)] == [1, 1, 1]
    assert torch.isfinite(final_params(d)).all()
    residuals = load_checkpoint(d)["extra"]["ef_residual"]
    assert 0 not in residuals and sorted(residuals) == [1, 2, 3]
    assert all(torch.isfinite(e).all() for e in residuals.values())


@pytest.mark.slow
def test_error_feedback_residuals_survive_checkpoint_and_resume(tmp_path, tiny_data):
    # prepare: a 4-round run with a checkpoint every round
    cfg = tiny_config("quantized", {"bits": 2, "error_feedback": True, "rounding": "stochastic"},
                      {"train.rounds": 4, "checkpoint_every": 1})
    d = run(cfg, tmp_path, data=tiny_data, progress=False)
    straight = final_params(d).clone()
    # execute: forget round 4 and resume from the round-3 checkpoint
    (d / "checkpoints" / "ckpt-000004.pt").unlink()
    (d / "status.json").unlink()
    assert load_checkpoint(d)["round"] == 3 and len(load_checkpoint(d)["extra"]["ef_residual"]) == 4
    run(cfg, tmp_path, data=tiny_data, progress=False)
    # assert: bitwise the same as the uninterrupted run (a lost residual would change round 4)
    assert torch.equal(final_params(d), straight)
    assert [r["round"] for r in _rows(d)] == [1, 2, 3, 4]


# -- the grid file --------------------------------------------------------------------------

def test_comm_grid_entries_are_valid_configs():
    # prepare
    grid = tomllib.loads((Path(__file__).parents[2] / "benchmark" / "grid" / "builtin" / "comm.toml").read_text())
    # execute: every method entry "name?k=v&..." builds a validated config
    entries = grid["axes"]["method"]
    cfgs = [tiny_config(e.partition("?")[0], dict(parse_qsl(e.partition("?")[2]))) for e in entries]
    # assert
    assert grid["name"] == "comm" and set(grid["axes"]["data.dataset"]) == {"fmnist", "svhn", "cifar10"}
    built = [methods.method_config(c.method, c.method_params) for c in cfgs if c.method == "quantized"]
    quant = {(m.bits, m.rounding) for m in built}
    assert quant == {(b, r) for b in (8, 4, 2) for r in ("deterministic", "stochastic")}
    assert "fedavg" in entries
