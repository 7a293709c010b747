"""A study's training speed per setting from its run folders: speed.csv and speed.md in the study folder.

    python scripts/speed.py results/cpu-privacy

The table and what it counts: `dfbench.benchmark.api.speed_table` and `write_speed_table` (benchmark/report/speed.py). Several
studies' make targets run it, so it is a shared script here rather than one study's own.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dfbench.benchmark.api import write_speed_table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/speed.py", description=__doc__.split("\n")[0])
    ap.add_argument("study", type=Path, help="the study folder holding runs.csv and runs/ (results/cpu-privacy)")
    args = ap.parse_args(argv)
    try:
        table = write_speed_table(args.study)
    except (FileNotFoundError, ValueError) as err:
        print(f"speed: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.study}/speed.csv and speed.md ({len(table)} settings)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
