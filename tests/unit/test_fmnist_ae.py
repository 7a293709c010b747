"""The label-free Fashion-MNIST autoencoder (extractor "fmnist_ae", features.FMNISTAutoencoder):
its committed, sha256-pinned weights, its features, and the metrics of the two Fashion-MNIST
spaces it adds (fd_fmnist_ae, kid_fmnist_ae, and KID in the classifier's space: kid_fmnist),
scored on real images against the train split."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dfbench.benchmark.metrics import features as fe
from dfbench.benchmark.metrics import scoring as ev
from dfbench.benchmark.metrics import table

FMNIST_OWN = ["fd_fmnist", "fd_fmnist_ae", "kid_fmnist", "kid_fmnist_ae"]


def _fmnist_available() -> bool:
    from dfbench import datasets

    return datasets.locate("fmnist", "train") is not None and datasets.locate("fmnist", "test") is not None


needs_fmnist = pytest.mark.skipif(not _fmnist_available(), reason="Fashion-MNIST files not on this machine")


def _noise_images(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (n, 1, 28, 28), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


# ------------------------------------------------------------------------- weights


def test_committed_weights_are_the_pinned_encoder_and_small():
    weights = fe.ASSETS_DIR / fe.FMNIST_AE_FILE
    meta = json.loads((fe.ASSETS_DIR / "fmnist_ae.json").read_text())
    assert meta["sha256"] == fe.FMNIST_AE_SHA256 == fe.file_sha256(weights)
    assert meta["bytes"] == weights.stat().st_size < 1_000_000
    assert 0 < meta["test_reconstruction_mse"] < 0.02  # per pixel in [0, 1] units, on the test split
    # the file holds the encoder and nothing else: exactly its tensors
    state = torch.load(weights, map_location="cpu", weights_only=True)
    assert set(state) == set(fe.FMNISTAutoencoder(decoder=False).encoder.state_dict())
    assert fe.FMNIST_AE_SHA256 != fe.FMNIST_CLASSIFIER_SHA256


def test_a_tampered_copy_is_refused_before_loading(tmp_path, monkeypatch):
    # prepare: the committed file with one bit flipped, and an untouched copy elsewhere
    payload = bytearray((fe.ASSETS_DIR / fe.FMNIST_AE_FILE).read_bytes())
    (tmp_path / "copy.pt").write_bytes(bytes(payload))
    payload[len(payload) // 2] ^= 1
    bad = tmp_path / "tampered.pt"
    bad.write_bytes(bytes(payload))
    # execute / assert: the relocated copy loads (same hash), the tampered one never reaches torch.load
    assert fe.get_extractor("fmnist_ae", weights=tmp_path / "copy.pt").sha256 == fe.FMNIST_AE_SHA256
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load reached with a bad hash"))
    with pytest.raises(fe.WeightsHashError) as err:
        fe.get_extractor("fmnist_ae", weights=bad)
    assert fe.FMNIST_AE_SHA256 in str(err.value) and fe.file_sha256(bad) in str(err.value)
    with pytest.raises(FileNotFoundError, match="train_fmnist_encoder.py"):
        fe.get_extractor("fmnist_ae", weights=tmp_path / "missing.pt")


# ------------------------------------------------------------------------ features


def test_features_are_64d_deterministic_and_independent_of_the_batch_size():
    images = _noise_images(300, seed=1) // 2 + torch.arange(300, dtype=torch.uint8).view(-1, 1, 1, 1) // 3
    extractor = fe.get_extractor("fmnist_ae")
    assert (extractor.name, extractor.backend, extractor.resize, extractor.dims) == ("fmnist_ae", "dfbench", "none-28", 64)

    first = extractor.features(images, batch_size=256)
    again = fe.get_extractor("fmnist_ae").features(images, batch_size=256)
    small = extractor.features(images, batch_size=7)

    assert first.shape == (300, 64) and first.dtype == np.float64
    np.testing.assert_array_equal(first, again)
    np.testing.assert_allclose(small, first, atol=1e-5, rtol=1e-5)
    assert first.std(axis=0).min() > 1e-3  # no dead coordinate: the covariance stays well conditioned
    with pytest.raises(ValueError, match=r"\[N, 1, 28, 28\]"):
        extractor.features(_noise_images(2, seed=2)[:, :, :20, :20])


def test_the_autoencoder_reconstructs_in_pixel_units_and_refuses_without_its_decoder():
    autoencoder = fe.FMNISTAutoencoder()
    x = _noise_images(3, seed=3).float() / 255.0
    assert autoencoder(x).shape == x.shape and autoencoder.embed(x).shape == (3, 64)
    with pytest.raises(RuntimeError, match="without its decoder"):
        fe.FMNISTAutoencoder(decoder=False)(x)


# ------------------------------------------------------------------------- metrics


def test_auto_on_fmnist_lists_the_four_fashion_mnist_metrics(tmp_path, monkeypatch):
    # no Inception weights anywhere dfbench looks
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("DFBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("DFBENCH_INCEPTION_WEIGHTS", raising=False)
    assert ev._resolve_metrics("auto", "fmnist", None) == table.auto_metrics("fmnist", False) == FMNIST_OWN
    assert [table.extractor_of(m) for m in FMNIST_OWN] == ["fmnist", "fmnist_ae", "fmnist", "fmnist_ae"]
    assert [table.METRICS[m].kind for m in FMNIST_OWN] == ["frechet", "frechet", "kid", "kid"]
    assert table.frechet_metric("fmnist_ae") == "fd_fmnist_ae" and table.PRIMARY == ("score_kl", "fid", "fd_fmnist")


@pytest.fixture(scope="module")
def real_and_noise_scores(tmp_path_factory) -> dict[str, dict[str, dict]]:
    """fd_fmnist_ae, kid_fmnist and kid_fmnist_ae of 1000 real test images and of 1000 uniform-noise
    images, both against the train split (references computed once, in a temporary cache)."""
    from dfbench import datasets

    cache = tmp_path_factory.mktemp("dfbench_cache")
    sets = {"real": datasets.load("fmnist", "test").images[:1000], "noise": _noise_images(1000, seed=4)}
    out = {}
    for name, images in sets.items():
        rows = ev.evaluate_images(images, "fmnist", metrics=FMNIST_OWN[1:],
                                  options=ev.ScoreOptions(reference_split="train", cache_dir=cache, bootstrap=0, kid_subsets=20))
        out[name] = {row["metric"]: row for row in rows}
    return out


@pytest.mark.slow
@needs_fmnist
def test_fd_fmnist_ae_of_real_images_is_small_next_to_that_of_noise(real_and_noise_scores):
    real, noise = real_and_noise_scores["real"]["fd_fmnist_ae"], real_and_noise_scores["noise"]["fd_fmnist_ae"]
    assert (real["extractor"], real["extractor_sha256"], real["reference"]) == ("fmnist_ae", fe.FMNIST_AE_SHA256, "fmnist/train")
    assert 0 < real["value"] < 0.02 * noise["value"], (real["value"], noise["value"])


@pytest.mark.slow
@needs_fmnist
@pytest.mark.parametrize("metric", ["kid_fmnist", "kid_fmnist_ae"])
def test_kid_of_real_images_is_near_zero_and_of_noise_large(real_and_noise_scores, metric):
    real, noise = real_and_noise_scores["real"][metric], real_and_noise_scores["noise"][metric]
    assert real["extractor"] == noise["extractor"] == table.extractor_of(metric)
    assert real["ci_method"].startswith("95% normal interval") and real["ci_replicates"] == 20
    # real test images vs the train split: within a few standard errors of 0, and tiny next to noise
    assert abs(real["value"]) < 3 * real["std_err"] + 1e-3 * noise["value"], (real, noise)
    assert noise["value"] > 10 * noise["std_err"] > 0 and noise["value"] > 100 * abs(real["value"])
