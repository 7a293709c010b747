"""User-level DP as a mechanism on top of any method (benchmark/engine/privacy.py).

- clipping bounds every client's update, and only the updates above C are touched;
- the noise on the round's sum has the stated standard deviation (a statistical test);
- the update is theta + (sum_k w_k clip(Delta_k) + noise) / D with the fixed denominator D;
- epsilon is the accountant's own answer for (q, z, rounds, delta), per round and in metrics.json;
- with z = 0 and C = inf a run equals the run without DP bitwise;
- what DP cannot hold is refused before any data is loaded.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from dfbench import methods
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.core.config import ConfigError
from dfbench.benchmark.engine import lifecycle, privacy
from dfbench.benchmark.engine.context import build_context, sample_round_clients
from dfbench.benchmark.engine.training import train_round
from helpers import final_params, tiny_config


class _Seen(methods.Mechanism):
    """Records every upload as the method receives it (after the mechanisms before it)."""

    def __init__(self) -> None:
        self.uploads: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, float]] = []

    def on_upload(self, up, plan, acc, ctx):
        self.uploads.append((plan.start.clone(), up.params.clone(), None if up.mask is None else up.mask.clone(), up.weight))
        return up


def _round(tiny_data, method_name, params, over, with_dp=True):
    cfg = tiny_config(method_name, params, over)
    ctx = build_context(cfg, data=tiny_data)
    method = methods.create_method(method_name, **params)
    state = method.init_state(ctx.init_params, ctx)
    seen = _Seen()
    mechs = (privacy.mechanisms(cfg, ctx) if with_dp else []) + [seen]
    new, row = train_round(method, state, ctx, 1, mechs)
    return cfg, ctx, state, new, row, seen


@pytest.mark.parametrize("name,params", [("fedavg", {}), ("random_prune", {"keep_ratio": 0.5}), ("quantized", {"bits": 4})])
def test_clipping_bounds_every_update(tiny_data, name, params):
    # prepare: C far below the updates' norms (a few local steps move the tiny model by ~1e-1)
    _, _, _, _, row, seen = _round(tiny_data, name, params, {"privacy.clip": 1e-3})
    # assert: every update the method accumulated has norm <= C, and they were all clipped to it
    assert len(seen.uploads) == 4 and row["dp_clipped_fraction"] == 1.0
    for start, local, mask, _ in seen.uploads:
        update = (local - start) if mask is None else (local - start) * mask
        assert 1e-3 * (1 - 1e-3) <= float(update.double().norm()) <= 1e-3  # float32 rounds, never above C


def test_updates_within_the_bound_are_untouched(tiny_data):
    _, _, _, _, row_dp, dp = _round(tiny_data, "fedavg", {}, {"privacy.clip": 1e6})
    _, _, _, _, _, plain = _round(tiny_data, "fedavg", {}, {}, with_dp=False)
    assert row_dp["dp_clipped_fraction"] == 0.0
    assert all(torch.equal(a[1], b[1]) for a, b in zip(dp.uploads, plain.uploads))


@pytest.mark.parametrize("weighting", ["uniform", "size"])
def test_the_update_is_the_clipped_weighted_sum_over_a_fixed_denominator(tiny_data, weighting):
    # prepare: quantity skew gives the clients different sizes, so uniform and size weights differ;
    # participation 0.5 with Poisson sampling: D = q * sum of all weights, not the round's own sum
    over = {"data.partition": "quantity:1.0", "system.participation": 0.5, "system.sampling": "poisson",
            "privacy.clip": 0.05, "privacy.weighting": weighting, "seed": 3}
    cfg, ctx, state, new, row, _ = _round(tiny_data, "fedavg", {}, over)
    _, _, _, _, _, plain = _round(tiny_data, "fedavg", {}, {k: v for k, v in over.items() if not k.startswith("privacy")},
                                  with_dp=False)
    sizes = ctx.client_sizes.astype(np.float64)
    assert len(set(sizes.tolist())) > 1 and 0 < len(row["clients"]) < 4  # the case the test is about
    # execute: the reference in float64 from the raw (unclipped) uploads of the same round
    w = np.ones(4) if weighting == "uniform" else sizes
    theta = state.params.double()
    total = torch.zeros_like(theta)
    for k, (start, local, _, _) in zip(row["clients"], plain.uploads):
        delta = (local - start).double()
        total += w[k] * delta * min(1.0, 0.05 / float(delta.norm()))
    expected = theta + total / (0.5 * w.sum())
    # assert
    assert torch.allclose(new.params.double(), expected, atol=1e-6, rtol=0)


def test_noise_has_the_stated_standard_deviation(tiny_data):
    # prepare: a round in which every client's update is cancelled, so the model moves by noise / D only
    class _Cancel(methods.Mechanism):
        def on_upload(self, up, plan, acc, ctx):
            up.params = plan.start.clone()
            return up

    over = {"privacy.clip": 0.5, "privacy.noise": 1.3, "privacy.weighting": "size", "data.partition": "quantity:1.0"}
    cfg = tiny_config("fedavg", {}, over)
    ctx = build_context(cfg, data=tiny_data)
    method = methods.create_method("fedavg")
    state = method.init_state(ctx.init_params, ctx)
    new, _ = train_round(method, state, ctx, 1, [_Cancel(), *privacy.mechanisms(cfg, ctx)])
    # execute
    z = (new.params.double() - state.params.double()).numpy()
    sizes = ctx.client_sizes
    stated = 1.3 * 0.5 * sizes.max() / sizes.sum()  # z C w_max / D, q = 1
    # assert: P ~ 1e4 draws; the sample sd is within 5 % (its relative SE is 1/sqrt(2P) < 1 %),
    # the mean within 5 standard errors of 0; a wrong factor (w_max, D or C) fails both
    n = z.size
    assert n > 5000
    assert abs(z.std() / stated - 1) < 0.05
    assert abs(z.mean()) < 5 * stated / math.sqrt(n)


@pytest.mark.slow
def test_epsilon_is_the_accountants_own_answer(tmp_path, tiny_data):
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    alphas = RDPAccountant.DEFAULT_ALPHAS

    # prepare
    over = {"privacy.clip": 1.0, "privacy.noise": 0.8, "privacy.delta": 1e-4, "system.participation": 0.5,
            "system.sampling": "poisson", "train.rounds": 3}
    cfg = tiny_config("fedavg", {}, over)
    # execute
    d = lifecycle.run(cfg, tmp_path, progress=False, data=tiny_data)
    rows = runfolder.read_rounds(d)
    metrics = runfolder.read_json(d / runfolder.METRICS)
    # assert: every round's epsilon is the accountant's for that many steps, and the final one is in metrics.json
    for r, row in enumerate(rows, start=1):
        eps, _ = get_privacy_spent(orders=alphas, rdp=compute_rdp(q=0.5, noise_multiplier=0.8, steps=r, orders=alphas), delta=1e-4)
        assert row["dp_epsilon"] == pytest.approx(eps, rel=1e-12)
    assert rows[0]["dp_epsilon"] < rows[1]["dp_epsilon"] < rows[2]["dp_epsilon"]
    assert metrics["privacy"]["epsilon"] == rows[-1]["dp_epsilon"]
    assert metrics["privacy"]["delta"] == 1e-4 and metrics["privacy"]["sample_rate"] == 0.5
    # the leaderboard says it: epsilon_mean in the CSV, an "ε (DP)" column in the markdown
    from dfbench.benchmark.report.build import build_report

    build_report(tmp_path, tmp_path / "report")
    board = pd.read_csv(tmp_path / "report" / "leaderboard.csv")
    assert board["epsilon_mean"].iloc[0] == pytest.approx(rows[-1]["dp_epsilon"])
    md = (tmp_path / "report" / "leaderboard.md").read_text()
    assert "ε (DP)" in md and f"{rows[-1]['dp_epsilon']:.4g}"[:4] in md
    # more noise, less epsilon (a check that the noise multiplier reaches the accountant)
    assert privacy.epsilon(0.5, 1.6, 3, 1e-4) < privacy.epsilon(0.5, 0.8, 3, 1e-4)
    assert privacy.epsilon(1.0, 0.0, 3, 1e-4) == math.inf and privacy.epsilon(1.0, 1.0, 0, 1e-4) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("name,params,weighting", [("fedavg", {}, "uniform"), ("fedavg", {}, "size"),
                                                   ("quantized", {"bits": 4}, "size"), ("fedprox", {"mu": 0.01}, "uniform")])
def test_no_noise_and_no_clipping_equals_the_method_without_dp_bitwise(tmp_path, tiny_data, name, params, weighting):
    # prepare: four clients of equal size (iid over 256 images), so uniform and size weights agree with FedAvg's
    plain = tiny_config(name, params)
    dp = tiny_config(name, params, {"privacy.clip": math.inf, "privacy.noise": 0.0, "privacy.weighting": weighting})
    assert plain.run_id() != dp.run_id()
    # execute
    a = lifecycle.run(plain, tmp_path / "a", progress=False, data=tiny_data)
    b = lifecycle.run(dp, tmp_path / "b", progress=False, data=tiny_data)
    # assert
    assert torch.equal(final_params(a), final_params(b))
    assert all(row["dp_clipped_fraction"] == 0.0 and row["dp_epsilon"] is None for row in runfolder.read_rounds(b))


def test_dp_off_keeps_every_run_id():
    cfg = tiny_config()
    assert "privacy" not in cfg.to_dict() or cfg.privacy.clip == 0
    # DP's other knobs change nothing while it is off, so they change no run id either
    assert tiny_config(over={"privacy.delta": 1e-3, "privacy.weighting": "size"}).run_id() == cfg.run_id()
    assert tiny_config(over={"privacy.clip": 1.0}).run_id() != cfg.run_id()


@pytest.mark.parametrize("over,words", [
    ({"privacy.noise": 1.0}, "privacy.clip=C"),
    ({"privacy.clip": math.inf, "privacy.noise": 1.0}, "an unclipped update has no bound"),
    ({"privacy.clip": -1.0}, "privacy.clip"),
    ({"privacy.clip": 1.0, "system.participation": 0.5}, "system.sampling=poisson"),
    ({"privacy.clip": 1.0, "train.driver": "fedbuff"}, "train.driver"),
    ({"privacy.clip": 1.0, "privacy.delta": 1.0}, "privacy.delta"),
    ({"privacy.clip": 1.0, "method": "scaffold"}, "differential privacy"),
    ({"privacy.clip": 1.0, "method": "experts", "data.partition": "clusters:2"}, "router"),
    ({"privacy.clip": 1.0, "method": "signsgd", "method.aggregation": "majority"}, "method.aggregation=mean"),
    ({"privacy.clip": 1.0, "method": "powersgd", "method.downlink": "factors"}, "method.downlink=full"),
])
def test_what_dp_cannot_hold_is_refused_before_any_data(monkeypatch, over, words):
    from dfbench import datasets

    monkeypatch.setattr(datasets, "load", lambda *a, **k: pytest.fail("data loaded before the refusal"))
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        tiny_config(over=over)


def test_poisson_sampling_is_seeded_and_at_the_rate():
    a = sample_round_clients(50, 0.2, 0.0, seed=1, round_=3, sampling="poisson")
    assert a == sample_round_clients(50, 0.2, 0.0, seed=1, round_=3, sampling="poisson")
    counts = [len(sample_round_clients(50, 0.2, 0.0, seed=1, round_=r, sampling="poisson")[0]) for r in range(1, 401)]
    # 400 rounds x 50 clients at q = 0.2: mean 10 per round, SE of the mean sqrt(50*0.2*0.8/400) = 0.14
    assert abs(np.mean(counts) - 10) < 5 * 0.142
    assert len(set(counts)) > 3  # the count varies (fixed-size sampling would give 10 every round)
    assert sample_round_clients(5, 1.0, 0.0, seed=0, round_=1, sampling="poisson")[0] == [0, 1, 2, 3, 4]


def test_images_per_client_caps_each_client_with_a_seeded_subset(tiny_data):
    # prepare
    cfg = tiny_config(over={"data.images_per_client": 5, "data.partition": "dirichlet:0.5"})
    full = build_context(tiny_config(over={"data.partition": "dirichlet:0.5"}), data=tiny_data).partition
    # execute
    ctx = build_context(cfg, data=tiny_data)
    again = build_context(cfg, data=tiny_data).partition
    # assert: at most 5 per client, each a subset of that client's share, the same on a rebuild
    for capped, whole in zip(ctx.partition.indices, full.indices):
        assert len(capped) == min(5, len(whole)) and set(capped) <= set(whole)
    assert ctx.partition.digest() == again.digest() and ctx.partition.spec.endswith("|max5")
    assert tiny_config().run_id() == tiny_config(over={"data.images_per_client": 0}).run_id()
    with pytest.raises(ConfigError, match="data.images_per_client"):
        tiny_config(over={"data.images_per_client": 2})  # below data.min_client_size (4)
