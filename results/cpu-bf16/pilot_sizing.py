"""How many seeds the bf16 study needs, from its pilot (seeds 201-203, used for nothing else):

    python results/cpu-bf16/pilot_sizing.py

reads results/cpu-bf16/pilot/runs.csv (`dfbench report --runs results/cpu-bf16/pilot/runs --out
results/cpu-bf16/pilot`) and writes pilot/sizing.md: per metric, the pilot's paired log-ratios
bf16 / float32, their mean and standard deviation, and the fewest seeds n at which a TOST within
+-5 % would decide at that spread, with Holm's strictest level over the study's three claims
(alpha = 0.05 / 3): t(1 - alpha, n - 1) * sd / sqrt(n) <= log(1.05) - |mean| (the upper bound, the
tighter of log(0.95)..log(1.05) on the side of a positive mean). The study's seed count (10, in
cpu-bf16.toml) was chosen from this table with room for a pilot that underestimates the spread.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

HERE = Path(__file__).resolve().parent
METRICS = ("fd_fmnist", "fd_fmnist_ae", "denoise_loss")
MARGIN = 0.05
ALPHA = 0.05 / 3


def seeds_needed(mean: float, sd: float, margin: float = MARGIN, alpha: float = ALPHA, most: int = 200) -> int | None:
    """The fewest pairs n >= 2 at which the TOST's wider one-sided test passes at this mean and spread."""
    room = min(math.log1p(margin) - mean, mean - math.log1p(-margin))
    if room <= 0:
        return None
    for n in range(2, most + 1):
        if stats.t.ppf(1 - alpha, n - 1) * sd / math.sqrt(n) <= room:
            return n
    return None


def sizing(runs: pd.DataFrame) -> str:
    lines = ["| metric | pilot seeds | log-ratios bf16 / float32 | mean | sd | seeds needed (Holm, +-5 %) |",
             "|---|---:|---|---:|---:|---:|"]
    amp = runs["cfg.amp"]
    for metric in METRICS:
        a = runs[amp == "bf16"].set_index("seed")[metric]
        b = runs[amp == "off"].set_index("seed")[metric]
        seeds = sorted(set(a.index) & set(b.index))
        logr = np.log(a.loc[seeds].to_numpy(float) / b.loc[seeds].to_numpy(float))
        mean, sd = float(logr.mean()), float(logr.std(ddof=1))
        need = seeds_needed(mean, sd)
        lines.append(f"| {metric} | {len(seeds)} | {', '.join(f'{x:+.4f}' for x in logr)} | {mean:+.4f} | {sd:.4f} | "
                     f"{need if need is not None else 'not at this mean'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    runs = pd.read_csv(HERE / "pilot" / "runs.csv")
    text = sizing(runs)
    (HERE / "pilot" / "sizing.md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
