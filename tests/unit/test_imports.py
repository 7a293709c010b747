"""The package's import graph follows the layers and has no circles.

Layers, lowest first (`LAYERS`; each package's docstring states its number, checked below): 0 datasets;
1 core (the run's configuration, value parsing, seeds, locks, the preset table, the run-folder format);
2 methods (the method protocol and the methods, which see a run only through their own protocol,
methods/context.py); 3 metrics; 4 tracking (experiment trackers); 5 engine (resolving a config against
the methods and the data, the run); 6 grid; 7 report (the leaderboard, and what study scripts build on); 8 the
fronts (cli, api, perf, flower_bench, the top-level dfbench API). The studies' own code is not in the package
(results/<study>/, tests/results/test_study_scripts.py). A module imports only from
its own layer or below, with no exception.

The graph is built statically (``ast`` over the package files, relative imports
resolved against the installed names: ``dfbench.benchmark`` is the folder
``benchmark/``, see pyproject.toml ``package-dir``). Two graphs are checked:
module-level imports (what runs at import time, where a circle breaks imports),
and every import including the late ones inside functions (a late import only
hides a circle; the code still depends both ways). ``if TYPE_CHECKING:`` imports
never run and are not counted.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _package_folders() -> dict[str, Path]:
    """Installed package name -> its folder, as pyproject.toml maps them (``package-dir``).

    A subpackage without its own mapping (``dfbench.benchmark.grid.builtin``) lives in its parent's folder.
    """
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    folders: dict[str, Path] = {}
    for name in setup["packages"]:  # parents are listed before their subpackages
        parent, _, leaf = name.rpartition(".")
        folders[name] = ROOT / setup["package-dir"][name] if name in setup["package-dir"] else folders[parent] / leaf
    return folders


PACKAGES = _package_folders()

# Lowest first. A module belongs to the layer of the longest prefix that names it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("dfbench.datasets",),
    ("dfbench.benchmark.core",),
    ("dfbench.methods",),
    ("dfbench.benchmark.metrics",),
    ("dfbench.benchmark.tracking",),
    ("dfbench.benchmark.engine",),
    ("dfbench.benchmark.grid",),
    ("dfbench.benchmark.report",),
    ("dfbench", "dfbench.benchmark", "dfbench.benchmark.cli", "dfbench.benchmark.api", "dfbench.benchmark.run_flags",
     "dfbench.benchmark.perf", "dfbench.benchmark.flower_bench", "dfbench.benchmark.__main__", "dfbench.__main__"),
)


def layer_of(module: str, layers: tuple[tuple[str, ...], ...] = LAYERS) -> int:
    """Index of the layer that owns `module` (the longest matching prefix wins)."""
    best, best_len = None, -1
    for i, prefixes in enumerate(layers):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = i, len(prefix)
    if best is None:
        raise KeyError(f"{module} is in no layer: add it to LAYERS in tests/unit/test_imports.py (and the layer list of docs/architecture.md)")
    return best


# Packages every import passes through (Python runs `dfbench/__init__.py` and
# `benchmark/__init__.py` before any submodule): they must import nothing of the package at
# import time (checked below), so an edge to them is no dependency on the front layer.
PASS_THROUGH = ("dfbench", "dfbench.benchmark")


def upward_imports(graph: dict[str, set[str]], layers: tuple[tuple[str, ...], ...] = LAYERS,
                   pass_through: tuple[str, ...] = PASS_THROUGH) -> list[str]:
    """Every edge importer -> imported whose target sits in a higher layer than the importer."""
    bad = []
    for name, targets in sorted(graph.items()):
        for target in sorted(targets):
            if target in pass_through:
                continue
            if layer_of(target, layers) > layer_of(name, layers):
                bad.append(f"{name} (layer {layer_of(name, layers)}) imports {target} (layer {layer_of(target, layers)})")
    return bad


def package_modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (``dfbench.benchmark.core.config`` -> its file)."""
    modules: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            modules[name] = path
    return modules


def _module_level(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """Imports run at import time: top level, and inside if/try/with blocks, not in defs or classes.

    ``if TYPE_CHECKING:`` blocks are skipped: they never run.
    """
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If):
            test = node.test
            is_type_checking = (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
            if not is_type_checking:
                found += _module_level(node.body)
            found += _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            found += _module_level(node.body)
            for handler in node.handlers:
                found += _module_level(handler.body)
            found += _module_level(node.orelse) + _module_level(node.finalbody)
        elif isinstance(node, ast.With):
            found += _module_level(node.body)
    return found


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (never executed)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                    isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
                skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skipped


def imported_modules(name: str, path: Path, known: set[str], *, late: bool = False,
                     type_checking: bool = False) -> set[str]:
    """The package modules that module ``name`` imports at import time (``late``: anywhere; ``type_checking``:
    with ``late``, the ``if TYPE_CHECKING:`` imports too, which never run)."""
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    if late:
        skipped = set() if type_checking else _type_checking_only(tree)
        nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in skipped]
    else:
        nodes = _module_level(tree.body)
    targets: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            if node.level:
                base_parts = package.split(".")
                base = ".".join(base_parts[: len(base_parts) - (node.level - 1)])
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            # `from pkg import mod` imports the submodule pkg.mod when one exists.
            candidates = [source] + [f"{source}.{alias.name}" for alias in node.names]
        for candidate in candidates:
            # `import a.b.c` also runs a and a.b: each package on the way is imported.
            parts = candidate.split(".")
            for end in range(1, len(parts) + 1):
                prefix = ".".join(parts[:end])
                if prefix in known and prefix != name:
                    targets.add(prefix)
    return targets


def import_graph(*, late: bool = False) -> dict[str, set[str]]:
    """Module -> the package modules it imports (module level, or with ``late`` every import)."""
    modules = package_modules()
    known = set(modules)
    return {name: imported_modules(name, path, known, late=late) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None (depth-first search with colours)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def _strip_package_parents(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Drop edges from a module to the packages it lives in.

    ``from . import x`` inside ``dfbench.methods.y`` names the package only to reach its
    submodule, and a parent package is always initialised before its children: Python
    imports ``dfbench.methods`` first, so that edge cannot be what closes a circle.
    """
    return {name: {t for t in targets if not name.startswith(t + ".")} for name, targets in graph.items()}


def test_find_cycle_names_a_circle() -> None:
    # prepare: a -> b -> c -> a, plus a branch d -> a that is not on the circle
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    # execute / assert
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_relative_imports_are_resolved(tmp_path: Path) -> None:
    # prepare: a module in dfbench.benchmark with relative, absolute, late and TYPE_CHECKING imports
    source = tmp_path / "mod.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from .config import RunConfig\n"
        "from ..methods import registry\n"
        "import dfbench.datasets.sources\n"
        "if TYPE_CHECKING:\n    from .loop import run\n"
        "def late():\n    from .report import build_report\n"
    )
    known = {"dfbench", "dfbench.benchmark", "dfbench.benchmark.config", "dfbench.methods",
             "dfbench.methods.registry", "dfbench.datasets", "dfbench.datasets.sources",
             "dfbench.benchmark.loop", "dfbench.benchmark.report", "dfbench.benchmark.mod"}
    # execute
    found = imported_modules("dfbench.benchmark.mod", source, known)
    found_late = imported_modules("dfbench.benchmark.mod", source, known, late=True)
    # assert: module-level imports only, each package on the way included; late adds the one in def
    eager = {"dfbench", "dfbench.benchmark", "dfbench.benchmark.config", "dfbench.methods",
             "dfbench.methods.registry", "dfbench.datasets", "dfbench.datasets.sources"}
    assert found == eager
    assert found_late == eager | {"dfbench.benchmark.report"}


@pytest.mark.parametrize("late", [False, True], ids=["module-level", "with-late-imports"])
def test_package_import_graph_has_no_cycles(late: bool) -> None:
    graph = _strip_package_parents(import_graph(late=late))
    # the resolver sees the real tree (guards against a vacuous pass on an empty graph)
    assert "dfbench.methods.registry" in graph["dfbench.methods"]
    assert "dfbench.benchmark.report.frames" in graph["dfbench.benchmark.report.build"]
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle or []) + (
        " (counting imports inside functions: a late import hides a circle, it does not remove it)" if late else "")


@pytest.mark.slow
def test_every_module_imports_first_in_a_fresh_interpreter() -> None:
    """Each module imported first, alone: a circle or a missing name would raise ImportError."""
    names = sorted(n for n in package_modules() if not n.endswith(".__main__"))  # __main__ runs the CLI
    # One interpreter for speed: dfbench.* is dropped from sys.modules before each import, so
    # every module starts from nothing of the package (torch and friends stay loaded).
    script = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    for loaded in [m for m in sys.modules if m == 'dfbench' or m.startswith('dfbench.')]:\n"
        "        del sys.modules[loaded]\n"
        "    importlib.import_module(name)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "MPLBACKEND": "Agg"})
    assert result.returncode == 0, result.stderr[-3000:]


def test_upward_imports_are_found():
    # prepare: core -> engine is upward; engine -> core and a package's own parent are not
    layers = (("pkg.core",), ("pkg.engine",))
    graph = {"pkg.core.config": {"pkg.engine.model"}, "pkg.engine.model": {"pkg.core.config"}, "pkg.engine.round": set()}
    # execute / assert
    assert upward_imports(graph, layers) == ["pkg.core.config (layer 0) imports pkg.engine.model (layer 1)"]
    assert upward_imports({"pkg.engine.model": {"pkg.core.config"}}, layers) == []


@pytest.mark.parametrize("late", [False, True], ids=["module-level", "with-late-imports"])
def test_no_module_imports_a_layer_above_its_own(late: bool) -> None:
    graph = _strip_package_parents(import_graph(late=late))
    # every module has a layer (a new sub-package must be placed, not silently allowed)
    for name in graph:
        layer_of(name)
    assert "dfbench.benchmark.engine.training" in graph and "dfbench.methods.base" in graph  # the real tree
    bad = upward_imports(graph)
    assert not bad, "imports from a higher layer:\n  " + "\n  ".join(bad)


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""


def test_the_layer_numbers_in_the_docstrings_are_true() -> None:
    """Each layer's package says "Layer N" (or "layer N") in its docstring's first sentence, N its index in
    LAYERS; benchmark/__init__.py's list of the layers ("0 datasets, 1 core, ...") is LAYERS' order."""
    modules = package_modules()
    for index, prefixes in enumerate(LAYERS[:-1]):  # the fronts are modules, not a package
        package = prefixes[0]
        first = _docstring(modules[package]).split(".\n")[0].split(". ")[0]
        found = re.search(r"\b[Ll]ayer (\d+)\b", first)
        assert found, f"{package}'s docstring does not say its layer (Layer {index}): {first!r}"
        assert int(found.group(1)) == index, f"{package}'s docstring says layer {found.group(1)}; it is layer {index}"
    listed = re.findall(r"\b(\d+) ([a-z]+)\b", _docstring(modules["dfbench.benchmark"]))
    assert [int(n) for n, _ in listed] == list(range(len(LAYERS) - 1)), listed
    assert [word for _, word in listed] == [prefixes[0].rpartition(".")[2] for prefixes in LAYERS[:-1]], listed


def test_the_methods_name_nothing_of_the_engine_not_even_for_type_checking() -> None:
    """A method's hooks are typed against the protocol the methods own (methods/context.py), so no module of
    methods/ imports the engine, not even under ``if TYPE_CHECKING:`` (which the layer check does not count)."""
    modules = package_modules()
    known = set(modules)
    named = {}
    for name, path in modules.items():
        if layer_of(name) != layer_of("dfbench.methods"):
            continue
        every = imported_modules(name, path, known, late=True, type_checking=True)
        above = [t for t in every if t not in PASS_THROUGH and layer_of(t) > layer_of(name)]
        if above:
            named[name] = sorted(above)
    assert "dfbench.methods.context" in modules  # the protocol is there
    assert not named, f"methods importing layers above them (type checking included): {named}"


def test_the_packages_every_import_passes_through_import_nothing_eagerly() -> None:
    graph = _strip_package_parents(import_graph(late=False))
    for name in PASS_THROUGH:
        assert not graph[name], f"{name} imports {sorted(graph[name])} at import time: every dfbench import would run them"


def test_the_layer_test_fails_on_an_upward_import(tmp_path: Path) -> None:
    """Plant `import dfbench.benchmark.report.build` in a copy of a core module: the check must name it."""
    modules = package_modules()
    known = set(modules)
    planted = tmp_path / "config.py"
    planted.write_text(modules["dfbench.benchmark.core.config"].read_text(encoding="utf-8")
                       + "\n\ndef _planted():\n    from dfbench.benchmark.report import build\n", encoding="utf-8")
    graph = _strip_package_parents(import_graph(late=True))
    graph["dfbench.benchmark.core.config"] = imported_modules("dfbench.benchmark.core.config", planted, known, late=True)
    bad = upward_imports(graph)
    assert any("dfbench.benchmark.core.config (layer 1) imports dfbench.benchmark.report.build" in b for b in bad), bad
