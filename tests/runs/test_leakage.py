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


def _split(data: datasets.ImageSet, size: int, seed: int) -> tuple[datasets.ImageSet, datasets.ImageSet]:
    """Two disjoint halves of `size` images each, drawn from `data` by a seeded permutation: one distribution."""
    order = np.random.default_rng(seed).permutation(len(data))
    def part(ix):
        ix = torch.as_tensor(np.sort(ix))
        return dataclasses.replace(data, images=data.images[ix].contiguous(), labels=data.labels[ix].contiguous())
    return part(order[:size]), part(order[size:2 * size])


def _untrained_auc(data: datasets.ImageSet, size: int, seed: int) -> dict:
    """The attack's pooled AUC row for an untrained tiny model whose clients hold one half of a seeded split
    and whose held-out set is the other half: members and non-members of equal size, one distribution."""
    members, held = _split(data, size, seed)
    cfg = tiny_config(over={"eval.leakage_metrics": True, "seed": seed, "data.partition": "iid"})
    ctx = build_context(cfg, data=members)
    rows, notes = leakage.membership(cfg, ctx, ctx.init_params, held.images, held.labels.numpy())
    row = next(r for r in rows if r["metric"] == "mia_auc")
    assert row["num_members"] == row["num_nonmembers"] == size  # every client image a member, every held-out image not
    return row


def test_the_untrained_attack_is_at_chance_on_a_seeded_split_of_one_dataset(tiny_data):
    # prepare / execute: 128 members and 128 non-members, a seeded split of the same synthetic images
    row = _untrained_auc(tiny_data, 128, seed=3)
    # assert: chance is inside the interval and the value within the band of chance (+-0.12 at 128 / 128)
    from dfbench.benchmark.metrics.membership import chance_band

    assert row["ci_low"] <= 0.5 <= row["ci_high"]
    assert abs(row["value"] - 0.5) < chance_band(128, 128)


def test_the_untrained_attack_is_at_chance_on_fashion_mnist():
    # prepare: 256 members and 256 non-members drawn by a seeded split of Fashion-MNIST's training images
    # (cpu-privacy's untrained model scored 0.211 [0.074, 0.356] with 16 members against 16 test images)
    try:
        data = datasets.load("fmnist", "train")
    except (OSError, ValueError) as err:
        pytest.skip(f"Fashion-MNIST not available here: {err}")
    # execute
    row = _untrained_auc(data, 256, seed=0)
    # assert
    assert row["ci_low"] <= 0.5 <= row["ci_high"]
    assert row["nonmembers"] == "label-matched held-out images"


def test_non_members_follow_the_members_label_mix_and_number_at_least_the_minimum():
    # prepare: members of two labels in a 3:1 mix; a held-out set of four labels
    labels = np.repeat(np.arange(4), 1000)
    members = np.array([1] * 30 + [2] * 10)
    # execute
    picked = leakage.matched_draw(members, labels, 1000, np.random.default_rng(0))
    # assert: 750 of label 1, 250 of label 2, distinct, sorted; a label the held-out set lacks is topped up
    assert len(np.unique(picked)) == 1000 and np.all(np.diff(picked) > 0)
    assert np.bincount(labels[picked], minlength=4).tolist() == [0, 750, 250, 0]
    short = leakage.matched_draw(np.array([1] * 40), labels, 1200, np.random.default_rng(0))
    assert len(np.unique(short)) == 1200 and (labels[short] == 1).sum() == 1000


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
