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

Selection: `--only PATTERN` (repeatable; any may match) is a glob over
"dataset/partition/method/seed" (method with or without its "?k=v" parameters, e.g.
"cifar10/dirichlet:0.1/*/0"), the run id, or the run folder path below --out. `--shard I/N`
then takes every N-th of the remaining cells starting at I (0-based), so N array jobs with
I = 0..N-1 cover the grid exactly once.

What a (re)run does with each selected cell, by the state of its run folder:

    missing     no folder or no status.json            run
    unfinished  status "running" (killed, preempted)   run: resumes from its newest checkpoint
    failed      status "failed" (an exception)         skipped and listed; --retry-failed reruns it
                                                       (resuming from its newest checkpoint)
    diverged    status "diverged"                      skipped: it is a result, and the same config
                                                       diverges again; --force reruns it
    done        status "done"                          skipped; --force deletes it and reruns it

Failed cells are not retried by default so that a deterministic failure (a bug, an
impossible partition) does not cost every rerun of an array job its time again. A cell
that fails before its run folder exists (e.g. its dataset cannot be loaded) has no status
and counts as missing, so a rerun tries it again.
"""

from __future__ import annotations

import difflib
import fnmatch
import itertools
import json
import math
import sys
import time
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from . import results
from .config import ConfigError, RunConfig, apply_overrides, parse_value

GRIDS_DIR = Path(__file__).with_name("grids")
TOP_KEYS = ("name", "description", "base", "axes", "cells")
SECTIONS = ("data", "train", "system", "eval")
STATES = ("missing", "unfinished", "failed", "diverged", "done")
# Rough cost of one sample-gradient evaluation (forward, backward, Adam share) in ms on 2 CPU
# cores, per model preset; one sampler network evaluation costs about a third of it. Scaled
# from the small28 figure in benchmark/model.py by relative timings: a planning aid, +-2x.
CPU_MS_PER_SAMPLE_GRAD = {"tiny": 1.0, "small28": 3.0, "small32": 11.0, "base28": 36.0, "base32": 67.0}
FORWARD_FRACTION = 1 / 3


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
    """missing | unfinished | failed | diverged | done, from the cell's status.json."""
    status = results.read_status(cell.folder(out))
    if status is None:
        return "missing"
    state = status.get("state")
    return "unfinished" if state == "running" else str(state)


def should_run(state: str, *, retry_failed: bool = False, force: bool = False) -> bool:
    """The rerun policy (see the module docstring)."""
    if force:
        return True
    if state == "failed":
        return retry_failed
    return state in ("missing", "unfinished")


# -- cost ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CellCost:
    sample_grads: float  # sum over rounds and clients of local steps x batch size
    eval_forwards: float  # evaluation samples x network evaluations per sample
    cpu_seconds: float  # rough: see CPU_MS_PER_SAMPLE_GRAD


def estimate_cost(cfg: RunConfig) -> CellCost:
    """Expected work of one run from its config alone (method extras such as a router not included)."""
    from .diffusion import default_sampler
    from .model import resolve_preset

    n, t, s = cfg.data.clients, cfg.train, cfg.system
    per_round = max(1, int(round(s.participation * n))) * (1 - s.dropout)  # as sample_round_clients
    slow = int(round(s.stragglers * n))
    mean_steps = ((n - slow) * t.local_steps + slow * max(1, math.ceil(s.straggler_steps * t.local_steps))) / n
    grads = t.rounds * per_round * mean_steps * t.batch_size
    sampler = cfg.eval.sampler if cfg.eval.sampler != "auto" else default_sampler(t.objective)
    forwards = cfg.eval.samples * cfg.eval.sampler_steps * (2 if sampler == "heun" else 1)
    ms = CPU_MS_PER_SAMPLE_GRAD.get(resolve_preset(t.model, cfg.data.dataset), 67.0)
    return CellCost(grads, forwards, (grads + FORWARD_FRACTION * forwards) * ms / 1000)


def fmt_seconds(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def describe(grid: Grid, cells: Sequence[Cell], out: str | Path, *, retry_failed: bool = False, force: bool = False) -> str:
    """The dry-run listing: every selected cell, its state, what a run would do, and its cost."""
    head = ["#", "run id", "dataset", "partition", "method", "seed", "rounds", "state", "action", "sample-grads", "eval-NFE", "~cpu"]
    rows, todo = [], CellCost(0, 0, 0)
    for c in cells:
        state = cell_state(out, c)
        go = should_run(state, retry_failed=retry_failed, force=force)
        cost = estimate_cost(c.cfg)
        if go:
            todo = CellCost(todo.sample_grads + cost.sample_grads, todo.eval_forwards + cost.eval_forwards, todo.cpu_seconds + cost.cpu_seconds)
        rows.append([str(c.index), c.run_id, c.cfg.data.dataset, c.cfg.data.partition, c.method, str(c.cfg.seed),
                     str(c.cfg.train.rounds), state, "run" if go else "skip", f"{cost.sample_grads:,.0f}",
                     f"{cost.eval_forwards:,.0f}", fmt_seconds(cost.cpu_seconds)])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = [f"grid {grid.name} ({grid.source}): {len(grid.cells)} cell(s), {len(cells)} selected; runs under {out}"]
    if grid.description:
        lines.append(grid.description)
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in [head, *rows]]
    n_run = sum(r[8] == "run" for r in rows)
    lines.append(
        f"to run: {n_run} cell(s), {todo.sample_grads:,.0f} sample-gradient evaluations (local steps x batch size, "
        f"over rounds and clients) and {todo.eval_forwards:,.0f} network evaluations for sampling; "
        f"rough time on 2 CPU cores {fmt_seconds(todo.cpu_seconds)} (+-2x, evaluation features and method "
        f"extras not included; a GPU is far faster)")
    return "\n".join(lines)


# -- running --------------------------------------------------------------------------------------

@dataclass
class CellOutcome:
    cell: Cell
    before: str  # state when the grid started
    after: str  # state when the grid finished with it
    ran: bool
    seconds: float = 0.0
    note: str = ""  # metric, error or divergence reason


@dataclass
class GridSummary:
    grid: Grid
    outcomes: list[CellOutcome] = field(default_factory=list)

    def count(self, state: str) -> int:
        return sum(o.after == state for o in self.outcomes)

    @property
    def unfinished(self) -> list[CellOutcome]:
        """Cells not done and not diverged: failed now, failed before and skipped, or never run."""
        return [o for o in self.outcomes if o.after not in ("done", "diverged")]

    @property
    def ok(self) -> bool:
        return not self.unfinished

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


def _note(out: str | Path, cell: Cell, state: str) -> str:
    """The one-line result of a cell: its first metric, or why it has none."""
    d = cell.folder(out)
    if state == "done":
        path = d / "metrics.json"
        metrics = results.read_json(path) if path.exists() else {}
        if metrics.get("evaluation_pending"):
            return "evaluation pending (see status.json)"
        rows = metrics.get("evaluations") or []
        return ", ".join(f"{r['metric']}={r['value']:.4g}" for r in rows[:2]) or "no metric (eval.metrics=none)"
    status = results.read_status(d) or {}
    return str(status.get("error", "")).splitlines()[0] if status.get("error") else ""


def run_grid(grid: Grid, out: str | Path, *, shard: tuple[int, int] | None = None, only: Sequence[str] = (),
             retry_failed: bool = False, force: bool = False, progress: bool = True, data: Any = None,
             echo: Callable[[str], None] | None = None, download: bool = False) -> GridSummary:
    """Run the selected cells one after another; a failing cell is recorded and the grid goes on.

    Before the first cell, `fetch.preflight` checks the inputs of the cells to run: missing data
    raises `fetch.MissingInputsError` (nothing run), or is fetched with `download`.
    `data`: one ImageSet used for every cell (tests); by default each dataset is loaded once.
    `echo`: where the one-line summaries go (default: stdout, above the progress bars).
    """
    from . import loop

    cells = select_cells(grid.cells, shard=shard, only=only)
    _check_devices(cells)
    summary = GridSummary(grid)
    todo: list[tuple[Cell, str]] = []
    for c in cells:
        state = cell_state(out, c)
        if should_run(state, retry_failed=retry_failed, force=force):
            todo.append((c, state))
        else:
            summary.outcomes.append(CellOutcome(c, state, state, ran=False, note=_note(out, c, state)))
    from .fetch import preflight

    preflight([c.cfg for c, _ in todo], download=download, check_data=data is None, progress=progress)
    bar = _bar(todo, progress, f"grid {grid.name}")
    say = echo or (_tqdm_write if progress else print)
    cache = _DataCache(data)
    for j, (cell, before) in enumerate(bar, 1):
        t0 = time.perf_counter()
        error = ""
        try:
            loop.run(cell.cfg, out, force=force, progress=progress, data=cache.get(cell.cfg))
        except Exception as err:  # noqa: BLE001 - isolate the cell: record it, go on with the grid
            error = f"{type(err).__name__}: {err}".splitlines()[0]
        seconds = time.perf_counter() - t0
        after = cell_state(out, cell)
        if error and after != "failed":
            after = "failed"  # it failed before its folder (and status) existed
        note = error or _note(out, cell, after)
        summary.outcomes.append(CellOutcome(cell, before, after, ran=True, seconds=seconds, note=note))
        where = f"  (traceback: {cell.folder(out) / 'status.json'})" if error and cell.folder(out).exists() else ""
        say(f"[{j}/{len(todo)}] {after:<8} {cell.label}  {note}  {fmt_seconds(seconds)}{where}")
    summary.outcomes.sort(key=lambda o: o.cell.index)
    return summary


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
