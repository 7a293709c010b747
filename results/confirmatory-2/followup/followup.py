"""The exploratory follow-up of confirmatory-2 (followup.toml: H1, the server learning rate at Dirichlet 0.1; H2, 18
rounds), as one table:

    python results/confirmatory-2/followup/followup.py

Reads followup/runs.csv (written by `dfbench report --runs results/confirmatory-2/followup/runs --out
results/confirmatory-2/followup`). For every setting and each of the three metrics (fd_fmnist, fd_fmnist_ae,
denoise_loss): the paired ratio against FedAvg at the same rounds and seed, its geometric mean over the seeds with a
95 % t-interval on the logs, and on how many seeds the setting is better (lower). No Holm, no verdict: the grid was
designed after confirmatory-2's result, so it suggests, it does not decide. Writes followup.csv and followup.md.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from dfbench.benchmark.api import metric_table

HERE = Path(__file__).resolve().parent
METRICS = ("fd_fmnist", *metric_table.independent_checks("fmnist"))  # the ranking metric and its independent checks


def setting(row: pd.Series) -> str:
    lr = row.get("param.server_lr")
    return str(row["method"]) + (f" (eta {lr:g})" if isinstance(lr, float) and math.isfinite(lr) else "")


def table(runs: pd.DataFrame) -> pd.DataFrame:
    runs = runs[runs["baseline"].astype(str).str.lower() != "true"].copy()
    runs["name"] = runs.apply(setting, axis=1)
    rows = []
    for (name, rounds), grp in runs.groupby(["name", "cfg.rounds"], sort=False):
        if name == "fedavg":
            continue
        ref = runs[(runs["method"] == "fedavg") & (runs["cfg.rounds"] == rounds)].set_index("seed")
        mine = grp.set_index("seed")
        seeds = sorted(set(mine.index) & set(ref.index))
        row = {"setting": name, "rounds": int(rounds), "seeds": len(seeds)}
        for m in METRICS:
            d = np.log(mine.loc[seeds, m].to_numpy(float)) - np.log(ref.loc[seeds, m].to_numpy(float))
            half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d)) if len(d) > 1 else math.nan
            row |= {f"{m}_ratio": math.exp(d.mean()), f"{m}_low": math.exp(d.mean() - half),
                    f"{m}_high": math.exp(d.mean() + half), f"{m}_wins": int((d < 0).sum())}
        rows.append(row)
    return pd.DataFrame(rows).sort_values(["rounds", "setting"], kind="stable").reset_index(drop=True)


def to_markdown(t: pd.DataFrame) -> str:
    lines = ["| setting | rounds | seeds | " + " | ".join(f"{m}: A / FedAvg [95% t] (seeds better)" for m in METRICS) + " |",
             "|---|---:|---:|" + "---|" * len(METRICS)]
    for _, r in t.iterrows():
        cells = [f"×{r[f'{m}_ratio']:.3f} [{r[f'{m}_low']:.3f}, {r[f'{m}_high']:.3f}] ({int(r[f'{m}_wins'])}/{int(r['seeds'])})"
                 for m in METRICS]
        lines.append(f"| {r['setting']} | {r['rounds']} | {r['seeds']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    t = table(pd.read_csv(HERE / "runs.csv"))
    t.to_csv(HERE / "followup.csv", index=False, float_format="%.6g")
    (HERE / "followup.md").write_text(
        "# confirmatory-2 follow-up (exploratory): each setting against FedAvg at the same rounds and seeds\n\n"
        + to_markdown(t) + "\nLower is better for all three metrics; no multiplicity correction and no verdicts: the "
        "grid was designed after confirmatory-2's result (followup.toml).\n", encoding="utf-8")
    print(to_markdown(t))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
