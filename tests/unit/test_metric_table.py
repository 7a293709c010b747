"""benchmark/metrics/table.py, the one table of metrics, against what each of its readers needs:
scoring (names, "auto", errors), grid.fetch (weights per metric), `dfbench fid` (the metric an
extractor gives), drift (the extractors), the reporter (ranking metric, direction).
(Every row `evaluate_samples` writes is checked against the table in test_evaluation.py.)"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
import pytest

from dfbench.benchmark.metrics import table
from helpers import tiny_config


def test_entries_are_consistent():
    from dfbench.benchmark.metrics import weight_files
    from dfbench.benchmark.metrics.prdc import PRDC_METRICS

    # the extractors are named once (table.ExtractorName); those with a third-party file are the weight specs there are
    assert table.EXTRACTORS == ("fmnist", "fmnist_ae", "inception", "clean", "dinov2")
    assert set(table.OPTIONAL_EXTRACTORS) <= set(table.THIRD_PARTY_EXTRACTORS) <= set(table.EXTRACTORS)
    assert all(weight_files.known_weights(e).file_name for e in table.THIRD_PARTY_EXTRACTORS)
    for committed in set(table.EXTRACTORS) - set(table.THIRD_PARTY_EXTRACTORS):  # shipped with the package
        with pytest.raises(ValueError, match="unknown weights"):
            weight_files.known_weights(committed)
    assert table.FETCHED_EXTRACTORS == ("inception", "clean")
    for name, m in table.METRICS.items():
        assert m.name == name and m.better in ("lower", "higher")
        assert m.extractor is None or m.extractor in table.EXTRACTORS, name
        assert (m.reference == "train") == (m.kind == "client"), name  # per-client rows need the clients' split
        # leakage rows, the model's held-out loss and the exact errors name their own reference (the clients' images,
        # the test split, the known mixture)
        assert (m.reference == "own") == (m.kind in ("leakage", "model", "exact", "exact_diff")), name
        assert m.requestable == (m.kind in ("frechet", "kid")), name
    # precision/recall/density/coverage in every extractor's space, better when higher, and the leakage
    # rows' nearest distances (farther from the images is better); the rest lower
    prdc = {table.prdc_metric(k, e) for k in PRDC_METRICS for e in table.EXTRACTORS}
    distances = {f"nn_{s}_{space}" for s in ("train", "test") for space in ("pixel", "fmnist")}
    assert prdc | distances == {n for n, m in table.METRICS.items() if m.better == "higher"}
    # every Frechet metric has its per-client rows, in its own extractor's space
    for ex in table.frechet_extractors():
        fd = table.frechet_metric(ex)
        assert [table.METRICS[n].extractor for n in table.client_metric_names(fd)] == [ex] * 3
    with pytest.raises(ValueError, match="choose one of"):
        table.frechet_metric("vgg")
    with pytest.raises(KeyError):
        table.prdc_metric("precision", "vgg")


def test_scoring_reads_the_table():
    from dfbench.benchmark.metrics import scoring

    fmnist_own = ["fd_fmnist", "fd_fmnist_ae", "kid_fmnist", "kid_fmnist_ae"]  # its two committed networks
    assert scoring.METRICS == table.REQUESTABLE == (*fmnist_own, "fid", "kid", "fid_clean", "fd_dinov2")
    assert table.auto_metrics("fmnist", False) == fmnist_own
    assert table.auto_metrics("fmnist", True) == [*fmnist_own, "fid", "kid"]
    assert table.auto_metrics("svhn", False) == table.auto_metrics("cifar10", True) == ["fid", "kid"]
    for name in fmnist_own:
        with pytest.raises(ValueError, match="only defined for dataset 'fmnist' or 'gmm:fmnist28', not 'svhn'; use 'fid'"):
            table.check_requested([name], "svhn")
        # the Fashion-MNIST-shaped ground-truth mixture (28x28 garments, any options) takes the Fashion-MNIST
        # networks; the smaller fitted sides and the vector family do not
        table.check_requested([name], "gmm:fmnist28")
        table.check_requested([name], "gmm:fmnist28?rank=8&n=60000&test=10000&seed=0")
        for other in ("gmm:fmnist16", "gmm:fmnist280", "gmm:dim8"):
            with pytest.raises(ValueError, match="only defined for dataset"):
                table.check_requested([name], other)
    with pytest.raises(ValueError, match="uses the label-free Fashion-MNIST autoencoder"):
        table.check_requested(["kid_fmnist_ae"], "cifar10")
    # the ranking metric stays the classifier's; the autoencoder's space is reported beside it
    # (the ground-truth track's exact score error ranks first wherever it is present: only gmm: runs have it)
    assert table.PRIMARY == ("score_kl", "fid", "fd_fmnist") and table.METRICS["fd_fmnist_ae"].rank is None
    with pytest.raises(ValueError, match="unknown metric"):
        table.check_requested(["precision_fmnist"], "fmnist")  # a quality row, not a metric one asks for
    assert table.reference_split_of("fid", "test") == "test" and table.reference_split_of("client_fid_mean", "test") == "train"


@pytest.mark.parametrize("metric", table.REQUESTABLE)
def test_fetch_asks_for_the_weights_of_the_extractor_the_table_names(metric):
    from dfbench.benchmark.grid.fetch import _weights_for
    from dfbench.benchmark.metrics.weight_files import known_weights

    dataset = "fmnist" if table.METRICS[metric].datasets else "svhn"
    cfg = tiny_config(over={"data.dataset": dataset, "eval.metrics": metric})
    extractor = table.extractor_of(metric)
    committed = extractor in ("fmnist", "fmnist_ae")  # Fashion-MNIST's networks are committed: nothing to fetch
    # DINOv2's file only the user supplies (no published checksum): nothing to fetch, and scoring leaves
    # fd_dinov2 out with a note when it is absent (tests/unit/test_dinov2.py)
    user_supplied = not committed and known_weights(str(extractor)).fetch_name is None
    expected = {} if committed or user_supplied else {known_weights(str(extractor)).fetch_name: [metric]}
    assert _weights_for(cfg) == expected


def test_dfbench_fid_names_its_metric_from_the_table(tmp_path):
    from dfbench.benchmark.cli import build_parser
    from dfbench.benchmark.metrics.folders import fid_between

    images = np.random.default_rng(0).integers(0, 256, (2, 8, 1, 28, 28), dtype=np.uint8)
    for i, name in enumerate("ab"):
        np.savez(tmp_path / f"{name}.npz", images=images[i])
    out = fid_between(tmp_path / "a.npz", tmp_path / "b.npz", extractor="fmnist")
    assert out["metric"] == table.frechet_metric("fmnist") == "fd_fmnist" and out["extractor"] == "fmnist"
    with pytest.raises(ValueError, match=r"unknown extractor 'vgg'; choose one of \['fmnist', 'fmnist_ae', 'inception', 'clean', 'dinov2'\]"):
        fid_between(tmp_path / "a.npz", tmp_path / "b.npz", extractor="vgg")  # type: ignore[arg-type]
    # `dfbench fid --extractor` offers exactly the extractors that give a Frechet distance
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    choices = next(a.choices for a in sub.choices["fid"]._actions if "--extractor" in a.option_strings)
    assert sorted(choices) == sorted(table.frechet_extractors())


def test_drift_measures_in_the_table_s_extractors_only():
    from dfbench.benchmark.metrics.drift import run_extractors

    metrics = {"evaluations": [{"metric": "fd_fmnist", "extractor": "fmnist"}, {"metric": "x", "extractor": "vgg"},
                               {"metric": "fd_fmnist_ae", "extractor": "fmnist_ae"},
                               {"metric": "kid_fmnist", "extractor": "fmnist"},
                               {"metric": "fid", "extractor": "inception"}, {"metric": "kid", "extractor": "inception"},
                               {"metric": "fid_clean", "extractor": "clean"}]}
    assert run_extractors(metrics) == ["fmnist", "fmnist_ae", "inception", "clean"]


def test_the_reporter_ranks_and_marks_direction_from_the_table():
    from dfbench.benchmark.report import frames

    assert frames.PRIMARY_METRICS == table.PRIMARY == ("score_kl", "fid", "fd_fmnist")
    assert all(table.better(m) == "lower" for m in table.PRIMARY)
    assert frames.primary_metric(["fd_fmnist", "fid", "kid"]) == "fid"
    assert frames.ordered_metrics(["kid", "fd_fmnist", "class_tv", "fid"]) == ["fid", "fd_fmnist", "class_tv", "kid"]
    # the table's direction wins over what a row says; a name the table lacks reads its rows
    evals = pd.DataFrame({"metric": ["precision_fmnist", "fd_fmnist", "recall_fmnist", "novel", "fid (clean-fid)"],
                          "better": ["lower", "higher", None, "higher", "lower"]})
    assert frames.higher_is_better(evals) == {"precision_fmnist", "recall_fmnist", "novel"}
    assert frames.better("fid (clean-fid)", evals) == "lower" and frames.better("unknown") == "lower"
