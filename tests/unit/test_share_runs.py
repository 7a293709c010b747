"""share_runs copies another study's finished runs that are cells of a grid (same run id = same result),
whole, and nothing else: not an unfinished run, not a run of another config, not over a cell already there."""

from __future__ import annotations

import json

from dfbench.benchmark.grid.spec import load_grid
from helpers import load_script

share = load_script("results/paper-fmnist-budget/share_runs.py").share

GRID = """
name = "t"
[base]
"data.dataset" = "fmnist"
"train.model" = "tiny"
"train.rounds" = 1
[axes]
method = ["fedavg", "fedprox?mu=0.1"]
seed = [0, 1]
"""


def _run(root, cell, state="done"):
    d = cell.folder(root)
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")  # what makes a folder a run folder (runfolder.iter_runs)
    (d / "status.json").write_text(json.dumps({"state": state}))
    (d / "metrics.json").write_text("{}")
    return d


def test_share_copies_finished_cells_only(tmp_path):
    grid = tmp_path / "t.toml"
    grid.write_text(GRID)
    cells = load_grid(grid).cells
    other = tmp_path / "other"
    _run(other, cells[0])
    _run(other, cells[1], state="running")
    stranger = other / "fmnist" / "iid" / "fedavg" / "s0-0000000000"
    stranger.mkdir(parents=True)
    (stranger / "config.json").write_text("{}")
    (stranger / "status.json").write_text(json.dumps({"state": "done"}))
    target = tmp_path / "mine"
    already = _run(target, cells[2])
    _run(other, cells[2])  # finished there too: not copied over the one already here
    (already / "metrics.json").write_text('{"mine": 1}')
    unconfigured = other / "fmnist" / "iid" / "fedavg" / cells[3].run_id
    unconfigured.mkdir(parents=True)
    (unconfigured / "status.json").write_text(json.dumps({"state": "done"}))  # no config.json: not a run folder
    copied = share(str(grid), other, target)
    assert copied == [cells[0].folder(target)]
    assert (cells[0].folder(target) / "metrics.json").read_text() == "{}"
    assert not cells[1].folder(target).exists() and (already / "metrics.json").read_text() == '{"mine": 1}'
    assert not cells[3].folder(target).exists()
    assert share(str(grid), other, target) == []  # a second pass finds nothing to copy
