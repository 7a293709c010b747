"""The metric calibration study (results/metric-calibration/calibration.py): its degradations are pure,
seeded and the identity at grade 0, and do what their names say on hand-checkable images; every
metric the suite reports for Fashion-MNIST has a declared direction on every family; the verdict
rules on hand-built series; the README keeps its hand-written text; and, on real images, the
ranking metric still gets worse with every family's grade at a small N (a change to the features
that breaks its calibration fails here)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dfbench.benchmark.metrics import table
from dfbench.benchmark.metrics.prdc import PRDC_METRICS
from helpers import load_script

cal = load_script("results/metric-calibration/calibration.py")


def _fmnist_available() -> bool:
    from dfbench import datasets

    return datasets.locate("fmnist", "train") is not None and datasets.locate("fmnist", "test") is not None


needs_fmnist = pytest.mark.skipif(not _fmnist_available(), reason="Fashion-MNIST files not on this machine")


def _pool(size: int = 1000, seed: int = 0) -> tuple[torch.Tensor, np.ndarray]:
    """Random uint8 images with labels 0..9 (size / 10 per class): a stand-in for the test split."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (size, 1, 28, 28), generator=g, dtype=torch.uint8), np.arange(size) % 10


# ------------------------------------------------------------------------- the degradations


@pytest.mark.parametrize("fam", cal.families(60), ids=lambda f: f.name)
def test_every_degradation_is_pure_seeded_and_the_identity_at_grade_0(fam: cal.Family) -> None:
    # prepare
    pool, labels = _pool()
    real = cal.real_set(pool, labels, 60, seed=3)
    before = pool.clone()
    # execute / assert: grade 0 is the clean set, bit for bit
    assert torch.equal(fam.degrade(real, fam.levels[0], 11), real.images)
    for level in fam.levels[1:]:
        out = fam.degrade(real, level, 11)
        assert out.dtype == torch.uint8 and out.shape == (60, 1, 28, 28)
        assert torch.equal(out, fam.degrade(real, level, 11))  # same seed, same images
        assert not torch.equal(out, real.images)  # every later grade changes something
    assert torch.equal(pool, before)  # the input is never written
    if fam.name in ("noise", "shift", "garbage", "classes"):  # the seeded ones
        assert not torch.equal(fam.degrade(real, fam.levels[-1], 11), fam.degrade(real, fam.levels[-1], 12))


def test_noise_std_is_the_declared_sigma_and_grows() -> None:
    # prepare: a mid-grey set, so clipping never bites
    grey = torch.full((50, 1, 28, 28), 128, dtype=torch.uint8)
    # execute
    stds = [(cal.add_noise(grey, s, seed=0).double() - 128).std().item() for s in (4, 8, 16, 32)]
    # assert
    assert stds == sorted(stds)
    for got, sigma in zip(stds, (4, 8, 16, 32)):
        assert abs(got - sigma) < 0.03 * sigma + 0.1  # rounding to integers adds 1/12 of variance


def test_pixel_degradations_do_what_they_say() -> None:
    # prepare: one image with one bright pixel at (10, 12) on black, and a two-level image
    dot = torch.zeros((1, 1, 28, 28), dtype=torch.uint8)
    dot[0, 0, 10, 12] = 200
    two = torch.zeros((1, 1, 28, 28), dtype=torch.uint8)
    two[..., :14] = 200  # mean 100
    # execute / assert
    shifted = cal.shift(dot, 3, seed=0)
    ys, xs = torch.nonzero(shifted[0, 0], as_tuple=True)
    assert shifted.sum() == 200 and abs(int(ys) - 10) + abs(int(xs) - 12) == 3  # moved 3 along one axis
    blurred = cal.blur(dot, 1.0)
    assert blurred.max() < 200 and (blurred > 0).sum() > 9 and abs(int(blurred.double().sum()) - 200) < 20
    assert torch.equal(cal.reduce_contrast(two, 0.5).unique(), torch.tensor([50, 150], dtype=torch.uint8))
    assert torch.equal(cal.brighten(two, 128).unique(), torch.tensor([128, 255], dtype=torch.uint8))  # saturates
    low = cal.resample(two, 7)
    assert low.shape == two.shape and 0 < int((low != two).sum()) < 28 * 28  # the edge is smeared, not the halves


def test_garbage_replaces_the_declared_fraction_nested() -> None:
    # prepare
    pool, labels = _pool()
    images = pool[:200]
    # execute
    changed = {f: set(torch.nonzero((cal.replace_with_garbage(images, f, seed=5) != images).flatten(1).any(1))
                      .flatten().tolist()) for f in (0.05, 0.2, 0.5)}
    # assert: round(f * N) images, the smaller fraction's among the larger's
    assert [len(changed[f]) for f in (0.05, 0.2, 0.5)] == [10, 40, 100]
    assert changed[0.05] <= changed[0.2] <= changed[0.5]


def test_classes_dropped_set_has_the_declared_class_count() -> None:
    # prepare
    pool, labels = _pool()
    real = cal.real_set(pool, labels, 100, seed=1)
    kept_sets = []
    for kept in (10, 6, 2, 1):
        # execute
        idx = cal.drop_classes_indices(labels, real.order, 100, kept, seed=4)
        # assert: N images, exactly `kept` classes, no image twice
        assert idx.size == 100 and np.unique(idx).size == 100
        assert np.unique(labels[idx]).size == kept
        kept_sets.append(set(labels[idx].tolist()))
    assert kept_sets[3] <= kept_sets[2] <= kept_sets[1] <= kept_sets[0]  # nested: one seeded class order
    with pytest.raises(ValueError, match="fewer than n"):
        cal.drop_classes_indices(labels, real.order, 101, 1, seed=4)  # 100 images per class


def test_diversity_set_has_the_declared_number_of_distinct_images() -> None:
    # prepare
    pool, _ = _pool()
    images = pool[:200]
    for count in (200, 60, 7, 1):
        # execute
        out = cal.keep_distinct(images, count)
        # assert
        assert out.shape == images.shape
        assert torch.unique(out.flatten(1), dim=0).shape[0] == count
    assert [f.levels for f in cal.families(200) if f.name == "diversity"] == [(200, 100, 40, 20, 6, 2)]


# ------------------------------------------------------------------------- declarations and verdicts


def test_every_metric_the_suite_reports_for_fmnist_is_declared_on_every_family() -> None:
    # the rows evaluate_samples gives for fmnist with quality: auto metrics, PRDC per extractor, the label rows
    auto = table.auto_metrics("fmnist", False)
    extractors = dict.fromkeys(table.extractor_of(m) for m in auto)
    names = auto + [table.prdc_metric(k, str(e)) for e in extractors for k in PRDC_METRICS] + ["class_tv", "low_classes"]
    assert {"fd_fmnist", "precision_fmnist", "coverage_fmnist"} <= set(names)
    for name in names:
        for fam in cal.FAMILIES:
            direction, reason = cal.declared(name, fam)
            assert direction in ("worse", "any") and reason
    # the literature's must-moves (Kynkaenniemi et al. 2019, Naeem et al. 2020)
    assert cal.declared("recall_fmnist", "classes")[0] == "worse"
    assert cal.declared("coverage_fmnist", "diversity")[0] == "worse"
    assert cal.declared("precision_fmnist", "diversity")[0] == "any"
    assert cal.declared("precision_fmnist", "classes")[0] == "any"
    assert all(cal.declared(m, f)[0] == "worse" for m in auto for f in cal.FAMILIES)  # distances see everything


def test_grade_stats_on_hand_built_series() -> None:
    nan = [float("nan")] * 4
    # a distance that grows, intervals disjoint from the clean one from grade 2 on
    s = cal.grade_stats([1, 2, 5, 9], [0, 1, 4, 8], [2, 3, 6, 10], "lower")
    assert s["rho"] == 1.0 and s["monotone"] and s["monotone_ci"] and s["detected_from"] == 2 and s["passes"]
    # a higher-is-better score that falls: the same, signed
    s = cal.grade_stats([0.9, 0.8, 0.5, 0.1], nan, nan, "higher")
    assert s["rho"] == 1.0 and s["passes"] and s["detected_from"] == 1
    # a step back inside the intervals is tolerated; beyond them it fails
    inside = cal.grade_stats([1, 5, 4.5, 9], [0, 4, 3.5, 8], [2, 6, 5.5, 10], "lower")
    assert not inside["monotone"] and inside["monotone_ci"] and inside["passes"]  # rho 0.8
    beyond = cal.grade_stats([1, 5, 3, 9], [0, 4.5, 2.5, 8], [2, 5.5, 3.5, 10], "lower")
    assert beyond["reversals"] == [2] and not beyond["passes"]
    # without intervals a step back costs only rho; a score that rises (better) fails; a constant one fails
    assert cal.grade_stats([0.9, 0.8, 0.81, 0.1], nan, nan, "higher")["passes"]
    assert not cal.grade_stats([0.5, 0.6, 0.7, 0.8], nan, nan, "higher")["passes"]
    flat = cal.grade_stats([0, 0, 0, 0], nan, nan, "lower")
    assert np.isnan(flat["rho"]) and not flat["passes"]
    # the strongest grade inside the clean interval: not detected
    assert cal.grade_stats([1, 1.2, 1.4, 1.6], [0, 0.2, 0.4, 0.6], [2, 2.2, 2.4, 2.6], "lower")["detected_from"] is None


def test_summary_needs_every_replicate_and_skips_any() -> None:
    # prepare: fd_fmnist fine on replicate 0, going back beyond its interval on replicate 1; precision on classes
    rows = []
    for rep, values in ((0, [1, 3, 6]), (1, [1, 6, 3])):
        for g, v in enumerate(values):
            rows.append({"replicate": rep, "family": "classes", "grade": g, "grade_value": 10 - 4 * g,
                         "metric": "fd_fmnist", "better": "lower", "value": v, "ci_low": v - 0.5, "ci_high": v + 0.5})
            rows.append({"replicate": rep, "family": "classes", "grade": g, "grade_value": 10 - 4 * g,
                         "metric": "precision_fmnist", "better": "higher", "value": 0.5 + 0.1 * g,
                         "ci_low": float("nan"), "ci_high": float("nan")})
    import pandas as pd

    # execute
    summary = cal.summarize(pd.DataFrame(rows)).set_index("metric")
    # assert
    assert summary.loc["fd_fmnist", "verdict"] == "fail" and summary.loc["fd_fmnist", "replicates_passed"] == "1/2"
    assert "replicate 1" in summary.loc["fd_fmnist", "why"] and "better again at 2" in summary.loc["fd_fmnist", "why"]
    assert summary.loc["precision_fmnist", "verdict"] == "not-required"
    assert summary.loc["precision_fmnist", "spearman_rho"] == -1.0


def test_readme_keeps_the_hand_written_text() -> None:
    first = cal.fill_readme(None, {"setup": "run 1"}, "# T\n\nhand A\n\n<!-- generated:setup -->\n"
                                                      "<!-- /generated:setup -->\n\nhand B\n")
    again = cal.fill_readme(first.replace("hand B", "hand B, edited"), {"setup": "run 2", "new": "x"}, "unused")
    assert "run 1" in first and "hand A" in first
    assert "run 2" in again and "run 1" not in again and "hand B, edited" in again
    assert again.rstrip().endswith("<!-- /generated:new -->")


# ------------------------------------------------------------------------- calibration on real images


# families where fd_fmnist is calibrated at full size (results/metric-calibration/summary.csv: pass on both subsets)
FD_CALIBRATED = ("noise", "blur", "contrast", "brightness", "resolution", "shift", "garbage", "classes", "diversity")


@pytest.mark.slow  # ~50 s on one thread, most of it the train split's reference statistics in a fresh cache
@needs_fmnist
def test_the_ranking_metric_gets_worse_with_every_grade_at_small_n() -> None:
    """200 real test images, 4 grades per family (clean, and grades 2, 4, 5 of the study): fd_fmnist
    must pass the study's verdict on every family where it passes at full size. Fails when a change
    to the classifier's features, the reference or the Frechet distance breaks its calibration."""
    # prepare
    fams = [f for f in cal.families(200) if f.name in FD_CALIBRATED]
    fams = [cal.Family(f.name, f.what, f.unit, tuple(f.levels[i] for i in (0, 2, 4, 5)), f.degrade) for f in fams]
    # execute
    frame = cal.measure(fams, n=200, seed=cal.SEED, replicates=1, metrics=["fd_fmnist"], quality=False)
    summary = cal.summarize(frame)
    # assert
    assert set(summary["metric"]) == {"fd_fmnist"} and len(summary) == len(FD_CALIBRATED)
    failed = summary[summary["verdict"] != "pass"]
    assert failed.empty, failed[["family", "spearman_rho", "why"]].to_string()
    assert (summary["spearman_rho"] == 1.0).sum() >= len(FD_CALIBRATED) - 1
