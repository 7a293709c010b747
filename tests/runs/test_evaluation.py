"""evaluate_images / reference_stats / fid_between: metric planning, caching,
row contents, the committed Fashion-MNIST classifier, and file inputs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from dfbench.benchmark.metrics import scoring as ev
from dfbench.benchmark.metrics import features as fe
from dfbench.benchmark.metrics.fid import frechet_distance, kid

ROW_KEYS = {"metric", "value", "std_err", "extractor", "extractor_sha256", "backend", "resize", "num_samples", "reference",
            "ci_low", "ci_high", "ci_level", "ci_method", "ci_replicates"}


def _fmnist_available() -> bool:
    from dfbench import datasets

    return datasets.locate("fmnist", "test") is not None


needs_fmnist = pytest.mark.skipif(not _fmnist_available(), reason="Fashion-MNIST files not on this machine")


def _fake_images(n: int, seed: int, shape=(1, 28, 28)) -> torch.Tensor:
    return torch.randint(0, 256, (n, *shape), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


def _fake_dataset(images: torch.Tensor, sha: str) -> SimpleNamespace:
    return SimpleNamespace(images=images, labels=torch.zeros(len(images), dtype=torch.int64), sha256=sha)


def _tiny_extractor(name: str = "inception", sha: str = "e" * 64, in_features: int = 784) -> fe.Extractor:
    """A cheap stand-in with the Extractor interface (8-d random projection)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(in_features, 8))
    return fe.Extractor(name=name, sha256=sha, backend="test", resize="none", dims=8,
                        network=net, prepare=lambda x: x.float() / 255.0)


class _CountingExtractor:
    """Wraps an extractor's `features` to count the images it processes."""

    def __init__(self, extractor: fe.Extractor) -> None:
        self.images_seen = 0
        inner = extractor.features

        def counted(images, *args, **kwargs):
            self.images_seen += images.shape[0]
            return inner(images, *args, **kwargs)

        extractor.features = counted  # type: ignore[method-assign]


@pytest.fixture
def no_inception(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty_torch_home"))
    monkeypatch.delenv("DFBENCH_INCEPTION_WEIGHTS", raising=False)


@pytest.fixture
def fake_reference(monkeypatch):
    """Reference splits served from memory: 300 random images per (dataset, split)."""
    served: list[tuple[str, str]] = []

    def load(dataset, split, root):
        served.append((dataset, split))
        shape = ev.dataset_shape(dataset)
        return _fake_dataset(_fake_images(300, seed=len(dataset), shape=shape), sha=dataset[0] * 64)

    monkeypatch.setattr(ev, "_load_dataset", load)
    return served


# ----------------------------------------------------------------------- caching


def test_cache_dir_follows_env(tmp_path, monkeypatch):
    monkeypatch.setenv("DFBENCH_CACHE", str(tmp_path / "c"))
    assert ev.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("DFBENCH_CACHE")
    assert ev.cache_dir() == Path.home() / ".cache" / "dfbench"


def test_reference_stats_are_cached_and_the_second_call_reads_the_file(tmp_path, monkeypatch):
    images = _fake_images(300, seed=1)
    data = {"sha": "a" * 64}
    monkeypatch.setattr(ev, "_load_dataset", lambda d, s, r: _fake_dataset(images, data["sha"]))
    extractor = _tiny_extractor()
    expected = extractor.features(images)
    counter = _CountingExtractor(extractor)

    mu, sigma = ev.reference_stats("fmnist", "train", extractor, cache_dir=tmp_path)
    assert counter.images_seen == 300
    np.testing.assert_allclose(mu, expected.mean(0), rtol=1e-12)
    np.testing.assert_allclose(sigma, np.cov(expected, rowvar=False), rtol=1e-9, atol=1e-12)

    files = list((tmp_path / "reference_stats").glob("*.npz"))
    assert len(files) == 1 and "fmnist-train-" in files[0].name and "-inception-" in files[0].name
    with np.load(files[0], allow_pickle=False) as cached:  # no pickles in the cache
        assert str(cached["dataset_sha256"]) == "a" * 64
        assert str(cached["extractor_sha256"]) == extractor.sha256
        assert cached["kid_features"].shape == (300, 8)

    mu2, sigma2 = ev.reference_stats("fmnist", "train", extractor, cache_dir=tmp_path)
    assert counter.images_seen == 300  # nothing recomputed
    np.testing.assert_array_equal(mu2, mu)
    np.testing.assert_array_equal(sigma2, sigma)

    data["sha"] = "b" * 64  # new dataset bytes -> new key -> recomputed
    ev.reference_stats("fmnist", "train", extractor, cache_dir=tmp_path)
    assert counter.images_seen == 600
    assert len(list((tmp_path / "reference_stats").glob("*.npz"))) == 2
    assert not list((tmp_path / "reference_stats").glob("*.tmp"))  # atomic write left no temp file


def test_cache_key_includes_the_extractor_weights_hash(tmp_path, fake_reference):
    first, second = _tiny_extractor(sha="1" * 64), _tiny_extractor(sha="2" * 64)
    ev.reference_stats("fmnist", "train", first, cache_dir=tmp_path)
    counter = _CountingExtractor(second)
    ev.reference_stats("fmnist", "train", second, cache_dir=tmp_path)
    assert counter.images_seen == 300


# ------------------------------------------------------------------ evaluate_images


def test_auto_on_fmnist_without_inception_weights_gives_its_two_networks_metrics(tmp_path, no_inception, fake_reference):
    samples = _fake_images(200, seed=2)
    rows = ev.evaluate_images(samples, "fmnist", options=ev.ScoreOptions(cache_dir=tmp_path, kid_subsets=10))
    assert [r["metric"] for r in rows] == ["fd_fmnist", "fd_fmnist_ae", "kid_fmnist", "kid_fmnist_ae"]
    assert [r["extractor"] for r in rows] == ["fmnist", "fmnist_ae", "fmnist", "fmnist_ae"]
    assert all(set(r) == ROW_KEYS for r in rows)
    # KID in the classifier's space: its features against the cached reference subset, recomputed
    extractor = fe.get_extractor("fmnist")
    ref = ev._reference("fmnist", "train", extractor, data_root=None, cache_dir_=tmp_path)
    expected_kid = kid(extractor.features(samples), ref["kid_features"], num_subsets=10, subset_size=1000, seed=0)
    assert (rows[2]["value"], rows[2]["std_err"]) == pytest.approx(expected_kid, rel=1e-9)
    row = rows[0]
    assert row["extractor"] == "fmnist" and row["backend"] == "dfbench"
    assert row["extractor_sha256"] == fe.FMNIST_CLASSIFIER_SHA256
    assert (row["num_samples"], row["reference"], row["std_err"]) == (200, "fmnist/train", None)
    # Value = Frechet distance of the classifier features, recomputed independently.
    extractor = fe.get_extractor("fmnist")
    mu_ref, sigma_ref = ev.reference_stats("fmnist", "train", extractor, cache_dir=tmp_path)
    feats = extractor.features(samples)
    assert row["value"] == pytest.approx(
        frechet_distance(feats.mean(0), np.cov(feats, rowvar=False), mu_ref, sigma_ref), rel=1e-9
    )


def test_auto_on_fmnist_adds_fid_and_kid_when_inception_weights_are_found(tmp_path, monkeypatch, fake_reference):
    weights = tmp_path / "weights.pth"
    weights.write_bytes(b"stand-in: the real hash check happens in get_extractor, replaced here")
    monkeypatch.setenv("DFBENCH_INCEPTION_WEIGHTS", str(weights))
    real_get = ev.get_extractor
    built = {}

    def get_extractor(name, *, weights=None, device="cpu"):
        built[name] = weights
        return _tiny_extractor() if name == "inception" else real_get(name, weights=weights, device=device)

    monkeypatch.setattr(ev, "get_extractor", get_extractor)
    samples = _fake_images(120, seed=3)
    rows = ev.evaluate_images(samples, "fmnist", options=ev.ScoreOptions(cache_dir=tmp_path, kid_subsets=10, kid_subset_size=50))
    assert [r["metric"] for r in rows] == ["fd_fmnist", "fd_fmnist_ae", "kid_fmnist", "kid_fmnist_ae", "fid", "kid"]
    assert built["inception"] == weights  # the located file is what the extractor is built from
    by_name = {r["metric"]: r for r in rows}
    assert by_name["fid"]["extractor"] == "inception" and by_name["fid"]["std_err"] is None
    tiny = _tiny_extractor()
    ref = ev._reference("fmnist", "train", tiny, data_root=None, cache_dir_=tmp_path)
    expected_kid = kid(tiny.features(samples), ref["kid_features"], num_subsets=10, subset_size=50, seed=0)
    assert (by_name["kid"]["value"], by_name["kid"]["std_err"]) == pytest.approx(expected_kid, rel=1e-9)


def test_every_row_evaluate_samples_writes_is_in_the_metric_table_with_its_extractor_and_direction(
        tmp_path, monkeypatch):
    from dfbench.benchmark.metrics import table

    # prepare: fmnist with (stand-in) Inception weights, quality rows, three clients in two groups
    weights = tmp_path / "weights.pth"
    weights.write_bytes(b"stand-in")
    monkeypatch.setenv("DFBENCH_INCEPTION_WEIGHTS", str(weights))
    real_get = ev.get_extractor
    monkeypatch.setattr(ev, "get_extractor", lambda name, *, weights=None, device="cpu":
                        _tiny_extractor() if name == "inception" else real_get(name, weights=weights, device=device))
    images = _fake_images(300, seed=6)  # a reference split with ten classes, for mode coverage
    monkeypatch.setattr(ev, "_load_dataset", lambda d, s, r: SimpleNamespace(
        images=images, labels=torch.arange(300) % 10, sha256=s[0] * 64))
    clients = [np.arange(0, 100), np.arange(100, 200), np.arange(200, 300)]
    # execute
    options = ev.ScoreOptions(cache_dir=tmp_path, kid_subsets=5, kid_subset_size=30, bootstrap=0)
    rows, notes = ev.evaluate_samples(_fake_images(60, seed=5), "fmnist", options=options,
                                      clients=ev.ClientSplit(clients, np.array([0, 1, 1]), split_size=300))
    # assert: the headline metrics are "auto"'s, and every row name is a table entry whose extractor
    # and direction are the ones the row records (a row without "better" is lower-is-better)
    names = [r["metric"] for r in rows]
    assert names[:6] == table.auto_metrics("fmnist", True) == [
        "fd_fmnist", "fd_fmnist_ae", "kid_fmnist", "kid_fmnist_ae", "fid", "kid"]
    assert {"precision_fmnist", "precision_fmnist_ae", "coverage_inception", "client_fd_fmnist_worst",
            "client_fd_fmnist_ae_mean", "client_fid_mean", "expert_fd_fmnist_worst", "expert_fd_fmnist_ae_worst",
            "expert_fid_worst", "class_tv", "low_classes"} <= set(names), (names, notes)
    for row in rows:
        entry = table.get(row["metric"])
        assert entry is not None, row["metric"]
        assert row.get("better", "lower") == entry.better, row["metric"]
        if entry.extractor is not None:
            assert row["extractor"] == entry.extractor, row["metric"]
    # the clients' reference split is the training split: with another one, no client row (a note)
    test_rows, test_notes = ev.evaluate_samples(_fake_images(60, seed=5), "fmnist",
                                                options=dataclasses.replace(options, reference_split="test"),
                                                clients=ev.ClientSplit(clients, split_size=300))
    assert not [r for r in test_rows if table.get(r["metric"]).reference == "train"]
    assert "per-client quality: needs eval.reference_split=train (the clients' split), got 'test'" in test_notes
    # group_of_client must name a group per client
    with pytest.raises(ValueError, match="group_of_client has 2 entries for 3 clients"):
        ev.ClientSplit(clients, np.array([0, 1]))


def test_score_options_are_a_checked_frozen_value_and_the_only_way_to_pass_them():
    options = ev.ScoreOptions(batch_size=64, seed=3)
    assert (options.batch_size, options.seed, options.device) == (64, 3, "cpu")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.seed = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match="bootstrap must be 0"):
        ev.ScoreOptions(bootstrap=1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'batch_size'"):
        ev.evaluate_samples(_fake_images(4, seed=0), "fmnist", batch_size=8)  # type: ignore[call-arg]


@pytest.mark.parametrize("dataset,metrics", [("cifar10", "auto"), ("svhn", ["fid"]), ("fmnist", ["fd_fmnist", "kid"])])
def test_missing_weights_raise_before_any_feature_work(tmp_path, monkeypatch, no_inception, dataset, metrics):
    monkeypatch.setattr(ev, "_load_dataset", lambda *a: pytest.fail("reference data loaded before the weights check"))
    monkeypatch.setattr(fe.Extractor, "features", lambda *a, **k: pytest.fail("features computed before the check"))
    samples = _fake_images(4, seed=4, shape=ev.dataset_shape(dataset))
    with pytest.raises(ev.MissingWeightsError, match="pt_inception-2015-12-05-6726825d.pth"):
        ev.evaluate_images(samples, dataset, metrics=metrics, options=ev.ScoreOptions(cache_dir=tmp_path))


def test_explicit_missing_weights_path_is_an_error_even_with_auto(tmp_path, no_inception):
    with pytest.raises(ev.MissingWeightsError, match="given explicitly"):
        ev.evaluate_images(_fake_images(4, seed=5), "fmnist", options=ev.ScoreOptions(inception_weights=tmp_path / "nope.pth"))


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"metrics": ["fid", "bogus"]}, ValueError, "unknown metric"),
        ({"metrics": "fid"}, ValueError, "pass a list"),
        ({"metrics": []}, ValueError, "empty"),
        ({"metrics": ["fid", "fid"]}, ValueError, "twice"),
        (
            {"dataset": "svhn", "metrics": ["fd_fmnist"], "images": _fake_images(4, 6, shape=(3, 32, 32))},
            ValueError,
            "only defined for dataset 'fmnist'",
        ),
        ({"dataset": "mnist"}, ValueError, "unknown dataset"),
        ({"images": _fake_images(4, 6).float()}, TypeError, "uint8"),
        ({"images": _fake_images(4, 6, shape=(3, 28, 28))}, ValueError, r"\[N, 1, 28, 28\]"),
    ],
)
def test_bad_arguments_are_rejected_with_clear_errors(kwargs, error, match):
    args = {"images": _fake_images(4, 6), "dataset": "fmnist", **kwargs}
    images, dataset = args.pop("images"), args.pop("dataset")
    with pytest.raises(error, match=match):
        ev.evaluate_images(images, dataset, **args)


# ------------------------------------------------------------ fmnist, real data


@pytest.mark.slow
@needs_fmnist
def test_committed_fmnist_classifier_is_pinned_and_accurate():
    from dfbench import datasets

    weights = fe.ASSETS_DIR / fe.FMNIST_CLASSIFIER_FILE
    meta = json.loads((fe.ASSETS_DIR / "fmnist_classifier.json").read_text())
    assert meta["sha256"] == fe.FMNIST_CLASSIFIER_SHA256 == fe.file_sha256(weights)
    assert meta["bytes"] == weights.stat().st_size < 2_000_000
    assert meta["test_accuracy"] >= 0.9
    # Re-measure on part of the test split (the full split is slow on a busy CPU).
    test = datasets.load("fmnist", "test")
    classifier = fe.get_extractor("fmnist").network.classifier
    with torch.inference_mode():
        predictions = classifier(test.images[:2000].float() / 255.0).argmax(1)
    assert float((predictions == test.labels[:2000]).float().mean()) >= 0.88


@pytest.mark.slow
@needs_fmnist
def test_fd_fmnist_grows_monotonically_with_noise_on_real_images(tmp_path, monkeypatch):
    from dfbench import datasets

    test = datasets.load("fmnist", "test")
    # Reference: 1000 real test images; samples: 300 other real images plus noise.
    monkeypatch.setattr(ev, "_load_dataset", lambda d, s, r: _fake_dataset(test.images[:1000], test.sha256))
    clean = test.images[1000:1300]
    noise = torch.randn(clean.shape, generator=torch.Generator().manual_seed(0))
    values = []
    for sigma in (0.0, 16.0, 48.0, 128.0):
        noisy = (clean.float() + sigma * noise).round().clamp(0, 255).to(torch.uint8)
        [row] = ev.evaluate_images(noisy, "fmnist", metrics=["fd_fmnist"],
                                   options=ev.ScoreOptions(reference_split="test", cache_dir=tmp_path))
        values.append(row["value"])
    assert row["reference"] == "fmnist/test"
    assert all(b > a for a, b in zip(values, values[1:])), values
    assert values[-1] > 10 * values[0]


# --------------------------------------------------------------------- fid_between


def _write_pngs(folder: Path, images: torch.Tensor) -> None:
    from PIL import Image

    folder.mkdir()
    for i, image in enumerate(images):
        Image.fromarray(image[0].numpy(), mode="L").save(folder / f"{i:04d}.png")


def test_fid_between_png_folder_and_npz_arrays(tmp_path):
    images = _fake_images(150, seed=9)
    _write_pngs(tmp_path / "pngs", images)
    np.savez(tmp_path / "nhwc.npz", images.permute(0, 2, 3, 1).numpy())  # single array: arr_0
    np.savez(tmp_path / "nchw.npz", images=images.numpy(), labels=np.zeros(150))

    same = ev.fid_between(tmp_path / "pngs", tmp_path / "nhwc.npz", extractor="fmnist")
    assert same["metric"] == "fd_fmnist" and same["extractor_sha256"] == fe.FMNIST_CLASSIFIER_SHA256
    assert abs(same["value"]) < 1e-6
    assert same["num_samples_a"] == same["num_samples_b"] == 150

    other = _fake_images(150, seed=10) // 2  # darker images: a different distribution
    np.save(tmp_path / "other.npy", other.numpy())
    different = ev.fid_between(tmp_path / "nchw.npz", tmp_path / "other.npy", extractor="fmnist")
    assert different["value"] > 1.0


@pytest.mark.parametrize(
    "array,match",
    [
        (np.zeros((2, 3, 8, 3), np.uint8), "cannot tell NCHW from NHWC"),
        (np.zeros((2, 8, 8, 8), np.uint8), "cannot tell NCHW from NHWC"),
        (np.zeros((2, 1, 8, 8), np.float32), "must be uint8"),
    ],
)
def test_load_image_source_rejects_unclear_arrays(tmp_path, array, match):
    np.savez(tmp_path / "x.npz", images=array)
    with pytest.raises(ValueError, match=match):
        ev.load_image_source(tmp_path / "x.npz")


def test_load_image_source_needs_a_known_key_when_there_are_several(tmp_path):
    np.savez(tmp_path / "x.npz", a=np.zeros((2, 1, 8, 8), np.uint8), b=np.zeros(2))
    with pytest.raises(ValueError, match="'images'"):
        ev.load_image_source(tmp_path / "x.npz")
    with pytest.raises(ValueError, match="unknown extractor"):
        ev.fid_between(tmp_path / "x.npz", tmp_path / "x.npz", extractor="vgg")  # type: ignore[arg-type]


def test_building_reference_statistics_is_timed_apart_and_a_cached_read_is_not(tmp_path, monkeypatch):
    # prepare: a build that takes measurable time
    import time as _time

    images = _fake_images(300, seed=5)
    monkeypatch.setattr(ev, "_load_dataset", lambda d, s, r: _fake_dataset(images, "c" * 64))
    real = ev._compute_reference
    monkeypatch.setattr(ev, "_compute_reference", lambda *a, **k: (_time.sleep(0.2), real(*a, **k))[1])
    extractor = _tiny_extractor()
    # execute: a build, then a read of the cached file
    before = ev.reference_build_seconds()
    ev.reference_stats("fmnist", "train", extractor, cache_dir=tmp_path)
    built = ev.reference_build_seconds()
    ev.reference_stats("fmnist", "train", extractor, cache_dir=tmp_path)
    # assert: the build is counted (what evaluate_state subtracts from a run's eval time), the read is not
    assert built - before >= 0.2 and ev.reference_build_seconds() == built
