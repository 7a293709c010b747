"""How many fresh seeds each claim of results/confirmatory-2 gets, from the spread of the exploratory study it
re-decides:

    python results/confirmatory-2/sizing.py

The rules and the checks are benchmark/report/confirm_sizing.py's (those results/confirmatory was sized by): each
claim keeps its source claim's settings, metric, expectation, bound and margin; each cell of confirmatory-2.toml is,
key for key, a cell of its source grid but for the seed and the metrics it records (the recipe cells record every
metric, where cpu-recipe's recorded fd_fmnist alone); the seeds at which the report's own test of a claim reaches
power 0.8 at the exploratory spread, at Holm's strictest level over this file's six claims (alpha = 0.05 / 6). The
five server-optimizer and SCAFFOLD claims share their FedAvg and form one block (six settings on the same seeds);
the recipe claim is the other. The printed lines are the table in confirmatory-2.toml's header. Reads only
committed files; trains nothing.
"""

from __future__ import annotations

from pathlib import Path

from dfbench.benchmark.api import ConfirmatoryStudy, size_confirmatory_study

STUDY = ConfirmatoryStudy(
    folder=Path(__file__).resolve().parent,
    sources={  # claim of this study -> (the exploratory study, its claim id)
        "S-fedavgm-0.1": ("cpu-aggregation", "fedavgm-0.1"),
        "S-fedyogi-0.1": ("cpu-aggregation", "fedyogi-0.1"),
        "S-fedadam-0.1": ("cpu-aggregation", "fedadam-0.1"),
        "S-fedadagrad-0.1": ("cpu-aggregation", "fedadagrad-0.1"),
        "S-scaffold-0.1": ("cpu-aggregation", "scaffold-0.1"),
        "S-recipe": ("cpu-recipe", "R2-combined"),
    },
    confidence=None,  # sized at the exploratory sample sd, before the upper-bound rule (issue 62): kept to reproduce it
    budget_s=50 * 60,
)

if __name__ == "__main__":
    raise SystemExit(size_confirmatory_study(STUDY, "results/confirmatory-2/sizing.py"))
