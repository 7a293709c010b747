"""Metric calibration: every Fashion-MNIST metric on graded degradations of real images (issue 41 item 1).

    python results/metric-calibration/calibration.py --out results/metric-calibration [--n 1000] [--seed 0]

A seeded subset of N real Fashion-MNIST *test* images is scored against the train split (as a
run's samples are) clean and under families of graded degradation -- pixel noise, blur, contrast,
brightness, resolution, shifts, garbage images, dropped classes, lost diversity -- each a pure,
seeded function whose grade 0 is the identity. Every metric `evaluate_samples` reports for
Fashion-MNIST (``eval.metrics=auto`` with ``quality``) is recorded at every grade with its
interval where its row has one. `EXPECTED` declares, per metric role and family, whether the
metric must get worse with the grade ("worse") or need not move ("any"), with the reason.

Per (metric, family) the summary gives Spearman's rho of the metric's *badness* (its value signed
so that larger is worse) against the grade, whether it is strictly monotone, whether it is
monotone within its interval (no step to a better value whose interval is disjoint from the
previous grade's; without an interval, no step to a better value at all), from which grade on it
is worse than the clean set beyond the clean set's interval, and the verdict. A "worse" metric
passes when, on every replicate subset, (1) rho >= `RHO_MIN` (the grades' order recovered up to
one swap of neighbours), (2) where its row has an interval, no step goes back beyond it (rows
without one -- precision/recall/density/coverage, low_classes -- have only rule 1 against noise),
and (3) its strongest grade is worse than clean beyond the clean set's interval. An "any" metric
is "not-required" (its rho is still reported).

Outputs (`write_study`): calibration.csv, run.json (machine, wall time), summary.csv,
family_<name>.png per family, samples.png, README.md (generated blocks between
``<!-- generated:NAME -->`` markers; the text outside them is kept on a rerun). ``--from-csv``
re-renders everything but calibration.csv from it (`rerender`).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import re
import subprocess
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from dfbench.benchmark.api import derive_seed
from dfbench.benchmark.api import metric_table as table

__all__ = [
    "DATASET", "EXPECTED", "FAMILIES", "Family", "N_IMAGES", "REPLICATES", "RHO_MIN", "RealSet", "SEED", "add_noise",
    "blur", "brighten", "declared", "drop_classes_indices", "families", "fill_readme", "grade_stats", "keep_distinct",
    "main", "measure", "plot_family", "plot_samples", "real_set", "reduce_contrast", "render", "replace_with_garbage",
    "rerender", "resample", "role_of", "shift", "summarize", "write_study",
]

DATASET = "fmnist"
N_IMAGES = 1000  # real test images per replicate (the size of a run's evaluation at eval.samples=1000)
SEED = 0  # the study's seed: subsets, degradations and every metric's bootstrap derive from it
REPLICATES = 2  # independently seeded test subsets; a verdict must hold on each
RHO_MIN = 0.8  # 6 grades: one swap of neighbours gives 0.94, of next-but-one 0.77; 4 grades: one swap gives 0.8
Direction = Literal["worse", "any"]


# -- the degradations: pure, seeded functions of uint8 images [N, C, H, W]; level 0 is the identity --------

def _to_uint8(x: torch.Tensor) -> torch.Tensor:
    return x.round().clamp(0, 255).to(torch.uint8)


def add_noise(images: torch.Tensor, sigma: float, seed: int) -> torch.Tensor:
    """Additive Gaussian noise of std `sigma` in 8-bit units, rounded and clipped to 0..255.
    One noise draw per seed: every sigma scales the same draw, so grades differ only in size."""
    if sigma == 0:
        return images.clone()
    g = torch.Generator().manual_seed(seed)
    return _to_uint8(images.double() + sigma * torch.randn(images.shape, generator=g, dtype=torch.float64))


def blur(images: torch.Tensor, sigma: float, seed: int = 0) -> torch.Tensor:
    """Separable Gaussian blur of std `sigma` pixels (kernel radius ceil(3 sigma), reflected edges)."""
    del seed  # deterministic
    if sigma == 0:
        return images.clone()
    radius = max(1, math.ceil(3 * sigma))
    x = torch.arange(-radius, radius + 1, dtype=torch.float64)
    kernel = torch.exp(-x * x / (2 * sigma * sigma))
    kernel = kernel / kernel.sum()
    c = images.shape[1]
    img = F.pad(images.double(), (radius, radius, radius, radius), mode="reflect")
    img = F.conv2d(img, kernel.view(1, 1, 1, -1).repeat(c, 1, 1, 1), groups=c)
    img = F.conv2d(img, kernel.view(1, 1, -1, 1).repeat(c, 1, 1, 1), groups=c)
    return _to_uint8(img)


def reduce_contrast(images: torch.Tensor, amount: float, seed: int = 0) -> torch.Tensor:
    """Each pixel pulled toward its image's mean: m + (1 - amount)(x - m) (amount 1: a flat image)."""
    del seed
    if amount == 0:
        return images.clone()
    x = images.double()
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    return _to_uint8(mean + (1.0 - amount) * (x - mean))


def brighten(images: torch.Tensor, offset: float, seed: int = 0) -> torch.Tensor:
    """`offset` added to every pixel, saturating at 255 (the black background turns grey)."""
    del seed
    if offset == 0:
        return images.clone()
    return _to_uint8(images.double() + offset)


def resample(images: torch.Tensor, side: int, seed: int = 0) -> torch.Tensor:
    """Down-sampled to side x side (bilinear, antialiased) and back up to the original size (bilinear)."""
    del seed
    size = tuple(images.shape[2:])
    if (int(side), int(side)) == size:
        return images.clone()
    small = F.interpolate(images.double(), size=(int(side), int(side)), mode="bilinear", antialias=True,
                          align_corners=False)
    return _to_uint8(F.interpolate(small, size=size, mode="bilinear", align_corners=False))


def shift(images: torch.Tensor, pixels: int, seed: int) -> torch.Tensor:
    """Each image moved `pixels` along one of the four axis directions (seeded per image); zero fill
    (Fashion-MNIST's background is 0)."""
    s = int(pixels)
    if s == 0:
        return images.clone()
    direction = torch.from_numpy(np.random.default_rng(seed).integers(0, 4, images.shape[0]))
    out = torch.zeros_like(images)
    h, w = images.shape[2:]
    for d, (dy, dx) in enumerate(((0, s), (0, -s), (s, 0), (-s, 0))):
        sel = direction == d
        src = images[sel]
        out[sel, :, max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = \
            src[:, :, max(-dy, 0):h + min(-dy, 0), max(-dx, 0):w + min(-dx, 0)]
    return out


def replace_with_garbage(images: torch.Tensor, fraction: float, seed: int) -> torch.Tensor:
    """round(fraction * N) seeded images replaced by uniform-noise images (each pixel 0..255).
    Nested across fractions: a larger fraction replaces the same images and more."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(images.shape[0])  # drawn first, so the draws do not depend on the fraction
    garbage = torch.from_numpy(rng.integers(0, 256, size=tuple(images.shape), dtype=np.uint8))
    out = images.clone()
    idx = torch.from_numpy(order[:round(fraction * images.shape[0])])
    out[idx] = garbage[idx]
    return out


def keep_distinct(images: torch.Tensor, count: int, seed: int = 0) -> torch.Tensor:
    """The same N images made of copies of the first `count` ones (image i becomes image i mod count):
    a memorizing model's samples. count = N is the identity."""
    del seed
    count = int(count)
    if not 1 <= count <= images.shape[0]:
        raise ValueError(f"count must be in 1..{images.shape[0]}, got {count}")
    return images[torch.arange(images.shape[0]) % count]


@dataclass(frozen=True)
class RealSet:
    """A seeded subset of a labelled split: `images` are the first n of the seeded `order` of `pool`."""

    pool: torch.Tensor  # uint8 [M, C, H, W]
    labels: np.ndarray  # int64 [M]
    order: np.ndarray  # a seeded permutation of range(M)
    n: int

    @property
    def images(self) -> torch.Tensor:
        return self.pool[torch.from_numpy(self.order[:self.n])]


def real_set(pool: torch.Tensor, labels: np.ndarray | torch.Tensor, n: int, seed: int) -> RealSet:
    """The first `n` images of a seeded permutation of the pool."""
    labels = np.asarray(labels, dtype=np.int64)
    if not 2 <= n <= pool.shape[0]:
        raise ValueError(f"n must be in 2..{pool.shape[0]}, got {n}")
    return RealSet(pool, labels, np.random.default_rng(seed).permutation(pool.shape[0]), n)


def drop_classes_indices(labels: np.ndarray, order: np.ndarray, n: int, kept: int, seed: int) -> np.ndarray:
    """Pool indices of n images of only `kept` classes: the first `kept` classes of a seeded class
    order, the images taken in the pool's seeded `order` (so kept = every class gives order[:n],
    the clean subset, and fewer classes keep the clean set's images of those classes first)."""
    num_classes = int(labels.max()) + 1
    if not 1 <= kept <= num_classes:
        raise ValueError(f"kept must be in 1..{num_classes}, got {kept}")
    classes = np.random.default_rng(seed).permutation(num_classes)[:int(kept)]
    chosen = order[np.isin(labels[order], classes)][:n]
    if chosen.size < n:
        raise ValueError(f"the pool holds {chosen.size} images of {int(kept)} classes, fewer than n={n}")
    return chosen


# -- the families ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Family:
    """A graded degradation: `levels` from 0 (the identity) to the strongest; `degrade(real, level, seed)`."""

    name: str
    what: str  # what a grade does, one line
    unit: str  # what a level is
    levels: tuple[float, ...]
    degrade: Callable[[RealSet, float, int], torch.Tensor]


def _on_images(fn: Callable[[torch.Tensor, Any, int], torch.Tensor]) -> Callable[[RealSet, float, int], torch.Tensor]:
    def degrade(real: RealSet, level: float, seed: int) -> torch.Tensor:
        return fn(real.images, level, seed)
    return degrade


def _classes(real: RealSet, kept: float, seed: int) -> torch.Tensor:
    return real.pool[torch.from_numpy(drop_classes_indices(real.labels, real.order, real.n, int(kept), seed))]


def families(n: int = N_IMAGES) -> tuple[Family, ...]:
    """The study's families at n images (only "diversity" depends on n: its levels are image counts)."""
    distinct = tuple(dict.fromkeys(max(1, round(f * n)) for f in (1.0, 0.5, 0.2, 0.1, 0.03, 0.01)))
    return (
        Family("noise", "additive Gaussian pixel noise, rounded and clipped", "σ (of 255)",
               (0, 4, 8, 16, 32, 64), _on_images(add_noise)),
        Family("blur", "Gaussian blur", "σ (pixels)", (0, 0.5, 0.75, 1.0, 1.5, 2.0), _on_images(blur)),
        Family("contrast", "contrast pulled toward each image's mean", "fraction removed",
               (0, 0.1, 0.25, 0.5, 0.75, 0.9), _on_images(reduce_contrast)),
        Family("brightness", "a constant added to every pixel (saturating at 255)", "offset (of 255)",
               (0, 8, 16, 32, 64, 128), _on_images(brighten)),
        Family("resolution", "down-sampled (bilinear, antialiased) and up-sampled back to 28 x 28", "side (pixels)",
               (28, 24, 20, 14, 10, 7), _on_images(resample)),
        Family("shift", "each image moved along a random axis direction, zero fill", "pixels",
               (0, 1, 2, 3, 4, 6), _on_images(shift)),
        Family("garbage", "a fraction of the set replaced by uniform-noise images", "fraction",
               (0, 0.02, 0.05, 0.1, 0.2, 0.5), _on_images(replace_with_garbage)),
        Family("classes", "the same N images drawn from fewer classes (mode dropping; test-split labels)",
               "classes kept", (10, 8, 6, 4, 2, 1), _classes),
        Family("diversity", "the same N images made of copies of fewer distinct images (memorization)",
               "distinct images", distinct, _on_images(keep_distinct)),
    )


FAMILIES: tuple[str, ...] = tuple(f.name for f in families())
_PIXEL = ("noise", "blur", "contrast", "brightness", "resolution", "shift")


# -- what each metric should do: (role, family) -> (direction, reason) -------------------------------------

def _declare() -> dict[tuple[str, str], tuple[Direction, str]]:
    out: dict[tuple[str, str], tuple[Direction, str]] = {}
    for fam in _PIXEL:
        out["distance", fam] = ("worse", "the samples' feature distribution leaves the reference's")
        out["precision", fam] = ("worse", "fidelity (Kynkäänniemi et al. 2019): degraded samples leave the real k-NN balls")
        out["recall", fam] = ("any", "diversity only: degraded samples' own k-NN balls may still hold real points")
        out["density", fam] = ("worse", "fidelity (Naeem et al. 2020): degraded samples sit in fewer real k-NN balls")
        out["coverage", fam] = ("worse", "a real point counts only if a sample lies in its own k-NN ball; degraded ones do not")
        out["class_tv", fam] = ("any", "label mix only: a degraded garment may keep its predicted class")
        out["low_classes", fam] = ("any", "label mix only: a degraded garment may keep its predicted class")
    out.update({
        ("distance", "garbage"): ("worse", "outliers move the mean and inflate the covariance"),
        ("precision", "garbage"): ("worse", "the garbage fraction lies outside every real ball"),
        ("recall", "garbage"): ("any", "the remaining real images still cover the reals; outliers' wide balls may add recall"),
        ("density", "garbage"): ("worse", "garbage samples lie in no real ball"),
        ("coverage", "garbage"): ("worse", "fewer real samples cover fewer real balls"),
        ("class_tv", "garbage"): ("any", "garbage lands on whatever classes the classifier picks"),
        ("low_classes", "garbage"): ("any", "garbage lands on whatever classes the classifier picks"),
        ("distance", "classes"): ("worse", "the mean moves to the kept classes' and the covariance narrows"),
        ("precision", "classes"): ("any", "images of the kept classes are still real images (Kynkäänniemi et al.)"),
        ("recall", "classes"): ("worse", "the dropped classes' real images are covered by no sample"),
        ("density", "classes"): ("any", "samples of the kept classes can sit in as many real balls, or more"),
        ("coverage", "classes"): ("worse", "the dropped classes' real balls hold no sample (Naeem et al.)"),
        ("class_tv", "classes"): ("worse", "the label histogram loses the dropped classes' share"),
        ("low_classes", "classes"): ("worse", "each dropped class is a class below a quarter of its share"),
        ("distance", "diversity"): ("worse", "copies shrink the covariance toward rank m"),
        ("precision", "diversity"): ("any", "copies of real images are real images"),
        ("recall", "diversity"): ("worse", "m distinct samples cover fewer real points; a copy's k-NN radius falls to 0"),
        ("density", "diversity"): ("any", "copies of real images sit in as many real balls as the originals"),
        ("coverage", "diversity"): ("worse", "m distinct samples lie in at most m real neighbourhoods (Naeem et al.)"),
        ("class_tv", "diversity"): ("worse", "few distinct images carry few labels: the histogram drifts from uniform"),
        ("low_classes", "diversity"): ("worse", "few distinct images leave classes without a sample"),
    })
    return out


# Every row of it is (direction, one-line reason); a metric is found by its role (`role_of`).
EXPECTED: dict[tuple[str, str], tuple[Direction, str]] = _declare()


def role_of(metric: str) -> str:
    """The declaration role of a metric row name: "distance" (every Frechet distance and KID),
    precision / recall / density / coverage (any extractor), class_tv, low_classes."""
    m = table.get(metric)
    if m is None:
        raise KeyError(f"{metric!r} is not in benchmark/metrics/table.py")
    if m.kind in ("frechet", "kid"):
        return "distance"
    if m.kind == "prdc":
        return metric.split("_")[0]
    if m.kind == "coverage":
        return metric
    raise KeyError(f"{metric!r} ({m.kind}) has no calibration role: declare it in calibration.EXPECTED")


def declared(metric: str, family: str) -> tuple[Direction, str]:
    """(direction, reason) declared for a metric on a family; KeyError names what to declare."""
    key = (role_of(metric), family)
    if key not in EXPECTED:
        raise KeyError(f"no declaration for role {key[0]!r} on family {family!r}: add it to calibration.EXPECTED")
    return EXPECTED[key]


# -- measuring ---------------------------------------------------------------------------------------------

def _score(images: torch.Tensor, seed: int, metrics: Sequence[str] | None, quality: bool) -> list[dict[str, Any]]:
    from dfbench.benchmark.api import ScoreOptions, evaluate_samples

    chosen = list(metrics) if metrics is not None else table.auto_metrics(DATASET, False)
    rows, notes = evaluate_samples(images, DATASET, metrics=chosen, options=ScoreOptions(seed=seed), quality=quality)
    if notes:
        raise RuntimeError(f"metrics left out: {notes}")
    return [{"metric": r["metric"], "value": float(r["value"]),
             "ci_low": float(r["ci_low"]) if r.get("ci_low") is not None else math.nan,
             "ci_high": float(r["ci_high"]) if r.get("ci_high") is not None else math.nan} for r in rows]


def _grade_value(level: float) -> float | int:
    return int(level) if float(level).is_integer() else float(level)


def measure(
    fams: Sequence[Family],
    *,
    n: int = N_IMAGES,
    seed: int = SEED,
    replicates: int = 1,
    metrics: Sequence[str] | None = None,
    quality: bool = True,
    data: tuple[torch.Tensor, np.ndarray] | None = None,
    log: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """Score every grade of every family on `replicates` seeded test subsets of n images.

    metrics: None = eval.metrics=auto for Fashion-MNIST without Inception (every metric the suite
    reports for it); `quality` adds precision/recall/density/coverage and the label rows. data:
    (images, labels) of the pool; None = the Fashion-MNIST test split. Every evaluation uses the
    study seed, so bootstrap draws are shared across grades. Returns one row per (replicate, family,
    grade, metric): grade_value, better, value, ci_low, ci_high (NaN where the row has no interval).
    """
    if data is None:
        from dfbench import datasets

        split = datasets.load(DATASET, "test")
        data = (split.images, split.labels.numpy())
    pool, labels = data
    rows: list[dict[str, Any]] = []
    for rep in range(replicates):
        real = real_set(pool, labels, n, derive_seed(seed, "subset", rep))
        clean = real.images
        clean_scores = _score(clean, seed, metrics, quality)
        for fam in fams:
            for grade, level in enumerate(fam.levels):
                images = fam.degrade(real, level, derive_seed(seed, "degrade", fam.name, rep))
                if grade == 0:
                    if not torch.equal(images, clean):
                        raise AssertionError(f"grade 0 of {fam.name} is not the identity")
                    scores = clean_scores
                else:
                    t0 = time.perf_counter()
                    scores = _score(images, seed, metrics, quality)
                    if log:
                        log(f"replicate {rep} {fam.name} grade {grade} ({_grade_value(level)}): "
                            f"{time.perf_counter() - t0:.1f} s")
                rows += [{"replicate": rep, "family": fam.name, "grade": grade, "grade_value": _grade_value(level),
                          "metric": s["metric"], "better": table.better(s["metric"]), "value": s["value"],
                          "ci_low": s["ci_low"], "ci_high": s["ci_high"]} for s in scores]
    return pd.DataFrame(rows)


# -- judging ----------------------------------------------------------------------------------------------

def grade_stats(values: Sequence[float], lows: Sequence[float], highs: Sequence[float],
                better: str) -> dict[str, Any]:
    """How one metric moves over the grades (index 0 = clean), on its badness (value signed so up = worse).

    rho: Spearman's rho of badness vs grade (NaN when constant); monotone: strictly worse at every
    step; monotone_ci: no step to a better value unless the two grades' intervals overlap (rows
    without an interval: no step to a better value at all); reversals: the grades stepped back to;
    detected_from: the first grade from which every grade is worse than the clean one beyond its
    interval (rows without one: worse at all), or None; improved: the grades better than the clean one
    beyond its interval; interval: every grade has one; passes: the verdict's three rules (module docstring).
    """
    from scipy.stats import spearmanr

    sign = 1.0 if better == "lower" else -1.0
    v = sign * np.asarray(values, dtype=np.float64)
    lo_hi = sign * np.asarray([lows, highs], dtype=np.float64)
    lo, hi = lo_hi.min(axis=0), lo_hi.max(axis=0)
    has_ci = np.isfinite(lo) & np.isfinite(hi)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a constant series: rho is NaN, said so below
        rho = float(spearmanr(np.arange(v.size), v).statistic) if np.ptp(v) > 0 else math.nan
    reversals = []
    for g in range(1, v.size):
        if v[g] < v[g - 1]:
            overlap = has_ci[g] and has_ci[g - 1] and lo[g] <= hi[g - 1] and lo[g - 1] <= hi[g]
            if not overlap:
                reversals.append(g)
    detected = [bool(lo[g] > hi[0]) if has_ci[g] and has_ci[0] else bool(v[g] > v[0]) for g in range(v.size)]
    improved = [g for g in range(1, v.size) if (hi[g] < lo[0] if has_ci[g] and has_ci[0] else v[g] < v[0])]
    detected_from = None
    for g in range(v.size - 1, 0, -1):
        if not detected[g]:
            break
        detected_from = g
    interval = bool(has_ci.all())
    passes = (not math.isnan(rho) and rho >= RHO_MIN - 1e-9 and not (interval and reversals)
              and detected_from is not None)
    return {"rho": rho, "monotone": bool(np.all(np.diff(v) > 0)), "monotone_ci": not reversals,
            "reversals": reversals, "detected_from": detected_from, "improved": improved, "interval": interval,
            "passes": passes}


def _why(stats: dict[str, Any], levels: Sequence[Any]) -> str:
    """Why a "worse" metric fails, in words (empty when it passes)."""
    why = []
    if math.isnan(stats["rho"]) or stats["rho"] < RHO_MIN - 1e-9:
        why.append("constant" if math.isnan(stats["rho"]) else f"rho {stats['rho']:.2f} < {RHO_MIN}")
    if stats["interval"] and stats["reversals"]:
        why.append("better again at " + ", ".join(_format_level(levels[g]) for g in stats["reversals"])
                   + " beyond its interval")
    if stats["improved"]:
        why.append("better than clean at " + ", ".join(_format_level(levels[g]) for g in stats["improved"]))
    if stats["detected_from"] is None:
        why.append("strongest grade not worse than clean" + (" beyond its interval" if stats["interval"] else ""))
    return ", ".join(why)


def summarize(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (metric, family): declared direction and reason, replicate 0's rho, monotone,
    monotone_ci, detected_from (a grade value), the rho of every replicate, how many replicates
    pass, the verdict (pass: every replicate passes; fail; not-required) and why it fails."""
    out = []
    metrics = list(dict.fromkeys(frame["metric"]))
    fams = list(dict.fromkeys(frame["family"]))
    for metric in metrics:
        for fam in fams:
            block = frame[(frame["metric"] == metric) & (frame["family"] == fam)]
            if block.empty:
                continue
            direction, reason = declared(metric, fam)
            per_rep = []
            for _, rep in block.groupby("replicate", sort=True):
                rep = rep.sort_values("grade")
                stats = grade_stats(rep["value"], rep["ci_low"], rep["ci_high"], str(rep["better"].iloc[0]))
                stats["levels"] = list(rep["grade_value"])
                per_rep.append(stats)
            first = per_rep[0]
            passed = sum(s["passes"] for s in per_rep)
            verdict = "not-required" if direction == "any" else ("pass" if passed == len(per_rep) else "fail")
            why = "" if direction == "any" else "; ".join(
                f"replicate {i}: {_why(s, s['levels'])}" for i, s in enumerate(per_rep) if not s["passes"])
            detected = first["detected_from"]
            out.append({
                "metric": metric, "family": fam, "direction": direction,
                "spearman_rho": round(first["rho"], 4) if not math.isnan(first["rho"]) else math.nan,
                "monotone": first["monotone"], "monotone_ci": first["monotone_ci"],
                "detected_from": first["levels"][detected] if detected is not None else "",
                "verdict": verdict, "replicates_passed": f"{passed}/{len(per_rep)}",
                "spearman_rho_replicates": " ".join("nan" if math.isnan(s["rho"]) else f"{s['rho']:.3f}" for s in per_rep),
                "why": why, "reason": reason,
            })
    return pd.DataFrame(out)


# -- figures ----------------------------------------------------------------------------------------------

_PANELS = (("distance", "Frechet distance and KID"), ("prdc", "precision / recall / density / coverage"),
           ("labels", "predicted labels"))


def _panel_of(metric: str) -> str:
    role = role_of(metric)
    return "distance" if role == "distance" else ("labels" if role in ("class_tv", "low_classes") else "prdc")


def _format_level(x: Any) -> str:
    return f"{x:g}" if isinstance(x, (float, np.floating)) else str(x)


def plot_family(frame: pd.DataFrame, summary: pd.DataFrame, fam: Family, path: Path) -> Path:
    """Every metric against the grade (replicate 0), each normalized to (b - b0) / max|b - b0| of its
    badness b, so up = worse and 1 = its largest change; shaded: its interval on the same scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    block = frame[(frame["family"] == fam.name) & (frame["replicate"] == 0)]
    fig, axes = plt.subplots(1, len(_PANELS), figsize=(16, 5.4), sharey=True)
    x = np.arange(len(fam.levels))
    for ax, (panel, title) in zip(axes, _PANELS):
        names = [m for m in dict.fromkeys(block["metric"]) if _panel_of(m) == panel]
        colours = plt.get_cmap("tab10").colors
        for i, metric in enumerate(names):
            rows = block[block["metric"] == metric].sort_values("grade")
            sign = 1.0 if table.better(metric) == "lower" else -1.0
            b = sign * rows["value"].to_numpy()
            scale = np.max(np.abs(b - b[0])) or 1.0
            verdict = summary[(summary["metric"] == metric) & (summary["family"] == fam.name)]["verdict"].iloc[0]
            mark = {"pass": "pass", "fail": "FAIL", "not-required": "not required"}[verdict]
            style = ":" if verdict == "not-required" else "-"
            ax.plot(x, (b - b[0]) / scale, style, marker="o", ms=4, lw=1.8, color=colours[i % 10],
                    label=f"{metric} ({mark})")
            lows, highs = sign * rows["ci_low"].to_numpy(), sign * rows["ci_high"].to_numpy()
            if np.isfinite(lows).all():
                ax.fill_between(x, (np.minimum(lows, highs) - b[0]) / scale, (np.maximum(lows, highs) - b[0]) / scale,
                                color=colours[i % 10], alpha=0.12, lw=0)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xticks(x, [_format_level(v) for v in fam.levels])
        ax.set_xlabel(fam.unit)
        ax.set_title(title, fontsize=11)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize=8.5, frameon=False)
    axes[0].set_ylabel("change from clean, scaled to its largest (up = worse)")
    fig.suptitle(f"{fam.name}: {fam.what} (replicate 0, dotted: need not move)", fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


def plot_samples(real: RealSet, fams: Sequence[Family], seed: int, path: Path, show: int = 8) -> Path:
    """One row per family, one cell per grade: `show` images spread evenly over the degraded set (2 rows),
    so copies (diversity) and garbage show in proportion."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = max(len(f.levels) for f in fams)
    fig, axes = plt.subplots(len(fams), cols, figsize=(1.75 * cols + 1.2, 1.15 * len(fams) + 0.4))
    for r, fam in enumerate(fams):
        for c in range(cols):
            ax = axes[r, c]
            ax.set_xticks([])
            ax.set_yticks([])
            if c >= len(fam.levels):
                ax.axis("off")
                continue
            degraded = fam.degrade(real, fam.levels[c], derive_seed(seed, "degrade", fam.name, 0))
            imgs = degraded[torch.arange(show) * degraded.shape[0] // show, 0].numpy()  # spread over the set
            per_row = (show + 1) // 2
            tile = np.full((2 * 29 - 1, per_row * 29 - 1), 255, dtype=np.uint8)
            for i, img in enumerate(imgs):
                tile[(i // per_row) * 29:(i // per_row) * 29 + 28, (i % per_row) * 29:(i % per_row) * 29 + 28] = img
            ax.imshow(tile, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
            ax.set_title(_format_level(fam.levels[c]), fontsize=8, pad=2)
            if c == 0:
                ax.set_ylabel(f"{fam.name}\n({fam.unit})", fontsize=8, rotation=0, ha="right", va="center")
    fig.suptitle(f"{show} images spread evenly over each set (replicate 0), grade 0 (clean) to the strongest",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path


# -- the README: generated blocks between markers, the rest kept -------------------------------------------

def _block(name: str, text: str) -> str:
    return f"<!-- generated:{name} -->\n{text.rstrip()}\n<!-- /generated:{name} -->"


def fill_readme(existing: str | None, blocks: dict[str, str], template: str) -> str:
    """`existing` (or `template` when None) with each generated block's text replaced; a block the
    text lacks is appended at the end."""
    text = template if existing is None else existing
    for name, body in blocks.items():
        pattern = re.compile(rf"<!-- generated:{re.escape(name)} -->.*?<!-- /generated:{re.escape(name)} -->", re.S)
        if pattern.search(text):
            text = pattern.sub(lambda _: _block(name, body), text)
        else:
            text = text.rstrip() + "\n\n" + _block(name, body) + "\n"
    return text


def _machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    found = re.search(r"^Model name:\s*(.+)$", out, re.M)
    model = found.group(1).strip() if found else (platform.processor() or "unknown CPU")
    return f"{model}, {os.cpu_count()} cores"


def _fmt(v: float, digits: int = 3) -> str:
    if isinstance(v, float) and math.isnan(v):
        return "–"
    a = abs(v)
    if a >= 100:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.{digits}f}"


def _tables(frame: pd.DataFrame, summary: pd.DataFrame, fams: Sequence[Family]) -> dict[str, str]:
    names = list(dict.fromkeys(summary["metric"]))
    order = [f.name for f in fams]
    # the verdict table: metric x family
    mark = {"pass": "✓", "fail": "**✗**", "not-required": "·"}
    lines = ["| metric | " + " | ".join(order) + " |", "|---|" + "---|" * len(order)]
    for metric in names:
        cells = []
        for fam in order:
            row = summary[(summary["metric"] == metric) & (summary["family"] == fam)].iloc[0]
            rho = "nan" if pd.isna(row["spearman_rho"]) else f"{row['spearman_rho']:.2f}"
            cells.append(f"{mark[row['verdict']]} {rho}")
        lines.append(f"| {metric} | " + " | ".join(cells) + " |")
    verdicts = ("✓ pass, **✗** fail, · not required (the metric need not move); the number is Spearman's rho of "
                "the metric's badness against the grade on replicate 0 (summary.csv has both replicates, "
                "the declared reason and why a cell fails).\n\n" + "\n".join(lines))
    # the mildest grade each metric detects
    lines = ["| metric | " + " | ".join(order) + " |", "|---|" + "---|" * len(order)]
    for metric in names:
        cells = []
        for fam in order:
            row = summary[(summary["metric"] == metric) & (summary["family"] == fam)].iloc[0]
            value = "–" if pd.isna(row["detected_from"]) or row["detected_from"] == "" else _format_level(
                float(row["detected_from"]))
            cells.append(value if row["direction"] == "worse" else f"({value})")
        lines.append(f"| {metric} | " + " | ".join(cells) + " |")
    detection = ("The mildest grade from which a metric stays worse than on the clean set beyond the clean "
                 "set's interval (rows without an interval: worse at all), replicate 0, in each family's unit "
                 "(setup table); – never; in brackets where it need not move.\n\n" + "\n".join(lines))
    # the ranking metric at every grade
    ranking = next(m for m in table.PRIMARY if m in names)
    rep0 = frame[(frame["replicate"] == 0) & (frame["metric"] == ranking)]
    cols = max(len(f.levels) for f in fams)
    lines = ["| family | " + " | ".join(f"grade {g}" for g in range(cols)) + " |", "|---|" + "---|" * cols]
    for fam in fams:
        cells = []
        for _, r in rep0[rep0["family"] == fam.name].sort_values("grade").iterrows():
            ci = "" if math.isnan(r["ci_low"]) else f" [{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}]"
            cells.append(f"{_format_level(r['grade_value'])}: {_fmt(r['value'])}{ci}")
        lines.append(f"| {fam.name} | " + " | ".join(cells) + " |")
    ranking_table = (f"`{ranking}` (the ranking metric) at every grade, replicate 0, as "
                     f"`grade value: value [95 % interval]`:\n\n" + "\n".join(lines))
    # where each metric fails, and where it moves although it need not
    lines = []
    for metric in names:
        rows = summary[summary["metric"] == metric]
        failed = rows[rows["verdict"] == "fail"]
        passed = rows[rows["verdict"] == "pass"]
        if failed.empty:
            lines.append(f"- **{metric}** passes every family it must follow ({len(passed)}).")
            continue
        parts = [f"{r['family']} ({r['why']})" for _, r in failed.iterrows()]
        lines.append(f"- **{metric}** fails {len(failed)} of {len(failed) + len(passed)}: " + "; ".join(parts) + ".")
    against = summary[(summary["direction"] == "any") & (summary["spearman_rho"] <= -RHO_MIN)]
    if not against.empty:
        lines += ["", "Where a metric need not move, it moved the *other* way (gets better as the set gets worse; "
                      "rho <= " + f"-{RHO_MIN}" + " on replicate 0): "
                  + "; ".join(f"{r['metric']} on {r['family']} (rho {r['spearman_rho']:.2f}, replicates "
                              f"{r['spearman_rho_replicates']})" for _, r in against.iterrows()) + "."]
    failures = "\n".join(lines)
    return {"verdicts": verdicts, "detection": detection, "ranking": ranking_table, "failures": failures}


_TEMPLATE = """# Metric calibration: every Fashion-MNIST metric on graded degradations of real images

(Hand-written introduction: kept when the study reruns.)

<!-- generated:setup -->
<!-- /generated:setup -->

![example images per family and grade](samples.png)

## Verdicts

<!-- generated:verdicts -->
<!-- /generated:verdicts -->

### How mild a degradation each metric sees

<!-- generated:detection -->
<!-- /generated:detection -->

<!-- generated:ranking -->
<!-- /generated:ranking -->

## Where each metric fails

<!-- generated:failures -->
<!-- /generated:failures -->

## What it means (hand-written)

## Figures

<!-- generated:figures -->
<!-- /generated:figures -->
"""


def _setup_block(fams: Sequence[Family], run: dict[str, Any], metrics: Sequence[str]) -> str:
    wall = float(run["wall_s"])
    lines = [
        f"Machine: {run['machine']}; torch {run['torch']}, {run['threads']} torch thread(s) and one BLAS thread "
        f"(`OMP_NUM_THREADS=1`), degradations in float64, the suite's float32 features. Run time: "
        f"{int(wall // 60)} min {wall % 60:.0f} s (`make bench-metric-calibration`; run.json's `wall_s` and this "
        f"line are all that change when it reruns).",
        "",
        f"N = {run['n']} real Fashion-MNIST test images per replicate, {run['replicates']} replicate subsets "
        f"(seeded from seed {run['seed']}), every set scored against the train split by `evaluate_samples(images, "
        f"\"fmnist\", metrics=table.auto_metrics(\"fmnist\", False), options=ScoreOptions(seed={run['seed']}), quality=True)`, which "
        f"gives " + ", ".join(f"`{m}`" for m in metrics) + ".",
        "",
        "| family | what a grade does | grades 0–5 |",
        "|---|---|---|",
    ]
    for fam in fams:
        lines.append(f"| {fam.name} | {fam.what} | " + ", ".join(_format_level(v) for v in fam.levels)
                     + f" ({fam.unit}) |")
    return "\n".join(lines)


_COLUMNS = ["replicate", "family", "grade", "grade_value", "metric", "better", "value", "ci_low", "ci_high"]


def render(out: str | Path, frame: pd.DataFrame, run: dict[str, Any]) -> list[Path]:
    """summary.csv, the figures and README.md from the measured frame and the run's record (run.json)."""
    import json

    out = Path(out)
    fams = families(int(run["n"]))
    summary = summarize(frame)
    summary.to_csv(out / "summary.csv", index=False, lineterminator="\n")
    written = [out / "summary.csv"]
    written += [plot_family(frame, summary, fam, out / f"family_{fam.name}.png") for fam in fams]
    from dfbench import datasets

    split = datasets.load(DATASET, "test")
    real = real_set(split.images, split.labels.numpy(), int(run["n"]), derive_seed(int(run["seed"]), "subset", 0))
    written.append(plot_samples(real, fams, int(run["seed"]), out / "samples.png"))
    blocks = _tables(frame, summary, fams)
    blocks["figures"] = "\n\n".join(f"![{fam.name}](family_{fam.name}.png)" for fam in fams)
    blocks["setup"] = _setup_block(fams, run, list(dict.fromkeys(frame["metric"])))
    readme = out / "README.md"
    readme.write_text(fill_readme(readme.read_text(encoding="utf-8") if readme.exists() else None, blocks, _TEMPLATE),
                      encoding="utf-8")
    (out / "run.json").write_text(json.dumps(run, indent=1) + "\n", encoding="utf-8")
    return written + [readme, out / "run.json"]


def write_study(out: str | Path, *, n: int = N_IMAGES, seed: int = SEED, replicates: int = REPLICATES,
                threads: int = 1, log: Callable[[str], None] | None = print) -> list[Path]:
    """Measure (`measure`), then write calibration.csv, run.json (machine, wall time) and `render`'s files."""
    torch.set_num_threads(threads)
    start = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    frame = measure(families(n), n=n, seed=seed, replicates=replicates, log=log)
    frame[_COLUMNS].to_csv(out / "calibration.csv", index=False, lineterminator="\n")
    run = {"n": n, "seed": seed, "replicates": replicates, "threads": threads, "torch": torch.__version__,
           "machine": _machine(), "wall_s": round(time.perf_counter() - start, 1)}
    return [out / "calibration.csv"] + render(out, _read(out), run)  # as --from-csv reads it: the same bytes


def rerender(out: str | Path) -> list[Path]:
    """`render` again from a study folder's calibration.csv and run.json (no metric is recomputed)."""
    import json

    out = Path(out)
    return render(out, _read(out), json.loads((out / "run.json").read_text(encoding="utf-8")))


def _read(out: Path) -> pd.DataFrame:
    return pd.read_csv(out / "calibration.csv")  # pandas' default parser reads repr floats back exactly


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python results/metric-calibration/calibration.py",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for calibration.csv, summary.csv, the figures and README.md")
    p.add_argument("--n", type=int, default=N_IMAGES, help=f"real test images per replicate (default {N_IMAGES})")
    p.add_argument("--seed", type=int, default=SEED, help=f"the study's seed (default {SEED})")
    p.add_argument("--replicates", type=int, default=REPLICATES,
                   help=f"seeded test subsets; a verdict must hold on each (default {REPLICATES})")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1; the committed numbers are for 1: results depend on it)")
    p.add_argument("--from-csv", action="store_true",
                   help="re-render summary, figures and README from OUT's calibration.csv and run.json")
    a = p.parse_args(argv)
    paths = rerender(a.out) if a.from_csv else write_study(a.out, n=a.n, seed=a.seed, replicates=a.replicates,
                                                           threads=a.threads)
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
