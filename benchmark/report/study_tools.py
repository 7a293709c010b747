"""What a study's own script builds on (re-exported by :mod:`dfbench.benchmark.api`): reading the runs with the
metric a study compares them by (`load_study`), writing a study's table as markdown and CSV with its figure when
it has one (`write_study`), the one command line of the scripts that compare every setting with a reference
(`study_main`: --runs, --out, --reference, --metric, then `write` and the paths), and the seed-paired difference
of two settings (`seed_differences`). The study scripts themselves live in their study's folder,
results/<study>/, outside the package."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dfbench.benchmark.metrics.uncertainty import t_interval
from dfbench.benchmark.report.frames import ReportData, collect, higher_is_better, primary_metric
from dfbench.methods.registry import reference_method


@dataclass(frozen=True)
class StudyRuns:
    """The finished runs under a root (`frames.collect`) and the metric a study compares them by."""

    data: ReportData
    metric: str
    higher: bool  # the metric is better when higher


def load_study(runs_dir: str | Path, metric: str | None = None, *, reference: str | None = None,
               needs: str | None = None, missing: str | None = None) -> StudyRuns:
    """Read the runs under `runs_dir`; `metric` defaults to the report's primary one.

    A ValueError when there is nothing to compare: no run with the column `needs` (default: the
    metric; `missing`, the message then), or, with `reference`, no run of that setting."""
    data = collect(runs_dir)
    metric = metric or primary_metric(data.metrics)
    if data.runs.empty or metric is None or (needs or metric) not in data.runs:
        raise ValueError(missing or f"no scored runs under {runs_dir}; run the grid first")
    if reference is not None and not (data.runs["setting"] == reference).any():
        raise ValueError(f"no run of the reference {reference!r} under {runs_dir}; "
                         f"settings found: {', '.join(sorted(data.runs['setting'].unique()))}")
    return StudyRuns(data, metric, metric in higher_is_better(data.evaluations))


def write_study(out: str | Path, stem: str, markdown: str, table: pd.DataFrame,
                plot: Callable[[Path], Path] | None = None) -> list[Path]:
    """<out>/<stem>.md and <stem>.csv (every column of `table`), and <stem>.png drawn by `plot`; the paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    md, csv = out / f"{stem}.md", out / f"{stem}.csv"
    md.write_text(markdown)
    table.to_csv(csv, index=False)
    return [md, csv] + ([plot(out / f"{stem}.png")] if plot is not None else [])


def study_main(argv: Sequence[str] | None, prog: str, doc: str, writes: str, reference_help: str,
               write: Callable[[str, str, str, str | None], list[Path]], runs_help: str = "root of the run folders") -> int:
    """Parse the shared flags, call `write(runs, out, reference, metric)`, print each path it wrote;
    a ValueError (no runs, no reference) exits with its message. `prog`: the command as a user types it
    (``python results/cpu-compression/frontier.py``)."""
    p = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    p.add_argument("--runs", required=True, help=runs_help)
    p.add_argument("--out", required=True, help=f"folder for {writes}")
    p.add_argument("--reference", default=reference_method(), help=reference_help)
    p.add_argument("--metric", default=None, help="default: the report's primary metric")
    a = p.parse_args(argv)
    try:
        for path in write(a.runs, a.out, a.reference, a.metric):
            print(path)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    return 0


def seed_differences(values: pd.Series, reference: pd.Series) -> tuple[list, np.ndarray, float, float, float]:
    """(shared seeds, values - reference per shared seed, mean, low, high): the mean difference
    with its 95 % Student-t bounds (nan with one seed, everything empty/nan with none).
    Both series are indexed by seed."""
    seeds = sorted(set(values.index) & set(reference.index))
    diff = np.array([float(values[s]) - float(reference[s]) for s in seeds])
    if not seeds:
        return seeds, diff, math.nan, math.nan, math.nan
    mean, interval = t_interval(diff)
    low, high = (interval.low, interval.high) if interval else (math.nan, math.nan)
    return seeds, diff, mean, low, high
