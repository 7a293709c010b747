"""Sample-quality metrics against cached reference statistics.

    images (uint8) -> Extractor.features -> mean / covariance -> frechet_distance (+ bootstrap interval)
                                         -> features          -> kid, prdc, per-client distances
                   -> pinned classifier  -> class histogram   -> class_tv, low_classes
    reference split -> Extractor.features -> cached npz (mu, sigma, seeded subset + its indices, label counts)

Metric names say which network produced them: ``fd_fmnist`` / ``kid_fmnist`` (the
committed Fashion-MNIST classifier; never reported as FID), ``fd_fmnist_ae`` /
``kid_fmnist_ae`` (the committed label-free Fashion-MNIST autoencoder), ``fid`` / ``kid``
(pytorch-fid's TF-Inception port), ``fid_clean`` (clean-fid), ``fd_dinov2`` (DINOv2 ViT-L/14, Stein
et al. 2023; left out with a note when its user-supplied weights are absent). Every row
records the extractor and its weights' sha256, the backend, the resize, the
number of samples and the reference split; every Frechet row its interval
(``ci_low``, ``ci_high``, ``ci_level``, ``ci_method``, ``ci_replicates``;
`benchmark.metrics.uncertainty`). Rows whose metric is better when higher carry
``"better": "higher"``. Every metric name, its extractor and direction: `benchmark.metrics.table`.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from dfbench.benchmark.metrics.features import (
    Extractor,
    MissingWeightsError,
    WeightsHashError,
    find_weights,
    get_extractor,
)
from dfbench.benchmark.core.numerics import exact_float32
from dfbench.benchmark.metrics import table
from dfbench.benchmark.metrics.fid import GaussianMoments, frechet_distance, kid
from dfbench.benchmark.metrics.folders import fid_between, load_image_source
from dfbench.datasets.safeio import follow_umask

__all__ = [
    "Extractor",
    "METRICS",
    "ClientSplit",
    "MissingWeightsError",
    "ScoreOptions",
    "WeightsHashError",
    "cache_dir",
    "dataset_shape",
    "evaluate_images",
    "evaluate_samples",
    "fid_between",
    "frechet_distance",
    "get_extractor",
    "kid",
    "load_image_source",
    "reference_stats",
]

# The metrics eval.metrics may name; which extractor computes each: benchmark/metrics/table.py.
METRICS: tuple[str, ...] = table.REQUESTABLE

# Reference features kept for KID, precision/recall/density/coverage and per-client
# quality: a seeded subset (the full 60k x 2048 set would be ~0.5 GB even in
# float32), stored in its seeded random order with its dataset indices. KID draws
# subsets of 1000 from it; PRDC compares the N samples with its first N rows.
KID_REFERENCE_SAMPLES = 10_000
# Images per feature pass over a reference split (bounds host memory).
_REFERENCE_CHUNK = 4096
# Bump when the layout of the cached npz changes.
_CACHE_VERSION = 2  # v2: subset in seeded order + its indices, reference label counts
_CACHED_KEYS = ("mu", "sigma", "kid_features", "subset_indices", "label_counts", "num_samples")


def cache_dir() -> Path:
    """Where reference statistics are cached: $DFBENCH_CACHE, else ~/.cache/dfbench."""
    env = os.environ.get("DFBENCH_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dfbench"


def _load_dataset(dataset: str, split: str, root: str | Path | None) -> Any:
    # Imported here: `datasets` (the project package) is only needed for
    # reference statistics, not for comparing two folders.
    from dfbench import datasets

    return datasets.load(dataset, split, root=root)


def dataset_shape(dataset: str) -> tuple[int, int, int]:
    """[C, H, W] of a dataset's images, which generated samples must match (the datasets' own `data_info`, a
    ground-truth mixture's spec; data users bring, folder:PATH or hf:PATH, is read to answer)."""
    from dfbench import datasets

    if dataset in datasets.DATASETS or datasets.is_user_data(dataset) or datasets.is_mixture(dataset):
        return tuple(int(v) for v in datasets.data_info(dataset)["image_shape"])  # type: ignore[return-value]
    raise ValueError(f"unknown dataset {dataset!r}; choose one of {list(datasets.DATASETS)}, or folder:PATH / hf:PATH")


def _check_dataset(dataset: str) -> None:
    dataset_shape(dataset)


def _atomic_savez(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write an npz so that readers see either nothing or the complete file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            follow_umask(handle.fileno())  # mkstemp's 0o600 would make a shared cache unreadable to the group
            np.savez(handle, **arrays)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _reference_path(root: Path, dataset: str, split: str, dataset_sha: str, extractor: Extractor) -> Path:
    # the numerics (device type, GPU model) are in the key: a reference built on a GPU is never
    # mixed with samples scored on a CPU, nor one from another GPU model
    # data users bring is named by its kind ("folder", "hf"), not its path: its split's content digest keys it
    from dfbench.datasets import short_name

    name = (f"{short_name(dataset)}-{split}-{dataset_sha[:16]}-{extractor.name}-{extractor.sha256[:16]}-{extractor.numerics}"
            f"-v{_CACHE_VERSION}.npz")
    return root / "reference_stats" / name


def _compute_reference(
    images: torch.Tensor, extractor: Extractor, batch_size: int, progress: bool
) -> dict[str, np.ndarray]:
    count = images.shape[0]
    subset = np.random.default_rng(0).choice(count, min(count, KID_REFERENCE_SAMPLES), replace=False)
    keep = np.sort(subset)  # streamed in dataset order, stored in the seeded order below
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
    feats = np.concatenate(kid_rows)[np.searchsorted(keep, subset)]
    return {"mu": mu, "sigma": sigma, "kid_features": feats, "subset_indices": subset.astype(np.int64),
            "num_samples": np.array(count)}


class _Stopwatch:
    """Seconds this process spent building reference statistics (a one-time cost per dataset, split and extractor,
    cached afterwards): the evaluation subtracts it from a run's eval time and reports it apart."""

    def __init__(self) -> None:
        self.seconds = 0.0


REFERENCE_BUILD = _Stopwatch()


def reference_build_seconds() -> float:
    """The process's cumulative seconds spent building (not reading) reference statistics."""
    return REFERENCE_BUILD.seconds


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
    """Cached reference arrays: mu, sigma, kid_features (the seeded subset), subset_indices,
    label_counts (per class, of the split's labels), num_samples."""
    _check_dataset(dataset)
    data = _load_dataset(dataset, split, data_root)
    root = Path(cache_dir_) if cache_dir_ is not None else cache_dir()
    path = _reference_path(root, dataset, split, data.sha256, extractor)
    if path.is_file():
        with np.load(path, allow_pickle=False) as cached:
            # The file name holds hash prefixes; the full hashes inside decide.
            same = (str(cached["dataset_sha256"]) == data.sha256 and str(cached["extractor_sha256"]) == extractor.sha256
                    and "numerics" in cached.files and str(cached["numerics"]) == extractor.numerics)
            if same:
                return {key: cached[key] for key in _CACHED_KEYS}
    t0 = time.perf_counter()
    images = data.images
    if images.dtype != torch.uint8:  # a ground-truth mixture's float draws: quantized to pixels as its samples are
        from dfbench.datasets import to_pixels

        images = to_pixels(images)
    arrays = _compute_reference(images, extractor, batch_size, progress)
    REFERENCE_BUILD.seconds += time.perf_counter() - t0
    arrays["label_counts"] = np.bincount(np.asarray(data.labels, dtype=np.int64))
    _atomic_savez(
        path,
        {
            **arrays,
            "dataset_sha256": np.array(data.sha256),
            "extractor_sha256": np.array(extractor.sha256),
            "extractor": np.array(extractor.name),
            "numerics": np.array(extractor.numerics),
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
    the dataset's source sha256, the extractor name, its weights' sha256 and
    its numerics (device type and GPU model: `Extractor.numerics`);
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
        try:
            find_weights("inception", inception_weights)
        except MissingWeightsError:
            if inception_weights is not None:
                raise  # an explicit path that does not exist is an error, not a silent skip
            available = False
        else:
            available = True
        return table.auto_metrics(dataset, available)
    chosen = list(metrics)
    table.check_requested(chosen, dataset)
    return chosen


def _check_images(images: torch.Tensor, dataset: str) -> None:
    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8:
        raise TypeError(
            "images must be a uint8 torch.Tensor [N, C, H, W] with values 0..255; convert samples in "
            "[-1, 1] with ((x + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)"
        )
    expected = dataset_shape(dataset)
    if images.ndim != 4 or tuple(images.shape[1:]) != expected:
        raise ValueError(
            f"images for {dataset!r} must have shape [N, {', '.join(map(str, expected))}], got {tuple(images.shape)}"
        )
    if images.shape[0] < 2:
        raise ValueError(f"need at least 2 images for a covariance, got {images.shape[0]}")


@dataclass(frozen=True)
class ScoreOptions:
    """How samples are scored (what is scored is the metric list): where the reference and the weights
    are, the compute knobs and the intervals (`evaluate_samples(..., options=ScoreOptions(...))`)."""

    reference_split: str = "train"  # the split the samples are compared with
    data_root: str | Path | None = None  # where the dataset is (None: the datasets' default)
    cache_dir: str | Path | None = None  # where reference statistics are cached (None: `cache_dir()`)
    inception_weights: str | Path | None = None  # pytorch-fid's TF-Inception weights (None: looked up)
    clean_weights: str | Path | None = None  # clean-fid's Inception weights (None: looked up)
    dinov2_weights: str | Path | None = None  # DINOv2 ViT-L/14 weights (None: looked up; absent: fd_dinov2 left out)
    device: str = "cpu"
    batch_size: int = 256  # images per feature batch
    kid_subsets: int = 100
    kid_subset_size: int = 1000
    bootstrap: int | None = None  # Frechet interval replicates: None = 200 up to 512-d features, 100 above; 0 = none
    seed: int = 0  # seeds the bootstrap intervals
    progress: bool = False

    def __post_init__(self) -> None:
        if self.bootstrap is not None and (self.bootstrap < 0 or self.bootstrap == 1):
            raise ValueError(f"bootstrap must be 0 (no interval), >= 2 replicates, or None (default), got {self.bootstrap}")


@dataclass(frozen=True)
class ClientSplit:
    """The clients' training data, for per-client quality: each client's indices into the training
    split, the group (e.g. expert) of each client, and how many images that split has (checked against
    the reference, so indices never point into another image set)."""

    indices: Sequence[np.ndarray]
    group_of_client: np.ndarray | None = None
    split_size: int | None = None

    def __post_init__(self) -> None:
        if self.group_of_client is not None and len(self.group_of_client) != len(self.indices):
            raise ValueError(f"group_of_client has {len(self.group_of_client)} entries for {len(self.indices)} clients")


def evaluate_images(images: torch.Tensor, dataset: str, *, metrics: Sequence[str] | Literal["auto"] = "auto",
                    options: ScoreOptions | None = None) -> list[dict[str, Any]]:
    """Score uint8 samples [N, C, H, W] of `dataset` against its reference split (`ScoreOptions`).

    metrics: "auto" = ["fd_fmnist", "fd_fmnist_ae", "kid_fmnist", "kid_fmnist_ae"]
    for fmnist (its two committed networks), plus ["fid", "kid"] when the
    Inception weights are found; ["fid", "kid"] for svhn / cifar10 (raises
    `MissingWeightsError` without the weights). Explicit metrics whose weights
    are missing raise before any feature is computed, except fd_dinov2 (a file
    only the user supplies), which is left out (`evaluate_samples` says why). Returns one dict per
    metric, in the order requested, each with its interval (ci_low, ci_high,
    ci_level, ci_method, ci_replicates): Frechet distances the value -+ half the central range of a
    bootstrap over the samples (`uncertainty`, "centred": it holds the value) with `options.bootstrap`
    replicates, seeded by `options.seed`; KID a normal interval clipped at 0 (`kid_interval`).
    """
    rows, _ = evaluate_samples(images, dataset, metrics=metrics, options=options, quality=False)
    return rows


def kid_interval(value: float, std_err: float, subsets: int) -> dict[str, Any]:
    """The interval fields of a KID row: the normal interval from the spread of the subset estimates, clipped
    at 0 (KID, an MMD^2, is >= 0 though its unbiased estimate can fall below; a value below 0 then lies
    outside its interval, which is for the true KID)."""
    low = value - 1.96 * std_err
    return {"ci_low": max(0.0, low), "ci_high": max(0.0, value + 1.96 * std_err), "ci_level": 0.95,
            "ci_method": "95% normal interval from the spread of KID subset estimates"
                         + (", clipped at 0 (KID >= 0)" if low < 0 else ""),
            "ci_replicates": subsets}

def _drop_optional(chosen: list[str], given: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(`chosen` without the metrics of an optional extractor whose weights are not found, a note for each
    extractor left out). The user's own file (`table.OPTIONAL_EXTRACTORS`): a run without it is scored on
    everything else, and `dfbench eval` adds the missing metric once the file is in place. A path given
    explicitly that does not exist is an error, as for the Inception weights."""
    notes: list[str] = []
    kept = list(chosen)
    for name in table.OPTIONAL_EXTRACTORS:
        wanted = [m for m in kept if table.extractor_of(m) == name]
        if not wanted:
            continue
        try:
            find_weights(name, given.get(name))  # type: ignore[arg-type]
        except MissingWeightsError as err:
            if given.get(name) is not None:
                raise
            spec = err.spec
            looked = ", ".join(str(path) for path, _ in err.searched)
            notes.append(f"{', '.join(wanted)} not computed: {spec.description} ({spec.file_name}) not found "
                         f"(looked in {looked}); nothing was downloaded. Get it from {spec.url}, put it in one "
                         f"of those places or set {spec.env_var}, then `dfbench eval RUN_DIR` adds "
                         f"{', '.join(wanted)}.")
            kept = [m for m in kept if m not in wanted]
    return kept, notes


@exact_float32()  # TF32 off for the features and every matrix product of the scores (GPU)
def evaluate_samples(images: torch.Tensor, dataset: str, *, metrics: Sequence[str] | Literal["auto"] = "auto",
                     options: ScoreOptions | None = None, quality: bool = True,
                     clients: ClientSplit | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """`evaluate_images` plus, with `quality`, the rows that say *why* a score is what it is.

    Per extractor: precision / recall / density / coverage (``precision_<extractor>``, ...;
    `benchmark.metrics.prdc`) of the samples against as many rows of the cached reference subset;
    mode coverage (``class_tv``, ``low_classes``; `benchmark.metrics.coverage`) when the dataset has
    a classifier; per-client quality (``client_<fd>_mean`` / ``_worst``, and
    ``expert_<fd>_worst`` -- the worst group of clients -- given `clients.group_of_client`;
    `benchmark.metrics.client_quality`) given the clients' training-split indices (`ClientSplit`).
    Returns (rows, notes): a metric that cannot be computed is left out and a note says why.

    How it scores is `options` (`ScoreOptions`, default: its defaults).
    """
    from dfbench.benchmark.metrics.client_quality import client_quality_rows
    from dfbench.benchmark.metrics.coverage import mode_coverage_rows
    from dfbench.benchmark.metrics.prdc import prdc
    from dfbench.benchmark.core.seeds import derive_seed
    from dfbench.benchmark.metrics.uncertainty import FrechetReference, default_replicates

    opts = options or ScoreOptions()
    reference_split, device, batch_size, seed, progress = opts.reference_split, opts.device, opts.batch_size, opts.seed, opts.progress
    _check_dataset(dataset)
    _check_images(images, dataset)
    chosen = _resolve_metrics(metrics, dataset, opts.inception_weights)

    # Fail on missing weights before any (slow) feature work.
    given = {"inception": opts.inception_weights, "clean": opts.clean_weights, "dinov2": opts.dinov2_weights}
    chosen, notes = _drop_optional(chosen, given)
    needed = list(dict.fromkeys(str(table.extractor_of(m)) for m in chosen))
    # third-party weights are looked up; the committed Fashion-MNIST networks are checked by get_extractor
    paths = {name: find_weights(name, given[name]) for name in needed if name in given}  # type: ignore[arg-type]
    extractors = {name: get_extractor(name, weights=paths.get(name), device=device) for name in needed}  # type: ignore[arg-type]

    reference = f"{dataset}/{reference_split}"
    count = int(images.shape[0])
    rows: dict[str, dict[str, Any]] = {}
    extra: list[dict[str, Any]] = []
    label_counts = None
    for name, extractor in extractors.items():
        feats = extractor.features(images, batch_size=batch_size, device=device, progress=progress)
        ref = _reference(
            dataset, reference_split, extractor,
            data_root=opts.data_root, cache_dir_=opts.cache_dir, batch_size=batch_size, progress=progress,
        )
        label_counts = ref["label_counts"]
        common = {"extractor": extractor.name, "extractor_sha256": extractor.sha256, "backend": extractor.backend,
                  "resize": extractor.resize, "num_samples": count, "reference": reference}
        for metric in (m for m in chosen if table.extractor_of(m) == name):
            interval = None
            if table.METRICS[metric].kind == "kid":  # in this extractor's space, against the cached reference subset
                value, std_err = kid(
                    feats, ref["kid_features"], num_subsets=opts.kid_subsets, subset_size=opts.kid_subset_size, seed=0
                )
                std_err = None if np.isnan(std_err) else float(std_err)
                if std_err is not None:
                    interval = kid_interval(value, std_err, opts.kid_subsets)
            else:
                value = frechet_distance(feats.mean(axis=0), np.cov(feats, rowvar=False), ref["mu"], ref["sigma"])
                std_err = None
                replicates = default_replicates(extractor.dims) if opts.bootstrap is None else opts.bootstrap
                if replicates:
                    fd_ref = FrechetReference(ref["mu"], ref["sigma"], device=device)  # sqrt(Sigma_ref) once
                    _, ci, _ = fd_ref.bootstrap(feats, replicates=replicates, seed=derive_seed(seed, "bootstrap", metric))
                    interval = ci.as_row()
            rows[metric] = {"metric": metric, "value": float(value), "std_err": std_err, **(interval or {}), **common}
        if not quality:
            continue
        size = min(count, ref["kid_features"].shape[0])
        if size <= 3:
            notes.append(f"precision/recall/density/coverage ({name}): need more than 3 samples, got {size}")
        else:
            # equal set sizes, as in Kynkaanniemi et al. and Naeem et al.: k-NN radii depend on set size
            scores = prdc(ref["kid_features"][:size], feats[:size])
            named = {table.prdc_metric(key, name): value for key, value in scores.items()}
            extra += [{"metric": metric, "value": value, "better": table.better(metric), "prdc_k": 3,
                       "prdc_reference_rows": size, **common, "num_samples": size} for metric, value in named.items()]
        if clients is None:
            continue
        client_names = table.client_metric_names(table.frechet_metric(name))
        needs = table.reference_split_of(client_names[0], reference_split)
        if needs != reference_split:
            notes.append(f"per-client quality: needs eval.reference_split={needs} (the clients' split), got {reference_split!r}")
            continue
        if clients.split_size is not None and clients.split_size != int(ref["num_samples"]):
            notes.append(f"per-client quality: the clients' data ({clients.split_size} images) is not the "
                         f"{reference} split ({int(ref['num_samples'])} images)")
            continue
        client_rows, why = client_quality_rows(
            table.frechet_metric(name), feats, ref["kid_features"], ref["subset_indices"], clients.indices,
            clients.group_of_client,
        )
        extra += [{**row, **common} for row in client_rows]
        notes += [why] if why else []
    if quality and label_counts is not None:
        coverage_rows, why = mode_coverage_rows(
            images, dataset, label_counts, device=device, seed=derive_seed(seed, "bootstrap", "class_tv"),
            replicates=200,
        )
        extra += [{**row, "reference": reference} for row in coverage_rows]
        notes += [why] if why else []
    return [rows[m] for m in chosen] + extra, list(dict.fromkeys(notes))
