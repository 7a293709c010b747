"""A grid run by N cooperating processes on this machine: `dfbench grid --workers N`, `dfbench.run_grid(workers=N)`.

`run_with_workers` checks the selected cells' inputs once (fetching them with `download`),
starts N-1 more `dfbench grid` processes on the same grid file, overrides, selection and --out
(quiet, without --download; with --plugin for each method plugin this process loaded), then works too; the cells are shared through their run locks
(benchmark/grid/runner.py), longest estimated cost first. Cells on the unindexed "cuda" are spread
over the visible GPUs: worker i (this process is worker 0) on cuda:(i mod GPUs), `worker_devices`.
Unless OMP_NUM_THREADS is set, every process gets cores/N torch threads (this one included): CPU
results depend on the thread count, so pin OMP_NUM_THREADS for numbers you want to reproduce. The
summary it returns reads again, once they have exited, the cells the other workers ran.
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
from dfbench.benchmark.tracking import parse_trackers
from dfbench.methods.plugins import child_plugin_modules


def set_text(value: Any) -> str:
    """`value` as the VALUE of `--set KEY=VALUE`: text that `parse_value` reads back as `value`."""
    if isinstance(value, str):
        parsed = parse_value(value)
        if isinstance(parsed, str) and parsed == value:
            return value
    return json.dumps(value)  # numbers, booleans, null, and strings that would parse as one of them


def worker_argv(grid: Grid, out: str | Path, *, only: Sequence[str] = (), retry_failed: bool = False,
                device: str | None = None, log: Sequence[str] = (), log_group: str | None = None,
                plugins: Sequence[str] = ()) -> list[str]:
    """The `dfbench grid` arguments of one extra worker: the same grid file, overrides (`grid.extra`),
    --only and --out, the trackers (--log, --log-group), the method plugins (--plugin, from
    `plugins.child_plugin_modules`), quiet; never --workers, --shard, --force or --download (the
    first process fetched). `device`: its --device instead of the grid's (`worker_devices`: one GPU
    of several)."""
    if not Path(grid.source).is_file():
        raise ConfigError(f"grid workers read the grid from its file; {grid.source!r} is not one "
                          "(load the grid with load_grid, or run it with workers=1)")
    argv = ["grid", grid.source, "--out", str(out)]
    for pattern in only:
        argv += ["--only", pattern]
    for key, value in grid.extra:
        if key == "device":
            argv += [] if device is not None else ["--device", str(value)]
        else:
            argv += ["--set", f"{key}={set_text(value)}"]
    if device is not None:
        argv += ["--device", device]
    if log:
        argv += ["--log", ",".join(log)]
    if log_group is not None:
        argv += ["--log-group", log_group]
    for module in plugins:
        argv += ["--plugin", module]
    return argv + (["--retry-failed"] if retry_failed else []) + ["--no-progress"]


def worker_devices(cell_devices: Sequence[str], workers: int, gpus: int) -> list[str | None]:
    """The device of each worker (0 = the calling process), None where the cells' own is kept.

    When every cell is on the unindexed "cuda" and there are `gpus` > 1, worker i computes on
    cuda:(i mod gpus); explicit cuda:K cells, CPU cells and a mix stay as the grid says (a --device
    would override them all). The index is not in the run id, so the workers still share the cells.
    """
    if gpus > 1 and cell_devices and all(d == "cuda" for d in cell_devices):
        return [f"cuda:{i % gpus}" for i in range(workers)]
    return [None] * workers


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def worker_command(argv: list[str]) -> list[str]:
    """The command line of one extra worker process (tests swap in an instrumented one)."""
    return [sys.executable, "-m", "dfbench", *argv]


#: set in the extra workers' environment (`worker_env`); `dfbench grid` then prints `GridSummary.worker_text`
WORKER_ENV = "DFBENCH_GRID_WORKER"


def worker_env(workers: int) -> dict[str, str]:
    """The extra workers' environment: unless OMP_NUM_THREADS is set, cores/N threads each (and
    this process's torch threads set to the same); idle OpenMP threads sleep instead of spinning."""
    env = dict(os.environ)
    if "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))
        import torch

        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env[WORKER_ENV] = "1"  # an extra worker prints only what it ran: the first process reports the grid
    return env


def run_with_workers(grid: Grid, out: str | Path, *, workers: int = 1, shard: tuple[int, int] | None = None,
                     only: Sequence[str] = (), retry_failed: bool = False, force: bool = False, progress: bool = True,
                     download: bool = False, data: Any = None, echo: Callable[[str], None] | None = None,
                     log: str | Sequence[str] = (), log_group: str | None = None) -> GridSummary:
    """Run the grid's selected cells in `workers` processes (this one and workers-1 more); see the module docstring.

    With `workers=1` it is `run_grid` in this process. More workers share the cells by locking
    them, so `shard` and `force` are refused (run --force alone: one process deletes the cells,
    then start the workers), and so is `data` (the other processes load the datasets themselves).
    Missing inputs raise `fetch.MissingInputsError` before any worker starts. `summary.worker_codes`
    holds the other workers' exit codes; `summary.ok` is False unless every one is 0. `log`,
    `log_group`: experiment trackers for every cell, in every worker (benchmark/tracking/).
    """
    log = parse_trackers(log)  # an unknown tracker: refused before any worker or cell
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"invalid value for '--workers': {workers}; allowed: an integer >= 1")
    if workers == 1:
        return run_grid(grid, out, shard=shard, only=only, retry_failed=retry_failed, force=force, progress=progress,
                        download=download, data=data, echo=echo, log=log, log_group=log_group)
    if shard is not None or force:
        raise ConfigError("--workers shares the cells by locking them: drop --shard, and run --force alone "
                          "(one process deletes the cells, then start the workers)")
    if data is not None:
        raise ConfigError("--workers: the other worker processes load their datasets themselves; pass data only with one worker")
    from dfbench.benchmark.grid.fetch import preflight

    selected = select_cells(grid.cells, only=only)
    # the workers load the plugins this process loaded (entry points they find themselves)
    plugins = child_plugin_modules(sorted({c.cfg.method for c in selected}))
    devices = worker_devices([c.cfg.device for c in selected], workers, _gpu_count())
    argvs = [worker_command(worker_argv(grid, out, only=only, retry_failed=retry_failed, device=dev, log=log,
                                        log_group=log_group, plugins=plugins))
             for dev in devices[1:]]
    if devices[0] is not None:  # this process on cuda:0, as its grid file read with that --device
        from dfbench.benchmark.grid.spec import load_grid

        grid = load_grid(grid.source, extra={**dict(grid.extra), "device": devices[0]})
    # once, before any worker starts: missing inputs stop (or, with download, are fetched) here
    preflight([c.cfg for c in selected], download=download, check_data=True, progress=progress)
    env = worker_env(workers)
    procs = [subprocess.Popen(argv, env=env) for argv in argvs]
    on = f"; devices {' '.join(devices)}" if devices[0] is not None else ""
    print(f"dfbench grid: {workers} workers on {out} (pids {os.getpid()} "
          f"{' '.join(str(p.pid) for p in procs)}; OMP_NUM_THREADS={env['OMP_NUM_THREADS']}{on})", file=sys.stderr)
    try:
        summary = run_grid(grid, out, only=only, retry_failed=retry_failed, progress=progress, echo=echo, log=log,
                           log_group=log_group)
    finally:
        codes = [p.wait() for p in procs]
    summary.worker_codes = codes
    summary.refresh(out)  # the cells the other workers ran are finished now: report their end state
    return summary
