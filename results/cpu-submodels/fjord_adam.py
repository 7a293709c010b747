"""Is FjORD's stall in cpu-submodels Adam's doing? (issue 53's open hypothesis; exploratory)

    python results/cpu-submodels/fjord_adam.py            # trains 5 runs (~5 min on 2 cores), then the table
    python results/cpu-submodels/fjord_adam.py --table    # the table from the runs already there

The hypothesis: FjORD draws one width per local step, and a unit outside this step's width gets a zero gradient,
but the client's Adam state is shared by the widths, so stale momentum still moves it (methods/fjord.py says so;
the paper trains with SGD, where it would not move). The test: cpu-submodels' five FjORD cells (seeds 231-235),
key for key, retrained with a *lazy* Adam: an entry whose gradient is exactly zero this step neither moves nor
updates its moments (`LazyAdam`; every other entry steps as torch's Adam). It is installed in place of
`local_step.make_optimizer` for these runs only (the runs are written to fjord_adam/runs, with LAZY_ADAM.txt
saying so); nothing in dfbench changes. The table compares each seed's score with the committed FjORD run and with
FedAvg at the same seed (cpu-submodels' runs.csv): if lazy Adam removes most of the gap to FedAvg, the hypothesis
holds. Written: fjord_adam.csv and fjord_adam.md beside this script. Exploratory: designed after the result.
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

HERE = Path(__file__).resolve().parent
OUT = HERE / "fjord_adam"
METRICS = ("fd_fmnist", "fd_fmnist_ae", "denoise_loss")


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


def _train(cell) -> str:
    torch.set_num_threads(1)
    from dfbench.benchmark.engine import lifecycle, local_step

    local_step.make_optimizer = _lazy  # this process's runs only
    return str(lifecycle.run(cell.cfg, OUT / "runs", progress=False))


def train() -> None:
    from dfbench.benchmark.grid.spec import load_grid

    cells = [c for c in load_grid(HERE / "cpu-submodels.toml").cells if c.cfg.method == "fjord"]
    (OUT / "runs").mkdir(parents=True, exist_ok=True)
    (OUT / "LAZY_ADAM.txt").write_text("These runs trained with fjord_adam.py's LazyAdam in place of dfbench's Adam; "
                                       "their config.json does not say so.\n", encoding="utf-8")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with mp.get_context("fork").Pool(2) as pool:
        for folder in pool.imap_unordered(_train, cells):
            print("done:", folder)


def table() -> pd.DataFrame:
    from dfbench.benchmark.report.frames import collect

    lazy = collect(OUT / "runs").runs.set_index("seed")
    committed = pd.read_csv(HERE / "runs.csv")
    fjord = committed[committed["method"] == "fjord"].set_index("seed")
    fedavg = committed[(committed["method"] == "fedavg") & (pd.to_numeric(committed["cfg.edges"]) == 0)].set_index("seed")
    rows = []
    for seed in sorted(lazy.index):
        row = {"seed": int(seed)}
        for m in METRICS:
            row |= {f"{m}_lazy": float(lazy.at[seed, m]), f"{m}_fjord": float(fjord.at[seed, m]),
                    f"{m}_fedavg": float(fedavg.at[seed, m])}
        rows.append(row)
    out = pd.DataFrame(rows)
    summary: dict = {"seed": -1}
    for m in METRICS:  # the geometric means over the seeds, and the share of the gap to FedAvg lazy Adam closes
        g = {k: float(np.exp(np.log(out[f"{m}_{k}"]).mean())) for k in ("lazy", "fjord", "fedavg")}
        gap = math.log(g["fjord"]) - math.log(g["fedavg"])
        summary |= {f"{m}_{k}": v for k, v in g.items()}
        summary[f"{m}_gap_closed"] = (math.log(g["fjord"]) - math.log(g["lazy"])) / gap if gap else math.nan
    return pd.concat([out, pd.DataFrame([summary])], ignore_index=True)


def to_markdown(t: pd.DataFrame) -> str:
    lines = ["| seed | " + " | ".join(f"{m}: lazy Adam / Adam (committed) / FedAvg" for m in METRICS) + " |",
             "|---|" + "---|" * len(METRICS)]
    for _, r in t.iterrows():
        seed = "geometric mean" if r["seed"] == -1 else str(int(r["seed"]))
        cells = []
        for m in METRICS:
            fmt = "{:.4f}" if m == "denoise_loss" else "{:.1f}"
            cell = " / ".join(fmt.format(r[f"{m}_{k}"]) for k in ("lazy", "fjord", "fedavg") if pd.notna(r[f"{m}_{k}"]))
            if r["seed"] == -1 and pd.notna(r.get(f"{m}_gap_closed")):
                cell += f" (gap closed: {r[f'{m}_gap_closed']:.0%})"
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
    (HERE / "fjord_adam.md").write_text("# FjORD with lazy Adam (exploratory; fjord_adam.py)\n\n" + md, encoding="utf-8")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
