"""benchmark.metrics.prdc: precision / recall / density / coverage equal the authors' `prdc` package."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest

from dfbench.benchmark.metrics import prdc as pr

prdc_ref = pytest.importorskip("prdc", reason="the reference `prdc` package is a test extra: pip install -e '.[test]'")


def _reference(real: np.ndarray, fake: np.ndarray, k: int) -> dict[str, float]:
    with contextlib.redirect_stdout(io.StringIO()):  # it prints the set sizes
        return {key: float(v) for key, v in prdc_ref.compute_prdc(real, fake, nearest_k=k).items()}


@pytest.mark.parametrize(
    "n_real,n_fake,d,shift,k",
    [(200, 200, 16, 0.0, 3), (300, 150, 8, 0.7, 3), (120, 260, 32, 0.2, 5), (2500, 2100, 4, 0.3, 3)],
)
def test_values_equal_the_prdc_package(n_real, n_fake, d, shift, k):
    # prepare: overlapping Gaussian clouds (the last case spans several 1024-row chunks)
    rng = np.random.default_rng(n_real + d)
    real = rng.standard_normal((n_real, d))
    fake = 1.3 * rng.standard_normal((n_fake, d)) + shift
    # execute
    ours = pr.prdc(real, fake, k=k)
    # assert
    expected = _reference(real, fake, k)
    assert ours == pytest.approx(expected, abs=1e-12)
    assert 0 < ours["precision"] < 1 and 0 < ours["recall"] < 1 and 0 < ours["coverage"] < 1


def test_identical_sets_and_far_sets_hit_the_extremes():
    rng = np.random.default_rng(0)
    real = rng.standard_normal((100, 5))
    same = pr.prdc(real, real + 1e-9)
    assert same["precision"] == same["recall"] == same["coverage"] == 1.0
    far = pr.prdc(real, real + 100.0)
    assert far == {"precision": 0.0, "recall": 0.0, "density": 0.0, "coverage": 0.0}


def test_knn_radii_by_hand():
    # points on a line at 0, 1, 3, 7: 2nd nearest other point of each
    x = np.array([[0.0], [1.0], [3.0], [7.0]])
    np.testing.assert_allclose(pr.knn_radii(x, k=2), [3.0, 2.0, 3.0, 6.0])


@pytest.mark.parametrize(
    "real,fake,match",
    [
        (np.zeros((3, 2)), np.zeros((10, 2)), "more than k=3 rows"),
        (np.zeros((10, 2)), np.zeros((10, 3)), "differ in dimension"),
        (np.zeros(10), np.zeros((10, 2)), r"\[N, D\]"),
        (np.full((10, 2), np.nan), np.zeros((10, 2)), "NaN"),
    ],
)
def test_bad_input_is_rejected(real, fake, match):
    with pytest.raises(ValueError, match=match):
        pr.prdc(real, fake)
