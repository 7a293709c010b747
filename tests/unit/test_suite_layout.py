"""The test suite's own rules: no test module imports another test module (what tests share lives in
conftest.py as fixtures or in helpers.py as plain functions), and the `slow` marker is registered,
so that `pytest -m "not slow"` (make test-fast) and `pytest` (make test) select what they say."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]  # tests/, where helpers.py is
# an import line inside a string run in a subprocess (python -c SCRIPT) counts too
SCRIPT_IMPORT = re.compile(r"^\s*(?:from\s+(?:tests\.|\.)?(test_\w+)\s+import|import\s+(?:tests\.)?(test_\w+))", re.M)


def imported_test_modules(source: str) -> list[str]:
    """The test modules (test_*) that `source` imports, at any depth, in strings of code too."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            names = [base] if base else [a.name for a in node.names]  # `from . import test_x`
            names += [f"{base}.{a.name}" for a in node.names] if base in ("tests", "") else []
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [a or b for a, b in SCRIPT_IMPORT.findall(node.value)]
        else:
            continue
        found += [part for name in names for part in name.split(".")[-1:] if part.startswith("test_")]
    return sorted(set(found))


@pytest.mark.parametrize("source,expected", [
    ("from test_grid import write_grid", ["test_grid"]),
    ("def f():\n    from test_workers import SMALL, _start\n", ["test_workers"]),
    ("import test_report", ["test_report"]),
    ("import tests.test_report as r", ["test_report"]),
    ("from tests.test_grid import write_grid", ["test_grid"]),
    ("from tests import test_grid", ["test_grid"]),
    ("from . import test_grid", ["test_grid"]),
    ("from .test_grid import write_grid", ["test_grid"]),
    ("SCRIPT = '''\nimport sys\nfrom test_serveropt import rows\n'''", ["test_serveropt"]),
    ("from helpers import tiny_config\nfrom conftest import make_imageset\nimport testfixtures", []),
    ("def test_x():\n    assert 'from test_grid' not in 'x'\n", []),
])
def test_the_check_sees_every_spelling_of_a_test_module_import(source, expected):
    assert imported_test_modules(source) == expected


def test_no_test_module_imports_another_test_module():
    offenders = {path.name: mods for path in sorted(TESTS.rglob("*.py"))
                 if (mods := imported_test_modules(path.read_text())) and path.name != Path(__file__).name}
    assert not offenders, (f"{offenders}: move what tests share into tests/conftest.py (fixtures) or "
                           "tests/helpers.py (plain functions) and import it from there")


def test_the_slow_marker_is_registered(pytestconfig):
    assert any(line.startswith("slow:") for line in pytestconfig.getini("markers"))
    assert "--strict-markers" in str(pytestconfig.getini("addopts"))


TIERS = ("unit", "runs", "results")


def test_every_test_file_sits_in_one_tier_folder():
    """tests/unit, tests/runs, tests/results (docs/testing.md): no test module at the top or elsewhere."""
    stray = sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py") if p.parent.name not in TIERS
                   or p.parent.parent != TESTS)
    assert not stray, f"{stray}: move each into tests/unit, tests/runs or tests/results (docs/testing.md)"
    assert all(any((TESTS / tier).glob("test_*.py")) for tier in TIERS)
