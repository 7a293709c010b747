"""Grids of runs: one TOML file -> validated cells -> runs that resume, shard and survive failures.

A grid file (benchmark/grids/NAME.toml, or any path):

    name = "demo"
    description = "..."
    [base]                      # dotted RunConfig keys (see config.apply_overrides) -> value
    "train.rounds" = 5
    [axes]                      # the cartesian product of these lists, in file order
    method = ["fedavg", "fedprox?mu=0.01"]     # "name?key=value&key2=value2": hyperparameters
    "data.dataset" = ["fmnist"]
    seed = [0]
    [[cells]]                   # explicit cells appended after the product: base + this table
    method = "fedavg"
    "train.rounds" = 0          # e.g. the untrained baseline

A cell's items are merged base < (axes combination | explicit cell) < `--set`/`--device`;
"method.<hp>" items from every layer apply (so [base] "method.mu" must suit every method).
Every cell becomes a RunConfig before anything runs; all problems are reported together,
each naming the cell, the key and the allowed values (`GridError`).

Which cells a run takes, in what order, and what it does with each by the state of its
run folder (the rerun policy, locks, cost, the dry-run listing): benchmark/grid_plan.py.
Running them (`run_grid`): below. Several `dfbench grid NAME --out X` processes without
--shard are cooperating workers: each takes the next cell that is neither done nor locked
by a live process, longest estimated cost first, and re-reads its state under the lock.
"""

from __future__ import annotations

import difflib
import fnmatch
import itertools
import json
import sys
import time
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from . import results
from .config import ConfigError, RunConfig, apply_overrides, parse_value
# selection, state, cost and the dry-run listing live in grid_plan; re-exported: `grid.X` keeps working
from .grid_plan import (STATES, CellCost, cell_note, cell_state, describe, estimate_cost, fmt_seconds, lock_owner,  # noqa: F401
                        parse_shard, select_cells, should_run, updated_after, work_order)
from .lock import RunLock

GRIDS_DIR = Path(__file__).with_name("grids")
TOP_KEYS = ("name", "description", "base", "axes", "cells")
SECTIONS = ("data", "train", "system", "eval")


class GridError(ConfigError):
    """A grid file is invalid; the message lists every problem found."""


# -- cells ------------------------------------------------------------------------------------

def parse_method(spec: Any) -> tuple[str, dict[str, Any]]:
    """'fedprox?mu=0.01&x=2' -> ('fedprox', {'mu': 0.01, 'x': 2}); values parse like --set values."""
    allowed = "a method name, optionally with hyperparameters as 'name?key=value&key2=value2' (e.g. 'fedprox?mu=0.01')"
    if not isinstance(spec, str) or not spec.partition("?")[0].strip():
        raise ConfigError(f"invalid value for 'method': {spec!r}; allowed: {allowed}")
    name, _, query = spec.partition("?")
    params: dict[str, Any] = {}
    for part in query.split("&") if query else []:
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ConfigError(f"invalid value for 'method': {spec!r}; allowed: {allowed}")
        if key in params:
            raise ConfigError(f"invalid value for 'method': {spec!r}: hyperparameter {key!r} is given twice")
        params[key] = parse_value(value.strip())
    return name.strip(), params


def format_method(name: str, params: Mapping[str, Any]) -> str:
    """The inverse of `parse_method` (keys sorted): how a cell's method is shown and matched."""
    if not params:
        return name

    def text(v: Any) -> str:
        return v if isinstance(v, str) else json.dumps(v)  # json: true/false, as --set parses them

    return name + "?" + "&".join(f"{k}={text(params[k])}" for k in sorted(params))


@dataclass(frozen=True)
class Cell:
    """One run of a grid: its position in the whole grid and its validated config."""

    index: int
    cfg: RunConfig
    given: tuple[tuple[str, Any], ...] = ()  # the method hyperparameters the grid set (cfg has all, defaults filled in)

    @property
    def method(self) -> str:
        return format_method(self.cfg.method, dict(self.given))

    @property
    def label(self) -> str:
        """dataset/partition/method?params/seed: what listings show and --only matches."""
        return f"{self.cfg.data.dataset}/{self.cfg.data.partition}/{self.method}/{self.cfg.seed}"

    @property
    def run_id(self) -> str:
        return self.cfg.run_id()

    def folder(self, out: str | Path) -> Path:
        return results.run_dir(out, self.cfg)

    def matches(self, pattern: str) -> bool:
        """Glob over the label (with or without the method's parameters), the run id, or the folder path."""
        c = self.cfg
        names = (
            self.label,
            f"{c.data.dataset}/{c.data.partition}/{c.method}/{c.seed}",
            self.run_id,
            f"{c.data.dataset}/{results.slug(c.data.partition)}/{results.slug(c.method)}/{self.run_id}",
        )
        return any(fnmatch.fnmatchcase(n, pattern) for n in names)


@dataclass(frozen=True)
class Grid:
    name: str
    description: str
    source: str
    cells: tuple[Cell, ...]


def builtin_grids() -> list[str]:
    """Names of the grids shipped in benchmark/grids/."""
    return sorted(p.stem for p in GRIDS_DIR.glob("*.toml"))


def resolve_grid(name_or_path: str | Path) -> Path:
    """A path to an existing .toml file, or the name of a shipped grid (benchmark/grids/NAME.toml)."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    if p.suffix == ".toml" or len(p.parts) > 1:
        raise FileNotFoundError(f"grid file {p} does not exist")
    shipped = GRIDS_DIR / f"{name_or_path}.toml"
    if not shipped.is_file():
        raise GridError(f"unknown grid {str(name_or_path)!r}; shipped grids: {', '.join(builtin_grids()) or '(none)'}, or pass a path to a .toml file")
    return shipped


def load_grid(name_or_path: str | Path, *, extra: Mapping[str, Any] | None = None) -> Grid:
    """Read and validate a grid; `extra` dotted overrides (--set, --device) apply to every cell last."""
    path = resolve_grid(name_or_path)
    try:
        spec = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise GridError(f"{path}: not valid TOML: {err}") from None
    return parse_grid(spec, source=str(path), extra=extra)


def parse_grid(spec: Mapping[str, Any], *, source: str = "<grid>", extra: Mapping[str, Any] | None = None) -> Grid:
    """Expand and validate a parsed grid file; raises one GridError listing every problem."""
    extra = extra or {}
    # three passes, each reporting everything it finds: the file's structure; then method specs
    # and key names (each would otherwise fail every cell alike); then every cell's full config
    problems = _check_shape(spec)
    problems = problems or _check_methods(spec, extra) + _check_keys(spec, extra)
    if problems:
        raise GridError(_report(source, problems))
    layers, names = _expand(spec, extra)
    by_message: dict[str, list[str]] = {}
    cells: list[Cell] = []
    for i, (items, origin) in enumerate(zip(layers, names)):
        try:
            given = tuple((k[len("method."):], v) for k, v in items.items() if k.startswith("method."))
            cells.append(Cell(i, build_config(items), given))
        except ConfigError as err:
            by_message.setdefault(str(err), []).append(f"{origin} ({_items_label(items)})")
    problems = [f"{_cells_text(where)}: {msg}" for msg, where in by_message.items()]
    seen: dict[str, Cell] = {}
    for c in cells:
        if c.run_id in seen:
            problems.append(f"cells {seen[c.run_id].index} and {c.index} are the same run ({c.label}, run id {c.run_id}); remove one")
        seen.setdefault(c.run_id, c)
    if problems:
        raise GridError(_report(source, problems))
    if not cells:
        raise GridError(f"{source}: the grid has no cells; give an [axes] table and/or [[cells]] tables")
    return Grid(name=str(spec.get("name") or Path(source).stem), description=str(spec.get("description", "")),
                source=source, cells=tuple(cells))


def build_config(items: Mapping[str, Any]) -> RunConfig:
    """One cell's merged dotted items -> a validated RunConfig (method and its parameters last)."""
    name = items.get("method", "fedavg")
    method_items = {k: v for k, v in items.items() if k.startswith("method.")}
    other = {k: v for k, v in items.items() if k != "method" and not k.startswith("method.")}
    cfg = apply_overrides(RunConfig(), other)
    return apply_overrides(replace(cfg, method=str(name), method_params={}), method_items)


def _check_shape(spec: Mapping[str, Any]) -> list[str]:
    """The file's structure: known top-level keys, tables where tables belong, scalars as values."""
    out = []
    unknown = [k for k in spec if k not in TOP_KEYS]
    if unknown:
        out.append(f"unknown top-level key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(TOP_KEYS)}")
    for key in ("name", "description"):
        if key in spec and not isinstance(spec[key], str):
            out.append(f"'{key}' must be a string, got {spec[key]!r}")
    base = spec.get("base", {})
    if not isinstance(base, dict):
        out.append("[base] must be a table of dotted keys, e.g. \"train.rounds\" = 5")
    else:
        out += [f"[base] {k!r} = {v!r}: a single value is needed (put lists under [axes])" for k, v in base.items() if not _scalar(v)]
    axes = spec.get("axes", {})
    if not isinstance(axes, dict):
        out.append("[axes] must be a table of key = [values], e.g. seed = [0, 1, 2]")
    else:
        for k, v in axes.items():
            if not isinstance(v, list) or not v:
                out.append(f"[axes] {k!r} = {v!r}: a non-empty list of values is needed")
            elif not all(_scalar(x) for x in v):
                out.append(f"[axes] {k!r}: every value must be a single string, number or boolean")
    cells = spec.get("cells", [])
    if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells):
        out.append("cells must be an array of tables: [[cells]] followed by dotted keys")
    else:
        out += [f"[[cells]] #{j} {k!r} = {v!r}: a single value is needed" for j, c in enumerate(cells) for k, v in c.items() if not _scalar(v)]
    return out


def _check_methods(spec: Mapping[str, Any], extra: Mapping[str, Any]) -> list[str]:
    """Every 'method' spec string parses (its name and values are validated with the cells)."""
    specs = [("[base]", spec.get("base", {}).get("method")), ("--set", extra.get("method"))]
    specs += [("[axes]", m) for m in spec.get("axes", {}).get("method", [])]
    specs += [(f"[[cells]] #{j}", c.get("method")) for j, c in enumerate(spec.get("cells", []))]
    out = []
    for where, value in specs:
        if value is None:
            continue
        try:
            parse_method(value)
        except ConfigError as err:
            out.append(f"{where}: {err}")
    return out


def _scalar(v: Any) -> bool:
    return isinstance(v, (str, int, float, bool))


def valid_keys() -> list[str]:
    """Every dotted key a grid may set (method hyperparameters are 'method.<name>')."""
    default = RunConfig()
    top = [f.name for f in fields(RunConfig) if f.name not in SECTIONS and f.name != "method_params"]
    return top + [f"{s}.{f.name}" for s in SECTIONS for f in fields(type(getattr(default, s)))]


def _check_keys(spec: Mapping[str, Any], extra: Mapping[str, Any]) -> list[str]:
    """Unknown keys anywhere in the file, all at once (a typo must not wait for its cell)."""
    valid = valid_keys()
    where: dict[str, list[str]] = {}
    tables = [("[base]", spec.get("base", {})), ("[axes]", spec.get("axes", {})), ("--set", extra)]
    tables += [(f"[[cells]] #{j}", c) for j, c in enumerate(spec.get("cells", []))]
    for name, table in tables:
        for key in table:
            if key not in valid and not (key.startswith("method.") and len(key) > len("method.")):
                where.setdefault(key, []).append(name)
    out = []
    for key, places in where.items():
        close = difflib.get_close_matches(key, valid, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        out.append(f"{', '.join(places)}: unknown key {key!r}{hint}; valid keys: {', '.join(valid)}, method.<hyperparameter>")
    return out


def _layer(table: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted items with a 'method' spec split into 'method' and 'method.<hyperparameter>' items."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key == "method":
            name, params = parse_method(value)  # already checked by _check_methods
            out["method"] = name
            out.update({f"method.{k}": v for k, v in params.items()})
        else:
            out[key] = value
    return out


def _expand(spec: Mapping[str, Any], extra: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """The cells' merged items (base < axes combination or explicit cell < extra) and their names."""
    base, last = _layer(spec.get("base", {})), _layer(extra)
    axes = spec.get("axes", {})
    layers, names = [], []
    if axes:
        keys = list(axes)
        for combo in itertools.product(*(axes[k] for k in keys)):
            layers.append({**base, **_layer(dict(zip(keys, combo))), **last})
            names.append(f"cell {len(names)}")
    for j, cell in enumerate(spec.get("cells", [])):
        layers.append({**base, **_layer(cell), **last})
        names.append(f"cell {len(names)} ([[cells]] #{j})")
    return layers, names


def _items_label(items: Mapping[str, Any]) -> str:
    d = RunConfig()
    params = {k[len("method."):]: v for k, v in items.items() if k.startswith("method.")}
    method = format_method(str(items.get("method", d.method)), params)
    return f"{items.get('data.dataset', d.data.dataset)}/{items.get('data.partition', d.data.partition)}/{method}/{items.get('seed', d.seed)}"


def _cells_text(where: list[str]) -> str:
    shown = "; ".join(where[:3])
    return shown + (f"; and {len(where) - 3} more cell(s)" if len(where) > 3 else "")


def _report(source: str, problems: list[str]) -> str:
    return f"{source}: {len(problems)} problem(s), nothing was run:\n" + "\n".join(f"  - {p}" for p in problems)


# -- running --------------------------------------------------------------------------------------

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

    def count(self, state: str) -> int:
        return sum(o.after == state for o in self.outcomes)

    @property
    def unfinished(self) -> list[CellOutcome]:
        """Cells not done and not diverged: failed now, failed before and skipped, never run, or run elsewhere."""
        return [o for o in self.outcomes if o.after not in ("done", "diverged")]

    @property
    def ok(self) -> bool:
        """Nothing failed or left undone here (cells another live worker is running are its business)."""
        return all(o.after == "running" for o in self.unfinished)

    def refresh(self, out: str | Path) -> None:
        """Read again the cells that other workers were running (call it once they have exited)."""
        for o in self.outcomes:
            if o.after == "running":
                o.after = cell_state(out, o.cell)
                o.note = cell_note(out, o.cell, o.after)

    def text(self) -> str:
        counts = ", ".join(f"{self.count(s)} {s}" for s in STATES if self.count(s))
        ran = sum(o.ran for o in self.outcomes)
        lines = [f"grid {self.grid.name}: {len(self.outcomes)} cell(s) selected, {ran} run now; {counts or 'nothing selected'}"]
        for o in self.unfinished:
            hint = " (skipped; rerun with --retry-failed)" if o.after == "failed" and not o.ran else ""
            lines.append(f"  {o.after}: {o.cell.label} [{o.cell.run_id}]{hint}: {o.note}")
        return "\n".join(lines)


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
             echo: Callable[[str], None] | None = None, download: bool = False) -> GridSummary:
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
    """
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
    from .fetch import preflight

    preflight([c.cfg for c, _ in todo], download=download, check_data=data is None, progress=progress)
    if shard is None:
        before = {c.index: s for c, s in todo}
        todo = [(c, before[c.index]) for c in work_order([c for c, _ in todo])]
    bar = _bar(todo, progress, f"grid {grid.name}")
    say = echo or (_tqdm_write if progress else print)
    cache = _DataCache(data)
    for j, (cell, before_state) in enumerate(bar, 1):
        o = _run_cell(cell, before_state, out, cache, started=started, retry_failed=retry_failed, force=force, progress=progress)
        summary.outcomes.append(o)
        where = f"  (traceback: {cell.folder(out) / 'status.json'})" if o.error and cell.folder(out).exists() else ""
        verb = o.after if o.ran else "busy" if o.after == "running" else "skip"
        say(f"[{j}/{len(todo)}] {verb:<8} {cell.label}  {o.note}  {fmt_seconds(o.seconds)}{where}")
    summary.outcomes.sort(key=lambda o: o.cell.index)
    return summary


def _run_cell(cell: Cell, before: str, out: str | Path, cache: _DataCache, *, started: float, retry_failed: bool,
              force: bool, progress: bool) -> CellOutcome:
    """Lock the cell, re-check it under the lock, run it if it is still to run; the lock is always released."""
    from . import loop

    lk = RunLock(cell.folder(out))
    if not lk.try_acquire():
        return CellOutcome(cell, before, "running", ran=False, note=f"locked by {lock_owner(out, cell)[0] or 'another process'}")
    try:
        state = cell_state(out, cell)
        finished_by_peer = state in ("failed", "diverged", "done") and updated_after(out, cell, started)
        if finished_by_peer or not should_run(state, retry_failed=retry_failed, force=force):
            return CellOutcome(cell, before, state, ran=False, note=cell_note(out, cell, state))
        t0 = time.perf_counter()
        error = ""
        try:
            loop.run(cell.cfg, out, force=force, progress=progress, data=cache.get(cell.cfg), lock=lk)
        except Exception as err:  # noqa: BLE001 - isolate the cell: record it, go on with the grid
            error = f"{type(err).__name__}: {err}".splitlines()[0]
        seconds = time.perf_counter() - t0
    finally:
        lk.release()
    after = cell_state(out, cell)
    if error and after != "failed":
        after = "failed"  # it failed before its folder (and status) existed
    return CellOutcome(cell, before, after, ran=True, seconds=seconds, note=error or cell_note(out, cell, after), error=bool(error))


def _check_devices(cells: Sequence[Cell]) -> None:
    """A missing GPU is the machine's fault, not the cells': refuse before any of them fails for it."""
    wanted = sorted({c.cfg.device for c in cells if c.cfg.device.startswith("cuda")})
    if wanted:
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"invalid value for 'device': {wanted[0]!r}; allowed: cpu (no CUDA device is visible to this process)")


def _bar(items: Iterable[Any], enabled: bool, desc: str) -> Iterable[Any]:
    if not enabled:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, unit="cell", dynamic_ncols=True, position=0)


def _tqdm_write(line: str) -> None:
    from tqdm.auto import tqdm

    tqdm.write(line, file=sys.stdout)
