"""No code outside methods/ names a method: what the engine, the metrics or a study needs to know about a
method is a declaration on `Method` (`reference`, `dense_param`, `headline_params`, `capabilities`) or a
hook, never a branch on its name.

Static: every string literal in the .py files of benchmark/ (but benchmark/report/, whose own test
covers the leaderboard), datasets/ and dfbench/ that is a registered method's name, or a method spec
(`name?key=value`) or a comma list of them, is a finding. Docstrings are prose and are not read (found
through ast); prose strings (messages, help text) never equal a name, so they pass by themselves.
`ALLOWED` lists, file by file, the few literals left, each with its reason; an entry that no longer
matches anything fails too, so the list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dfbench.benchmark.metrics import drift
from dfbench.methods.registry import get_method_class, list_methods, reference_method
from helpers import docstring_nodes

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("benchmark", "datasets", "dfbench")
SKIPPED = (REPO / "benchmark" / "report",)  # the leaderboard's own rule (its helper's test)

# (file, method name) -> why the literal stays. Each is a value a user can change, not a decision on a method.
ALLOWED: dict[tuple[str, str], str] = {
    ("benchmark/core/config.py", "fedavg"):
        "RunConfig.method's default: the schema declares it, and core sits below methods/ (it cannot ask the "
        "registry for the reference method)",
    ("benchmark/run_flags.py", "fedavg"):
        "config_from_flags' default method, the CLI's and the API's (the same default as RunConfig.method)",
    ("benchmark/api.py", "fedavg"): "dfbench.make_config's default method (as RunConfig.method)",
    ("benchmark/cli.py", "fedavg"):
        "`dfbench run --method` and `dfbench report --reference` defaults, shown in --help; "
        "`dfbench perf --methods` default list",
    ("benchmark/cli.py", "random_prune"): "`dfbench perf --methods` default list (the methods whose overhead is timed)",
    ("benchmark/cli.py", "quantized"): "`dfbench perf --methods` default list (the methods whose overhead is timed)",
    ("benchmark/grid/spec.py", "fedavg"): "a grid cell without a method axis runs the default method (as RunConfig.method)",
    ("benchmark/perf.py", "fedavg"): "perf's measured configurations: the plain round it times (a benchmark's input, not a branch)",
    ("benchmark/perf.py", "random_prune"): "perf's default methods for the overhead rows (a benchmark's input)",
    ("benchmark/perf.py", "quantized"): "perf's default methods for the overhead rows (a benchmark's input)",
    ("benchmark/flower_bench.py", "fedavg"):
        "the side-by-side benchmark's work is FedAvg on both sides (Flower's FedAvg strategy): a benchmark's input",
}


def named_methods(text: str, names: set[str]) -> list[str]:
    """The method names a literal spells: the literal is one name, a spec `name?k=v`, or a comma list."""
    parts = [p.strip().split("?", 1)[0] for p in text.split(",")]
    return parts if parts and all(p in names for p in parts) else []


def findings(path: Path, names: set[str], root: Path = REPO) -> list[tuple[str, str, int]]:
    """(file relative to `root`, method name, line) for each method-naming literal in `path` (not docstrings)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = docstring_nodes(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            out += [(path.relative_to(root).as_posix(), n, node.lineno) for n in named_methods(node.value, names)]
    return out


def _scanned_files() -> list[Path]:
    return [f for top in SCANNED for f in sorted((REPO / top).rglob("*.py"))
            if not any(f.is_relative_to(s) for s in SKIPPED)]


def test_the_rule_finds_a_name_a_spec_and_a_list_but_not_prose_or_docstrings(tmp_path: Path) -> None:
    names = set(list_methods())
    probe = tmp_path / "probe.py"
    probe.write_text('"""fedavg in a docstring."""\n'
                     'A = "fedavg"\nB = "fedprox?mu=0.1"\nC = "fedavg,quantized"\n'
                     'D = "compare with fedavg"\nE = "fedavg_like"\n\n'
                     'def f():\n    """Also fedavg."""\n    return x == "scaffold"\n')
    assert sorted((n, line) for _, n, line in findings(probe, names, tmp_path)) == [
        ("fedavg", 2), ("fedavg", 4), ("fedprox", 3), ("quantized", 4), ("scaffold", 10)]


def test_no_code_outside_methods_names_a_method() -> None:
    names = set(list_methods())
    files = _scanned_files()
    assert len(files) > 50  # the walk saw the package
    found = [f for path in files for f in findings(path, names)]
    unexplained = sorted(f"{file}:{line} {name!r}" for file, name, line in found if (file, name) not in ALLOWED)
    assert not unexplained, ("a method named outside methods/: declare what is needed on Method (a capability, "
                             "`reference`, `dense_param`, a hook) and read it from there:\n" + "\n".join(unexplained))
    stale = sorted(f"{file} {name!r}" for file, name in ALLOWED if not any((f, n) == (file, name) for f, n, _ in found))
    assert not stale, "ALLOWED lists literals that are gone; remove them:\n" + "\n".join(stale)


def test_the_reference_and_the_dense_setting_come_from_the_declarations(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drift's dense reference follows `Method.reference` and `Method.dense_param`, not a name."""
    assert reference_method() == "fedavg" and vars(get_method_class("fedavg")).get("reference") is True
    dense = {"method": "random_prune", "method_params": {"keep_ratio": 1.0}}
    assert drift._is_dense(dense, "random_prune") and drift._is_reference({"method": "fedavg"})
    assert not drift._is_dense({**dense, "system": {"capacity": "0.5:1"}}, "random_prune")  # tiers: not dense
    assert not drift._is_dense({"method": "quantized", "method_params": {"bits": 1.0}}, "quantized")  # declares none
    monkeypatch.setattr(get_method_class("random_prune"), "dense_param", None)
    assert not drift._is_dense(dense, "random_prune")  # the declaration decides
    monkeypatch.setattr(get_method_class("quantized"), "dense_param", "bits")
    assert drift._is_dense({"method": "quantized", "method_params": {"bits": 1.0}}, "quantized")
