"""Sample-quality metrics against cached reference statistics.

    images (uint8) -> Extractor.features -> mean / covariance -> frechet_distance
                                         -> features          -> kid
    reference split -> Extractor.features -> cached npz (mu, sigma, KID subset)

Metric names say which network produced them: ``fd_fmnist`` (the committed
Fashion-MNIST classifier; never reported as FID), ``fid`` / ``kid``
(pytorch-fid's TF-Inception port), ``fid_clean`` (clean-fid). Every row
records the extractor and its weights' sha256, the backend, the resize, the
number of samples and the reference split.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from .features import (
    Extractor,
    MissingWeightsError,
    WeightsHashError,
    find_weights,
    get_extractor,
)
from .fid import GaussianMoments, frechet_distance, kid

__all__ = [
    "DATASET_SHAPES",
    "Extractor",
    "METRICS",
    "MissingWeightsError",
    "WeightsHashError",
    "cache_dir",
    "evaluate_images",
    "fid_between",
    "frechet_distance",
    "get_extractor",
    "kid",
    "load_image_source",
    "reference_stats",
]

MetricName = Literal["fd_fmnist", "fid", "kid", "fid_clean"]
METRICS: tuple[str, ...] = ("fd_fmnist", "fid", "kid", "fid_clean")
# Which extractor each metric is computed with.
_METRIC_EXTRACTOR = {"fd_fmnist": "fmnist", "fid": "inception", "kid": "inception", "fid_clean": "clean"}
_FD_METRIC_OF_EXTRACTOR = {"fmnist": "fd_fmnist", "inception": "fid", "clean": "fid_clean"}

# Image shape [C, H, W] of each dataset: generated samples must match it.
DATASET_SHAPES: dict[str, tuple[int, int, int]] = {
    "fmnist": (1, 28, 28),
    "svhn": (3, 32, 32),
    "cifar10": (3, 32, 32),
}

# Reference features kept for KID (a seeded subset; the full 60k x 2048 set
# would be ~0.5 GB even in float32). KID draws subsets of 1000 from these.
KID_REFERENCE_SAMPLES = 10_000
# Images per feature pass over a reference split (bounds host memory).
_REFERENCE_CHUNK = 4096
# Bump when the layout of the cached npz changes.
_CACHE_VERSION = 1


def cache_dir() -> Path:
    """Where reference statistics are cached: $DFBENCH_CACHE, else ~/.cache/dfbench."""
    env = os.environ.get("DFBENCH_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dfbench"


def _load_dataset(dataset: str, split: str, root: str | Path | None) -> Any:
    # Imported here: `datasets` (the project package) is only needed for
    # reference statistics, not for comparing two folders.
    from dfbench import datasets

    return datasets.load(dataset, split, root=root)


def _check_dataset(dataset: str) -> None:
    if dataset not in DATASET_SHAPES:
        raise ValueError(f"unknown dataset {dataset!r}; choose one of {list(DATASET_SHAPES)}")


def _atomic_savez(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write an npz so that readers see either nothing or the complete file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, **arrays)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _reference_path(root: Path, dataset: str, split: str, dataset_sha: str, extractor: Extractor) -> Path:
    name = f"{dataset}-{split}-{dataset_sha[:16]}-{extractor.name}-{extractor.sha256[:16]}-v{_CACHE_VERSION}.npz"
    return root / "reference_stats" / name


def _compute_reference(
    images: torch.Tensor, extractor: Extractor, batch_size: int, progress: bool
) -> dict[str, np.ndarray]:
    count = images.shape[0]
    keep = np.sort(np.random.default_rng(0).choice(count, min(count, KID_REFERENCE_SAMPLES), replace=False))
    moments = GaussianMoments()
    kid_rows = []
    chunks = range(0, count, _REFERENCE_CHUNK)
    if progress:
        from tqdm import tqdm

        chunks = tqdm(chunks, desc=f"reference {extractor.name}", unit="chunk")
    for start in chunks:
        stop = min(start + _REFERENCE_CHUNK, count)
        feats = extractor.features(images[start:stop], batch_size=batch_size)
        moments.update(feats)
        local = keep[(keep >= start) & (keep < stop)] - start
        # Network features are float32, so storing the KID subset as float32 is lossless.
        kid_rows.append(feats[local].astype(np.float32))
    mu, sigma = moments.finalize()
    return {"mu": mu, "sigma": sigma, "kid_features": np.concatenate(kid_rows), "num_samples": np.array(count)}


def _reference(
    dataset: str,
    split: str,
    extractor: Extractor,
    *,
    data_root: str | Path | None,
    cache_dir_: str | Path | None,
    batch_size: int = 256,
    progress: bool = False,
) -> dict[str, np.ndarray]:
    """Cached reference arrays: mu, sigma, kid_features, num_samples."""
    _check_dataset(dataset)
    data = _load_dataset(dataset, split, data_root)
    root = Path(cache_dir_) if cache_dir_ is not None else cache_dir()
    path = _reference_path(root, dataset, split, data.sha256, extractor)
    if path.is_file():
        with np.load(path, allow_pickle=False) as cached:
            # The file name holds hash prefixes; the full hashes inside decide.
            if str(cached["dataset_sha256"]) == data.sha256 and str(cached["extractor_sha256"]) == extractor.sha256:
                return {key: cached[key] for key in ("mu", "sigma", "kid_features", "num_samples")}
    arrays = _compute_reference(data.images, extractor, batch_size, progress)
    _atomic_savez(
        path,
        {
            **arrays,
            "dataset_sha256": np.array(data.sha256),
            "extractor_sha256": np.array(extractor.sha256),
            "extractor": np.array(extractor.name),
        },
    )
    return arrays


def reference_stats(
    dataset: str,
    split: str,
    extractor: Extractor,
    *,
    data_root: str | Path | None = None,
    cache_dir: str | Path | None = None,
    batch_size: int = 256,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(mean, covariance) of `extractor` features over a dataset split, float64.

    Computed once and cached as an npz under a key made of the dataset, split,
    the dataset's source sha256, the extractor name and its weights' sha256;
    later calls read the file. Written atomically.
    """
    arrays = _reference(
        dataset, split, extractor, data_root=data_root, cache_dir_=cache_dir, batch_size=batch_size, progress=progress
    )
    return np.asarray(arrays["mu"], dtype=np.float64), np.asarray(arrays["sigma"], dtype=np.float64)


def _resolve_metrics(
    metrics: Sequence[str] | str, dataset: str, inception_weights: str | Path | None
) -> list[str]:
    if isinstance(metrics, str):
        if metrics != "auto":
            raise ValueError(
                f"metrics must be 'auto' or a list drawn from {list(METRICS)}, got {metrics!r} "
                f"(for one metric pass a list, e.g. [{metrics!r}])"
            )
        if dataset != "fmnist":
            return ["fid", "kid"]
        chosen = ["fd_fmnist"]
        try:
            find_weights("inception", inception_weights)
        except MissingWeightsError:
            if inception_weights is not None:
                raise  # an explicit path that does not exist is an error, not a silent skip
        else:
            chosen += ["fid", "kid"]
        return chosen
    chosen = list(metrics)
    if not chosen:
        raise ValueError(f"metrics is empty; pass 'auto' or names from {list(METRICS)}")
    unknown = [m for m in chosen if m not in METRICS]
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; choose from {list(METRICS)}")
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"metric listed twice in {chosen}")
    if "fd_fmnist" in chosen and dataset != "fmnist":
        raise ValueError(
            f"fd_fmnist uses the Fashion-MNIST classifier and is only defined for dataset 'fmnist', "
            f"not {dataset!r}; use 'fid' for {dataset!r}"
        )
    return chosen


def _check_images(images: torch.Tensor, dataset: str) -> None:
    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8:
        raise TypeError(
            "images must be a uint8 torch.Tensor [N, C, H, W] with values 0..255; convert samples in "
            "[-1, 1] with ((x + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)"
        )
    expected = DATASET_SHAPES[dataset]
    if images.ndim != 4 or tuple(images.shape[1:]) != expected:
        raise ValueError(
            f"images for {dataset!r} must have shape [N, {', '.join(map(str, expected))}], got {tuple(images.shape)}"
        )
    if images.shape[0] < 2:
        raise ValueError(f"need at least 2 images for a covariance, got {images.shape[0]}")


def evaluate_images(
    images: torch.Tensor,
    dataset: str,
    *,
    metrics: Sequence[str] | Literal["auto"] = "auto",
    reference_split: str = "train",
    data_root: str | Path | None = None,
    cache_dir: str | Path | None = None,
    inception_weights: str | Path | None = None,
    clean_weights: str | Path | None = None,
    device: str = "cpu",
    batch_size: int = 256,
    kid_subsets: int = 100,
    kid_subset_size: int = 1000,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Score uint8 samples [N, C, H, W] of `dataset` against its `reference_split`.

    metrics: "auto" = ["fd_fmnist"] for fmnist, plus ["fid", "kid"] when the
    Inception weights are found; ["fid", "kid"] for svhn / cifar10 (raises
    `MissingWeightsError` without the weights). Explicit metrics whose weights
    are missing raise before any feature is computed. Returns one dict per
    metric, in the order requested.
    """
    _check_dataset(dataset)
    _check_images(images, dataset)
    chosen = _resolve_metrics(metrics, dataset, inception_weights)

    # Fail on missing weights before any (slow) feature work.
    needed = list(dict.fromkeys(_METRIC_EXTRACTOR[m] for m in chosen))
    given = {"inception": inception_weights, "clean": clean_weights}
    paths = {name: find_weights(name, given[name]) for name in needed if name != "fmnist"}  # type: ignore[arg-type]
    extractors = {name: get_extractor(name, weights=paths.get(name), device=device) for name in needed}  # type: ignore[arg-type]

    reference = f"{dataset}/{reference_split}"
    rows: dict[str, dict[str, Any]] = {}
    for name, extractor in extractors.items():
        feats = extractor.features(images, batch_size=batch_size, device=device, progress=progress)
        ref = _reference(
            dataset, reference_split, extractor,
            data_root=data_root, cache_dir_=cache_dir, batch_size=batch_size, progress=progress,
        )
        for metric in (m for m in chosen if _METRIC_EXTRACTOR[m] == name):
            if metric == "kid":
                value, std_err = kid(
                    feats, ref["kid_features"], num_subsets=kid_subsets, subset_size=kid_subset_size, seed=0
                )
            else:
                value = frechet_distance(feats.mean(axis=0), np.cov(feats, rowvar=False), ref["mu"], ref["sigma"])
                std_err = None
            rows[metric] = {
                "metric": metric,
                "value": float(value),
                "std_err": None if std_err is None or np.isnan(std_err) else float(std_err),
                "extractor": extractor.name,
                "extractor_sha256": extractor.sha256,
                "backend": extractor.backend,
                "resize": extractor.resize,
                "num_samples": int(images.shape[0]),
                "reference": reference,
            }
    return [rows[m] for m in chosen]


# ------------------------------------------------------------------ dfbench fid A B


def _png_folder(folder: Path) -> torch.Tensor:
    from PIL import Image

    files = sorted(p for p in folder.iterdir() if p.suffix.lower() == ".png")
    if not files:
        raise ValueError(f"{folder} contains no .png files")
    arrays = []
    for file in files:
        with Image.open(file) as img:
            if img.mode in ("L", "1", "I", "I;16", "LA"):
                arrays.append(np.asarray(img.convert("L"))[..., None])
            else:
                arrays.append(np.asarray(img.convert("RGB")))
    if len({a.shape[:2] for a in arrays}) != 1:
        raise ValueError(f"{folder}: images have different sizes; resize them to one size first")
    if len({a.shape[2] for a in arrays}) != 1:
        # Mixed grayscale and colour: promote all to RGB, as PIL's convert("RGB") does.
        arrays = [np.repeat(a, 3, axis=2) if a.shape[2] == 1 else a for a in arrays]
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()


def _array_file(path: Path) -> torch.Tensor:
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            keys = list(data.keys())
            if "images" in keys:
                array = data["images"]
            elif len(keys) == 1:
                array = data[keys[0]]
            else:
                raise ValueError(f"{path}: expected an 'images' array or a single array, found keys {keys}")
    else:
        array = np.load(path, allow_pickle=False)
    if array.dtype != np.uint8:
        raise ValueError(f"{path}: images must be uint8 (0..255), got {array.dtype}")
    if array.ndim == 3:  # [N, H, W] grayscale
        array = array[:, None]
    elif array.ndim == 4:
        nchw, nhwc = array.shape[1] in (1, 3), array.shape[3] in (1, 3)
        if nchw == nhwc:
            raise ValueError(
                f"{path}: cannot tell NCHW from NHWC for shape {array.shape}; "
                "channels (1 or 3) must be either axis 1 or axis 3"
            )
        if nhwc:
            array = array.transpose(0, 3, 1, 2)
    else:
        raise ValueError(f"{path}: expected images [N, H, W], [N, C, H, W] or [N, H, W, C], got {array.shape}")
    return torch.from_numpy(np.ascontiguousarray(array))


def load_image_source(source: str | Path) -> torch.Tensor:
    """uint8 [N, C, H, W] images from a folder of PNGs or an .npz / .npy array.

    npz: the array under key "images", or the file's only array (np.savez's
    "arr_0"). Arrays are uint8, [N, C, H, W] or [N, H, W, C] with C in {1, 3},
    or [N, H, W] grayscale.
    """
    path = Path(source)
    if path.is_dir():
        return _png_folder(path)
    if path.is_file() and path.suffix in (".npz", ".npy"):
        return _array_file(path)
    raise ValueError(f"{path}: expected a folder of .png files or an .npz / .npy file")


def fid_between(
    a: str | Path,
    b: str | Path,
    *,
    extractor: Literal["fmnist", "inception", "clean"] = "inception",
    weights: str | Path | None = None,
    device: str = "cpu",
    batch_size: int = 256,
) -> dict[str, Any]:
    """Frechet distance between two image sets (`dfbench fid A B`).

    A and B are folders of PNGs or .npz/.npy uint8 arrays (see
    `load_image_source`). The metric is named after the extractor: "fid"
    (inception), "fid_clean" (clean) or "fd_fmnist" (fmnist).
    """
    if extractor not in _FD_METRIC_OF_EXTRACTOR:
        raise ValueError(f"unknown extractor {extractor!r}; choose one of {list(_FD_METRIC_OF_EXTRACTOR)}")
    images_a, images_b = load_image_source(a), load_image_source(b)
    for path, images in ((a, images_a), (b, images_b)):
        if images.shape[0] < 2:
            raise ValueError(f"{path}: need at least 2 images, got {images.shape[0]}")
    net = get_extractor(extractor, weights=weights, device=device)
    feats_a = net.features(images_a, batch_size=batch_size)
    feats_b = net.features(images_b, batch_size=batch_size)
    value = frechet_distance(
        feats_a.mean(axis=0), np.cov(feats_a, rowvar=False), feats_b.mean(axis=0), np.cov(feats_b, rowvar=False)
    )
    return {
        "metric": _FD_METRIC_OF_EXTRACTOR[extractor],
        "value": value,
        "extractor": net.name,
        "extractor_sha256": net.sha256,
        "backend": net.backend,
        "resize": net.resize,
        "a": str(a),
        "b": str(b),
        "num_samples_a": int(images_a.shape[0]),
        "num_samples_b": int(images_b.shape[0]),
    }
