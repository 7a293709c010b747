"""Each setting minus a reference (FedAvg by default), paired by seed: paired_vs_<reference>.md / .csv.

    python scripts/paired.py --runs results/cpu-aggregation/runs --out results/cpu-aggregation

What the table holds and how its verdicts are decided: `dfbench.benchmark.api.paired_table`
(benchmark/report/paired.py). Several studies' make targets run it, so it is a shared script here rather
than one study's own.
"""

from __future__ import annotations

from dfbench.benchmark.api import study_main, write_paired_table


def main(argv: list[str] | None = None) -> int:
    return study_main(argv, "python scripts/paired.py", __doc__, "paired_vs_<reference>.md/.csv",
                      "the setting every other one is compared with (default fedavg)", write_paired_table)


if __name__ == "__main__":
    raise SystemExit(main())
