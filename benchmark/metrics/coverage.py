"""Mode coverage on labelled data: which classes do the samples fall into?

A pinned classifier labels every generated sample; the class histogram is
compared with the reference split's label distribution:

- ``class_tv``: total-variation distance 1/2 sum_c |p_c - q_c| (0 = same class
  mix, 1 = disjoint), with a bootstrap interval over the samples;
- ``low_classes``: the number of classes c with p_c < q_c / 4, i.e. that get
  less than a quarter of their share -- the classes label skew or pruning lost.

The classifiers live in one table, `CLASSIFIERS` (dataset -> builder); a
classifier for another dataset is added there and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dfbench.benchmark.metrics import table
from dfbench.benchmark.metrics.uncertainty import BootstrapMethod, bootstrap_statistic

__all__ = ["CLASSIFIERS", "LOW_SHARE", "LabelClassifier", "get_classifier", "mode_coverage", "mode_coverage_rows"]

# A class is "low" when it gets less than this fraction of its reference share.
LOW_SHARE = 0.25


@dataclass(frozen=True)
class LabelClassifier:
    """A hash-pinned image classifier for one dataset: uint8 [N, C, H, W] -> class labels [N]."""

    dataset: str
    name: str
    sha256: str
    num_classes: int
    predict: Callable[[torch.Tensor], np.ndarray]


def _fmnist_classifier(device: str) -> LabelClassifier:
    # the same committed, sha256-pinned network whose penultimate layer gives fd_fmnist
    from dfbench.benchmark.metrics.features import get_extractor

    extractor = get_extractor("fmnist", device=device)
    net = extractor.network.classifier  # type: ignore[attr-defined]

    def predict(images: torch.Tensor, batch_size: int = 1024) -> np.ndarray:
        out = []
        with torch.inference_mode():
            for start in range(0, images.shape[0], batch_size):
                batch = extractor.prepare(images[start:start + batch_size]).to(device)
                out.append(net(batch).argmax(dim=1).cpu().numpy())
        return np.concatenate(out).astype(np.int64)

    return LabelClassifier("fmnist", "fmnist", extractor.sha256, 10, predict)


# dataset -> builder(device). Add a dataset's classifier here (and only here).
CLASSIFIERS: dict[str, Callable[[str], LabelClassifier]] = {"fmnist": _fmnist_classifier}


def get_classifier(dataset: str, device: str = "cpu") -> LabelClassifier | None:
    """The dataset's pinned classifier, or None when none is registered (mode coverage is then absent)."""
    builder = CLASSIFIERS.get(dataset)
    return builder(device) if builder is not None else None


def _tv(labels: np.ndarray, q: np.ndarray) -> float:
    p = np.bincount(labels, minlength=q.size) / labels.size
    return float(0.5 * np.abs(p - q).sum())


def mode_coverage(
    labels: np.ndarray,
    reference_counts: np.ndarray,
    *,
    replicates: int = 200,
    seed: int = 0,
    level: float = 0.95,
    method: BootstrapMethod = "basic",
) -> dict[str, Any]:
    """Class histogram of predicted `labels`, TV distance to the reference distribution
    (with a bootstrap interval over the samples) and the classes below a quarter of their share."""
    labels = np.asarray(labels)
    counts = np.asarray(reference_counts, dtype=np.float64)
    if counts.ndim != 1 or counts.size < 2 or (counts < 0).any() or counts.sum() <= 0:
        raise ValueError(f"reference_counts must be non-negative per-class counts with a positive sum, got {counts}")
    if labels.ndim != 1 or labels.size < 2 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be a 1-d integer array of >= 2 predicted classes, got {labels.dtype} {labels.shape}")
    if labels.min() < 0 or labels.max() >= counts.size:
        raise ValueError(f"labels must lie in 0..{counts.size - 1} (the reference's classes), got {labels.min()}..{labels.max()}")
    q = counts / counts.sum()
    hist = np.bincount(labels, minlength=q.size)
    p = hist / labels.size
    tv, interval = bootstrap_statistic(labels, lambda rows: _tv(rows, q), replicates=replicates, seed=seed,
                                       level=level, method=method)
    low = [int(c) for c in np.flatnonzero(p < LOW_SHARE * q)]
    return {"histogram": hist.tolist(), "reference_distribution": q.tolist(), "tv": tv, "tv_interval": interval,
            "low_classes": low}


def mode_coverage_rows(
    images: torch.Tensor,
    dataset: str,
    reference_counts: np.ndarray,
    *,
    device: str = "cpu",
    seed: int = 0,
    replicates: int = 200,
) -> tuple[list[dict[str, Any]], str | None]:
    """Metric rows ``class_tv`` and ``low_classes`` for uint8 samples, or ([], why not)."""
    classifier = get_classifier(dataset, device)
    if classifier is None:
        return [], f"mode coverage: no classifier for dataset {dataset!r} (benchmark/metrics/coverage.py CLASSIFIERS)"
    result = mode_coverage(classifier.predict(images), reference_counts, replicates=replicates, seed=seed)
    common = {"extractor": classifier.name, "classifier": classifier.name, "classifier_sha256": classifier.sha256,
              "histogram": result["histogram"], "reference_distribution": result["reference_distribution"],
              "num_samples": int(images.shape[0])}
    tv_row = {"metric": "class_tv", "value": result["tv"], **result["tv_interval"].as_row(), **common,
              "better": table.better("class_tv")}
    low_row = {"metric": "low_classes", "value": len(result["low_classes"]), "classes": result["low_classes"],
               "low_share": LOW_SHARE, **common, "better": table.better("low_classes")}
    return [tv_row, low_row], None
