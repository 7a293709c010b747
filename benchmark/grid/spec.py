"""Grid files: one TOML file -> validated cells (the specs; running them: benchmark/grid/runner.py).

A grid file (benchmark/grid/builtin/NAME.toml, shipped; or any path, e.g. a study's results/STUDY/STUDY.toml):

    name = "demo"
    description = "..."
    [base]                      # dotted RunConfig keys (see engine/resolve.apply_overrides) -> value
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
run folder (the rerun policy, locks, cost, the dry-run listing): benchmark/grid/plan.py.
Running them in this process: benchmark/grid/runner.py; in several: benchmark/grid/workers.py.
"""

from __future__ import annotations

import difflib
import fnmatch
import itertools
import json
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from dfbench.benchmark.core import runfolder
from dfbench.benchmark.core.config import ConfigError, RunConfig, parse_value
from dfbench.benchmark.engine.resolve import apply_overrides

GRIDS_DIR = Path(__file__).with_name("builtin")
TOP_KEYS = ("name", "description", "base", "axes", "cells")
SECTIONS = ("data", "train", "system", "eval", "privacy")


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
        return runfolder.run_dir(out, self.cfg)

    def matches(self, pattern: str) -> bool:
        """Glob over the label (with or without the method's parameters), the run id, or the folder path."""
        c = self.cfg
        names = (
            self.label,
            f"{c.data.dataset}/{c.data.partition}/{c.method}/{c.seed}",
            self.run_id,
            f"{runfolder.dataset_folder(c)}/{runfolder.slug(c.data.partition)}/{runfolder.slug(c.method)}/{self.run_id}",
        )
        return any(fnmatch.fnmatchcase(n, pattern) for n in names)


@dataclass(frozen=True)
class Grid:
    name: str
    description: str
    source: str  # the file it was read from (or what parse_grid was told)
    cells: tuple[Cell, ...]
    extra: tuple[tuple[str, Any], ...] = ()  # the overrides applied to every cell last (--set, --device)


def builtin_grids() -> list[str]:
    """Names of the grids shipped in benchmark/grid/builtin/ (a grid's claims, NAME.claims.toml beside it, are
    not grids: benchmark/report/claims.py reads them)."""
    return sorted(p.stem for p in GRIDS_DIR.glob("*.toml") if not p.name.endswith(".claims.toml"))


def resolve_grid(name_or_path: str | Path) -> Path:
    """A path to an existing .toml file, or the name of a shipped grid (benchmark/grid/builtin/NAME.toml)."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    if p.suffix == ".toml" or len(p.parts) > 1:
        raise FileNotFoundError(f"grid file {p} does not exist")
    shipped = GRIDS_DIR / f"{name_or_path}.toml"
    study = Path("results") / str(name_or_path) / f"{name_or_path}.toml"  # a committed study's own, in a checkout
    if not shipped.is_file() and study.is_file():
        raise GridError(f"{str(name_or_path)!r} is a study's grid, not a shipped one: pass its file, {study.as_posix()}")
    if not shipped.is_file():
        close = difflib.get_close_matches(str(name_or_path), builtin_grids(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise GridError(f"unknown grid {str(name_or_path)!r}{hint}; shipped grids: {', '.join(builtin_grids()) or '(none)'}, or pass a path to a .toml file")
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
                source=source, cells=tuple(cells), extra=tuple(extra.items()))


def build_config(items: Mapping[str, Any]) -> RunConfig:
    """One cell's merged dotted items -> a validated RunConfig (method and its parameters last)."""
    name = items.get("method", "fedavg")
    method_items = {k: v for k, v in items.items() if k.startswith("method.")}
    other = {k: v for k, v in items.items() if k != "method" and not k.startswith("method.")}
    cfg = apply_overrides(RunConfig(), other)
    # the method and its hyperparameters in ONE step: validated (its check included) as a whole
    return apply_overrides(cfg, {"method": str(name), **method_items})


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
