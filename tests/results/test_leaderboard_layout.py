"""The leaderboard a newcomer reads in ten seconds (issue 51, item 4): every committed main table has at
most ten columns, every hyperparameter that tells two rows apart is named, a one-seed contrast says it
was not tested, each flag is explained under the table that shows it, and the report names no method
(what it needs from one is declared on `Method`)."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
COMMITTED = sorted(p for p in RESULTS.glob("**/leaderboard.md") if "runs" not in p.relative_to(RESULTS).parts)


def main_tables(md: str) -> list[list[str]]:
    """The header cells of every block's main table (the first table after each `## ` block heading)."""
    headers = []
    for block in md.split("\n## ")[1:]:
        lines = block.splitlines()
        first = next((ln for ln in lines if ln.startswith("| ")), None)
        if first is not None and first.startswith("| rank | method |"):
            headers.append([c.strip() for c in first.strip().strip("|").split("|")])
    return headers


@pytest.mark.parametrize("page", COMMITTED, ids=lambda p: str(p.parent.relative_to(RESULTS)))
def test_committed_main_tables_have_at_most_ten_columns(page: Path) -> None:
    from dfbench.benchmark.report.layout import MAX_MAIN_COLUMNS

    tables = main_tables(page.read_text(encoding="utf-8"))
    assert tables, f"{page}: no main table found"
    for header in tables:
        assert len(header) <= MAX_MAIN_COLUMNS == 10, f"{page}: main table with {len(header)} columns: {header}"


def test_the_demo_and_paper_fmnist_pages_are_committed() -> None:
    """The acceptance names these two: the parametrized check above must see them."""
    names = {str(p.parent.relative_to(RESULTS)) for p in COMMITTED}
    assert "paper-fmnist" in names and any(n.startswith("demo") for n in names), names


def _block(**rows: dict) -> pd.DataFrame:
    """An aggregated block: one row per setting, its method and param.* columns (sorted, as leaderboard.csv has them)."""
    frame = pd.DataFrame([{"dataset": "fmnist", "partition": "iid", "baseline": False, **r} for r in rows.values()],
                         index=list(rows))
    return frame[sorted(frame.columns)]


def test_hyperparameters_that_tell_rows_apart_are_named() -> None:
    """The demo's case: both pruning methods at their default keep_ratio=0.5 (a headline: named), with
    different inference rules (one name, two values across methods: named), the same masked_mean
    (default, equal everywhere: not named); fedprox's mu at its default is its headline."""
    from dfbench.benchmark.report.names import hyperparameters, setting_names

    prune = {"param.keep_ratio": 0.5, "param.masked_mean": "covered", "param.prune_biases": False}
    block = _block(
        fa={"method": "fedavg"},
        fp={"method": "fedprox", "param.mu": 0.01},
        rp={"method": "random_prune", **prune, "param.inference": "scaled"},
        tk={"method": "topk_prune", **prune, "param.inference": "full", "param.scope": "layer"},
        q={"method": "quantized", "param.bits": 4, "param.rounding": "stochastic"},
        base={"method": "fedavg", "baseline": True},
    )
    got = hyperparameters(block)
    assert got["fa"] == "" and got["base"] == ""
    assert got["fp"] == "mu=0.01"
    assert got["rp"] == "inference=scaled, keep_ratio=0.5"
    assert got["tk"] == "inference=full, keep_ratio=0.5"  # scope=layer is topk_prune's default
    assert got["q"] == "bits=4"
    names = setting_names(block)
    assert names["tk"] == "topk_prune (inference=full, keep_ratio=0.5)" and names["base"] == "untrained (fedavg)"
    assert len(set(names.values())) == len(names)


def test_declared_headline_params_and_reference_are_real() -> None:
    """Every `Method.headline_params` names a field of the method's Config; exactly one method (FedAvg)
    declares itself the reference, and a subclass does not inherit the role."""
    from dfbench.benchmark.report.names import reference_method
    from dfbench.methods.registry import get_method_class, list_methods

    for name in list_methods():
        cls = get_method_class(name)
        fields = {f.name for f in dataclasses.fields(cls.Config)}
        assert set(cls.headline_params) <= fields, (name, cls.headline_params, fields)
    assert reference_method() == "fedavg"
    assert [m for m in list_methods() if get_method_class(m).reference] == ["fedavg"]


def test_report_code_names_no_method() -> None:
    """No string in benchmark/report (docstrings aside) is a registered method's name: the report asks
    `Method` (headline_params, reference) instead."""
    from dfbench.methods.registry import list_methods

    methods = set(list_methods())
    found = []
    for path in sorted((ROOT / "benchmark" / "report").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in methods:
                found.append(f"{path.name}:{node.lineno} {node.value!r}")
    assert found == []


def test_one_seed_contrast_reads_as_untested() -> None:
    from dfbench.benchmark.report.layout import verdict_text

    row = {"verdict": "inconclusive", "estimate": 0.97, "estimate_low": math.nan, "estimate_high": math.nan,
           "paired_seeds": 1, "n": 1, "primary_metric": "fd_fmnist", "verdict_note": "one paired seed: no spread to test"}
    assert verdict_text(row) == "×0.97 (1 seed: not tested)"
    three = {**row, "paired_seeds": 3, "n": 3, "estimate_low": 0.9, "estimate_high": 1.05, "seeds_to_decide": 9}
    assert verdict_text(three) == "inconclusive ×0.97 [0.9, 1.05] · 9 seeds to decide"
    assert verdict_text({**three, "n": 4}).startswith("inconclusive ×0.97 [0.9, 1.05], 3 paired seeds")


def _demo_page():
    """The committed demo reference's blocks, as `dfbench report --from-csv` reads them back."""
    from dfbench.benchmark.report.layout import PageMeta, metrics_of, sections

    folder = RESULTS / "demo" / "reference"
    if not (folder / "leaderboard.csv").is_file():
        folder = RESULTS / "demo"
    table = pd.read_csv(folder / "leaderboard.csv")
    table = table.assign(params=table["params"].fillna("")).copy()  # (copy: one block of memory again)
    meta = PageMeta.from_json(json.loads((folder / "report.json").read_text(encoding="utf-8")))
    return table, meta, metrics_of(table), sections


def test_each_flag_is_explained_under_its_table() -> None:
    table, meta, metrics, sections = _demo_page()
    (s,) = sections(table, metrics, meta, {})
    flags = s.main.headers.index("flags")
    used = {f.split(" ")[0] for row in s.main.rows for f in row[flags].split("; ") if f}
    assert used == {"collapsed"}  # topk_prune: collapsed 1/1
    collapsed = [line for line in s.legend if line.startswith("collapsed k/n:")]
    assert len(collapsed) == 1 and "untrained model" in collapsed[0] and "|log(score / untrained)|" in collapsed[0]
    assert not any(line.startswith(("unstable", "not better than untrained")) for line in s.legend)  # not used here
    assert any("1 seed: not tested" in row[s.main.headers.index("vs fedavg (paired)")] for row in s.main.rows)
    assert not any(row[s.main.headers.index("vs fedavg (paired)")].startswith("inconclusive") for row in s.main.rows)


def test_main_table_keeps_ten_columns_and_moves_the_rest() -> None:
    """With a time-to-target column on top of the demo's (every cost present), the main table still has
    at most ten columns; the costs without room are in "Communication and time"."""
    from dfbench.benchmark.report.layout import MAX_MAIN_COLUMNS

    table, meta, metrics, sections = _demo_page()
    table = table.assign(time_to_target_mean=12.0, time_to_target_reached=1)
    meta.target = ["fd_fmnist", 300.0]
    (s,) = sections(table, metrics, meta, {})
    assert len(s.main.headers) == MAX_MAIN_COLUMNS
    assert s.main.headers[:3] == ["rank", "method", "hyperparameters"]
    assert "sim time to fd_fmnist ≤ 300" in s.main.headers
    cost = next(t for t in s.secondary if t.title == "Communication and time")
    moved = {"uplink MB", "sim time", "wall time", "uplink vs fedavg"} - set(s.main.headers)
    assert moved and moved <= set(cost.headers)
    # every row of each table has a cell per header
    for t in [s.main, *s.secondary]:
        assert all(len(r) == len(t.headers) for r in t.rows), t.title
    # the hyperparameter column names the pruning methods' keep_ratio
    hp = {r[1]: r[2] for r in s.main.rows}
    assert re.search(r"keep_ratio=0\.5", hp["random_prune"]) and re.search(r"keep_ratio=0\.5", hp["topk_prune"])
