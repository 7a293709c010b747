"""How many of a committed page's scores a fresh run of the same grid equals (`make demo`'s last line).

    python results/demo/reproduce.py FRESH_DIR REFERENCE_DIR

Both folders hold a report's `runs.csv` (one row per run, `dfbench report` writes it) and the run
folders under `runs/`. Runs are matched by run id (the id is a hash of the config, so the same
grid cell has the same id on any machine); every score column of the reference (a column with
`__lo` / `__hi` interval companions, e.g. `fd_fmnist`) is compared exactly, as written. The line
says how many scores are equal, the largest difference where one is not, and which machines made
the two runs: on another CPU the kernels round differently and training amplifies it, so a
difference is reported, never an error. Exit status: 0, or 1 when a reference run has no fresh run
(the grid did not finish) or a folder has no runs.csv.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dfbench.benchmark.api import iter_runs


@dataclass(frozen=True)
class Reproduction:
    """What `compare` found: scores compared and equal, runs missing, the largest difference."""

    compared: int
    equal: int
    close: int  # of them equal to CLOSE (relative): the last digits of float64 linear algebra, not training
    missing_runs: tuple[str, ...]
    worst: tuple[str, str, float, float] | None  # (setting, metric, reference, fresh) of the largest relative difference
    primary: str | None  # the page's ranking metric (leaderboard.csv `primary_metric`), None without one
    primary_worst: tuple[str, str, float, float] | None  # the largest difference of the ranking metric
    reference_machines: tuple[str, ...]
    fresh_machines: tuple[str, ...]


def score_columns(frame: pd.DataFrame) -> list[str]:
    """The score columns of a runs.csv: those written with their interval (`X__lo`, `X__hi`)."""
    return [c for c in frame.columns if f"{c}__lo" in frame.columns and f"{c}__hi" in frame.columns]


CLOSE = 1e-6


def _relative(a: float, b: float) -> float:
    """|b - a| / |a| (inf where one is missing or a is 0 and b is not)."""
    if a == b:
        return 0.0
    if math.isnan(a) or math.isnan(b) or a == 0.0:
        return math.inf
    return abs(b - a) / abs(a)


def machines(runs_dir: Path) -> tuple[str, ...]:
    """The distinct `environment.hardware` records of the run folders under `runs_dir` (sorted)."""
    found: set[str] = set()
    if not runs_dir.is_dir():
        return ()  # a study copied without its run folders names no machine
    for run in iter_runs(runs_dir):
        try:
            hardware = (run.metrics() or {}).get("environment", {}).get("hardware")
        except (OSError, ValueError):
            continue  # an unreadable record names no machine; the scores are compared from runs.csv
        if hardware:
            found.add(str(hardware))
    return tuple(sorted(found))


@dataclass
class _Tally:
    compared: int = 0
    equal: int = 0
    close: int = 0
    worst: tuple[str, str, float, float] | None = None
    worst_rel: float = -1.0

    def add(self, setting: str, column: str, a: float, b: float) -> None:
        rel = _relative(a, b)
        self.compared += 1
        self.equal += rel == 0.0
        self.close += rel <= CLOSE
        if rel > 0.0 and rel > self.worst_rel:
            self.worst_rel, self.worst = rel, (setting, column, a, b)


def compare(fresh: pd.DataFrame, reference: pd.DataFrame, primary: str | None = None
            ) -> tuple[_Tally, _Tally, tuple[str, ...]]:
    """(every score, the `primary` metric's scores, reference runs with no fresh row) of two runs.csv tables."""
    fresh_by_id = fresh.set_index("run_id")
    columns = [c for c in score_columns(reference) if c in fresh.columns]
    every, ranking, missing = _Tally(), _Tally(), []
    for _, ref in reference.iterrows():
        if ref["run_id"] not in fresh_by_id.index:
            missing.append(f"{ref['setting']} ({ref['run_id']})")
            continue
        new = fresh_by_id.loc[ref["run_id"]]
        for column in columns:
            a, b = float(ref[column]), float(new[column])
            if math.isnan(a) and math.isnan(b):
                continue  # a metric neither run has (not applicable to this method)
            every.add(str(ref["setting"]), column, a, b)
            if column == primary:
                ranking.add(str(ref["setting"]), column, a, b)
    return every, ranking, tuple(missing)


def primary_metric(folder: Path) -> str | None:
    """The ranking metric of the page in `folder` (its leaderboard.csv), or None."""
    path = folder / "leaderboard.csv"
    if not path.is_file():
        return None
    column = pd.read_csv(path, usecols=lambda c: c == "primary_metric")
    return str(column["primary_metric"].dropna().iloc[0]) if "primary_metric" in column and column["primary_metric"].notna().any() else None


def reproduce(fresh_dir: Path, reference_dir: Path) -> Reproduction:
    """Compare `fresh_dir`/runs.csv with `reference_dir`/runs.csv (FileNotFoundError when one is missing)."""
    tables = []
    for folder in (fresh_dir, reference_dir):
        path = folder / "runs.csv"
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist: run `dfbench report --runs {folder / 'runs'} --out {folder}` first")
        tables.append(pd.read_csv(path))
    primary = primary_metric(reference_dir)
    every, ranking, missing = compare(*tables, primary=primary)
    return Reproduction(every.compared, every.equal, every.close, missing, every.worst, primary, ranking.worst,
                        machines(reference_dir / "runs"), machines(fresh_dir / "runs"))


def _difference(worst: tuple[str, str, float, float]) -> str:
    setting, metric, a, b = worst
    change = f" ({(b - a) / a:+.2%})" if a and not math.isnan(a) and not math.isnan(b) else ""
    return f"{metric} of {setting}: {a:.7g} committed, {b:.7g} now{change}"


def describe(r: Reproduction, reference_dir: Path) -> str:
    """The reproduction line(s) a user reads at the end of `make demo`."""
    if r.equal == r.compared:
        lines = [f"reproduction: all {r.compared} scores equal the committed page's ({reference_dir}/runs.csv) bit for bit"]
    else:
        lines = [f"reproduction: of the committed page's {r.compared} scores ({reference_dir}/runs.csv), {r.equal} are "
                 f"equal bit for bit and {r.close} to {CLOSE:g} (relative; the rest differ more)"]
        if r.primary_worst is not None:
            lines.append(f"  largest difference in the ranking metric: {_difference(r.primary_worst)}")
        if r.worst is not None and r.worst != r.primary_worst:
            lines.append(f"  largest difference in any score: {_difference(r.worst)}")
    if r.missing_runs:
        lines.append(f"  {len(r.missing_runs)} committed run(s) have no fresh run: {', '.join(r.missing_runs)}")
    ref_m, new_m = ", ".join(r.reference_machines) or "unrecorded", ", ".join(r.fresh_machines) or "unrecorded"
    if r.equal < r.compared:
        if set(r.reference_machines) != set(r.fresh_machines):
            lines.append(f"  the committed page was made on {ref_m}; this run on {new_m}: another CPU's kernels round "
                         "differently and training amplifies it, so compare scores from one machine only")
        else:
            lines.append(f"  both on {new_m}: the same machine type should give the same scores; "
                         "please report this difference with both runs.csv files")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python results/demo/reproduce.py", description=__doc__.split("\n")[0])
    p.add_argument("fresh", type=Path, help="the fresh report's folder (runs.csv, runs/), e.g. results/demo")
    p.add_argument("reference", type=Path, help="the committed reference's folder, e.g. results/demo/reference")
    args = p.parse_args(argv)
    try:
        r = reproduce(args.fresh, args.reference)
    except FileNotFoundError as err:
        print(f"reproduction: {err}", file=sys.stderr)
        return 1
    print(describe(r, args.reference))
    return 1 if r.missing_runs else 0


if __name__ == "__main__":
    raise SystemExit(main())
