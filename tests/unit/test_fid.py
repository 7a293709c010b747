"""Frechet distance, KID and the Inception feature path, checked against
independent references (float64 eigen-decomposition, pytorch-fid, clean-fid).

No weights are downloaded: Inception tests use a seeded random state dict of
the real FID architecture, placed where torch hub (and thus pytorch-fid) looks.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dfbench.benchmark.metrics import features as fe
from dfbench.benchmark.metrics.fid import GaussianMoments, frechet_distance, kid


def _random_stats(rng: np.random.Generator, dims: int, samples: int) -> tuple[np.ndarray, np.ndarray]:
    x = rng.standard_normal((samples, dims)) @ rng.standard_normal((dims, dims)) * 0.3 + rng.standard_normal(dims)
    return x.mean(axis=0), np.cov(x, rowvar=False)


def _psd_sqrt(a: np.ndarray) -> np.ndarray:
    w, v = np.linalg.eigh(a)
    return (v * np.sqrt(np.clip(w, 0.0, None))) @ v.T


def _reference_fd(mu1, s1, mu2, s2) -> float:
    """Independent float64 formula: Tr((S1 S2)^1/2) = sum sqrt(eig(S1^1/2 S2 S1^1/2)),
    symmetric eigenproblems only (no scipy.linalg.sqrtm)."""
    r = _psd_sqrt(s1)
    eig = np.linalg.eigvalsh(r @ s2 @ r)
    diff = mu1 - mu2
    return float(diff @ diff + np.trace(s1) + np.trace(s2) - 2.0 * np.sqrt(np.clip(eig, 0.0, None)).sum())


# ----------------------------------------------------------------- Frechet distance


def test_frechet_distance_closed_form_for_diagonal_gaussians():
    # prepare: diagonal covariances, where sqrt(S1 S2) = diag(sqrt(a b))
    mu1, mu2 = np.array([0.0, 1.0, 2.0]), np.array([1.0, 1.0, 0.0])
    a, b = np.array([1.0, 4.0, 9.0]), np.array([4.0, 1.0, 1.0])
    # execute
    value = frechet_distance(mu1, np.diag(a), mu2, np.diag(b))
    # assert: ||mu1-mu2||^2 + sum (sqrt a - sqrt b)^2 = 5 + (1 + 1 + 4)
    assert value == pytest.approx(11.0, abs=1e-12)


@pytest.mark.parametrize("dims,samples", [(16, 200), (64, 500)])
def test_frechet_distance_equals_float64_eigen_reference(dims, samples):
    rng = np.random.default_rng(dims)
    mu1, s1 = _random_stats(rng, dims, samples)
    mu2, s2 = _random_stats(rng, dims, samples)
    assert frechet_distance(mu1, s1, mu2, s2) == pytest.approx(_reference_fd(mu1, s1, mu2, s2), rel=1e-9)


@pytest.mark.parametrize("dims,samples", [(32, 400), (48, 20)])  # second: rank-deficient covariances
@pytest.mark.filterwarnings("ignore:The `disp` argument is deprecated:DeprecationWarning")  # inside pytorch-fid
def test_frechet_distance_equals_pytorch_fid(dims, samples):
    from pytorch_fid.fid_score import calculate_frechet_distance

    rng = np.random.default_rng(100 + dims)
    mu1, s1 = _random_stats(rng, dims, samples)
    mu2, s2 = _random_stats(rng, dims, samples)
    ours = frechet_distance(mu1, s1, mu2, s2)
    theirs = float(calculate_frechet_distance(mu1, s1, mu2, s2))
    assert ours == pytest.approx(theirs, rel=1e-10, abs=1e-10)


def test_fid_of_a_set_with_itself_is_zero_and_fid_is_symmetric():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((400, 24)) @ rng.standard_normal((24, 24))
    y = rng.standard_normal((400, 24)) * 2.0 + 0.5
    mx, sx = x.mean(0), np.cov(x, rowvar=False)
    my, sy = y.mean(0), np.cov(y, rowvar=False)
    scale = np.trace(sx)
    assert abs(frechet_distance(mx, sx, mx, sx)) < 1e-9 * scale
    assert frechet_distance(mx, sx, my, sy) == pytest.approx(frechet_distance(my, sy, mx, sx), rel=1e-9)
    assert frechet_distance(mx, sx, my, sy) > 1.0


def test_fid_grows_monotonically_with_added_gaussian_noise():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2000, 16)) @ rng.standard_normal((16, 16)) * 0.5
    noise = rng.standard_normal(x.shape)
    mx, sx = x.mean(0), np.cov(x, rowvar=False)
    values = []
    for sigma in (0.0, 0.1, 0.3, 1.0, 3.0):
        y = x + sigma * noise
        values.append(frechet_distance(mx, sx, y.mean(0), np.cov(y, rowvar=False)))
    assert abs(values[0]) < 1e-9
    assert all(b > a for a, b in zip(values, values[1:])), values


def test_frechet_distance_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="same extractor"):
        frechet_distance(np.zeros(3), np.eye(3), np.zeros(4), np.eye(4))
    with pytest.raises(ValueError, match=r"\[D, D\]"):
        frechet_distance(np.zeros(3), np.eye(2), np.zeros(3), np.eye(3))


def test_gaussian_moments_match_numpy_even_far_from_the_origin():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1000, 7)) * 1e-2 + 1e4  # large offset: naive E[xx]-mumu cancels badly
    moments = GaussianMoments()
    for start, stop in ((0, 1), (1, 300), (300, 300), (300, 1000)):
        moments.update(x[start:stop])
    mu, sigma = moments.finalize()
    np.testing.assert_allclose(mu, x.mean(0), rtol=1e-14)
    np.testing.assert_allclose(sigma, np.cov(x, rowvar=False), rtol=1e-8, atol=1e-14)


# ------------------------------------------------------------------------------ KID


def test_kid_matches_clean_fid_on_full_sets():
    from cleanfid.fid import kernel_distance

    # With subset size = set size the estimate does not depend on the draw,
    # so our value must equal clean-fid's implementation exactly.
    rng = np.random.default_rng(4)
    a = rng.standard_normal((60, 10))
    b = rng.standard_normal((60, 10)) * 1.3 + 0.2
    ours, _ = kid(a, b, num_subsets=1, subset_size=60)
    assert ours == pytest.approx(kernel_distance(a, b, num_subsets=1, max_subset_size=60), rel=1e-12)


def test_kid_is_unbiased_near_zero_for_one_distribution_and_positive_otherwise():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((600, 8))
    b = rng.standard_normal((600, 8))
    c = rng.standard_normal((600, 8)) * 1.5 + 0.3
    same, same_se = kid(a, b, num_subsets=50, subset_size=200, seed=0)
    diff, diff_se = kid(a, c, num_subsets=50, subset_size=200, seed=0)
    assert same_se > 0 and abs(same) < 3 * same_se
    assert diff > 3 * diff_se > 0
    # Unbiased means not clipped: some same-distribution subsets go negative.
    assert kid(a, b, num_subsets=1, subset_size=600)[0] != 0.0


def test_kid_is_reproducible_and_validates_inputs():
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((50, 4)), rng.standard_normal((40, 4))
    assert kid(a, b, num_subsets=5, subset_size=30, seed=1) == kid(a, b, num_subsets=5, subset_size=30, seed=1)
    assert math.isnan(kid(a, b, num_subsets=1, subset_size=30)[1])
    with pytest.raises(ValueError, match="same D"):
        kid(a, rng.standard_normal((40, 5)))
    with pytest.raises(ValueError, match="at least 2"):
        kid(a[:1], b)


# ------------------------------------------------------------------------ Inception


@pytest.fixture(scope="module")
def random_inception_home(tmp_path_factory) -> tuple[Path, fe.WeightsSpec]:
    """A torch home whose hub checkpoints dir holds a seeded random FID-Inception
    state dict under the official file name, and a WeightsSpec accepting it."""
    torch_home = tmp_path_factory.mktemp("torch_home")
    path = torch_home / "hub" / "checkpoints" / fe.INCEPTION_WEIGHTS.file_name
    path.parent.mkdir(parents=True)
    torch.save(fe.seeded_fid_inception_state_dict(seed=0), path)
    spec = dataclasses.replace(fe.INCEPTION_WEIGHTS, sha256=fe.file_sha256(path), size=path.stat().st_size)
    return torch_home, spec


def _use_random_inception(mp: pytest.MonkeyPatch, home: tuple[Path, fe.WeightsSpec]) -> Path:
    # The test hook: dfbench accepts the random file's hash; torch hub (and so
    # pytorch-fid) looks in the temporary torch home.
    torch_home, spec = home
    mp.setenv("TORCH_HOME", str(torch_home))
    mp.delenv("DFBENCH_INCEPTION_WEIGHTS", raising=False)
    mp.setitem(fe._KNOWN_WEIGHTS, "inception", spec)
    return torch_home / "hub" / "checkpoints" / spec.file_name


@pytest.fixture
def random_inception(monkeypatch, random_inception_home) -> Path:
    return _use_random_inception(monkeypatch, random_inception_home)


@pytest.fixture(scope="module")
def tiny_images():
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, 256, (3, 3, 32, 32), generator=g, dtype=torch.uint8)


@pytest.fixture(scope="module")
def our_inception_features(random_inception_home, tiny_images):
    with pytest.MonkeyPatch.context() as mp:
        _use_random_inception(mp, random_inception_home)
        extractor = fe.get_extractor("inception")  # found in the torch hub dir, hash verified
    return extractor, extractor.features(tiny_images, batch_size=3)


@pytest.mark.slow
def test_inception_features_equal_pytorch_fid_activations(random_inception, tiny_images, our_inception_features):
    from pytorch_fid.inception import InceptionV3

    extractor, ours = our_inception_features
    assert (extractor.name, extractor.backend, extractor.dims) == ("inception", "pytorch-fid", 2048)
    # pytorch-fid finds the same file in the torch hub cache: no download.
    reference = InceptionV3([InceptionV3.BLOCK_INDEX_BY_DIM[2048]]).eval()
    with torch.no_grad():
        theirs = reference(tiny_images.float() / 255.0)[0].squeeze(-1).squeeze(-1).double().numpy()
    assert ours.dtype == np.float64 and ours.shape == (3, 2048)
    assert np.abs(theirs).mean() > 1e-2  # the random network is not degenerate
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_inception_features_do_not_depend_on_batch_size(our_inception_features, tiny_images):
    extractor, full_batch = our_inception_features
    np.testing.assert_allclose(extractor.features(tiny_images, batch_size=2), full_batch, atol=1e-5, rtol=1e-5)


def test_inception_input_is_unit_range_rgb_with_gray_repeated():
    gray = torch.tensor([[[[0, 255], [51, 102]]]], dtype=torch.uint8)
    prepared = fe._prepare_inception(gray)
    assert prepared.shape == (1, 3, 2, 2)
    torch.testing.assert_close(prepared[0, 2], torch.tensor([[0.0, 1.0], [0.2, 0.4]]))
    torch.testing.assert_close(prepared[0, 0], prepared[0, 1])


def test_wrong_sha256_is_refused_before_loading(tmp_path, monkeypatch):
    bad = tmp_path / fe.INCEPTION_WEIGHTS.file_name
    bad.write_bytes(b"not the inception weights")
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load reached with a bad hash"))
    with pytest.raises(fe.WeightsHashError) as err:
        fe.get_extractor("inception", weights=bad)
    message = str(err.value)
    assert str(bad) in message
    assert fe.INCEPTION_WEIGHTS.sha256 in message
    assert fe.file_sha256(bad) in message


def test_missing_inception_weights_give_the_placement_message(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty_torch_home"))
    monkeypatch.delenv("DFBENCH_INCEPTION_WEIGHTS", raising=False)
    with pytest.raises(fe.MissingWeightsError) as err:
        fe.get_extractor("inception")
    message = str(err.value)
    hub_file = tmp_path / "empty_torch_home" / "hub" / "checkpoints" / "pt_inception-2015-12-05-6726825d.pth"
    for needle in (
        "pt_inception-2015-12-05-6726825d.pth",
        "95,628,359 bytes",
        "6726825d0af5f729cebd5821db510b11b1cfad8faad88a03f1befd49fb9129b2",
        "https://github.com/mseitzer/pytorch-fid/releases/download/fid_weights/pt_inception-2015-12-05-6726825d.pth",
        "--inception-weights",
        "DFBENCH_INCEPTION_WEIGHTS",
        str(hub_file),
    ):
        assert needle in message, needle


def test_explicit_weights_path_that_does_not_exist_is_not_replaced_by_another(tmp_path, random_inception):
    # The hub dir holds a valid file (fixture), but an explicit typo must not fall back to it.
    with pytest.raises(fe.MissingWeightsError, match="given explicitly"):
        fe.get_extractor("inception", weights=tmp_path / "typo.pth")


def test_env_var_is_used_for_inception_weights(tmp_path, monkeypatch, random_inception):
    monkeypatch.setenv("DFBENCH_INCEPTION_WEIGHTS", str(random_inception))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))  # hub dir empty: only the env var can find it
    assert fe.find_weights("inception") == random_inception


# ------------------------------------------------------------------------ clean-fid


class _FakeTorchScriptInception(nn.Module):
    """Same interface as clean-fid's TorchScript file (`layers`, return_features)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(48, 2048))

    def forward(self, x: torch.Tensor, return_features: bool = False) -> torch.Tensor:
        x = F.interpolate(x, size=(299, 299), mode="bilinear", align_corners=False)
        return self.layers((x - 128.0) / 128.0)


@pytest.mark.filterwarnings("ignore:`torch.jit:FutureWarning")  # deprecated in recent torch, still works
def test_clean_extractor_uses_clean_fid_resize_and_network(tmp_path, monkeypatch):
    from cleanfid.resize import build_resizer

    torch.manual_seed(0)
    fake = _FakeTorchScriptInception().eval()
    path = tmp_path / fe.CLEAN_INCEPTION_WEIGHTS.file_name
    torch.jit.save(torch.jit.script(fake), str(path))
    spec = dataclasses.replace(fe.CLEAN_INCEPTION_WEIGHTS, sha256=fe.file_sha256(path))
    monkeypatch.setitem(fe._KNOWN_WEIGHTS, "clean", spec)
    images = torch.randint(0, 256, (3, 1, 20, 20), generator=torch.Generator().manual_seed(8), dtype=torch.uint8)

    extractor = fe.get_extractor("clean", weights=path)
    ours = extractor.features(images, batch_size=2)

    # Independent path: clean-fid's resizer on HWC arrays, then the network's layers.
    resize = build_resizer("clean")
    rgb = images.repeat(1, 3, 1, 1).permute(0, 2, 3, 1).numpy()
    resized = torch.from_numpy(np.stack([resize(im) for im in rgb])).permute(0, 3, 1, 2).float()
    with torch.no_grad():
        expected = fake.layers((resized - 128.0) / 128.0).double().numpy()
    assert (extractor.backend, extractor.resize) == ("clean-fid", "clean-fid-PIL-bicubic-299")
    np.testing.assert_allclose(ours, expected, atol=1e-5, rtol=1e-5)


def test_missing_clean_fid_weights_name_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.delenv("DFBENCH_CLEAN_INCEPTION_WEIGHTS", raising=False)
    monkeypatch.setitem(
        fe._KNOWN_WEIGHTS, "clean", dataclasses.replace(fe.CLEAN_INCEPTION_WEIGHTS, extra_dirs=(tmp_path,))
    )
    with pytest.raises(fe.MissingWeightsError) as err:
        fe.get_extractor("clean")
    message = str(err.value)
    for needle in ("inception-2015-12-05.pt", "95,607,719 bytes", fe.CLEAN_INCEPTION_WEIGHTS.sha256,
                   fe.CLEAN_INCEPTION_WEIGHTS.url, "DFBENCH_CLEAN_INCEPTION_WEIGHTS"):
        assert needle in message, needle


def test_unknown_extractor_and_mode_are_rejected():
    with pytest.raises(ValueError, match="choose one of"):
        fe.get_extractor("inceptoin")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="clean_mode"):
        fe.get_extractor("clean", clean_mode="bicubic")  # type: ignore[arg-type]
