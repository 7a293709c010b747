"""Ground-truth data (datasets/gmm.py): the gmm: spec, its refusal of malformed specs before any work, the
deterministic draws, the Fashion-MNIST fit against an independent numpy computation, and the data staying float
through the one conversion to the model's space (datasets.to_model_space)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dfbench import datasets
from dfbench.benchmark.core.config import ConfigError, RunConfig
from dfbench.benchmark.core.runfolder import run_dir
from dfbench.benchmark.engine.resolve import apply_overrides
from dfbench.datasets import gmm


def test_a_spec_is_made_canonical_with_every_option_in_a_fixed_order():
    # execute
    a = datasets.gmm_canonical("gmm:dim8")
    b = datasets.gmm_canonical("GMM:dim8?seed=0&k=8")
    c = datasets.gmm_canonical("gmm:dim8?k=4")
    # assert: the defaults spelled out; the same mixture spelled two ways is one spec, another is another
    assert a == "gmm:dim8?k=8&rank=2&sep=4.0&n=20000&test=10000&seed=0"
    assert a == b and c != a
    assert datasets.gmm_canonical("gmm:dim2").startswith("gmm:dim2?k=8&rank=1&")  # rank at most d - 1
    assert datasets.gmm_canonical("gmm:fmnist16") == "gmm:fmnist16?rank=8&n=60000&test=10000&seed=0"


@pytest.mark.parametrize("spec,problem", [
    ("gmm:fmnist15", "side 15"), ("gmm:dim1", "dimension 1"), ("gmm:dim65", "dimension 65"), ("gmm:circle", "unknown mixture"),
    ("gmm:dim8?k=x", "not an integer"), ("gmm:dim8?foo=1", "unknown option 'foo'"), ("gmm:dim8?k=2&k=3", "given twice"),
    ("gmm:dim8?rank=8", "outside"), ("gmm:dim8?sep=nan", "outside"), ("gmm:dim8?n=1", "outside"), ("gmm:dim8?k", "cannot read"),
])
def test_a_malformed_spec_is_refused_naming_the_allowed_form(spec, problem):
    with pytest.raises(datasets.DatasetError) as err:
        datasets.parse_gmm(spec)
    assert problem in str(err.value) and gmm.SYNTAX in str(err.value)


def test_the_config_refuses_a_malformed_spec_before_any_data_is_loaded_and_names_the_form(monkeypatch):
    # prepare: loading anything would fail the test
    monkeypatch.setattr(datasets.sources, "load", lambda *a, **k: pytest.fail("data loaded before the spec was checked"))
    # execute / assert
    with pytest.raises(ConfigError) as err:
        apply_overrides(RunConfig(), {"data.dataset": "gmm:dim99"})
    assert "data.dataset" in str(err.value) and "gmm:dimD" in str(err.value)


def test_the_run_id_and_folder_hash_the_canonical_spec():
    # prepare
    def cfg(spec: str) -> RunConfig:
        return apply_overrides(RunConfig(), {"data.dataset": spec, "train.model": "mlp-tiny", "data.clients": 4})
    # execute
    a, b, c = cfg("gmm:dim8"), cfg("gmm:dim8?seed=0"), cfg("gmm:dim8?seed=1")
    # assert: the config stores the canonical spec; spellings of one spec share a run, another seed is another run
    assert a.data.dataset == datasets.gmm_canonical("gmm:dim8")
    assert a.run_id() == b.run_id() != c.run_id()
    folder = run_dir("/out", a)
    assert folder.parts[2] == "gmm-dim8-k-8-rank-2-sep-4.0-n-20000-test-10000-seed-0"  # file-name safe
    assert all(ch not in folder.parts[2] for ch in ":?&=")


def test_draws_are_deterministic_float_and_their_labels_are_the_components():
    # execute
    train = datasets.load("gmm:dim4?n=500&test=200&k=3", "train")
    gmm._SPLITS.clear()
    fresh = datasets.load("gmm:dim4?n=500&test=200&k=3", "train")
    test = datasets.load("gmm:dim4?n=500&test=200&k=3", "test")
    other = datasets.load("gmm:dim4?n=500&test=200&k=3&seed=1", "train")
    # assert
    assert train.images.dtype == torch.float32 and tuple(train.images.shape) == (500, 1, 1, 4)
    assert torch.equal(train.images, fresh.images) and train.sha256 == fresh.sha256
    assert len(test) == 200 and test.sha256 != train.sha256 and other.sha256 != train.sha256
    assert set(train.labels.tolist()) <= {0, 1, 2} and train.num_classes == 3
    # labels are the drawn components: each sample is (almost always) most likely under its own component
    mix = datasets.mixture("gmm:dim4?n=500&test=200&k=3")
    agree = float((mix.assign(train.images.reshape(500, -1)) == train.labels).double().mean())
    assert agree > 0.9
    # and the empirical component shares follow the weights (500 draws: 3 binomial sd ~ 0.07)
    shares = torch.bincount(train.labels, minlength=3).double() / 500
    assert torch.allclose(shares, mix.weights, atol=0.07)


def test_the_fashion_mnist_fit_is_each_class_mean_and_its_probabilistic_pca():
    # prepare: an independent computation in numpy at side 28 (no resizing): x / 127.5 - 1 per class
    fm = datasets.load("fmnist", "train")
    x = fm.images.numpy().reshape(len(fm), -1).astype(np.float64) / 127.5 - 1.0
    y = fm.labels.numpy()
    # execute
    mix = datasets.mixture("gmm:fmnist28?rank=4")
    # assert: means, and the PPCA covariance's spectrum: the top-4 eigenvalues are the class's, the rest their mean
    for k in (0, 7):
        xk = x[y == k]
        assert np.allclose(mix.means[k].numpy(), xk.mean(0), atol=1e-10)
        evals = np.sort(np.linalg.eigvalsh(np.cov(xk, rowvar=False)))[::-1]
        s2 = evals[4:].mean()
        model = np.sort(np.linalg.eigvalsh(mix.covariance(k).numpy()))[::-1]
        assert np.allclose(model[:4], evals[:4], rtol=1e-8) and np.allclose(model[4:], s2, rtol=1e-8)
    assert torch.allclose(mix.weights, torch.full((10,), 0.1, dtype=torch.float64))


def test_an_image_shaped_mixture_is_shaped_like_its_side_and_partitions_by_component():
    # execute
    info = datasets.data_info("gmm:fmnist8?n=2000&test=100")
    train = datasets.load("gmm:fmnist8?n=2000&test=100", "train")
    part = datasets.partition(train.labels.numpy(), "shards:2", num_clients=5, seed=0)
    # assert: label skew is component skew, unchanged partitioners
    assert info["image_shape"] == (1, 8, 8) and info["num_classes"] == 10 and info["float"] is True
    assert tuple(train.images.shape) == (2000, 1, 8, 8) and train.images.dtype == torch.float32
    assert all(len(set(train.labels.numpy()[ix].tolist())) <= 2 for ix in part.indices)
    assert datasets.sources.missing("gmm:fmnist8", "train") is None and datasets.locate("gmm:fmnist8") is None


def test_to_model_space_maps_pixels_and_passes_floats_unchanged_in_a_copy():
    # prepare
    pixels = torch.tensor([[0, 127, 255]], dtype=torch.uint8)
    floats = torch.tensor([[-3.5, 0.0, 2.25]])
    # execute
    a, b = datasets.to_model_space(pixels), datasets.to_model_space(floats)
    # assert: the pixel rule of every image path, and no clamping or quantization of float data
    assert torch.equal(a, pixels.float() / 127.5 - 1.0)
    assert torch.equal(b, floats) and b.data_ptr() != floats.data_ptr()


def test_another_draws_index_is_the_same_mixture_with_other_samples_and_draws_0_keeps_the_old_spec():
    # execute
    spec = "gmm:dim4?n=400&test=100&k=3"
    own, public = datasets.load(spec, "train"), datasets.load(spec + "&draws=1", "train")
    again = datasets.load(spec + "&draws=0", "train")
    # assert: draws=0 is the spec as it was (its canonical form leaves the option out), so no run id moves
    assert datasets.gmm_canonical(spec + "&draws=0") == datasets.gmm_canonical(spec)
    assert "draws" not in datasets.gmm_canonical("gmm:dim8") and "draws" not in datasets.gmm_canonical("gmm:fmnist8")
    assert datasets.gmm_canonical(spec + "&draws=1").endswith("&draws=1")
    assert torch.equal(own.images, again.images)
    # another index: the same mixture (its parameters unchanged), draws that share no sample with the default's
    assert torch.equal(datasets.mixture(spec).means, datasets.mixture(spec + "&draws=1").means)
    assert public.sha256 != own.sha256
    dist = torch.cdist(public.images.reshape(400, -1).double(), own.images.reshape(400, -1).double())
    assert float(dist.min()) > 0
    with pytest.raises(datasets.DatasetError, match="draws"):
        datasets.gmm_canonical(spec + "&draws=-1")
