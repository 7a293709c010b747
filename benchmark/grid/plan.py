"""What a grid run would do: selection, cell states and locks, the rerun policy, cost, the dry-run listing.

Selection: `--only PATTERN` (repeatable; any may match) is a glob over
"dataset/partition/method/seed" (method with or without its "?k=v" parameters, e.g.
"cifar10/dirichlet:0.1/*/0"), the run id, or the run folder path below --out. `--shard I/N`
then takes every N-th of the remaining cells starting at I (0-based), so N array jobs with
I = 0..N-1 cover the grid exactly once. Without --shard, every worker started on the same
--out takes the selection in `work_order` (longest estimated cost first) and skips cells
another live process has locked (benchmark/core/lock.py), so several workers balance themselves.

What a (re)run does with each selected cell, by the state of its run folder:

    missing     no folder or no status.json            run
    unfinished  status "running" (killed, preempted)   run: resumes from its newest checkpoint
                or "interrupted" (SIGTERM)
    failed      status "failed" (an exception)         skipped and listed; --retry-failed reruns it
                                                       (resuming from its newest checkpoint)
    diverged    status "diverged"                      skipped: it is a result, and the same config
                                                       diverges again; --force reruns it
    done        status "done"                          skipped; --force deletes it and reruns it

and whatever the state, a cell whose folder is locked by a live process is busy: skipped by
this worker (the owner finishes it). Failed cells are not retried by default so that a
deterministic failure (a bug, an impossible partition) does not cost every rerun of an array
job its time again. A cell that fails before its run folder exists (e.g. its dataset cannot
be loaded) has no status and counts as missing, so a rerun tries it again.
"""

from __future__ import annotations

import datetime
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from dfbench.benchmark.core import presets, runfolder
from dfbench.benchmark.core.config import ConfigError, RunConfig
from dfbench.benchmark.core.lock import read_lock
from dfbench.benchmark.grid.spec import Cell, Grid

# a cell's state: its run state from status.json, "missing" (no status), "unfinished" (a run
# state a rerun resumes), or "running": locked by a live process other than this one
MISSING, UNFINISHED = "missing", "unfinished"
STATES = (MISSING, UNFINISHED, runfolder.RUNNING, runfolder.FAILED, runfolder.DIVERGED, runfolder.DONE)
# one sampler network evaluation costs about this fraction of a sample-gradient evaluation (a preset's
# cost: benchmark/core/presets.py, cpu_ms_per_sample_grad)
FORWARD_FRACTION = 1 / 3


# -- selection and state ----------------------------------------------------------------------

def parse_shard(text: str) -> tuple[int, int]:
    """'I/N' -> (I, N): this process takes cells I, I+N, I+2N, ... (0-based) of the selection."""
    try:
        i_s, n_s = text.split("/")
        i, n = int(i_s), int(n_s)
    except ValueError:
        i, n = -1, 0
    if not (n >= 1 and 0 <= i < n):
        raise ConfigError(f"invalid value for '--shard': {text!r}; allowed: I/N with 0 <= I < N, e.g. 0/4 (0-based)")
    return i, n


def select_cells(cells: Sequence[Cell], *, shard: tuple[int, int] | None = None, only: Sequence[str] = ()) -> list[Cell]:
    """Filter by --only globs (any may match), then take shard I/N of what is left (round-robin).

    Round-robin keeps shards balanced: neighbouring cells usually differ only in the last axis.
    """
    chosen = [c for c in cells if not only or any(c.matches(p) for p in only)]
    if only and not chosen:
        sample = ", ".join(c.label for c in cells[:3])
        raise ConfigError(f"--only {' '.join(map(repr, only))} matches no cell; patterns are globs over "
                          f"dataset/partition/method/seed (e.g. {sample}), the run id or the run folder path")
    if shard is not None:
        i, n = shard
        chosen = chosen[i::n]
    return chosen


def cell_state(out: str | Path, cell: Cell) -> str:
    """missing | unfinished | failed | diverged | done, from the cell's status.json (a final state whose files
    do not parse is unfinished: runfolder.damaged; the run starts it over)."""
    if runfolder.damaged(cell.folder(out)):
        return UNFINISHED
    status = runfolder.read_status(cell.folder(out))
    if status is None:
        return MISSING
    state = status.get("state")
    return UNFINISHED if state in (runfolder.RUNNING, runfolder.INTERRUPTED) else str(state)


def should_run(state: str, *, retry_failed: bool = False, force: bool = False) -> bool:
    """The rerun policy (see the module docstring)."""
    if force:
        return True
    if state == runfolder.FAILED:
        return retry_failed
    return state in (MISSING, UNFINISHED)




def lock_owner(out: str | Path, cell: Cell) -> tuple[str, bool]:
    """(who holds the cell's lock, whether that owner is alive); ("", False) when unlocked."""
    info = read_lock(cell.folder(out))
    if info is None:
        return "", False
    reason = info.stale_reason()
    beat = f"heartbeat {max(0.0, time.time() - info.heartbeat):.0f}s ago"
    if reason is None:
        return f"{info.host}:{info.pid} since {info.since} ({beat})", True
    return f"stale ({reason}): {info.host}:{info.pid}", False


def work_order(cells: Sequence[Cell]) -> list[Cell]:
    """Longest estimated cost first (ties in grid order): the classic greedy balance for workers
    that each take the next free cell, so no long cell starts last."""
    return sorted(cells, key=lambda c: (-estimate_cost(c.cfg).cpu_seconds, c.index))


def updated_after(out: str | Path, cell: Cell, since: float) -> bool:
    """Whether the cell's status.json was written after `since` (epoch s; the writer's clock, so
    nodes' clocks must agree, as NTP keeps them): a cell a peer worker finished or failed since."""
    status = runfolder.read_status(cell.folder(out)) or {}
    if isinstance(status.get("updated_epoch"), (int, float)):
        return float(status["updated_epoch"]) > since
    try:  # written before "updated_epoch" existed: whole seconds
        written = datetime.datetime.strptime(str(status.get("updated")), "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except ValueError:
        return False
    return written > math.floor(since)


# -- cost ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CellCost:
    sample_grads: float  # sum over rounds and clients of local steps x batch size
    eval_forwards: float  # evaluation samples x network evaluations per sample
    cpu_seconds: float  # rough: see presets.ModelPreset.cpu_ms_per_sample_grad


def estimate_cost(cfg: RunConfig) -> CellCost:
    """Expected work of one run from its config alone (method extras such as a router not included)."""
    from dfbench.benchmark.engine.diffusion import default_sampler
    from dfbench.benchmark.engine.model import resolve_preset

    n, t, s = cfg.data.clients, cfg.train, cfg.system
    if t.driver == "fedbuff":  # a server step applies `buffer` reports (0 = concurrency, 0 = every client)
        per_round = float(t.buffer or t.concurrency or n)
    else:
        # as sample_round_clients (poisson: participation * n expected)
        per_round = (s.participation * n if s.sampling == "poisson" else max(1, int(round(s.participation * n)))) * (1 - s.dropout)
        if s.deadline > 0:  # clients whose full-model compute alone misses the deadline are not trained
            from dfbench.benchmark.engine.clock import build_clock

            clock = build_clock(n, s, cfg.seed)
            on_time = sum(clock.compute_seconds(k, t.local_steps, t.batch_size, 1.0) <= s.deadline for k in range(n))
            per_round *= on_time / n
    if s.edges:  # edge servers: a cloud round (train.rounds counts them) trains edge_rounds rounds of clients
        per_round *= s.edge_rounds
    slow = int(round(s.stragglers * n))
    mean_steps = ((n - slow) * t.local_steps + slow * max(1, math.ceil(s.straggler_steps * t.local_steps))) / n
    grads = t.rounds * per_round * mean_steps * t.batch_size
    sampler = cfg.eval.sampler if cfg.eval.sampler != "auto" else default_sampler(t.objective)
    nfe = cfg.eval.sampler_steps * (2 if sampler == "heun" else 1)
    forwards = cfg.eval.samples * nfe
    if cfg.eval.every > 0 and t.rounds > 0:  # quality-curve points: round 0, every `every` rounds, the last
        points = 1 + t.rounds // cfg.eval.every + (1 if t.rounds % cfg.eval.every else 0)
        forwards += points * cfg.eval.curve_samples * nfe
    ms = presets.PRESETS[resolve_preset(t.model, cfg.data.dataset)].cpu_ms_per_sample_grad
    return CellCost(grads, forwards, (grads + FORWARD_FRACTION * forwards) * ms / 1000)


def fmt_seconds(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def describe(grid: Grid, cells: Sequence[Cell], out: str | Path, *, retry_failed: bool = False, force: bool = False) -> str:
    """The dry-run listing: every selected cell, its state, its lock, what a run would do, and its cost."""
    head = ["#", "run id", "dataset", "partition", "method", "seed", "rounds", "state", "action", "sample-grads",
            "eval-NFE", "~cpu", "locked by"]
    rows, todo = [], CellCost(0, 0, 0)
    for c in cells:
        state = cell_state(out, c)
        owner, alive = lock_owner(out, c)
        go = should_run(state, retry_failed=retry_failed, force=force)
        cost = estimate_cost(c.cfg)
        if go and not alive:
            todo = CellCost(todo.sample_grads + cost.sample_grads, todo.eval_forwards + cost.eval_forwards, todo.cpu_seconds + cost.cpu_seconds)
        rows.append([str(c.index), c.run_id, c.cfg.data.dataset, c.cfg.data.partition, c.method, str(c.cfg.seed),
                     str(c.cfg.train.rounds), state, "busy" if alive else "run" if go else "skip",
                     f"{cost.sample_grads:,.0f}", f"{cost.eval_forwards:,.0f}", fmt_seconds(cost.cpu_seconds), owner or "-"])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = [f"grid {grid.name} ({grid.source}): {len(grid.cells)} cell(s), {len(cells)} selected; runs under {out}"]
    if grid.description:
        lines.append(grid.description)
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in [head, *rows]]
    n_run, n_busy = sum(r[8] == "run" for r in rows), sum(r[8] == "busy" for r in rows)
    lines.append(
        f"to run: {n_run} cell(s), {todo.sample_grads:,.0f} sample-gradient evaluations (local steps x batch size, "
        f"over rounds and clients) and {todo.eval_forwards:,.0f} network evaluations for sampling; "
        f"rough time on 2 CPU cores {fmt_seconds(todo.cpu_seconds)} (+-2x, evaluation features and method "
        f"extras not included; a GPU is far faster)")
    if n_busy:
        lines.append(f"busy: {n_busy} cell(s) locked by a live process (another worker is running them)")
    return "\n".join(lines)


def cell_note(out: str | Path, cell: Cell, state: str) -> str:
    """The one-line result of a cell: its first metric, or why it has none."""
    d = cell.folder(out)
    if state == runfolder.DONE:
        path = d / runfolder.METRICS
        metrics = runfolder.read_json(path) if path.exists() else {}
        if metrics.get("evaluation_pending"):
            return f"evaluation pending (see {runfolder.STATUS})"
        rows = metrics.get("evaluations") or []
        return ", ".join(f"{r['metric']}={r['value']:.4g}" for r in rows[:2]) or "no metric (eval.metrics=none)"
    status = runfolder.read_status(d) or {}
    return str(status.get("error", "")).splitlines()[0] if status.get("error") else ""

