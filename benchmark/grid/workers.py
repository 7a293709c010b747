"""A grid run by N cooperating processes on this machine: `dfbench grid --workers N`, `dfbench.run_grid(workers=N)`.

`run_with_workers` checks the selected cells' inputs once (fetching them with `download`),
starts N-1 more `dfbench grid` processes on the same grid file, overrides, selection and --out
(quiet, without --download), then works too; the cells are shared through their run locks
(benchmark/grid/runner.py), longest estimated cost first. Unless OMP_NUM_THREADS is set, every
process gets cores/N torch threads (this one included): CPU results depend on the thread count,
so pin OMP_NUM_THREADS for numbers you want to reproduce. The summary it returns reads again,
once they have exited, the cells the other workers ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from dfbench.benchmark.core.config import ConfigError, parse_value
from dfbench.benchmark.grid.plan import select_cells
from dfbench.benchmark.grid.runner import GridSummary, run_grid
from dfbench.benchmark.grid.spec import Grid


def set_text(value: Any) -> str:
    """`value` as the VALUE of `--set KEY=VALUE`: text that `parse_value` reads back as `value`."""
    if isinstance(value, str):
        parsed = parse_value(value)
        if isinstance(parsed, str) and parsed == value:
            return value
    return json.dumps(value)  # numbers, booleans, null, and strings that would parse as one of them


def worker_argv(grid: Grid, out: str | Path, *, only: Sequence[str] = (), retry_failed: bool = False) -> list[str]:
    """The `dfbench grid` arguments of one extra worker: the same grid file, overrides (`grid.extra`),
    --only and --out, quiet; never --workers, --shard, --force or --download (the first process fetched)."""
    if not Path(grid.source).is_file():
        raise ConfigError(f"grid workers read the grid from its file; {grid.source!r} is not one "
                          "(load the grid with load_grid, or run it with workers=1)")
    argv = ["grid", grid.source, "--out", str(out)]
    for pattern in only:
        argv += ["--only", pattern]
    for key, value in grid.extra:
        argv += ["--device", str(value)] if key == "device" else ["--set", f"{key}={set_text(value)}"]
    return argv + (["--retry-failed"] if retry_failed else []) + ["--no-progress"]


def worker_command(argv: list[str]) -> list[str]:
    """The command line of one extra worker process (tests swap in an instrumented one)."""
    return [sys.executable, "-m", "dfbench", *argv]


def worker_env(workers: int) -> dict[str, str]:
    """The extra workers' environment: unless OMP_NUM_THREADS is set, cores/N threads each (and
    this process's torch threads set to the same); idle OpenMP threads sleep instead of spinning."""
    env = dict(os.environ)
    if "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))
        import torch

        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def run_with_workers(grid: Grid, out: str | Path, *, workers: int = 1, shard: tuple[int, int] | None = None,
                     only: Sequence[str] = (), retry_failed: bool = False, force: bool = False, progress: bool = True,
                     download: bool = False, data: Any = None, echo: Callable[[str], None] | None = None) -> GridSummary:
    """Run the grid's selected cells in `workers` processes (this one and workers-1 more); see the module docstring.

    With `workers=1` it is `run_grid` in this process. More workers share the cells by locking
    them, so `shard` and `force` are refused (run --force alone: one process deletes the cells,
    then start the workers), and so is `data` (the other processes load the datasets themselves).
    Missing inputs raise `fetch.MissingInputsError` before any worker starts. `summary.worker_codes`
    holds the other workers' exit codes; `summary.ok` is False unless every one is 0.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"invalid value for '--workers': {workers}; allowed: an integer >= 1")
    if workers == 1:
        return run_grid(grid, out, shard=shard, only=only, retry_failed=retry_failed, force=force, progress=progress,
                        download=download, data=data, echo=echo)
    if shard is not None or force:
        raise ConfigError("--workers shares the cells by locking them: drop --shard, and run --force alone "
                          "(one process deletes the cells, then start the workers)")
    if data is not None:
        raise ConfigError("--workers: the other worker processes load their datasets themselves; pass data only with one worker")
    from dfbench.benchmark.grid.fetch import preflight

    argv = worker_command(worker_argv(grid, out, only=only, retry_failed=retry_failed))
    # once, before any worker starts: missing inputs stop (or, with download, are fetched) here
    preflight([c.cfg for c in select_cells(grid.cells, only=only)], download=download, check_data=True, progress=progress)
    env = worker_env(workers)
    procs = [subprocess.Popen(argv, env=env) for _ in range(workers - 1)]
    print(f"dfbench grid: {workers} workers on {out} (pids {os.getpid()} "
          f"{' '.join(str(p.pid) for p in procs)}; OMP_NUM_THREADS={env['OMP_NUM_THREADS']})", file=sys.stderr)
    try:
        summary = run_grid(grid, out, only=only, retry_failed=retry_failed, progress=progress, echo=echo)
    finally:
        codes = [p.wait() for p in procs]
    summary.worker_codes = codes
    summary.refresh(out)  # the cells the other workers ran are finished now: report their end state
    return summary
