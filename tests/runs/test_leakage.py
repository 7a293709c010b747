"""What a run leaks (benchmark/engine/leakage.py): memorization of the samples and a loss-based
membership attack, wired into a run's evaluation (eval.leakage_metrics=true)."""

from __future__ import annotations

import dataclasses
import numpy as np
import pytest
import torch

from conftest import make_imageset
from dfbench import datasets
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.engine import leakage, lifecycle
from dfbench.benchmark.engine.context import build_context
from dfbench.benchmark.engine.evaluate import evaluate_dir
from helpers import tiny_config

pytestmark = pytest.mark.slow  # whole runs scored for memorization and membership


@pytest.fixture
def test_split(monkeypatch, tiny_data):
    """datasets.load(..., "test") gives a held-out set drawn like the training images (another seed)."""
    held = make_imageset(n=256, seed=11)
    real = datasets.load

    def load(name, split, **kw):
        return held if split == "test" else real(name, split, **kw)

    monkeypatch.setattr(datasets, "load", load)
    return held


def test_a_planted_copy_is_found_and_attributed_to_its_client(tiny_data, test_split):
    # prepare: the samples are held-out images, except sample 3, an exact copy of a training image of client 2
    cfg = tiny_config(over={"eval.leakage_metrics": True})
    ctx = build_context(cfg, data=tiny_data)
    samples = test_split.images[:16].clone()
    victim = int(ctx.client_indices[2][5])
    samples[3] = tiny_data.images[victim]
    # execute
    rows, notes = leakage.leakage_rows(cfg, ctx, ctx.init_params, samples)
    by = {r["metric"]: r for r in rows}
    # assert: in pixels and in the classifier's features, one copy in 16, from client 2
    for space in ("pixel", "fmnist"):
        assert by[f"copy_rate_{space}"]["value"] == pytest.approx(1 / 16)
        assert by[f"copy_rate_client_max_{space}"]["client_of_max"] == 2
        assert by[f"copy_rate_client_max_{space}"]["per_client"] == pytest.approx([0, 0, 1 / 16, 0])
    # the membership rows are there, on as many held-out images as members (4 clients x 64 images)
    assert by["mia_auc"]["num_members"] == 256 and by["mia_auc"]["num_nonmembers"] == 256
    assert all(r["reference"].startswith("fmnist/train") for r in rows)


def test_membership_attack_on_an_untrained_model_is_at_chance(tiny_data, test_split):
    # prepare: the untrained model has never seen the members; members and non-members are drawn alike
    cfg = tiny_config(over={"eval.leakage_metrics": True})
    ctx = build_context(cfg, data=tiny_data)
    # execute
    rows, _ = leakage.membership(cfg, ctx, ctx.init_params, test_split.images)
    auc = next(r for r in rows if r["metric"] == "mia_auc")
    # assert: 256 vs 256 images; the interval (about +-0.05) holds 0.5 -- a leak through the noise
    # (e.g. other noises for members than for non-members) or a swapped sign would move it
    assert auc["ci_low"] <= 0.5 <= auc["ci_high"]
    assert abs(auc["value"] - 0.5) < 0.1


def test_image_losses_are_the_objectives_loss_at_the_fixed_levels(tiny_data):
    # prepare: an independent computation of the same per-image loss for two images
    cfg = tiny_config(over={"train.objective": "fm"})
    ctx = build_context(cfg, data=tiny_data)
    images = tiny_data.images[:2]
    # execute
    got = leakage.image_losses(ctx, ctx.init_params, images, seed=5)
    # assert
    from dfbench.benchmark.core.seeds import torch_gen

    eps = torch.randn(tuple(images.shape), generator=torch_gen(5, "membership", "noise"))
    x0 = images.float() / 127.5 - 1
    ctx.flat.copy_(ctx.init_params)
    ctx.model.eval()
    want = np.zeros(2)
    with torch.no_grad():
        for t in leakage.LEVELS:
            xt = (1 - t) * x0 + t * eps
            v = ctx.model(xt, torch.full((2,), t))
            want += ((v - (eps - x0)).double() ** 2).mean(dim=(1, 2, 3)).numpy()
    ctx.model.train()
    np.testing.assert_allclose(got, want / len(leakage.LEVELS), rtol=1e-6)


def test_a_run_writes_its_leakage_rows_and_dfbench_eval_keeps_them(tmp_path, tiny_data, test_split):
    # prepare
    cfg = tiny_config(over={"eval.leakage_metrics": True, "eval.leakage_members": 8})
    # execute
    d = lifecycle.run(cfg, tmp_path, progress=False, data=tiny_data)
    first = runfolder.read_json(d / runfolder.METRICS)["evaluations"]
    evaluate_dir(d, device="cpu")
    again = runfolder.read_json(d / runfolder.METRICS)["evaluations"]
    # assert: every leakage metric, flagged; 8 members per client; unchanged by a re-scoring
    names = {r["metric"] for r in first if r.get("leakage")}
    assert {"copy_rate_pixel", "copy_rate_fmnist", "copy_rate_test_pixel", "nn_train_fmnist", "nn_test_fmnist",
            "copy_rate_client_max_pixel", "mia_auc", "mia_tpr_1fpr", "mia_auc_client_max"} <= names
    assert next(r for r in first if r["metric"] == "mia_auc")["num_members"] == 32
    assert [r for r in again if r.get("leakage")] == [r for r in first if r.get("leakage")]
    # off by default: no such rows, and the run id of every config before the switch is unchanged
    assert tiny_config().run_id() == tiny_config(over={"eval.leakage_members": 8}).run_id()


def test_every_candidate_of_the_attack_gets_its_own_noise(monkeypatch, tiny_data, test_split):
    # prepare: every client holds the same 4 images and the held-out images are those images too, so
    # scores can differ only through the noise each candidate is given
    cfg = tiny_config(over={"eval.leakage_metrics": True, "eval.leakage_members": 4})
    ctx = build_context(cfg, data=tiny_data)
    same = ctx.client_indices[0][:4]
    ctx = dataclasses.replace(ctx, client_indices=[same.clone() for _ in range(4)])
    seen = []
    real = leakage.image_losses

    def spy(ctx_, params, images, seed, batch=128):
        out = real(ctx_, params, images, seed, batch)
        seen.append(out)
        return out

    monkeypatch.setattr(leakage, "image_losses", spy)
    # execute: 16 members (4 clients x the same 4 images) against those 4 images as non-members, 4 times over
    held = tiny_data.images[same.repeat(4)]
    leakage.membership(cfg, ctx, ctx.init_params, held)
    losses = np.concatenate(seen)
    # assert: 32 candidates, 32 different losses -- no two candidates share a noise (restarting the
    # noise stream per client made the 4 clients' copies of an image score identically, and biased the AUC)
    assert losses.shape == (32,) and len(np.unique(losses)) == 32
