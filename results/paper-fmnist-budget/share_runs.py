"""Copy another study's finished run folders that are cells of a grid, so the grid does not train them again.

    python results/paper-fmnist-budget/share_runs.py --grid results/paper-fmnist-budget/paper-fmnist-budget.toml \
        --from results/paper-fmnist/runs --to results/paper-fmnist-budget/runs

A run id is the hash of everything that decides a result (benchmark/core/schema.py), so a finished run
of another study with the id of one of the grid's cells *is* that cell: it is copied (its whole folder,
checkpoints included) into the grid's layout. A cell already present under --to is left alone; runs
that are not finished (status.json other than done) are not copied. Prints what it copied.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from dfbench.benchmark.api import iter_runs, load_grid, runfolder


def share(grid: str, source: str | Path, target: str | Path) -> list[Path]:
    """Copy the finished runs under `source` whose run id is a cell of `grid` to the cell's folder under
    `target`; the folders written."""
    cells = {c.run_id: c for c in load_grid(grid).cells}
    copied = []
    for found in iter_runs(source):
        run, cell = found.path, cells.get(found.run_id)
        if cell is None or found.state() != runfolder.DONE:
            continue
        dest = cell.folder(target)
        if dest.exists():
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.copytree(run, tmp, ignore=shutil.ignore_patterns(runfolder.LOCK))
        tmp.rename(dest)  # whole or not at all
        copied.append(dest)
    return copied


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python results/paper-fmnist-budget/share_runs.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--grid", required=True, help="the grid whose cells are looked for (a shipped name or a .toml path)")
    p.add_argument("--from", dest="source", required=True, help="the other study's runs root")
    p.add_argument("--to", dest="target", required=True, help="the grid's runs root (its --out)")
    a = p.parse_args(argv)
    try:
        copied = share(a.grid, a.source, a.target)
    except FileNotFoundError as err:
        print(f"share_runs: {err}", file=sys.stderr)
        return 2
    for path in copied:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
