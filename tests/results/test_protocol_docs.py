"""The docs' "The method protocol" (docs/architecture.md) is the protocol as one list: its tables equal the code.

Every public method of `Method` (each is a hook the engine or config validation calls) and of
`Mechanism` has a row with its parameters in order; every public class-level declaration of `Method`
(name, family, headline_params, reference, Config, masked_mean, capabilities) a row with its default;
every field of `Capabilities` a row with its default; every value the hooks exchange (ServerState,
ClientPlan, LocalStep, Upload, SampleVariants, EdgeLoad, RoundState) its fields. A hook, a parameter, a
declaration or a field added without its row fails here, and so does a row for something the code no
longer has.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from dfbench import methods
from dfbench.benchmark.engine.context import RoundState
from dfbench.methods.base import (Capabilities, ClientPlan, EdgeLoad, LocalStep, Mechanism, Method, SampleVariants, ServerState,
                                  Upload)

PAGE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
SECTION = "## The method protocol"
VALUES = {cls.__name__: cls for cls in (ServerState, ClientPlan, LocalStep, Upload, SampleVariants, EdgeLoad, RoundState)}


def _cells(line: str) -> list[str]:
    """A markdown table row's cells (an escaped pipe, `\\|`, stays inside its cell)."""
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def protocol_tables(text: str) -> dict[str, list[list[str]]]:
    """The tables of the page's protocol section: first header cell -> its rows' cells."""
    start = text.index(SECTION) + len(SECTION)
    end = re.search(r"^#{1,2} ", text[start:], flags=re.M)  # the next section of the same level or above
    body = text[start:start + end.start()] if end else text[start:]
    tables: dict[str, list[list[str]]] = {}
    current: list[list[str]] | None = None
    for line in body.splitlines():
        if not line.startswith("|"):
            current = None
            continue
        cells = _cells(line)
        if current is None:  # a header row opens a table
            current = tables.setdefault(cells[0], [])
        elif not set("".join(cells)) <= set("-: "):  # (the separator row)
            current.append(cells)
    return tables


def _name(cell: str) -> str:
    m = re.fullmatch(r"`(\w+)`", cell)
    assert m, f"the first cell of a protocol row is a `name`, not {cell!r}"
    return m.group(1)


def _documented_params(signature: str) -> list[str]:
    """`upload(local, plan, client, state, ctx) -> Upload` -> ["local", "plan", "client", "state", "ctx"]."""
    m = re.match(r"`(\w+)\(([^)]*)\)", signature)
    assert m, f"a signature cell starts with `name(params)`, not {signature!r}"
    return [p.split("=")[0].strip() for p in m.group(2).split(",") if p.strip()]


def public_hooks(cls: type) -> dict[str, list[str]]:
    """The public methods a class defines (functions, class- and static methods; not nested classes or
    aliases) -> their parameter names as a caller passes them (no self / cls)."""
    out = {}
    for name, value in vars(cls).items():
        if name.startswith("_") or not isinstance(value, (classmethod, staticmethod)) and not inspect.isfunction(value):
            continue
        params = list(inspect.signature(getattr(cls, name)).parameters)  # a classmethod comes bound (no cls)
        out[name] = params[1:] if inspect.isfunction(value) else params  # (no self)
    return out


@pytest.fixture(scope="module")
def tables() -> dict[str, list[list[str]]]:
    return protocol_tables(PAGE.read_text(encoding="utf-8"))


@pytest.mark.parametrize("header,cls", [("Method hook", Method), ("Mechanism hook", Mechanism)])
def test_every_hook_is_documented_with_its_parameters(tables, header, cls):
    rows = {_name(r[0]): r for r in tables[header]}
    code = public_hooks(cls)
    assert sorted(rows) == sorted(code), (
        f"{PAGE.name} '{SECTION}', table '{header}': undocumented {sorted(set(code) - set(rows))}, "
        f"documented but not in the code {sorted(set(rows) - set(code))}")
    for name, params in code.items():
        assert rows[name][1].startswith(f"`{name}("), f"{header} {name}: its signature cell names another hook"
        assert _documented_params(rows[name][1]) == params, f"{header} {name}({', '.join(params)}): the docs say {rows[name][1]}"
        assert len(rows[name]) == 4 and all(rows[name]), f"{header} {name}: every cell filled (signature, when, default)"


def method_declarations() -> dict[str, object]:
    """What `Method` declares at class level for a method to set (public, not a hook): name -> its default."""
    return {name: value for name, value in vars(Method).items()
            if not name.startswith("_") and not isinstance(value, (classmethod, staticmethod)) and not inspect.isfunction(value)}


def test_every_declaration_is_documented_with_its_default(tables):
    rows = {_name(r[0]): r for r in tables["Method declaration"]}
    code = method_declarations()
    assert sorted(rows) == sorted(code), (
        f"{PAGE.name} '{SECTION}', table 'Method declaration': undocumented {sorted(set(code) - set(rows))}, "
        f"documented but not in the code {sorted(set(rows) - set(code))}")
    for name, value in code.items():
        assert len(rows[name]) == 3 and all(rows[name]), f"Method.{name}: every cell filled (default, what it declares)"
        if value is None or isinstance(value, (str, bool, int, tuple)):  # a plain value: its repr, as written
            assert rows[name][1] == f"`{value!r}`", f"Method.{name} defaults to {value!r}; the docs say {rows[name][1]}"
    assert rows["capabilities"][1] == f"`{Capabilities.__name__}()`" and Method.capabilities == Capabilities()


def test_every_capability_is_documented_with_its_default(tables):
    rows = tables["Capabilities field"]
    fields = dataclasses.fields(Capabilities)
    assert [_name(r[0]) for r in rows] == [f.name for f in fields]
    for row, f in zip(rows, fields):
        assert row[1] == f"`{f.default!r}`", f"Capabilities.{f.name} defaults to {f.default!r}; the docs say {row[1]}"
        assert row[2], f"Capabilities.{f.name}: say when it is False (or set)"


def test_every_value_the_hooks_exchange_is_documented_with_its_fields(tables):
    rows = {_name(r[0]): r[1] for r in tables["value"]}
    assert sorted(rows) == sorted(VALUES)
    for name, cls in VALUES.items():
        # the documented fields: the backquoted names that open the cell's comma-separated items
        documented = [m.group(1) for m in re.finditer(r"(?:^|, )`(\w+)`", rows[name])]
        assert documented == [f.name for f in dataclasses.fields(cls)], f"{name}: the docs list {documented}"


def test_the_parser_fails_on_a_hook_added_without_a_row(tables, monkeypatch):
    """The check above is not vacuous: a new public hook on Method is missing from the docs."""

    def on_round_start(self, state, ctx):  # a hypothetical new hook
        return None

    monkeypatch.setattr(Method, "on_round_start", on_round_start, raising=False)
    with pytest.raises(AssertionError, match="undocumented \\['on_round_start'\\]"):
        test_every_hook_is_documented_with_its_parameters(tables, "Method hook", Method)


def test_a_declaration_added_without_a_row_fails(tables, monkeypatch):
    monkeypatch.setattr(Method, "server_side_only", False, raising=False)  # a hypothetical new declaration
    with pytest.raises(AssertionError, match="undocumented \\[[^]]*'server_side_only'"):
        test_every_declaration_is_documented_with_its_default(tables)


def test_the_methods_package_exports_what_the_docs_name():
    for name in ("Capabilities", "Mechanism", "Method", "ServerState", "ClientPlan", "LocalStep", "Upload", "SampleVariants"):
        assert hasattr(methods, name), f"dfbench.methods.{name}"
