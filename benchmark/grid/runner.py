"""Running a grid's cells in this process (`run_grid`): resumable, isolated, shared with peers.

The grid file and its cells: benchmark/grid/spec.py. Which cells to run and in what order (the
rerun policy, locks, cost): benchmark/grid/plan.py. Several `dfbench grid NAME --out X` processes
without --shard are cooperating workers: each takes the next cell that is neither done nor locked
by a live process, longest estimated cost first, and re-reads its state under the lock;
benchmark/grid/workers.py starts them (`--workers N`, `dfbench.run_grid(..., workers=N)`).
"""

from __future__ import annotations

import os

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from dfbench.benchmark.core import runfolder
from dfbench.benchmark.core.config import ConfigError, RunConfig
from dfbench.benchmark.core.lock import RunLock
from dfbench.benchmark.grid.plan import (STATES, cell_note, cell_state, fmt_seconds, lock_owner, select_cells, should_run,
                                         updated_after, work_order)
from dfbench.benchmark.grid.spec import Cell, Grid
from dfbench.benchmark.tracking import parse_trackers

BUSY = runfolder.RUNNING  # a cell's state when a live process other than this one holds its lock


@dataclass
class CellOutcome:
    cell: Cell
    before: str  # state when the grid started
    after: str  # state when the grid finished with it
    ran: bool
    seconds: float = 0.0
    note: str = ""  # metric, error or divergence reason
    error: bool = False  # it raised when run now


@dataclass
class GridSummary:
    grid: Grid
    outcomes: list[CellOutcome] = field(default_factory=list)
    worker_codes: list[int] = field(default_factory=list)  # exit codes of the extra worker processes (workers.py)

    def count(self, state: str) -> int:
        return sum(o.after == state for o in self.outcomes)

    @property
    def unfinished(self) -> list[CellOutcome]:
        """Cells not done and not diverged: failed now, failed before and skipped, never run, or run elsewhere."""
        return [o for o in self.outcomes if o.after not in runfolder.FINAL_STATES]

    @property
    def cells_ok(self) -> bool:
        """Nothing failed or left undone here (cells another live worker is running are its business)."""
        return all(o.after == BUSY for o in self.unfinished)

    @property
    def ok(self) -> bool:
        """`cells_ok`, and every extra worker process this grid started exited with 0."""
        return self.cells_ok and not any(self.worker_codes)

    @property
    def exit_code(self) -> int:
        """What `dfbench grid` exits with: 1 unless `cells_ok`, or the highest worker exit code if higher."""
        return max([0 if self.cells_ok else 1, *self.worker_codes])

    def refresh(self, out: str | Path) -> None:
        """Read again the cells that other workers were running (call it once they have exited)."""
        for o in self.outcomes:
            if o.after == BUSY:
                o.after = cell_state(out, o.cell)
                o.note = cell_note(out, o.cell, o.after)

    def text(self) -> str:
        counts = ", ".join(f"{self.count(s)} {s}" for s in STATES if self.count(s))
        ran = sum(o.ran for o in self.outcomes)
        lines = [f"grid {self.grid.name}: {len(self.outcomes)} cell(s) selected, {ran} run now; {counts or 'nothing selected'}"]
        for o in self.unfinished:
            hint = " (skipped; rerun with --retry-failed)" if o.after == runfolder.FAILED and not o.ran else ""
            lines.append(f"  {o.after}: {o.cell.label} [{o.cell.run_id}]{hint}: {o.note}")
        return "\n".join(lines)


    def worker_text(self) -> str:
        """An extra worker's one line: the cells it ran. It does not wait for the other workers, so the
        cells they were running would read "running" here; the first process reports every cell's end."""
        mine = [o for o in self.outcomes if o.ran]
        failed = sum(o.after != runfolder.DONE for o in mine)
        return (f"grid {self.grid.name} (extra worker, pid {os.getpid()}): {len(mine)} cell(s) run here"
                f"{f', {failed} not done' if failed else ''}; the first process reports the grid")


class _DataCache:
    """Each dataset (and data root) is loaded once per grid, not once per cell (at most three)."""

    def __init__(self, fixed: Any = None) -> None:
        self.fixed = fixed
        self.loaded: dict[tuple[str, str | None], Any] = {}

    def get(self, cfg: RunConfig) -> Any:
        if self.fixed is not None:
            return self.fixed
        key = (cfg.data.dataset, cfg.data.root)
        if key not in self.loaded:
            from dfbench import datasets

            self.loaded[key] = datasets.load(cfg.data.dataset, "train", root=cfg.data.root)
        return self.loaded[key]


def run_grid(grid: Grid, out: str | Path, *, shard: tuple[int, int] | None = None, only: Sequence[str] = (),
             retry_failed: bool = False, force: bool = False, progress: bool = True, data: Any = None,
             echo: Callable[[str], None] | None = None, download: bool = False, log: str | Sequence[str] = (),
             log_group: str | None = None) -> GridSummary:
    """Run the selected cells one after another; a failing cell is recorded and the grid goes on.

    Without `shard` this process is one of any number of workers on `out`: it takes the cells
    longest estimated cost first; with `shard`, its shard in grid order. Either way each cell's
    run lock is taken first: a cell locked by a live process is skipped (its owner runs it,
    outcome "running"), and under the lock the state is read again, so a cell another worker
    finished meanwhile is not run twice (nor one it finished or failed after this worker
    started, even with --force / --retry-failed).
    Before the first cell, `fetch.preflight` checks the inputs of the cells to run: missing data
    raises `fetch.MissingInputsError` (nothing run), or is fetched with `download`.
    `data`: one ImageSet used for every cell (tests); by default each dataset is loaded once.
    `echo`: where the one-line summaries go (default: stdout, above the progress bars).
    `log`: experiment trackers for every cell run now (benchmark/tracking/), grouped under
    `log_group` (default: the grid's name).
    """
    trackers = parse_trackers(log)  # an unknown name: refused before any cell
    started = time.time()
    cells = select_cells(grid.cells, shard=shard, only=only)
    _check_devices(cells)
    summary = GridSummary(grid)
    todo: list[tuple[Cell, str]] = []
    for c in cells:
        state = cell_state(out, c)
        if should_run(state, retry_failed=retry_failed, force=force):
            todo.append((c, state))
        else:
            summary.outcomes.append(CellOutcome(c, state, state, ran=False, note=cell_note(out, c, state)))
    from dfbench.benchmark.grid.fetch import preflight

    preflight([c.cfg for c, _ in todo], download=download, check_data=data is None, progress=progress)
    if shard is None:
        before = {c.index: s for c, s in todo}
        todo = [(c, before[c.index]) for c in work_order([c for c, _ in todo])]
    bar = _bar(todo, progress, f"grid {grid.name}")
    say = echo or (_tqdm_write if progress else print)
    cache = _DataCache(data)
    for j, (cell, before_state) in enumerate(bar, 1):
        o = _run_cell(cell, before_state, out, cache, started=started, retry_failed=retry_failed, force=force, progress=progress,
                      log=trackers, log_group=log_group or grid.name)
        summary.outcomes.append(o)
        where = f"  (traceback: {cell.folder(out) / runfolder.STATUS})" if o.error and cell.folder(out).exists() else ""
        verb = o.after if o.ran else "busy" if o.after == BUSY else "skip"
        say(f"[{j}/{len(todo)}] {verb:<8} {cell.label}  {o.note}  {fmt_seconds(o.seconds)}{where}")
    if any(o.ran for o in summary.outcomes):
        # A cell evaluated before its dense reference finished (another worker's cell) has no drift
        # yet: whichever worker ends last records it in drift.json (each run under its lock;
        # metrics.json stays what the evaluation wrote), so the run folders hold the same numbers
        # whatever the workers' timing, and the reporter only reads.
        from dfbench.benchmark.metrics.drift import record_missing_drift

        written = record_missing_drift([c.folder(out) for c in grid.cells], device=cells[0].cfg.device if cells else "cpu")
        if written:
            say(f"drift recorded (drift.json) for {len(written)} run(s) evaluated before their dense reference was done")
    summary.outcomes.sort(key=lambda o: o.cell.index)
    return summary


def _run_cell(cell: Cell, before: str, out: str | Path, cache: _DataCache, *, started: float, retry_failed: bool,
              force: bool, progress: bool, log: Sequence[str] = (), log_group: str | None = None) -> CellOutcome:
    """Lock the cell, re-check it under the lock, run it if it is still to run; the lock is always released."""
    from dfbench.benchmark.engine import lifecycle

    lk = RunLock(cell.folder(out))
    if not lk.try_acquire():
        return CellOutcome(cell, before, BUSY, ran=False, note=f"locked by {lock_owner(out, cell)[0] or 'another process'}")
    try:
        state = cell_state(out, cell)
        finished_by_peer = state in (runfolder.FAILED, *runfolder.FINAL_STATES) and updated_after(out, cell, started)
        if finished_by_peer or not should_run(state, retry_failed=retry_failed, force=force):
            return CellOutcome(cell, before, state, ran=False, note=cell_note(out, cell, state))
        t0 = time.perf_counter()
        error = ""
        try:
            lifecycle.run(cell.cfg, out, force=force, progress=progress, data=cache.get(cell.cfg), lock=lk, log=log,
                          log_group=log_group)
        except Exception as err:  # noqa: BLE001 - isolate the cell: record it, go on with the grid
            error = f"{type(err).__name__}: {err}".splitlines()[0]
        seconds = time.perf_counter() - t0
        if error:  # the exception is gone now, and with its traceback the failed cell's tensors:
            lifecycle.free_gpu_memory()  # give their GPU memory back before the next cell (after an OOM)
    finally:
        lk.release()
    after = cell_state(out, cell)
    if error and after != runfolder.FAILED:
        after = runfolder.FAILED  # it failed before its folder (and status) existed
    return CellOutcome(cell, before, after, ran=True, seconds=seconds, note=error or cell_note(out, cell, after), error=bool(error))


def _check_devices(cells: Sequence[Cell]) -> None:
    """A missing GPU is the machine's fault, not the cells': refuse before any of them fails for it."""
    wanted = sorted({c.cfg.device for c in cells if c.cfg.device.startswith("cuda")})
    if wanted:
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"invalid value for 'device': {wanted[0]!r}; allowed: cpu (no CUDA device is visible to this process)")
        from dfbench.benchmark.engine.evaluate import check_device

        for device in wanted:  # cuda:3 on a 2-GPU machine: "invalid device ordinal" in every cell otherwise
            check_device(device, fix="pass --device cuda or one of them")


def _bar(items: Iterable[Any], enabled: bool, desc: str) -> Iterable[Any]:
    if not enabled:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, unit="cell", dynamic_ncols=True, position=0)


def _tqdm_write(line: str) -> None:
    from tqdm.auto import tqdm

    tqdm.write(line, file=sys.stdout)
