"""benchmark.metrics.coverage: class histogram, TV distance to the reference labels, low classes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dfbench.benchmark.metrics import coverage as cv


def test_mode_coverage_by_hand():
    # prepare: 4 classes, reference 1:1:1:1; samples 50 / 30 / 15 / 5 of 100
    labels = np.repeat(np.arange(4), [50, 30, 15, 5])
    # execute
    out = cv.mode_coverage(labels, np.array([10, 10, 10, 10]), replicates=300, seed=0)
    # assert: TV = (0.25 + 0.05 + 0.10 + 0.20) / 2 = 0.30; class 3 has 0.05 < 0.25 / 4
    assert out["histogram"] == [50, 30, 15, 5]
    assert out["tv"] == pytest.approx(0.30)
    assert out["low_classes"] == [3]
    assert out["tv_interval"].low < 0.30 < out["tv_interval"].high
    assert out["tv_interval"].replicates == 300


def test_reference_shares_are_respected():
    # class 0 holds 70% of the reference: 20% of the samples is below a quarter of 70%? no (17.5%)
    labels = np.repeat(np.arange(3), [20, 40, 40])
    out = cv.mode_coverage(labels, np.array([70, 15, 15]), replicates=10)
    assert out["low_classes"] == []
    assert out["tv"] == pytest.approx(0.5 * (0.5 + 0.25 + 0.25))
    out = cv.mode_coverage(np.repeat(np.arange(3), [17, 43, 40]), np.array([70, 15, 15]), replicates=10)
    assert out["low_classes"] == [0]


def test_every_dataset_without_a_classifier_gets_a_note_not_a_zero():
    rows, note = cv.mode_coverage_rows(torch.zeros((4, 3, 32, 32), dtype=torch.uint8), "cifar10", np.ones(10))
    assert rows == [] and "no classifier for dataset 'cifar10'" in note


def test_fmnist_rows_use_the_pinned_classifier(monkeypatch):
    # a stand-in classifier registered in the one place classifiers are added
    fake = cv.LabelClassifier("fmnist", "stand-in", "f" * 64, 10, lambda images: np.arange(images.shape[0]) % 2)
    monkeypatch.setitem(cv.CLASSIFIERS, "fmnist", lambda device: fake)
    rows, note = cv.mode_coverage_rows(torch.zeros((40, 1, 28, 28), dtype=torch.uint8), "fmnist", np.ones(10), replicates=20)
    assert note is None
    tv, low = rows
    assert (tv["metric"], tv["value"], tv["classifier"]) == ("class_tv", pytest.approx(0.8), "stand-in")
    assert (low["metric"], low["value"], low["classes"]) == ("low_classes", 8, list(range(2, 10)))
    assert tv["ci_replicates"] == 20 and tv["histogram"][:3] == [20, 20, 0]


@pytest.mark.parametrize(
    "labels,counts,match",
    [
        (np.array([0, 5]), np.ones(3), "lie in 0..2"),
        (np.array([0.0, 1.0]), np.ones(3), "integer"),
        (np.array([0, 1]), np.array([1, -1, 1]), "non-negative"),
    ],
)
def test_bad_input_is_rejected(labels, counts, match):
    with pytest.raises(ValueError, match=match):
        cv.mode_coverage(labels, counts)


def test_real_classifier_labels_real_images():
    from dfbench import datasets

    if datasets.locate("fmnist", "test") is None:
        pytest.skip("Fashion-MNIST files not on this machine")
    test = datasets.load("fmnist", "test")
    classifier = cv.get_classifier("fmnist")
    predicted = classifier.predict(test.images[:500])
    assert (predicted == test.labels[:500].numpy()).mean() > 0.85
