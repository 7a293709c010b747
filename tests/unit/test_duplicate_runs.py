"""One run id in two run folders (trees copied from two machines into one), issue 61 item 3: the reader
(benchmark/report/run_records.py `load_runs`) keeps one copy of identical results and names the other, and refuses
copies whose results differ, naming the folders, before the report writes anything."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dfbench.benchmark.cli import main
from dfbench.benchmark.report.frames import collect
from dfbench.benchmark.report.run_records import DuplicateRuns, load_runs
from helpers import fd, make_run


def _tree(root: Path) -> None:
    """Machine A's runs, copied as they are to machine B's folder of the same tree."""
    make_run(root / "machine-a", "s0-fa", seed=0, evaluations=[fd(100.0)])
    make_run(root / "machine-a", "s1-fa", seed=1, evaluations=[fd(110.0)])
    make_run(root / "machine-a", "s0-fp", method="fedprox", params={"mu": 0.01}, evaluations=[fd(90.0)])
    shutil.copytree(root / "machine-a", root / "machine-b")


def test_identical_copies_are_one_run_the_first_by_path_kept_and_the_other_named(tmp_path):
    _tree(tmp_path)
    done, failures = load_runs(tmp_path)
    assert sorted(r.run_id for r in done) == ["s0-fa", "s0-fp", "s1-fa"] and not failures
    assert all("machine-a" in str(r.path) for r in done)  # the first by path order
    said = next(r for r in done if r.run_id == "s0-fa").warnings
    assert any("machine-b" in w and "second copy of run s0-fa" in w and "identical results" in w for w in said)
    data = collect(tmp_path)  # was: pandas "Reindexing only valid with uniquely valued Index objects"
    assert len(data.runs) == 3 and sorted(data.table["n"]) == [1, 2]
    assert any("machine-b" in w for w in data.warnings)  # the page lists it with the run's warnings


def test_copies_whose_results_differ_are_refused_naming_both_folders_and_nothing_is_written(tmp_path, capsys):
    _tree(tmp_path)
    other = tmp_path / "machine-b" / "fmnist" / "iid" / "fedavg" / "s0-fa" / "metrics.json"
    metrics = json.loads(other.read_text())
    metrics["evaluations"][0]["value"] = 100.5  # another CPU rounds differently
    other.write_text(json.dumps(metrics))
    with pytest.raises(DuplicateRuns, match="s0-fa in .*machine-a.*s0-fa, .*machine-b.*s0-fa"):
        load_runs(tmp_path)
    out = tmp_path / "report"
    assert main(["report", "--runs", str(tmp_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "different results" in err and str(other.parent) in err and "Traceback" not in err
    assert not out.exists()
    # only the wall-clock times differ: the same run
    metrics["evaluations"][0]["value"], metrics["wall_seconds"] = 100.0, 99.0
    other.write_text(json.dumps(metrics))
    assert len(load_runs(tmp_path)[0]) == 3


def test_an_unfinished_copy_beside_a_finished_one_leaves_the_finished_one_reported(tmp_path):
    make_run(tmp_path / "machine-a", "s0-fa", evaluations=[fd(100.0)])
    make_run(tmp_path / "machine-b", "s0-fa", state="failed", error="killed")
    done, failures = load_runs(tmp_path)
    assert [r.run_id for r in done] == ["s0-fa"] and failures == []
    assert any("machine-b" in w and "failed" in w for w in done[0].warnings)
