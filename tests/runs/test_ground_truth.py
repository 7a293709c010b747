"""Whole runs on the ground-truth track (gmm: data): every registered method trains and is scored exactly,
the exact-score anchor is the floor (score error 0, samples like fresh draws), and training beats the untrained
network on every exact metric."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dfbench import datasets, methods
from dfbench.benchmark.core.config import ConfigError, RunConfig
from dfbench.benchmark.engine.lifecycle import run
from dfbench.benchmark.engine.resolve import apply_overrides
from dfbench.benchmark.metrics import table

EXACT = ("score_kl", "velocity_mse", "component_tv", "frechet_exact", "nll_gap")
LOW = "gmm:dim4?n=2000&test=500"
SMALL = {"data.clients": 2, "train.model": "mlp-tiny", "train.local_steps": 50, "train.batch_size": 64, "eval.grid": 4,
         "train.objective": "fm", "eval.sampler_steps": 20, "eval.samples": 2000}


def _scores(d: Path) -> dict[str, dict]:
    return {r["metric"]: r for r in json.loads((d / "metrics.json").read_text())["evaluations"]}


def _run(tmp: Path, method: str, rounds: int, spec: str = LOW, **over) -> dict[str, dict]:
    cfg = apply_overrides(RunConfig(), {"method": method, "data.dataset": spec, "train.rounds": rounds, **SMALL, **over})
    return _scores(run(cfg, tmp, progress=False))


def test_the_exact_metrics_are_declared_and_rank_first_on_ground_truth():
    assert table.PRIMARY[0] == "score_kl"
    assert [table.scale(m) for m in EXACT] == ["log", "log", "difference", "log", "difference"]
    assert "exact_score" not in methods.list_methods() and "exact_score" in methods.list_methods(anchors=True)
    # "auto" asks no feature network of a mixture (the torch-free table spells the prefix the datasets own)
    assert table.GROUND_TRUTH_PREFIX == f"{datasets.GMM_KIND}:" and table.auto_metrics("gmm:dim8", True) == []


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["fm", "ddpm"])
def test_the_exact_score_is_the_floor_and_its_samples_are_like_fresh_draws(tmp_path, objective):
    # execute: the anchor samples with the run's own sampler (Heun for flow matching, DDIM for DDPM), 100 steps
    s = _run(tmp_path, "exact_score", 0, **{"train.objective": objective, "eval.sampler_steps": 100})
    # assert: no score error but the float32 rounding of the network's output
    assert s["score_kl"]["value"] < 1e-10 and max(s["velocity_mse"]["per_band"]["velocity_mse"]) < 1e-12
    # its samples score as 2000 fresh exact draws do, within Monte Carlo error: component shares (TV of 2000
    # multinomial draws over 8 components: ~0.03), moments, mean log-density (sd of log p here ~1.5: se 0.034)
    assert s["component_tv"]["value"] < s["component_tv"]["fresh_draws"] + 0.03
    assert s["frechet_exact"]["value"] < 3 * s["frechet_exact"]["fresh_draws"] + 0.01
    assert abs(s["nll_gap"]["value"]) < 0.15


def test_the_exact_score_refuses_image_data_and_training():
    with pytest.raises(ConfigError, match="needs data whose score is known"):
        apply_overrides(RunConfig(), {"method": "exact_score", "train.rounds": 0})
    with pytest.raises(ConfigError, match="train.rounds=0"):
        apply_overrides(RunConfig(), {"method": "exact_score", "data.dataset": LOW, **SMALL, "train.rounds": 3})


@pytest.mark.slow
def test_a_trained_model_beats_the_untrained_one_on_every_exact_metric(tmp_path):
    # execute: the untrained network (the ceiling) and 1000 local steps of FedAvg from the same seed
    untrained = _run(tmp_path, "fedavg", 0)
    trained = _run(tmp_path, "fedavg", 10)
    # assert: lower is better for each; the score error's intervals do not overlap
    for metric in EXACT + ("denoise_loss",):
        assert trained[metric]["value"] < untrained[metric]["value"], metric
    assert trained["score_kl"]["ci_high"] < untrained["score_kl"]["ci_low"]


@pytest.mark.slow
@pytest.mark.parametrize("name", methods.list_methods())
def test_every_method_trains_and_is_scored_exactly_on_an_image_shaped_mixture(tmp_path, name):
    # prepare: the Fashion-MNIST-fitted mixture at side 8, the tiny UNet (every method runs on it unchanged)
    over = {"data.clients": 4, "data.min_client_size": 4, "train.model": "tiny", "train.local_steps": 2,
            "train.batch_size": 8, "eval.samples": 16, "eval.grid": 4, "eval.sampler_steps": 3}
    cfg = apply_overrides(RunConfig(), {"method": name, "data.dataset": "gmm:fmnist8?n=400&test=100", "train.rounds": 1, **over})
    # execute
    d = run(cfg, tmp_path, progress=False)
    # assert: done, every exact metric finite, the samples left unclipped (the float path)
    assert json.loads((d / "status.json").read_text())["state"] == "done"
    s = _scores(d)
    assert all(np.isfinite(s[m]["value"]) for m in EXACT), {m: s[m]["value"] for m in EXACT}
    assert s["score_kl"]["reference"].startswith(datasets.gmm_canonical("gmm:fmnist8?n=400&test=100"))


def test_samplers_do_not_clip_unbounded_data():
    # prepare: a flow-matching "network" whose velocity carries every point from noise to 3 x noise at t = 0
    from dfbench.benchmark.engine import diffusion

    noise = torch.full((2, 1, 1, 4), 0.9)
    v = -2.0 * noise  # x(0) = x(1) - v = 3 * noise, outside [-1, 1]
    fm = diffusion.make_objective("fm")
    # execute
    clipped = fm.sample(lambda x, t: v, noise, steps=4)
    free = fm.sample(lambda x, t: v, noise, steps=4, clip=False)
    # assert
    assert torch.equal(clipped, torch.ones_like(noise)) and torch.allclose(free, 3 * noise)


def test_reports_name_the_anchor_by_its_role_and_keep_it_out_of_the_verdicts():
    from dfbench.benchmark.report import names

    assert names.baseline_name("exact_score") == "floor (exact_score)" and names.baseline_name("fedavg") == "untrained (fedavg)"
    assert names.is_unranked_name("floor (exact_score)") and not names.is_unranked_name("fedavg")
    assert names.anchor_role("exact_score") == "floor" and names.anchor_role("not-a-method") == ""


def test_the_cli_lists_the_family_and_the_anchor(capsys):
    from dfbench.benchmark import cli

    assert cli.main(["methods", "exact*"]) == 0
    assert "exact_score: [anchor: floor]" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    assert "gmm:dimD" in capsys.readouterr().out.replace("\n", " ").replace("  ", "")


@pytest.mark.slow
def test_the_fashion_mnist_proxies_score_the_fmnist28_mixture_against_its_quantized_draws(tmp_path):
    # prepare: the Fashion-MNIST-shaped mixture with a small test split; its draws as pixels, the way samples become images
    from dfbench.benchmark.metrics.features import get_extractor
    from dfbench.benchmark.metrics.fid import frechet_distance
    from dfbench.benchmark.metrics.scoring import ScoreOptions, evaluate_samples, reference_stats

    spec = "gmm:fmnist28?n=64&test=300"
    test = datasets.load(spec, "test")
    pixels = datasets.to_pixels(test.images)
    extractor = get_extractor("fmnist")
    # execute: the cached reference of the test split, and the Frechet distance of 300 quantized draws of the mixture
    mu, sigma = reference_stats(spec, "test", extractor, cache_dir=tmp_path)
    rows, _ = evaluate_samples(pixels, spec, metrics=["fd_fmnist", "kid_fmnist"],
                               options=ScoreOptions(reference_split="test", cache_dir=tmp_path, bootstrap=0))
    # assert: the reference is the features of the quantized draws (float64 reference: numpy's moments), so the
    # draws themselves score 0 against it; fresh draws of the same mixture score far below the untrained network's
    feats = extractor.features(pixels).astype(np.float64)
    np.testing.assert_allclose(mu, feats.mean(0), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(sigma, np.cov(feats, rowvar=False), rtol=1e-5, atol=1e-6)
    score = {r["metric"]: r["value"] for r in rows}
    assert score["fd_fmnist"] == pytest.approx(0.0, abs=1e-3)
    fresh = datasets.to_pixels(datasets.mixture(spec).sample(300, torch.Generator().manual_seed(5))[0].float()
                               .reshape(-1, 1, 28, 28))
    noise = datasets.to_pixels(torch.randn(300, 1, 28, 28, generator=torch.Generator().manual_seed(5)))
    fd = lambda x: frechet_distance(*(lambda f: (f.mean(0), np.cov(f, rowvar=False)))(extractor.features(x)), mu, sigma)  # noqa: E731
    assert fd(fresh) < 0.1 * fd(noise)
    # and the metric is refused where the networks do not apply (another side of the fitted family)
    with pytest.raises(ValueError, match="only defined for dataset 'fmnist' or 'gmm:fmnist28'"):
        evaluate_samples(pixels[:, :, :8, :8], "gmm:fmnist8", metrics=["fd_fmnist"])


@pytest.mark.parametrize("name", methods.list_methods())
def test_every_method_trains_on_the_vector_family_under_the_default_clients_mode(tmp_path, name):
    # prepare: the defaults' train.clients_mode=auto on the MLP track: lockstep where the method allows it
    from dfbench.benchmark.engine.resolve import with_clients_mode

    over = {"data.clients": 3, "data.min_client_size": 4, "train.model": "mlp-tiny", "train.local_steps": 2,
            "train.batch_size": 8, "eval.samples": 32, "eval.grid": 4, "eval.sampler_steps": 3, "train.objective": "fm"}
    spec = {"method": name, "data.dataset": "gmm:dim4?n=200&test=64", "train.rounds": 2, **over}
    if name == "fedphd":  # its pruning traces a UNet's channel spaces: refused on the MLP, before any work
        with pytest.raises(ConfigError, match="cannot prune train.model=mlp-tiny"):
            apply_overrides(RunConfig(), spec)
        spec["method.prune_ratio"] = 0.0
    cfg = apply_overrides(RunConfig(), spec)
    assert cfg.train.clients_mode == "auto"
    chosen = with_clients_mode(cfg).train.clients_mode
    # execute
    d = run(cfg, tmp_path, progress=False)
    # assert: done, config.json records the mode that ran (never lockstep for a method that refuses it), scored exactly
    assert json.loads((d / "status.json").read_text())["state"] == "done"
    assert json.loads((d / "config.json").read_text())["train"]["clients_mode"] == chosen
    if not methods.get_method_class(name).capabilities.batched_clients:
        assert chosen == "sequential"
    assert np.isfinite(_scores(d)["score_kl"]["value"])


def test_auto_clients_mode_is_lockstep_for_the_mlp_presets_only():
    from dfbench.benchmark.engine.resolve import with_clients_mode

    def mode(**over):
        return with_clients_mode(apply_overrides(RunConfig(), over)).train.clients_mode

    assert mode(**{"data.dataset": "gmm:dim8"}) == "batched"  # auto = mlp
    assert mode(**{"data.dataset": "gmm:dim8", "method": "scaffold"}) == "sequential"  # refuses lockstep
    assert mode(**{"data.dataset": "gmm:fmnist8", "train.model": "tiny"}) == "sequential"  # a UNet
    assert mode(**{"data.dataset": "fmnist"}) == "sequential"
    assert mode(**{"data.dataset": "gmm:dim8", "train.clients_mode": "sequential"}) == "sequential"  # as asked
    # a choice made for the first method does not stick when an override switches it (the CLI and grids do so)
    first = apply_overrides(RunConfig(), {"data.dataset": "gmm:dim8"})
    assert with_clients_mode(apply_overrides(first, {"method": "scaffold"})).train.clients_mode == "sequential"
