"""How many fresh seeds the claims of results/confirmatory-3 get, from the spread of paper-fmnist's runs:

    python results/confirmatory-3/sizing.py

The rules and the checks are benchmark/report/confirm_sizing.py's (as for results/confirmatory and
results/confirmatory-2): each claim keeps paper-fmnist's claim unchanged, each cell of confirmatory-3.toml is a cell of
paper-fmnist.toml but for the seed; the seeds at which the report's own test reaches power 0.8 at the exploratory
spread, at Holm's strictest level over this file's two claims (alpha = 0.05 / 2). The two claims share no setting,
so each is its own block: keep 0.75's two settings get the seeds its spread asks for, keep 0.25's theirs, and the four
share the first ones (the comparison across keep ratios is made on those). The printed lines are the table in confirmatory-3.toml's
header. Reads only committed files; trains nothing.
"""

from __future__ import annotations

from pathlib import Path

from dfbench.benchmark.api import ConfirmatoryStudy, size_confirmatory_study

STUDY = ConfirmatoryStudy(
    folder=Path(__file__).resolve().parent,
    sources={  # claim of this study -> (the exploratory study, its claim id)
        "Q-0.75": ("paper-fmnist", "C1-0.75"),
        "Q-0.25": ("paper-fmnist", "C1-0.25"),
    },
    budget_s=85 * 60,
)

if __name__ == "__main__":
    raise SystemExit(size_confirmatory_study(STUDY, "results/confirmatory-3/sizing.py"))
