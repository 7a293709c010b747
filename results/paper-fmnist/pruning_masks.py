"""Which weights did a pruning run ever train? Why top-k's inference rules differ (issue 24).

    .venv/bin/python results/paper-fmnist/pruning_masks.py results/paper-fmnist/runs [--out FILE.csv]

For every finished random_prune / topk_prune run under the given roots, compares the final global
model with the run's seeded initial model. A weight that no client ever trained keeps its initial
value bit for bit (`masked_mean=covered` leaves entries nobody trained untouched); one that any
client trained moves (every step of Adam moves a weight whose gradient is not exactly zero). So

- trained:            the share of prunable weights that differ from their initial value;
- outside:            the share of prunable weights outside the final model's own mask (the top-k
                      magnitude mask at the run's keep ratio; random: the submodel rule's mask);
- outside_untrained:  of those outside weights, the share never trained. `full` samples them as
                      they are (their initial values), `submodel` zeroes them;
- untrained_norm:     ||never-trained weights|| / ||all prunable weights||, the size of what
                      `full` adds that training never saw.

Prints one row per run (and a mean per method and keep ratio); --out writes the rows as CSV.
Run folders are read, never modified.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import torch

from dfbench import methods
from dfbench.benchmark.api import iter_runs, runfolder
from dfbench.benchmark.engine.resolve import config_from_dict
from dfbench.benchmark.engine.context import build_context
from dfbench.methods.pruning import prunable_tensors  # the same rule the methods use

FAMILIES = ("random_prune", "topk_prune")


def run_dirs(roots: list[Path]) -> list[Path]:
    """Finished pruning run folders under the roots (a root may itself be a run folder)."""
    out = []
    for root in roots:
        for run in iter_runs(root) if root.is_dir() else []:  # a run folder itself: that folder
            if run.config().get("method") in FAMILIES and run.has(runfolder.METRICS):
                out.append(run.path)
    return out


def trained_shares(d: Path) -> dict[str, object]:
    """The row of one run folder (see the module docstring)."""
    cfg = config_from_dict(runfolder.RunFolder(d).config())
    ck = runfolder.load_checkpoint(d)
    if ck is None or ck["round"] != cfg.train.rounds:
        raise SystemExit(f"{d} has no final checkpoint (round {cfg.train.rounds}); finish the run first")
    final = ck["params"]
    ctx = build_context(cfg)
    init = ctx.init_params.to(final.device, final.dtype)
    method = methods.create_method(cfg.method, **dict(cfg.method_params))
    keep = float(method.config.keep_ratio)
    prunable = torch.zeros(ctx.layout.total, dtype=torch.bool)
    for (_, sl, _), p in zip(ctx.layout.slices(), prunable_tensors(ctx.layout, method.config.prune_biases)):
        prunable[sl] = p
    mask = method.inference_mask(final, method.sampling_keep(ctx), ctx).bool()
    trained = (final != init) & prunable
    untrained = ~trained & prunable
    outside = ~mask & prunable
    n_out = int(outside.sum())
    return {
        "method": cfg.method, "keep": keep, "seed": cfg.seed, "run": d.name,
        "trained": float(trained.sum()) / float(prunable.sum()),
        "outside": n_out / float(prunable.sum()),
        "outside_untrained": float((outside & untrained).sum()) / n_out if n_out else 0.0,
        "untrained_norm": float(final[untrained].norm() / final[prunable].norm()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("roots", nargs="+", type=Path, help="run folders or roots of run folders")
    ap.add_argument("--out", type=Path, help="write the per-run rows here as CSV")
    args = ap.parse_args(argv)
    dirs = run_dirs(args.roots)
    if not dirs:
        print(f"no finished random_prune / topk_prune run under {', '.join(map(str, args.roots))}", file=sys.stderr)
        return 2
    rows = pd.DataFrame([trained_shares(d) for d in dirs]).sort_values(["method", "keep", "seed"])
    pd.set_option("display.width", 200)
    print(rows.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print("\nmean per method and keep ratio:")
    cols = ["trained", "outside", "outside_untrained", "untrained_norm"]
    print(rows.groupby(["method", "keep"])[cols].mean().to_string(float_format=lambda v: f"{v:.4f}"))
    if args.out:
        rows.to_csv(args.out, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
