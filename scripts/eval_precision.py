"""What the evaluation's sample count buys: fd_fmnist on random subsets of a run's samples.

    .venv/bin/python scripts/eval_precision.py RUN_DIR [RUN_DIR ...] [--sizes 200,400,1000] [--draws 10]

For every finished Fashion-MNIST run folder (its samples.npz, e.g. 1000 samples), draws `draws`
random subsets of each size without replacement (seeded: --seed), computes fd_fmnist of each
subset against the cached reference statistics, and prints per run and size the mean and the
standard deviation over the draws. The mean shows the Frechet distance's small-sample bias (it
falls as the sample count grows: the sample covariance of N points is noisier than the
reference's), the spread its sampling noise at that size; the cost of evaluation is linear in
the sample count (one sampler pass per sample). Run folders are read, never modified.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from dfbench.benchmark.core import runfolder
from dfbench.benchmark.engine.resolve import config_from_dict
from dfbench.benchmark.metrics.features import get_extractor
from dfbench.benchmark.metrics.fid import frechet_distance
from dfbench.benchmark.metrics.scoring import reference_stats


def subset_distances(features: np.ndarray, mu: np.ndarray, sigma: np.ndarray, sizes: list[int], draws: int,
                     seed: int) -> dict[int, np.ndarray]:
    """size -> the Frechet distances of `draws` random subsets of that many rows of `features`."""
    rng = np.random.default_rng(seed)
    out = {}
    for n in sizes:
        if n > len(features):
            raise ValueError(f"subset size {n} exceeds the {len(features)} samples of the run; use --sizes up to {len(features)}")
        if n < 2:
            raise ValueError(f"subset size {n} has no covariance; use sizes >= 2")
        values = []
        for _ in range(draws if n < len(features) else 1):  # the full set has one draw
            rows = features[rng.choice(len(features), size=n, replace=False)]
            values.append(frechet_distance(rows.mean(0), np.cov(rows, rowvar=False), mu, sigma))
        out[n] = np.asarray(values)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="finished fmnist run folders with samples.npz")
    ap.add_argument("--sizes", default="200,400,600,800,1000", help="comma list of subset sizes")
    ap.add_argument("--draws", type=int, default=10, help="random subsets per size")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    extractor = get_extractor("fmnist")
    reference: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    print(f"{'run':40s} " + " ".join(f"{'N=' + str(n):>15s}" for n in sizes))
    for d in args.runs:
        cfg = config_from_dict(runfolder.read_json(d / runfolder.CONFIG))
        if cfg.data.dataset != "fmnist":
            print(f"{d}: a {cfg.data.dataset} run; fd_fmnist needs Fashion-MNIST samples", file=sys.stderr)
            return 2
        if not (d / "samples.npz").exists():
            print(f"{d}: no samples.npz (an unfinished run?); finish it first", file=sys.stderr)
            return 2
        split = cfg.eval.reference_split
        if split not in reference:
            reference[split] = reference_stats("fmnist", split, extractor)
        with np.load(d / "samples.npz") as z:
            images = torch.from_numpy(z["images"])
        feats = extractor.features(images)
        dist = subset_distances(feats, *reference[split], sizes, args.draws, args.seed)
        print(f"{str(d)[-40:]:40s} " + " ".join(f"{v.mean():8.1f} ± {v.std(ddof=1) if len(v) > 1 else 0.0:4.1f}" for v in dist.values()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
