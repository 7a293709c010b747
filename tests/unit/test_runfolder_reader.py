"""The one reader of a tree of run folders (`runfolder.iter_runs`) and the rule that makes it the only one:
no module of the package spells a run-folder file name; they all take it from benchmark/core/runfolder.py."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from dfbench.benchmark.core import runfolder
from helpers import docstring_nodes

REPO = Path(__file__).resolve().parents[2]


def _run(root: Path, *parts: str, state: str | None = "done", metrics: dict | None = None) -> Path:
    d = root.joinpath(*parts)
    d.mkdir(parents=True)
    runfolder.write_json(d / runfolder.CONFIG, {"run_id": parts[-1]})
    if state is not None:
        runfolder.write_status(d, state)
    if metrics is not None:
        runfolder.write_json(d / runfolder.METRICS, metrics)
    return d


def test_iter_runs_finds_nested_runs_in_sorted_order_and_skips_folders_without_config(tmp_path: Path) -> None:
    # prepare: runs at several depths, made in an order that is not the sorted one; folders that are not runs
    b = _run(tmp_path, "fmnist", "iid", "fedavg", "s1-bbb", metrics={"client_images": 4})
    a = _run(tmp_path, "fmnist", "iid", "fedavg", "s0-aaa", state=None)
    deep = _run(tmp_path, "cifar10", "dirichlet-0.1", "m", "x", "s0-ccc", state="failed")
    (tmp_path / "fmnist" / "iid" / "fedavg" / "s2-noconfig").mkdir()
    runfolder.write_status(tmp_path / "fmnist" / "iid" / "fedavg" / "s2-noconfig", "done")  # status alone: no run
    (b / runfolder.CHECKPOINTS).mkdir()
    # execute
    found = list(runfolder.iter_runs(tmp_path))
    # assert: every run folder once, in path order (not creation order), none without config.json
    assert [r.path for r in found] == [deep, a, b]
    assert [r.run_id for r in found] == ["s0-ccc", "s0-aaa", "s1-bbb"]
    assert [r.state() for r in found] == ["failed", None, "done"]
    assert found[2].metrics() == {"client_images": 4} and found[1].metrics() is None
    assert found[2].config() == {"run_id": "s1-bbb"} and found[2].has(runfolder.METRICS)
    assert list(runfolder.iter_runs(tmp_path)) == found  # the same walk twice: the same list


def test_iter_runs_of_a_run_folder_is_that_folder_and_a_missing_root_is_one_clear_error(tmp_path: Path) -> None:
    d = _run(tmp_path, "s0-aaa")
    assert [r.path for r in runfolder.iter_runs(d)] == [d]
    (tmp_path / "empty").mkdir()
    assert list(runfolder.iter_runs(tmp_path / "empty")) == []
    with pytest.raises(FileNotFoundError, match="does not exist"):
        runfolder.iter_runs(tmp_path / "nowhere")  # raised at the call, not at the first step


def test_a_damaged_file_is_raised_by_its_reader_not_by_the_walk(tmp_path: Path) -> None:
    d = _run(tmp_path, "s0-aaa")
    (d / runfolder.METRICS).write_text("{torn")
    (run,) = runfolder.iter_runs(tmp_path)  # the walk itself reads nothing
    with pytest.raises(json.JSONDecodeError):
        run.metrics()


# -- the static rule -----------------------------------------------------------------------

# The package: what `pip install .` ships. The study scripts (results/<study>/*.py, scripts/*.py: run from a
# checkout, outside the package; tests/results/test_study_scripts.py holds them to the one reader) and tests/
# (which write run folders to check the format itself) are left out.
PACKAGE = ("benchmark", "methods", "datasets", "dfbench")
OWNER = REPO / "benchmark" / "core" / "runfolder.py"


def _file_names() -> set[str]:
    """Every file name of the format (runfolder's constants with an extension; not `checkpoints` or `.lock`,
    words other code uses for other things)."""
    return {v for k, v in vars(runfolder).items()
            if k.isupper() and isinstance(v, str) and "." in v.strip(".") and v not in runfolder.STATES}


def spelled_file_names(path: Path, names: set[str], root: Path = REPO) -> list[str]:
    """`path:line 'text'` for each string in `path` that is a file name of `names` or a path ending in one
    (`x/metrics.json`, `**/status.json`); prose that mentions a file (a message, a docstring) is not."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = docstring_nodes(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if node.value in names or any(f"/{n}" in node.value for n in names):
                out.append(f"{path.relative_to(root)}:{node.lineno} {node.value[:60]!r}")
    return out


def test_the_rule_sees_a_file_name_spelled_out(tmp_path: Path) -> None:
    names = _file_names()
    assert {"config.json", "metrics.json", "status.json", "rounds.jsonl", "partition.json", "samples.npz"} <= names
    bad = tmp_path / "probe.py"
    bad.write_text('"""Mentions metrics.json in prose: fine."""\nP = d / "metrics.json"\nG = "**/status.json"\n'
                   'M = f"no {x} in config.json"\n')
    hits = spelled_file_names(bad, names, root=tmp_path)
    assert sorted(h.split(" ")[0] for h in hits) == ["probe.py:2", "probe.py:3"]


def test_no_module_outside_runfolder_spells_a_run_folder_file_name() -> None:
    names = _file_names()
    files = [f for top in PACKAGE for f in sorted((REPO / top).rglob("*.py")) if f != OWNER]
    assert len(files) > 50  # the walk saw the package
    hits = [h for f in files for h in spelled_file_names(f, names)]
    assert not hits, "name these files through benchmark/core/runfolder.py's constants:\n" + "\n".join(hits)


def test_status_keeps_the_first_start_and_a_run_without_one_is_dated_by_its_wall_time(tmp_path: Path, monkeypatch) -> None:
    # prepare: a clock that says what we tell it
    clock = [1000.0]
    monkeypatch.setattr(runfolder.time, "time", lambda: clock[0])
    d = tmp_path / "run"
    d.mkdir()
    # execute: the first status, a resume's, the final one
    for now, state in ((1000.0, runfolder.RUNNING), (2000.5, runfolder.INTERRUPTED), (3000.25, runfolder.DONE)):
        clock[0] = now
        runfolder.write_status(d, state)
    # assert: every status keeps the first start; only "updated" moves
    status = runfolder.read_status(d)
    assert status["started_epoch"] == 1000.0 and status["updated_epoch"] == 3000.25 and status["started"]
    assert runfolder.RunFolder(d).started() == (1000.0, "recorded")
    # a status written before the field existed gains none when resumed (the resume is not the start) ...
    runfolder.write_json(d / runfolder.STATUS, {"state": "interrupted", "updated_epoch": 5000.0})
    clock[0] = 6000.0
    runfolder.write_status(d, runfolder.DONE)
    assert "started_epoch" not in runfolder.read_status(d) and runfolder.RunFolder(d).started() is None
    # ... and is dated by updated_epoch - wall_seconds once metrics.json says how long it ran
    runfolder.write_json(d / runfolder.METRICS, {"wall_seconds": 500.0})
    assert runfolder.RunFolder(d).started() == (5500.0, "derived")
