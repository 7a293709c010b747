"""Why KID ranks some trained models below the untrained one here (a check of a result that contradicts common
sense): KID's kernel, k(x, y) = (x.y / d + 1)^3, grows with the feature vectors' norms cubed, and the random-mask
models' samples have larger Fashion-MNIST classifier features than the reference draws. Recomputes kid_fmnist of
the three models KID ranks worst, the best one and the untrained model, (1) as scored (the samples' features against
the reference draws') and (2) with every feature vector scaled to the reference's mean norm, so that only their
directions count; and prints each one's mean feature norm and exact errors. Writes kid_norm.md.

Run: .venv/bin/python results/proxy-validity/kid_norm.py  (after analyze.py, which writes models.csv)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from dfbench import datasets
from dfbench.benchmark.api import iter_runs, load_samples
from dfbench.benchmark.metrics.features import get_extractor
from dfbench.benchmark.metrics.fid import kid

HERE = Path(__file__).resolve().parent
REFERENCE = 1000  # reference draws: the first of the mixture's test split, quantized to pixels as samples are


def _kid(a: np.ndarray, b: np.ndarray) -> float:
    return kid(a, b, num_subsets=100, subset_size=min(len(a), len(b)), seed=0)[0]  # x 1e3 already, as the runs report it


def main() -> None:
    models = pd.read_csv(HERE / "models.csv").set_index("run_id")
    folders = {rf.path.name: rf.path for rf in iter_runs(HERE / "runs")}
    ranked = models[models["role"] == "model"].sort_values("kid_fmnist")
    chosen = [*ranked.index[::-1][:3], ranked.index[0], *models.index[models["role"] == "untrained"]]
    extractor = get_extractor("fmnist")
    spec = str(next(iter(iter_runs(HERE / "runs"))).config()["data"]["dataset"])
    ref = extractor.features(datasets.to_pixels(datasets.load(spec, "test").images[:REFERENCE]))
    norm = float(np.linalg.norm(ref, axis=1).mean())
    unit = ref * (norm / np.linalg.norm(ref, axis=1, keepdims=True))
    lines = [f"KID (x 1e3) in the Fashion-MNIST classifier's space against {REFERENCE} quantized test draws (mean feature "
             f"norm {norm:.2f}), as scored and with every feature vector at that norm (directions only); kid_norm.py", "",
             "| run | role | setting | rounds | score_kl | frechet_exact | mean feature norm | KID | KID, norms equalised |",
             "|---|---|---|---|---|---|---|---|---|"]
    for rid in chosen:
        feats = extractor.features(torch.from_numpy(load_samples(folders[rid])))
        norms = np.linalg.norm(feats, axis=1)
        row = models.loc[rid]
        lines.append(f"| {rid} | {row['role']} | {row['method'].split(' [')[0]} | {int(row['rounds'])} | {row['score_kl']:.0f} | "
                     f"{row['frechet_exact']:.0f} | {norms.mean():.2f} | {_kid(feats, ref):.1f} | "
                     f"{_kid(feats * (norm / norms[:, None]), unit):.1f} |")
    text = "\n".join(lines) + "\n"
    (HERE / "kid_norm.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
