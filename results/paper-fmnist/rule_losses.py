"""Every inference rule of the pruning runs at one keep ratio, scored twice: fd_fmnist of its samples
and the training loss of the model it samples (issue 24: why random pruning at keep 0.5 misses
0.5x untrained). FedAvg's final models are the reference loss.

    .venv/bin/python results/paper-fmnist/rule_losses.py --runs results/paper-fmnist/runs \
        --out results/paper-fmnist/rule_losses --keep 0.5

For each finished run under --runs (random_prune and topk_prune at --keep, and fedavg trained
runs) it calls rescore_inference.py's `rescore` (beside this script) with `--loss N` (the same N training
images, times and noises for every rule of a run; run seed, "rescore_loss"): random_prune under
full / scaled / submodel / ensemble:draws=4, topk_prune under submodel / full / scaled, fedavg
under full. Writes OUT/rule_losses.csv (one row per run x rule), OUT/rule_losses.md (seed
means) and OUT/random_rules.png (random_prune's samples under each rule, one row per seed, with
both numbers in the panel titles). The run folders are never modified.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from dfbench.benchmark.api import iter_runs, runfolder
from rescore_inference import rescore  # beside this script (Python puts a script's own folder first on its path)

RULES = {"random_prune": ["full", "scaled", "submodel", "ensemble:draws=4"], "topk_prune": ["submodel", "full", "scaled"],
         "fedavg": ["full"]}
FAMILY = {"random_prune": "random", "topk_prune": "top-k", "fedavg": "fedavg"}


def finished_runs(root: Path, keep: float) -> list[tuple[Path, dict]]:
    """(folder, config) of the done runs to rescore, by method then seed."""
    out = []
    for run in iter_runs(root):
        if run.state() != runfolder.DONE:
            continue
        d, cfg = run.path, run.config()
        method, params = cfg["method"], cfg.get("method_params") or {}
        if method not in RULES or cfg["train"]["rounds"] == 0:
            continue
        if method != "fedavg" and float(params.get("keep_ratio", 1.0)) != keep:
            continue
        out.append((d, cfg))
    return sorted(out, key=lambda x: (list(RULES).index(x[1]["method"]), x[1]["seed"]))


def main() -> None:
    ap = argparse.ArgumentParser(prog="python results/paper-fmnist/rule_losses.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--keep", type=float, default=0.5)
    ap.add_argument("--loss", type=int, default=2048, metavar="N", help="training images the loss is measured on")
    args = ap.parse_args()
    runs = finished_runs(args.runs, args.keep)
    if not runs:
        raise SystemExit(f"no finished fedavg, random_prune or topk_prune (keep {args.keep}) runs under {args.runs}")
    rows = []
    for d, cfg in runs:
        print(f"== {d}", flush=True)
        table = rescore(d, RULES[cfg["method"]], args.out / "samples" / f"{cfg['method']}-s{cfg['seed']}", args.loss)
        for rule, values in table.items():
            rows.append({"family": FAMILY[cfg["method"]], "keep": 1.0 if cfg["method"] == "fedavg" else args.keep,
                         "seed": cfg["seed"], "rule": rule, "fd_fmnist": values["fd_fmnist"], "loss": values["loss"],
                         "run_id": d.name})
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "rule_losses.csv", index=False)
    write_table(frame, args.out / "rule_losses.md", args.loss)
    draw(frame, args.out)


def write_table(frame: pd.DataFrame, path: Path, n: int) -> None:
    lines = [f"fd_fmnist of each rule's samples and the training loss (flow-matching velocity MSE on {n} training "
             "images, the same images, times and noises for every rule of a run) of the model it samples. "
             "Seeds as `s0 / s1 / s2 (mean)`. Lower is better for both.", "",
             "| family | keep | rule | fd_fmnist | loss |", "|---|---:|---|---|---|"]
    for (family, keep, rule), grp in frame.groupby(["family", "keep", "rule"], sort=False):
        grp = grp.sort_values("seed")
        fd = " / ".join(f"{v:.1f}" for v in grp["fd_fmnist"]) + f" ({grp['fd_fmnist'].mean():.1f})"
        loss = " / ".join(f"{v:.3f}" for v in grp["loss"]) + f" ({grp['loss'].mean():.3f})"
        lines.append(f"| {family} | {keep:g} | `{rule}` | {fd} | {loss} |")
    path.write_text("\n".join(lines) + "\n")


def draw(frame: pd.DataFrame, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sub = frame[frame["family"] == "random"]
    seeds = sorted(sub["seed"].unique())
    rules = list(dict.fromkeys(sub["rule"]))
    fig, axes = plt.subplots(len(seeds), len(rules), figsize=(3.1 * len(rules), 3.8 * len(seeds)), squeeze=False)
    for i, seed in enumerate(seeds):
        for j, rule in enumerate(rules):
            row = sub[(sub["seed"] == seed) & (sub["rule"] == rule)].iloc[0]
            name = rule.replace(":", "_").replace(",", "_").replace("=", "-")
            img = plt.imread(out / "samples" / f"random_prune-s{seed}" / name / "grid.png")
            ax = axes[i][j]
            ax.imshow(np.asarray(img), cmap="gray")
            ax.set_axis_off()
            ax.set_title(f"seed {seed}, {rule}\nfd {row['fd_fmnist']:.0f}, loss {row['loss']:.3f}", fontsize=9)
    fig.suptitle(f"random_prune keep {sub['keep'].iloc[0]:g}: one trained model per row, sampled under each rule "
                 "(same noises)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "random_rules.png", dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
