"""The held-out denoising loss: its maths against a float64 hand computation, its fixed protocol, a
trained model scoring below an untrained one, and `dfbench eval` adding it (and new metric rows) to a
finished run without touching any other byte of the run folder."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from dfbench import datasets
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.engine import evaluate, heldout, lifecycle
from dfbench.benchmark.engine.resolve import config_from_dict
from helpers import tiny_config

pytestmark = pytest.mark.slow  # whole runs, trained and re-scored


def test_the_loss_is_the_mean_squared_velocity_error_of_a_hand_computation_in_float64():
    # prepare: 5 images of 2x3x3, 3 times, and a velocity field that is an affine map of (x_t, t)
    gen = torch.Generator().manual_seed(0)
    x0 = torch.rand((5, 2, 3, 3), generator=gen) * 2 - 1
    times = (0.1, 0.5, 0.9)
    eps = torch.randn((3, 5, 2, 3, 3), generator=gen)
    w = torch.randn((2, 3, 3), generator=gen, dtype=torch.float64)

    def velocity(x, t):
        return x.double() * w + 2.0 * t - 0.25

    # execute
    per_image, per_time = heldout.denoising_loss(velocity, x0, eps, times, batch=2)
    # assert: numpy, float64, loops written out
    X, E, W = x0.double().numpy(), eps.double().numpy(), w.numpy()
    want = np.zeros((3, 5))
    for j, t in enumerate(times):
        for i in range(5):
            xt = (1 - t) * X[i] + t * E[j, i]
            vhat = xt * W + 2.0 * t - 0.25
            want[j, i] = np.mean((vhat - (E[j, i] - X[i])) ** 2)
    # x_t is formed in float32, as the network sees it: agreement to float32 rounding, not beyond
    np.testing.assert_allclose(per_image, want.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(per_time, want.mean(axis=1), rtol=1e-6)
    assert not np.allclose(per_image, want.mean(axis=1).mean(), rtol=1e-3)  # per image, not pooled
    # the oracle that knows eps and x0 scores exactly 0 (a could-fail check of the target's sign)
    # (x_t - x0) / t = eps - x0 on the path x_t = (1 - t) x0 + t eps
    zero, _ = heldout.denoising_loss(lambda x, t: (x.double() - x0.double()) / t, x0, eps, times)
    np.testing.assert_allclose(zero, 0.0, atol=1e-10)


def test_the_row_has_a_t_interval_over_images_and_says_its_protocol():
    per_image = np.array([1.0, 2.0, 3.0, 4.0])
    row = heldout.loss_row(per_image, np.array([1.5, 3.5]), (0.25, 0.75), "fmnist/test")
    from scipy import stats

    half = stats.t.ppf(0.975, 3) * np.std(per_image, ddof=1) / 2
    assert row["metric"] == "denoise_loss" and row["value"] == 2.5
    assert row["ci_low"] == pytest.approx(2.5 - half) and row["ci_high"] == pytest.approx(2.5 + half)
    assert row["per_time"] == [1.5, 3.5] and row["times"] == [0.25, 0.75] and row["reference"] == "fmnist/test"


def test_the_images_and_noises_are_fixed_whatever_the_run():
    images = torch.randint(0, 256, (600, 1, 4, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    a = heldout.heldout_set(images)
    b = heldout.heldout_set(images)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and np.array_equal(a[2], b[2])
    assert a[0].shape[0] == heldout.DENOISE_IMAGES and len(set(a[2].tolist())) == heldout.DENOISE_IMAGES
    assert float(a[0].min()) >= -1 and float(a[0].max()) <= 1
    with pytest.raises(ValueError, match="at least 2 test images"):
        heldout.heldout_set(images[:1])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A FedAvg run long enough to learn something, and the same config's untrained model, both scored
    on the real Fashion-MNIST test split."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("heldout")
    over = {"train.rounds": 3, "train.local_steps": 15, "train.batch_size": 16, "train.lr": 2e-3, "train.objective": "fm",
            "eval.metrics": "fd_fmnist", "eval.samples": 64}
    d = lifecycle.run(tiny_config(over=over), out, progress=False)
    return d


def _loss(d: Path) -> dict:
    return next(r for r in runfolder.read_json(d / runfolder.METRICS)["evaluations"] if r["metric"] == "denoise_loss")


def test_a_trained_model_scores_below_its_untrained_start(trained):
    row = _loss(trained)
    cfg = config_from_dict(runfolder.read_json(trained / runfolder.CONFIG))
    ctx, method, _ = evaluate.final_model(trained, cfg)
    untrained = heldout.method_denoising_rows(cfg, ctx, method, ctx.init_params)[0]
    assert row["reference"] == "fmnist/test" and row["num_samples"] == heldout.DENOISE_IMAGES
    assert row["ci_high"] < untrained["ci_low"], (row["value"], untrained["value"])
    assert len(row["per_time"]) == len(heldout.DENOISE_TIMES)


def _digests(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*")) if p.is_file()}


def test_rescoring_adds_rows_and_leaves_every_other_byte_of_the_run_folder_as_it_was(trained, tmp_path, capsys):
    # prepare: the run as an older dfbench wrote it -- no denoising loss row -- inside a runs tree
    tree = tmp_path / "runs"
    d = Path(shutil.copytree(trained, tree / "fmnist" / "iid" / "fedavg" / trained.name))
    metrics = runfolder.read_json(d / runfolder.METRICS)
    dropped = {r["metric"]: r for r in metrics["evaluations"] if r["metric"] in ("denoise_loss", "fd_fmnist")}
    kept = [r for r in metrics["evaluations"] if r["metric"] not in dropped]
    recorded = metrics["pairing"]  # and from before the pairing records (the seeded init, the fixed noises)
    runfolder.write_json(d / runfolder.METRICS, {**{k: v for k, v in metrics.items() if k != "pairing"}, "evaluations": kept})
    before = _digests(d)
    # execute: `dfbench eval` over the whole tree
    from dfbench.benchmark.cli import main

    assert main(["eval", str(tree)]) == 0
    out = capsys.readouterr().out
    # assert: one new file with the missing row, the same value the run computed itself; nothing else moved
    after = _digests(d)
    assert set(after) - set(before) == {runfolder.RESCORED}
    assert {k: v for k, v in after.items() if k != runfolder.RESCORED} == before
    added = runfolder.read_json(d / runfolder.RESCORED)["evaluations"]
    # only what it lacks is scored again: the one sample metric and the model's loss (the rows that come with
    # fd_fmnist, PRDC and mode coverage, are there already: not added twice)
    assert sorted(r["metric"] for r in added) == ["denoise_loss", "fd_fmnist"] and "1 run(s) rescored" in out
    by_name = {r["metric"]: r for r in added}
    assert by_name["denoise_loss"]["value"] == pytest.approx(_loss(trained)["value"], rel=1e-6)
    assert by_name["fd_fmnist"]["value"] == pytest.approx(dropped["fd_fmnist"]["value"], rel=1e-6)
    # the pairing records rebuilt from the config are the ones the run wrote when it trained
    assert runfolder.read_json(d / runfolder.RESCORED)["pairing"] == recorded
    # the reporter reads the added row beside metrics.json's
    from dfbench.benchmark.report.run_records import read_run

    record = read_run(d)
    assert [r["metric"] for r in record.metrics["evaluations"]].count("denoise_loss") == 1
    assert [r["metric"] for r in record.metrics["evaluations"]].count("fd_fmnist") == 1
    assert record.metrics["pairing"] == recorded
    # a second pass finds nothing to add and writes nothing
    again = _digests(d)
    assert main(["eval", str(tree)]) == 0 and "1 up to date" in capsys.readouterr().out
    assert _digests(d) == again
