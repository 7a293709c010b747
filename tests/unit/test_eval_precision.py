"""scripts/eval_precision.py: the Frechet distance on random subsets of a run's samples.

Checked against a float64 reference written here (scipy's sqrtm), for the full set; the
small-sample bias on features drawn from the reference distribution itself (the distance
falls toward 0 as the subset grows); and the script end to end on a tiny run's samples.
"""

from __future__ import annotations


import numpy as np
import pytest
import scipy.linalg

from dfbench import datasets
from dfbench.benchmark.engine import lifecycle
from helpers import load_script, tiny_config



def _script():
    return load_script("eval_precision")


def _reference_fd(x: np.ndarray, mu: np.ndarray, sigma: np.ndarray) -> float:
    s1 = np.cov(x, rowvar=False)
    covmean = scipy.linalg.sqrtm(s1 @ sigma).real
    return float(((x.mean(0) - mu) ** 2).sum() + np.trace(s1 + sigma - 2 * covmean))


def test_the_full_set_is_one_draw_equal_to_a_float64_reference():
    rng = np.random.default_rng(3)
    feats = rng.normal(size=(300, 6)) @ rng.normal(size=(6, 6)) + 0.5
    mu, sigma = np.zeros(6), np.eye(6)
    out = _script().subset_distances(feats, mu, sigma, [300], draws=5, seed=0)
    assert out[300].shape == (1,)
    assert out[300][0] == pytest.approx(_reference_fd(feats, mu, sigma), rel=1e-6)


def test_samples_of_the_reference_distribution_score_closer_to_zero_with_more_samples():
    rng = np.random.default_rng(4)
    a = rng.normal(size=(8, 8))
    sigma = a @ a.T / 8 + np.eye(8)
    feats = rng.multivariate_normal(np.zeros(8), sigma, size=2000)
    out = _script().subset_distances(feats, np.zeros(8), sigma, [50, 200, 2000], draws=20, seed=1)
    means = [out[n].mean() for n in (50, 200, 2000)]
    assert means[0] > means[1] > means[2] > 0  # the bias falls with N (it is about tr-terms / N)
    assert out[50].std() > out[200].std()  # and so does the spread


def test_bad_sizes_are_refused_with_the_limit():
    script = _script()
    with pytest.raises(ValueError, match="exceeds the 10 samples"):
        script.subset_distances(np.zeros((10, 2)), np.zeros(2), np.eye(2), [20], 3, 0)
    with pytest.raises(ValueError, match="sizes >= 2"):
        script.subset_distances(np.zeros((10, 2)), np.zeros(2), np.eye(2), [1], 3, 0)


def test_the_script_scores_a_runs_samples(tmp_path, tiny_data, monkeypatch, capsys):
    monkeypatch.setattr(datasets, "load", lambda name, split="train", root=None, **kw: tiny_data)
    d = lifecycle.run(tiny_config(over={"eval.samples": 16}), tmp_path / "runs", data=tiny_data, progress=False)
    assert _script().main([str(d), "--sizes", "8,16", "--draws", "3"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith(str(d)[-40:]) and line.count("±") == 2


def test_a_run_without_samples_is_refused(tmp_path, tiny_data, capsys):
    d = lifecycle.run(tiny_config(over={"eval.samples": 16}), tmp_path / "runs", data=tiny_data, progress=False)
    (d / "samples.npz").unlink()
    assert _script().main([str(d)]) == 2
    assert "no samples.npz" in capsys.readouterr().err
