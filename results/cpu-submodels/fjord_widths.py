"""A test of one hypothesis for FjORD's poor score in cpu-submodels (README, "Quality curves"): is the full
width the undertrained one, so that sampling a narrower nested width would score better?

    .venv/bin/python results/cpu-submodels/fjord_widths.py    # needs the runs' final checkpoints (not committed)

Each FjORD run's final model is sampled at widths 1.0 / 0.75 / 0.5 / 0.25 (the leading-channel prefix, as
FjORD's inference rule samples its top width) on the run's fixed noises and sampler, and scored like the
run's own evaluation (`engine.evaluate.score`, as results/paper-fmnist/rescore_inference.py scores a rule). Writes fjord_widths.csv (fd_fmnist per run and
width) and fjord_widths.md. The run folders are never modified; a checkpoint-less clone cannot run it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from dfbench import methods
from dfbench.benchmark.api import iter_runs, runfolder
from dfbench.benchmark.engine.context import build_context
from dfbench.benchmark.engine.evaluate import generate, score
from dfbench.benchmark.engine.resolve import config_from_dict

ROOT = Path(__file__).resolve().parent
WIDTHS = (1.0, 0.75, 0.5, 0.25)


def fd_of(cfg, ctx, samples, folder: Path) -> float:
    """fd_fmnist of `samples`, scored as the run's own evaluation scores its samples (`folder`: scratch)."""
    rows, pending = score(folder, cfg, samples, ctx.sampler_name(cfg.train.objective))[:2]
    if pending:
        raise SystemExit(pending)
    return next(float(r["value"]) for r in rows if r["metric"] == "fd_fmnist")


def main() -> int:
    rows = []
    for found in iter_runs(ROOT / "runs" / "fmnist" / "dirichlet-0.5" / "fjord"):
        run = found.path
        cfg = config_from_dict(found.config())
        ck = runfolder.load_checkpoint(run)
        if ck is None or ck["round"] != cfg.train.rounds:
            raise SystemExit(f"{run} has no final checkpoint: re-run `make bench-cpu-submodels` (checkpoints are not committed)")
        ctx = build_context(cfg)
        for w in WIDTHS:
            method = methods.create_method("fjord", **dict(cfg.method_params))
            method.inference_rate = lambda ctx, w=w: w  # sample the nested prefix of width w
            with tempfile.TemporaryDirectory() as tmp:
                fd = fd_of(cfg, ctx, generate(cfg, ctx, method, ck["params"]), Path(tmp))
            rows.append({"seed": cfg.seed, "width": w, "fd_fmnist": round(fd, 1)})
            print(rows[-1], flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(ROOT / "fjord_widths.csv", index=False)
    table = df.pivot(index="seed", columns="width", values="fd_fmnist")[list(WIDTHS)]
    gm = np.exp(np.log(table).mean())
    lines = ["fd_fmnist of each FjORD run's final model sampled at a nested width (400 samples, the run's fixed "
             "noises); last row: geometric mean over the seeds.", "",
             "| seed | " + " | ".join(f"width {w:g}" for w in WIDTHS) + " |", "|---|" + "---|" * len(WIDTHS)]
    lines += [f"| {s} | " + " | ".join(f"{table.loc[s, w]:.1f}" for w in WIDTHS) + " |" for s in table.index]
    lines.append("| geometric mean | " + " | ".join(f"{gm[w]:.1f}" for w in WIDTHS) + " |")
    (ROOT / "fjord_widths.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
