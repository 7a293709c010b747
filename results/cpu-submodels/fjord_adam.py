"""Why does FjORD stall in cpu-submodels? Two hypotheses tested on its five cells (exploratory: designed after the result)

    python results/cpu-submodels/fjord_adam.py            # trains 10 runs (~10 min on 2 cores), then the table
    python results/cpu-submodels/fjord_adam.py --table    # the table from the runs already there

1. *Stale momentum*: FjORD draws one width per local step, and a unit outside this step's width gets a zero gradient,
   but the client's Adam state is shared by the widths, so stale momentum still moves it (methods/fjord.py says so;
   the paper trains with SGD, where it would not move). Test: the five FjORD cells (seeds 231-235), key for key,
   retrained with a *lazy* Adam: an entry whose gradient is exactly zero this step neither moves nor updates its
   moments (`LazyAdam`; every other entry steps as torch's Adam), installed in place of `local_step.make_optimizer`
   for these runs only (written to fjord_adam/runs, with LAZY_ADAM.txt saying so); nothing in dfbench changes.
2. *Too few full-width steps*: with widths {0.25, 0.5, 0.75, 1} a full-capacity client trains the full width in a
   quarter of its steps and a half-capacity one never, so the outer units get a small share of FedAvg's updates in
   12 rounds. Test: the same cells with widths {0.5, 1} (dfbench's own Adam; the half-capacity clients then train
   width 0.5 only, the full ones the full width in half their steps), written to fjord_adam/widths-runs.

The table compares each seed's score with the committed FjORD run and with FedAvg at the same seed (cpu-submodels'
runs.csv), and says what share of the gap to FedAvg (on the log scale, geometric means) each variant closes.
Written: fjord_adam.csv and fjord_adam.md beside this script.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from dfbench.benchmark.api import metric_table

HERE = Path(__file__).resolve().parent
OUT = HERE / "fjord_adam"
METRICS = ("fd_fmnist", *metric_table.independent_checks("fmnist"))  # the ranking metric and its independent checks
VARIANTS = ("lazy", "widths", "fjord", "fedavg")  # lazy Adam, widths {0.5, 1}, the committed FjORD, FedAvg


class LazyAdam(torch.optim.Adam):
    """torch's Adam, except that an entry whose gradient is exactly zero in a step keeps its value and its moments."""

    def __init__(self, params, lr: float) -> None:
        super().__init__(params, lr=lr, foreach=False)

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        saved = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                frozen = p.grad == 0
                state = self.state.get(p, {})
                saved.append((p, frozen, p.detach().clone(),
                              state["exp_avg"].clone() if "exp_avg" in state else None,
                              state["exp_avg_sq"].clone() if "exp_avg_sq" in state else None))
        loss = super().step(closure)
        for p, frozen, value, m, v in saved:
            p.data[frozen] = value[frozen]
            state = self.state[p]
            state["exp_avg"][frozen] = 0.0 if m is None else m[frozen]
            state["exp_avg_sq"][frozen] = 0.0 if v is None else v[frozen]
        return loss


def _lazy(params, lr):
    return LazyAdam(params, lr)


WIDTHS = "0.5,1.0"  # hypothesis 2's nested set


def _train(job) -> str:
    variant, cfg = job
    torch.set_num_threads(1)
    from dfbench.benchmark.engine import lifecycle, local_step

    if variant == "lazy":
        local_step.make_optimizer = _lazy  # this process's runs only
    return str(lifecycle.run(cfg, OUT / ("runs" if variant == "lazy" else "widths-runs"), progress=False))


def _cells() -> list:
    from dfbench.benchmark.grid.spec import load_grid

    return [c for c in load_grid(HERE / "cpu-submodels.toml").cells if c.cfg.method == "fjord"]


def _with_widths(cfg, widths: str):
    """The cell's config with method.widths replaced (the run id follows the config)."""
    from dfbench.benchmark.engine.resolve import apply_overrides

    return apply_overrides(cfg, {"method.widths": widths})


def train() -> None:
    cells = _cells()
    (OUT / "runs").mkdir(parents=True, exist_ok=True)
    (OUT / "LAZY_ADAM.txt").write_text("The runs under runs/ trained with fjord_adam.py's LazyAdam in place of dfbench's "
                                       "Adam; their config.json does not say so. widths-runs/ trained with dfbench's "
                                       "own Adam.\n", encoding="utf-8")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    jobs = [("lazy", c.cfg) for c in cells] + [("widths", _with_widths(c.cfg, WIDTHS)) for c in cells]
    with mp.get_context("fork").Pool(2) as pool:
        for folder in pool.imap_unordered(_train, jobs):
            print("done:", folder)


def table() -> pd.DataFrame:
    from dfbench.benchmark.report.frames import collect

    lazy = collect(OUT / "runs").runs.set_index("seed")
    widths = collect(OUT / "widths-runs").runs.set_index("seed") if (OUT / "widths-runs").is_dir() else None
    committed = pd.read_csv(HERE / "runs.csv")
    fjord = committed[committed["method"] == "fjord"].set_index("seed")
    fedavg = committed[(committed["method"] == "fedavg") & (pd.to_numeric(committed["cfg.edges"]) == 0)].set_index("seed")
    rows = []
    for seed in sorted(lazy.index):
        row = {"seed": int(seed)}
        for m in METRICS:
            row |= {f"{m}_lazy": float(lazy.at[seed, m]), f"{m}_fjord": float(fjord.at[seed, m]),
                    f"{m}_fedavg": float(fedavg.at[seed, m])}
            row[f"{m}_widths"] = float(widths.at[seed, m]) if widths is not None else math.nan
        rows.append(row)
    out = pd.DataFrame(rows)
    summary: dict = {"seed": -1}
    for m in METRICS:  # the geometric means over the seeds, and the share of the gap to FedAvg lazy Adam closes
        g = {k: float(np.exp(np.log(out[f"{m}_{k}"]).mean())) for k in VARIANTS}
        gap = math.log(g["fjord"]) - math.log(g["fedavg"])
        summary |= {f"{m}_{k}": v for k, v in g.items()}
        for k in ("lazy", "widths"):
            summary[f"{m}_{k}_gap_closed"] = (math.log(g["fjord"]) - math.log(g[k])) / gap if gap else math.nan
    return pd.concat([out, pd.DataFrame([summary])], ignore_index=True)


def to_markdown(t: pd.DataFrame) -> str:
    lines = ["| seed | " + " | ".join(f"{m}: lazy Adam / widths {{0.5, 1}} / FjORD (committed) / FedAvg" for m in METRICS)
             + " |", "|---|" + "---|" * len(METRICS)]
    for _, r in t.iterrows():
        seed = "geometric mean" if r["seed"] == -1 else str(int(r["seed"]))
        cells = []
        for m in METRICS:
            fmt = "{:.4f}" if m == "denoise_loss" else "{:.1f}"
            cell = " / ".join(fmt.format(r[f"{m}_{k}"]) if pd.notna(r[f"{m}_{k}"]) else "–" for k in VARIANTS)
            if r["seed"] == -1:
                cell += " (gap to FedAvg closed: " + ", ".join(
                    f"{name} {r[f'{m}_{k}_gap_closed']:.0%}" for k, name in (("lazy", "lazy"), ("widths", "widths"))
                    if pd.notna(r.get(f"{m}_{k}_gap_closed"))) + ")"
            cells.append(cell)
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", action="store_true", help="only the table, from the runs already trained")
    args = parser.parse_args()
    if not args.table:
        train()
    t = table()
    t.to_csv(HERE / "fjord_adam.csv", index=False, float_format="%.6g")
    md = to_markdown(t)
    (HERE / "fjord_adam.md").write_text("# FjORD's stall, two hypotheses (exploratory; fjord_adam.py)\n\n" + md,
                                        encoding="utf-8")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
