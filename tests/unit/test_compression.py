"""Update compression (issue 26): top-k, EF-signSGD (mean / majority vote), QSGD and PowerSGD.

Each codec against an independent computation on hand-built or float64 cases, the bits against
the stated encodings (hand-computed numbers), the settings that lose nothing against FedAvg,
error-feedback memory across partial participation and a SIGKILL, and the refusals."""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dfbench import methods
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.core.config import ConfigError
from dfbench.benchmark.engine.resolve import resolve
from dfbench.benchmark.core.seeds import torch_gen
from dfbench.benchmark.engine import lifecycle
from dfbench.benchmark.engine.context import build_context
from dfbench.benchmark.engine.lifecycle import run
from dfbench.benchmark.engine.model import Layout
from dfbench.methods.minmax_codec import segment_ids
from dfbench.methods.powersgd import power_step
from dfbench.methods.qsgd import qsgd_bits, qsgd_decode, qsgd_encode
from dfbench.methods.signsgd import SignUpload, sign_bits, sign_encode
from dfbench.methods.topk_update import kept_mask, topk_bits
from helpers import final_params, run_then_sigkill, tiny_config

NEW = ("topk_update", "signsgd", "qsgd", "powersgd")
SHAPES = [(7,), (3, 5), (2, 3, 2, 2)]  # numels 7, 15, 24: P = 46, T = 3


def _layout(shapes: list[tuple[int, ...]]) -> Layout:
    numels = [math.prod(s) for s in shapes]
    offsets = tuple(int(o) for o in np.cumsum([0, *numels[:-1]]))
    return Layout(names=tuple(f"p{i}" for i in range(len(shapes))), shapes=tuple(shapes), offsets=offsets, total=sum(numels))


def _fake_ctx(shapes: list[tuple[int, ...]], sizes: list[int]) -> SimpleNamespace:
    """The few RunContext fields the compression hooks read."""
    return SimpleNamespace(layout=_layout(shapes), client_sizes=np.array(sizes), round=1, world=1,
                           round_weight=float(sum(sizes)), gen=lambda *keys: torch_gen(0, *keys))


def _vec(n: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)) * scale


def _rows(d: Path) -> list[dict]:
    return [runfolder.without_wall_clock(r) for r in map(json.loads, (d / "rounds.jsonl").read_text().splitlines())]


def _upload(m: methods.Method, delta: torch.Tensor, client: int, state: methods.ServerState, ctx) -> torch.Tensor:
    """The decoded update of one upload of `delta` from the zero model."""
    start = torch.zeros_like(delta)
    return m.upload(start + delta, methods.ClientPlan(start=start), client, state, ctx).params - start


# -- top-k -------------------------------------------------------------------------------------

def test_topk_keeps_the_largest_magnitudes_per_tensor_or_globally_ties_to_the_lower_index():
    # prepare: tensors of 4 and 5 entries; fraction 0.4 keeps floor(0.4 n + 1/2) = 2 of each, 4 of all 9
    m = torch.tensor([1.0, -3.0, 3.0, 0.5, 0.1, -0.1, 0.2, 0.0, 0.1])
    # execute
    layer = kept_mask(m, [4, 5], 0.4, "layer")
    glob = kept_mask(m, [4, 5], 0.4, "global")
    # assert: layer -- |3| twice in the first tensor; 0.2, then the first of three tied 0.1s (index 4)
    assert layer.nonzero().flatten().tolist() == [1, 2, 4, 6]
    # global -- the four largest of all are the whole first tensor
    assert glob.nonzero().flatten().tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("scope", ["layer", "global"])
def test_topk_mask_matches_a_numpy_lexsort_on_ties_everywhere(scope):
    # prepare: small integers, so almost every magnitude is tied
    m = torch.randint(-3, 4, (46,), generator=torch.Generator().manual_seed(3)).float()
    numels = [7, 15, 24]
    blocks = [(0, 7), (7, 15), (22, 24)] if scope == "layer" else [(0, 46)]
    expected = np.zeros(46, dtype=bool)
    for o, n in blocks:
        a = np.abs(m.numpy()[o:o + n])
        k = min(n, max(1, math.floor(0.3 * n + 0.5)))
        order = np.lexsort((np.arange(n), -a))  # by |m| descending, then index ascending
        expected[o + order[:k]] = True
    # execute / assert
    assert np.array_equal(kept_mask(m, numels, 0.3, scope).numpy(), expected)


@pytest.mark.parametrize("fraction,scope,bits", [
    (0.25, "layer", 70 + 143 + 216),  # k = 2, 4, 6: 32k + min(k ceil(log2 n), n) = 64+6, 128+15, 192+24
    (0.25, "global", 430),  # k = 12 of 46: 384 + min(12 * 6, 46)
    (0.01, "layer", 35 + 36 + 37),  # k = 1 each: 32 + ceil(log2 n) = 3, 4, 5 bits of index
    (1.0, "layer", 32 * 46),  # every entry: no positions, FedAvg's count
    (1.0, "global", 32 * 46),
])
def test_topk_bits_are_the_stated_encoding(fraction, scope, bits):
    assert topk_bits([7, 15, 24], fraction, scope) == bits


# -- signSGD ----------------------------------------------------------------------------------

def test_sign_message_is_l1_over_d_times_the_signs_with_zero_as_plus():
    # prepare
    m = _vec(46, seed=1)
    m[[3, 10]] = 0.0
    m[20] = -0.0
    seg = segment_ids([7, 15, 24])
    # execute
    signs, scales = sign_encode(m, seg, [7, 15, 24])
    # assert: against float64 numpy
    x = m.double().numpy()
    ref_scale = [np.abs(x[o:o + n]).sum() / n for o, n in [(0, 7), (7, 15), (22, 24)]]
    np.testing.assert_allclose(scales.double().numpy(), ref_scale, rtol=2**-23)
    assert signs.tolist() == [1 if v >= 0 else -1 for v in x]
    assert signs[3] == 1 and signs[10] == 1 and signs[20] == 1
    assert sign_bits([7, 15, 24]) == 46 + 3 * 32


def test_majority_vote_on_a_hand_case_weights_votes_by_n_and_ties_move_nothing():
    # prepare: 3 clients with n = 3, 2, 1; one tensor of 4 entries and one of 2
    ctx = _fake_ctx([(4,), (2,)], [3, 2, 1])
    m = methods.create_method("signsgd", aggregation="majority", error_feedback=False)
    start = torch.tensor([1.0, 1.0, 1.0, 1.0, -1.0, -1.0])
    state = m.init_state(start, ctx)
    deltas = [torch.tensor([1.0, 1.0, -1.0, -1.0, 2.0, 2.0]),   # scales 1, 2
              torch.tensor([2.0, -2.0, 2.0, -2.0, 4.0, -4.0]),  # scales 2, 4
              torch.tensor([-4.0, -4.0, 4.0, 4.0, -8.0, 8.0])]  # scales 4, 8
    acc = m.new_accumulator(state, ctx)
    # execute
    for k, d in enumerate(deltas):
        up = m.upload(start + d, methods.ClientPlan(start=start), k, state, ctx)
        assert isinstance(up, SignUpload) and up.uplink_bits == 6 + 2 * 32
        m.accumulate(acc, up, ctx)
    new = m.apply(state, acc, ctx).params
    # assert: V = 3 s0 + 2 s1 + s2 = [4, 0, 0, -4 | 4, 2]; scales (3 a0 + 2 a1 + a2) / 6 = 11/6, 22/6
    v = torch.tensor([1.0, 0.0, 0.0, -1.0, 1.0, 1.0])
    bar = torch.tensor([11 / 6] * 4 + [22 / 6] * 2)
    torch.testing.assert_close(new, start + v * bar, rtol=0, atol=1e-6)
    # the mean of the decoded models is not the vote (e.g. entry 1: (3 - 4 - 4) / 6 != 0)
    mean = methods.create_method("signsgd", error_feedback=False)
    acc2 = mean.new_accumulator(state, ctx)
    for k, d in enumerate(deltas):
        mean.accumulate(acc2, mean.upload(start + d, methods.ClientPlan(start=start), k, state, ctx), ctx)
    assert not torch.allclose(mean.apply(state, acc2, ctx).params, new)


# -- QSGD -------------------------------------------------------------------------------------

def test_qsgd_is_unbiased_with_the_stated_variance_and_a_biased_rounding_fails_the_same_test():
    # prepare: one tensor of 200 entries and one of 46, s = 3 levels, N = 3000 seeded draws
    v = torch.cat([_vec(200, seed=2), _vec(46, seed=3, scale=1e-3)])
    numels, s, N = [200, 46], 3, 3000
    seg = segment_ids(numels)
    x = v.double().numpy()
    norm = np.concatenate([np.full(n, np.linalg.norm(x[o:o + n])) for o, n in [(0, 200), (200, 46)]])
    r = s * np.abs(x) / norm
    f = r - np.floor(r)
    se = norm / s * np.sqrt(f * (1 - f) / N)  # the standard error of the N-draw mean, from the known distribution
    g = torch.Generator().manual_seed(11)
    # execute
    draws = np.stack([qsgd_decode(*qsgd_encode(v, seg, s, g), seg, s).double().numpy() for _ in range(N)])
    # assert: every entry's mean within 4.5 standard errors (float32 decode slack), and the variance
    slack = 4 * 2**-23 * np.abs(x).max()
    assert np.all(np.abs(draws.mean(0) - x) <= 4.5 * se + slack)
    assert np.all(np.abs(draws - x) <= norm / s * (1 + 1e-6))  # |Q(v) - v| < ||v|| / s, every draw
    np.testing.assert_allclose(draws[:, :200].var(0, ddof=1).mean(), ((norm / s) ** 2 * f * (1 - f))[:200].mean(), rtol=0.05)
    # ... which a test that could fail: deterministic rounding of r (round to nearest) is far outside it
    nearest = norm / s * np.sign(x) * np.round(r)
    assert np.mean(np.abs(nearest - x) > 4.5 * se + slack) > 0.5


def test_qsgd_draws_come_from_the_seeded_generator_and_a_zero_tensor_decodes_to_zero():
    v = torch.cat([_vec(10), torch.zeros(5)])
    seg = segment_ids([10, 5])
    a = qsgd_encode(v, seg, 4, torch_gen(0, "qsgd", 1, 2))[1]
    b = qsgd_encode(v, seg, 4, torch_gen(0, "qsgd", 1, 2))[1]
    c = qsgd_encode(v, seg, 4, torch_gen(0, "qsgd", 1, 3))[1]
    assert torch.equal(a, b) and not torch.equal(a, c)
    norms, signed = qsgd_encode(v, seg, 4, torch_gen(0, "qsgd", 1, 2))
    assert norms[1] == 0 and torch.equal(qsgd_decode(norms, signed, seg, 4)[10:], torch.zeros(5))


@pytest.mark.parametrize("levels,bits", [
    (15, 3 * 32 + 46 * (1 + 4)),  # ceil(log2 16) = 4
    (16, 3 * 32 + 46 * (1 + 5)),  # ceil(log2 17) = 5
    (1, 3 * 32 + 46 * (1 + 1)),
    (65535, 3 * 32 + 46 * (1 + 16)),
])
def test_qsgd_bits_are_the_stated_fixed_length_encoding(levels, bits):
    assert qsgd_bits([7, 15, 24], levels) == bits


# -- PowerSGD ---------------------------------------------------------------------------------

def test_power_step_equals_the_float64_computation_and_the_method_reads_conv_kernels_as_out_by_rest():
    # prepare: a (6, 2, 5) kernel -> M [6 x 10], rank 2; the client's first Q from its seeded generator
    shapes = [(6,), (6, 2, 5), (3, 2)]
    ctx = _fake_ctx(shapes, [5])
    m = methods.create_method("powersgd", rank=2, error_feedback=False)
    state = m.init_state(torch.zeros(ctx.layout.total), ctx)
    delta = _vec(ctx.layout.total, seed=4)
    q0 = torch.randn(10 * 2, generator=torch_gen(0, "powersgd_q0", 0)).view(10, 2).double()
    M = delta[6:66].double().view(6, 10)
    # execute
    got = _upload(m, delta, 0, state, ctx)
    # assert: float64 M Q0 -> qr -> M^T P_hat, and M_hat = P_hat Q'^T (unique, whatever the QR signs)
    p_hat = torch.linalg.qr(M @ q0).Q
    q1 = M.T @ p_hat
    torch.testing.assert_close(got[6:66].double(), (p_hat @ q1.T).flatten(), rtol=0, atol=1e-5)
    assert torch.equal(got[:6], delta[:6]) and torch.equal(got[66:], delta[66:])  # 1-D and r(n + m) >= nm: as is
    # the warm start: next round starts from Q' (checked against float64 again)
    stored = state.extra["powersgd_q"][0].double().view(10, 2)
    torch.testing.assert_close(stored @ stored.T, q1 @ q1.T, rtol=0, atol=1e-5)  # Q' up to the QR's column signs
    delta2 = _vec(ctx.layout.total, seed=5)
    M2 = delta2[6:66].double().view(6, 10)
    p2 = torch.linalg.qr(M2 @ q1).Q
    torch.testing.assert_close(_upload(m, delta2, 0, state, ctx)[6:66].double(), (p2 @ (M2.T @ p2).T).flatten(), rtol=0, atol=1e-5)


def test_power_iterations_recover_a_low_rank_matrix_and_converge_to_the_truncated_svd():
    g = torch.Generator().manual_seed(6)
    # a rank-2 matrix: one step with rank 2 recovers it
    low = torch.randn(8, 2, generator=g) @ torch.randn(2, 12, generator=g)
    p, q = power_step(low, torch.randn(12, 2, generator=g))
    torch.testing.assert_close(p @ q.T, low, rtol=0, atol=1e-5)
    # a full-rank matrix with a decaying spectrum: warm-started steps converge to its best rank-2 approximation
    u, _, vh = torch.linalg.svd(torch.randn(8, 12, generator=g, dtype=torch.float64), full_matrices=False)
    M = (u * torch.tensor([8.0, 4.0, 1.0, 0.5, 0.2, 0.1, 0.05, 0.01], dtype=torch.float64)) @ vh
    best = (u[:, :2] * torch.tensor([8.0, 4.0], dtype=torch.float64)) @ vh[:2]
    q = torch.randn(12, 2, generator=g, dtype=torch.float64)
    first = None
    for it in range(40):
        p, q = power_step(M, q)
        first = (p @ q.T - best).norm() if first is None else first
    assert (p @ q.T - best).norm() < 1e-9 < first


def test_powersgd_bits_are_the_stated_encoding():
    # prepare: r = 2; (6, 2, 5) -> 6 x 10 compressed: 32 * 2 * (6 + 10); (3, 2): 2 * 5 >= 6 and (4, 4): 2 * 8 >= 16 as is
    ctx = _fake_ctx([(6,), (6, 2, 5), (3, 2), (4, 4)], [1])
    m = methods.create_method("powersgd", rank=2)
    # execute / assert
    assert m.message_bits(ctx) == 6 * 32 + 1024 + 6 * 32 + 16 * 32


# -- the shared error feedback and upload -------------------------------------------------------

EF = {"topk_update": {"fraction": 0.2}, "signsgd": {}, "qsgd": {"levels": 2, "error_feedback": True}, "powersgd": {"rank": 1}}


@pytest.mark.parametrize("name", NEW)
def test_error_feedback_sends_the_true_updates_up_to_the_last_residual(name):
    # prepare: the same update every round from the same start, 20 rounds
    ctx = _fake_ctx(SHAPES, [5])
    m = methods.create_method(name, **EF[name])
    state = m.init_state(torch.zeros(ctx.layout.total), ctx)
    delta = _vec(ctx.layout.total, seed=7, scale=1e-2)
    sent = torch.zeros(ctx.layout.total, dtype=torch.float64)
    # execute
    for r in range(1, 21):
        ctx.round = r
        sent += _upload(m, delta, 0, state, ctx).double()
    # assert: sum of what was sent = 20 delta - e_20 (float32 rounding of each round's sums aside)
    e = state.extra["ef_residual"][0].double()
    torch.testing.assert_close(sent, 20 * delta.double() - e, rtol=0, atol=1e-5 * float(delta.abs().max()))
    assert float(e.abs().max()) < 20 * float(delta.abs().max())  # bounded, not growing with the rounds


@pytest.mark.parametrize("name", NEW)
def test_non_finite_update_decodes_to_nan_and_keeps_the_memory(name):
    # prepare: one good round (memory exists), then a NaN local model
    ctx = _fake_ctx(SHAPES, [5])
    m = methods.create_method(name, **{**EF[name], "error_feedback": True})
    state = m.init_state(torch.zeros(ctx.layout.total), ctx)
    _upload(m, _vec(ctx.layout.total, seed=8), 0, state, ctx)
    before = {k: v[0].clone() for k, v in state.extra.items()}
    bad = torch.full((ctx.layout.total,), float("nan"))
    # execute
    up = m.upload(bad, methods.ClientPlan(start=torch.zeros(ctx.layout.total)), 0, state, ctx)
    # assert: undecodable (the loop drops it), memory as it was, the bits still counted
    assert torch.isnan(up.params).all() and up.uplink_bits == m.message_bits(ctx)
    assert set(before) == set(state.extra) and all(torch.equal(state.extra[k][0], v) for k, v in before.items())


def test_a_finite_update_whose_norm_overflows_float32_is_dropped_too():
    ctx = _fake_ctx(SHAPES, [5])
    m = methods.create_method("qsgd", error_feedback=True)
    state = m.init_state(torch.zeros(ctx.layout.total), ctx)
    state.set_client_state("ef_residual", 0, torch.ones(ctx.layout.total))
    up = m.upload(torch.full((ctx.layout.total,), 3e38), methods.ClientPlan(start=torch.zeros(ctx.layout.total)), 0, state, ctx)
    assert torch.isnan(up.params).all() and torch.equal(state.extra["ef_residual"][0], torch.ones(ctx.layout.total))


def test_memory_dtype_bfloat16_stores_the_residual_in_half_the_bytes():
    ctx = _fake_ctx(SHAPES, [5])
    m = methods.create_method("topk_update", fraction=0.2, memory_dtype="bfloat16")
    state = m.init_state(torch.zeros(ctx.layout.total), ctx)
    delta = _vec(ctx.layout.total, seed=9)
    got = _upload(m, delta, 0, state, ctx)
    e = state.extra["ef_residual"][0]
    assert e.dtype == torch.bfloat16
    torch.testing.assert_close(e.float(), delta - got, rtol=2**-8, atol=0)  # rounded to 8 significant bits


def test_without_error_feedback_no_memory_is_kept():
    ctx = _fake_ctx(SHAPES, [5])
    for name in ("topk_update", "signsgd", "qsgd"):
        m = methods.create_method(name, error_feedback=False)
        state = m.init_state(torch.zeros(ctx.layout.total), ctx)
        _upload(m, _vec(ctx.layout.total), 0, state, ctx)
        assert state.extra == {}, name


def test_the_compression_methods_and_quantized_are_one_family():
    assert methods.method_families()["compression"] == sorted(["quantized", *NEW])


# -- hyperparameters and refusals ---------------------------------------------------------------

@pytest.mark.parametrize("name,params,needle", [
    ("topk_update", {"fraction": 0.0}, r"'method.fraction' of 'topk_update': 0.0; allowed: a number in \(0, 1\]"),
    ("topk_update", {"fraction": 1.5}, "'method.fraction'"),
    ("topk_update", {"scope": "row"}, "'method.scope'.*layer, global"),
    ("topk_update", {"memory_dtype": "float16"}, "'method.memory_dtype'.*float32, bfloat16"),
    ("signsgd", {"aggregation": "median"}, "'method.aggregation'.*mean, majority"),
    ("qsgd", {"levels": 0}, r"'method.levels' of 'qsgd': 0; allowed: an integer in 1..65535"),
    ("qsgd", {"levels": 65536}, "'method.levels'"),
    ("powersgd", {"rank": 0}, r"'method.rank' of 'powersgd': 0; allowed: an integer >= 1"),
    ("powersgd", {"downlink": "low_rank"}, "'method.downlink'.*full, factors"),
])
def test_invalid_hyperparameters_are_clear_errors(name, params, needle):
    with pytest.raises((ValueError, ConfigError), match=needle):
        methods.create_method(name, **params)
    with pytest.raises(ConfigError, match=needle):
        tiny_config(name, params)


@pytest.mark.parametrize("name,params", [("topk_update", {}), ("signsgd", {}), ("qsgd", {"error_feedback": True}),
                                         ("powersgd", {"error_feedback": False})])
def test_per_client_memory_refuses_several_ranks_before_any_data_is_loaded(name, params, tmp_path, monkeypatch):
    # prepare: two ranks as the life cycle sees them; any data load would fail loudly
    cfg = tiny_config(name, params)
    monkeypatch.setattr(lifecycle.distributed, "rank_world", lambda: (0, 2))
    monkeypatch.setattr("dfbench.datasets.load", lambda *a, **k: pytest.fail("data was loaded"))
    # execute / assert: refused with the fix named, nothing written
    with pytest.raises(ConfigError, match=r"world size 1, here 2.*without torchrun"):
        run(cfg, tmp_path, progress=False)
    assert not any(tmp_path.iterdir())
    resolve(cfg, 1)


@pytest.mark.parametrize("name,params", [("topk_update", {"error_feedback": False}), ("qsgd", {}),
                                         ("signsgd", {"error_feedback": False, "aggregation": "majority"})])
def test_without_memory_several_ranks_are_allowed(name, params):
    resolve(tiny_config(name, params), 2)


def test_majority_vote_and_factor_downlink_refuse_the_asynchronous_driver():
    with pytest.raises(ConfigError, match="aggregation=majority.*train.driver=fedbuff.*train.driver=sync"):
        tiny_config("signsgd", {"aggregation": "majority"}, {"train.driver": "fedbuff"})
    with pytest.raises(ConfigError, match="downlink=factors.*train.driver=fedbuff.*method.downlink=full"):
        tiny_config("powersgd", {"downlink": "factors"}, {"train.driver": "fedbuff"})


# -- end to end -------------------------------------------------------------------------------

def _layout_of(cfg, data) -> Layout:
    return build_context(cfg, data=data).layout


@pytest.mark.slow
@pytest.mark.parametrize("name,params", [
    ("topk_update", {"fraction": 1.0}),
    ("topk_update", {"fraction": 1.0, "scope": "global", "error_feedback": False}),
    ("powersgd", {"rank": 64}),  # >= min(n, mm) of every matrix of the tiny model: nothing compressed
])
def test_lossless_settings_are_fedavg_bitwise(name, params, tmp_path, tiny_data):
    # prepare: 3 rounds, 2 of 4 clients each
    over = {"train.rounds": 3, "system.participation": 0.5}
    P = _layout_of(tiny_config(over=over), tiny_data).total
    # execute
    ref = run(tiny_config("fedavg", over=over), tmp_path / "ref", data=tiny_data, progress=False)
    got = run(tiny_config(name, params, over), tmp_path / "got", data=tiny_data, progress=False)
    # assert: the same model, the same 32 P bits per client
    assert torch.equal(final_params(got), final_params(ref))
    assert all(r["client_uplink_bits"] == [32 * P, 32 * P] for r in _rows(got))


def test_qsgd_with_65535_levels_is_fedavg_within_its_stated_bound(tmp_path, tiny_data, monkeypatch):
    # prepare: record every client's per-tensor update norm ||delta_{k,t}|| as the codec sees it
    over = {"train.rounds": 1}
    cfg = tiny_config("qsgd", {"levels": 65535}, over)
    layout = _layout_of(cfg, tiny_data)
    seg = segment_ids(layout.numels)
    norms = []
    real = methods.get_method_class("qsgd").upload

    def recording(self, local, plan, client, state, ctx):
        norms.append(torch.zeros(len(layout.numels), dtype=torch.float64).index_add_(0, seg, (local - plan.start).double().square()).sqrt())
        return real(self, local, plan, client, state, ctx)

    monkeypatch.setattr(methods.get_method_class("qsgd"), "upload", recording)
    # execute
    ref = final_params(run(tiny_config("fedavg", over=over), tmp_path / "ref", data=tiny_data, progress=False))
    got = final_params(run(cfg, tmp_path / "got", data=tiny_data, progress=False))
    # assert: per tensor within max_k ||delta_{k,t}|| / s (+ float32 rounding of the model), and not bitwise
    bound = torch.stack(norms).max(0).values[seg] / 65535
    assert len(norms) == 4
    assert torch.all((got - ref).abs().double() <= bound + 2**-23 * ref.abs().double())
    assert not torch.equal(got, ref)


def test_majority_vote_runs_and_moves_every_entry_by_the_tensors_mean_scale(tmp_path, tiny_data):
    cfg = tiny_config("signsgd", {"aggregation": "majority", "error_feedback": False}, {"train.rounds": 1})
    init = build_context(cfg, data=tiny_data).init_params
    d = run(cfg, tmp_path, data=tiny_data, progress=False)
    final = final_params(d)
    step = (final - init).double()
    # every entry of a tensor moves by -bar, 0 (a tie) or +bar: one magnitude per tensor, up to the
    # float32 rounding of the new parameters (an ulp of the largest of them)
    layout = _layout_of(cfg, tiny_data)
    for _, sl, _ in layout.slices():
        mags = step[sl].abs()
        nz = mags[mags > 0]
        assert nz.numel() > 0 and float(nz.max() - nz.min()) <= 2**-22 * float(final[sl].abs().max())
    assert _rows(d)[0]["client_uplink_bits"] == [layout.total + 32 * len(layout.numels)] * 4


@pytest.mark.slow
@pytest.mark.parametrize("name,params", [("topk_update", {"fraction": 0.1}), ("signsgd", {}),
                                         ("qsgd", {"error_feedback": True}), ("powersgd", {"rank": 2})])
def test_partial_participation_leaves_a_sitting_out_clients_memory_unchanged(name, params, tmp_path, tiny_data):
    # prepare: 3 rounds of 2 of 4 clients, a checkpoint after each (the run keeps the last two)
    cfg = tiny_config(name, params, {"train.rounds": 3, "checkpoint_every": 1, "system.participation": 0.5})
    # execute
    d = run(cfg, tmp_path, data=tiny_data, progress=False)
    # assert: round 3's clients changed their memory, the others kept theirs bitwise
    r2, r3 = (torch.load(d / "checkpoints" / f"ckpt-{r:06d}.pt", weights_only=True)["extra"] for r in (2, 3))
    took_part = set(_rows(d)[2]["clients"])
    keys = ["ef_residual"] + (["powersgd_q"] if name == "powersgd" else [])
    for key in keys:
        for k, mem in r3[key].items():
            if k in took_part:
                assert k not in r2[key] or not torch.equal(mem, r2[key][k]), (key, k)
            else:
                assert torch.equal(mem, r2[key][k]), (key, k)
    assert len(took_part) == 2 and any(k not in took_part for k in r2["ef_residual"])


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:took over the stale lock")  # the killed run left its lock behind
@pytest.mark.parametrize("name,params", [("topk_update", {"fraction": 0.1}), ("powersgd", {"rank": 2})])
def test_error_feedback_memory_survives_a_sigkill_and_resumes_bitwise(name, params, tmp_path, tiny_data):
    # prepare: the uninterrupted reference
    over = {"method": name, **{f"method.{k}": v for k, v in params.items()},
            "train.rounds": 3, "checkpoint_every": 1, "system.participation": 0.5}
    cfg = tiny_config(over=over)
    ref = run(cfg, tmp_path / "ref", data=tiny_data, progress=False)
    # execute: killed after logging round 2 (before its checkpoint), then resumed from round 1's
    out = tmp_path / "killed"
    proc = run_then_sigkill(out, over, 2)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    d = runfolder.run_dir(out, cfg)
    assert runfolder.load_checkpoint(d)["round"] == 1 and runfolder.load_checkpoint(d)["extra"]["ef_residual"]
    assert run(cfg, out, data=tiny_data, progress=False) == d
    # assert: model, every client's memory and the round log bitwise the uninterrupted run's
    assert torch.equal(final_params(d), final_params(ref))
    a, b = runfolder.load_checkpoint(d)["extra"], runfolder.load_checkpoint(ref)["extra"]
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].keys() == b[key].keys() and all(torch.equal(a[key][k], b[key][k]) for k in a[key])
    assert _rows(d) == _rows(ref)


@pytest.mark.slow
def test_powersgd_factor_downlink_charges_the_broadcast_only_to_clients_of_the_previous_round(tmp_path, tiny_data):
    # prepare: 4 rounds of 2 of 4 clients, rank 2; the broadcast B = 32 + K (32 + F) + U with K = 2
    over = {"train.rounds": 4, "system.participation": 0.5}
    cfg = tiny_config("powersgd", {"rank": 2, "downlink": "factors"}, over)
    layout = _layout_of(cfg, tiny_data)
    P, F, dense = layout.total, 0, 0
    for shape in layout.shapes:  # an independent count of the stated encoding
        n, mm = shape[0], math.prod(shape[1:])
        if len(shape) >= 2 and 2 * (n + mm) < n * mm:
            F += 32 * 2 * (n + mm)
        else:
            dense += math.prod(shape)
    B = 32 + 2 * (32 + F) + 32 * dense
    assert B < 32 * P
    # execute
    rows = _rows(run(cfg, tmp_path / "f", data=tiny_data, progress=False))
    full = _rows(run(tiny_config("powersgd", {"rank": 2}, over), tmp_path / "full", data=tiny_data, progress=False))
    # assert: B for a client of the previous round, 32 P for the others; downlink=full: 32 P always
    for prev, row in zip([None, *rows], rows):
        expect = [B if prev is not None and k in prev["clients"] else 32 * P for k in row["clients"]]
        assert row["client_downlink_bits"] == expect
        assert row["client_uplink_bits"] == [F + 32 * dense] * 2
    assert any(B in r["client_downlink_bits"] for r in rows)
    assert all(r["client_downlink_bits"] == [32 * P] * 2 for r in full)
    # the training itself is the same
    assert [r["client_loss"] for r in rows] == [r["client_loss"] for r in full]


@pytest.mark.slow
@pytest.mark.parametrize("name,params", [("topk_update", {"fraction": 0.1}), ("signsgd", {}), ("powersgd", {"rank": 2})])
def test_the_asynchronous_driver_runs_them_and_is_the_synchronous_round_when_nothing_is_stale(name, params, tmp_path, tiny_data):
    over = {"train.rounds": 2}
    sync = run(tiny_config(name, params, over), tmp_path / "sync", data=tiny_data, progress=False)
    buff = run(tiny_config(name, params, {**over, "train.driver": "fedbuff"}), tmp_path / "buff", data=tiny_data, progress=False)
    assert torch.equal(final_params(buff), final_params(sync))


@pytest.mark.slow
def test_ledger_counts_each_methods_stated_bits(tmp_path, tiny_data):
    # prepare: one round each; the bit formulas of the module docstrings, on the real tiny layout
    over = {"train.rounds": 1}
    layout = _layout_of(tiny_config(over=over), tiny_data)
    P, T = layout.total, len(layout.numels)
    topk = sum(32 * (k := max(1, math.floor(0.01 * n + 0.5))) + (0 if k == n else min(k * math.ceil(math.log2(n)) if n > 1 else 0, n))
               for n in layout.numels)
    expected = {"topk_update": topk, "signsgd": P + 32 * T, "qsgd": 32 * T + P * (1 + 4)}
    for name, bits in expected.items():
        # execute
        d = run(tiny_config(name, over=over), tmp_path / name, data=tiny_data, progress=False)
        # assert
        assert _rows(d)[0]["client_uplink_bits"] == [bits] * 4, name
        assert bits < 32 * P
