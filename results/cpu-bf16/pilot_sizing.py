"""How many seeds the bf16 study needs, from its pilot (seeds 201-203, used for nothing else):

    python results/cpu-bf16/pilot_sizing.py

reads results/cpu-bf16/pilot/runs.csv (`dfbench report --runs results/cpu-bf16/pilot/runs --out
results/cpu-bf16/pilot`) and writes pilot/sizing.md: per metric, the pilot's paired log-ratios
bf16 / float32, their mean and standard deviation, that sd's one-sided 80 % upper confidence bound,
and the seeds the report's test of a +-5 % equivalence claim needs (`verdicts.seeds_needed`, the
suite's one sizing rule: power 0.8 with the pilot's mean and the sd's upper bound as the truth) at
Holm's strictest level over the study's three claims (alpha = 0.05 / 3).

The study's seed count (10, in cpu-bf16.toml) was chosen before that rule, from the fewest seeds at
which the TOST would pass at the pilot's mean and sample sd (6, 3 and 2), with room for a pilot that
underestimates the spread; the README says what the rule gives now.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dfbench.benchmark.api import claims
from dfbench.benchmark.api import verdicts as V

HERE = Path(__file__).resolve().parent
METRICS = claims.quality_metrics("fd_fmnist", "fmnist")  # the ranking metric and its independent checks (metrics/table.py)
MARGIN = 0.05
ALPHA = V.ALPHA / 3


def sizing(runs: pd.DataFrame) -> str:
    lines = [f"| metric | pilot seeds | log-ratios bf16 / float32 | mean | sd | sd's {V.SIZING_CONFIDENCE:.0%} upper bound | "
             f"seeds needed (power {V.POWER}, Holm, +-5 %) |",
             "|---|---:|---|---:|---:|---:|---:|"]
    amp = runs["cfg.amp"]
    for metric in METRICS:
        a = runs[amp == "bf16"].set_index("seed")[metric]
        b = runs[amp == "off"].set_index("seed")[metric]
        seeds = sorted(set(a.index) & set(b.index))
        logr = np.log(a.loc[seeds].to_numpy(float) / b.loc[seeds].to_numpy(float))
        mean, sd = float(logr.mean()), float(logr.std(ddof=1))
        need = V.seeds_needed(mean, sd, len(seeds), V.equivalence_bounds("log", MARGIN, 1.0), ALPHA)
        lines.append(f"| {metric} | {len(seeds)} | {', '.join(f'{x:+.4f}' for x in logr)} | {mean:+.4f} | {sd:.4f} | "
                     f"{V.sd_upper_bound(sd, len(seeds)):.4f} | {need if need is not None else 'out of reach'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    runs = pd.read_csv(HERE / "pilot" / "runs.csv")
    text = sizing(runs)
    (HERE / "pilot" / "sizing.md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
