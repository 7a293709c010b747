"""A grid checks its inputs before its first cell (benchmark/grid/fetch.py: required_inputs, preflight)."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
import scipy.io

from dfbench.benchmark.grid import fetch as F
from dfbench.benchmark.grid import runner as R, spec as S
from dfbench.benchmark.cli import main
from dfbench.datasets import sources
from helpers import TINY, tiny_config
from http_files import serve

HAS_FMNIST = Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").is_file()


@pytest.fixture(autouse=True)
def _no_data_anywhere(monkeypatch, tmp_path):
    """Empty $DFBENCH_DATA and cache, no weights, no mirror."""
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("DFBENCH_DATA", str(tmp_path / "empty"))
    monkeypatch.setenv("DFBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    monkeypatch.delenv("DFBENCH_INCEPTION_WEIGHTS", raising=False)
    monkeypatch.delenv("DFBENCH_CLEAN_INCEPTION_WEIGHTS", raising=False)
    monkeypatch.delenv("DFBENCH_MIRROR", raising=False)
    sources.clear_cache()
    yield
    sources.clear_cache()


def svhn_mat(n: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    scipy.io.savemat(buf, {"X": rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8),
                           "y": rng.integers(1, 11, (n, 1)).astype(np.uint8)})
    return buf.getvalue()


def svhn_grid(tmp_path: Path, seeds: list[int]) -> Path:
    """A tiny grid TOML on SVHN, one cell per seed (JSON scalars are valid TOML scalars)."""
    base = {**TINY, "data.dataset": "svhn"}
    lines = ['name = "svhn"', "[base]", *(f'"{k}" = {json.dumps(v)}' for k, v in base.items()),
             "[axes]", f"seed = {json.dumps(seeds)}"]
    path = tmp_path / "svhn.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_grid_whose_data_is_missing_stops_before_any_cell_with_one_message(tmp_path, capsys):
    out = tmp_path / "runs"
    assert main(["grid", str(svhn_grid(tmp_path, [0, 1, 2])), "--out", str(out), "--no-progress"]) == 1
    captured = capsys.readouterr()
    assert not out.exists() or not any(out.rglob("config.json"))  # no run folder was created
    err = captured.err
    assert err.strip().endswith("Get them with: `dfbench fetch svhn` (or rerun with --download).")
    assert "svhn (train), needed by 3 run(s)" in err and "nothing was run" in err
    assert err.count("not found") == 1  # the loader's paragraph once, not once per cell
    assert str(tmp_path / "empty") in err  # where it looked


def test_download_fetches_the_grids_data_then_runs(tmp_path, monkeypatch, capsys):
    train, test = svhn_mat(24, 0), svhn_mat(8, 1)
    for name, blob in (("train_32x32.mat", train), ("test_32x32.mat", test)):
        monkeypatch.setitem(sources.CHECKSUMS["svhn"], name, ("sha256", hashlib.sha256(blob).hexdigest()))
    out = tmp_path / "runs"
    with serve({"train_32x32.mat": train, "test_32x32.mat": test}) as server:
        monkeypatch.setenv("DFBENCH_MIRROR", server.url)
        code = main(["grid", str(svhn_grid(tmp_path, [0])), "--out", str(out), "--no-progress", "--download"])
    assert code == 0, capsys.readouterr().err
    assert sorted(server.requests) == ["test_32x32.mat", "train_32x32.mat"]
    assert (tmp_path / "cache" / "data" / "svhn" / "train_32x32.mat").read_bytes() == train
    assert len(list(out.rglob("status.json"))) == 1


def test_required_inputs_follow_the_metrics_and_reference_split():
    cifar = tiny_config(over={"data.dataset": "cifar10", "eval.metrics": "auto"})
    fm_auto = tiny_config(over={"eval.metrics": "auto"})
    fm_clean = tiny_config(over={"eval.metrics": "fd_fmnist,fid_clean", "eval.reference_split": "test", "seed": 1})
    fm_none = tiny_config(over={"seed": 2, "data.root": "/data/fm"})
    inputs = F.required_inputs([cifar, fm_auto, fm_clean, fm_none])
    assert [(i.kind, i.name, i.splits, i.root, i.runs, i.why) for i in inputs] == [
        ("dataset", "cifar10", ("train",), None, 1, ()),
        ("weights", "inception", (), None, 1, ("fid", "kid")),  # auto on cifar10 scores FID
        ("dataset", "fmnist", ("train", "test"), None, 2, ()),  # auto on fmnist needs no weights
        ("weights", "clean-inception", (), None, 1, ("fid_clean",)),
        ("dataset", "fmnist", ("train",), "/data/fm", 1, ()),  # metrics none: no reference split
    ]
    assert inputs[-1].command == "dfbench fetch fmnist --data-root /data/fm"


@pytest.mark.skipif(not HAS_FMNIST, reason="needs dataset-fashion-mnist")
def test_missing_weights_only_warn_that_evaluation_will_be_pending(monkeypatch):
    monkeypatch.delenv("DFBENCH_DATA")
    lines: list[str] = []
    F.preflight([tiny_config(over={"eval.metrics": "fid", "seed": s}) for s in (0, 1)], echo=lines.append)
    assert len(lines) == 1
    assert "2 run(s) will train but leave their evaluation pending (fid)" in lines[0]
    assert "`dfbench fetch inception`" in lines[0] and "dfbench eval" in lines[0]


def test_supplied_data_and_an_empty_selection_are_not_checked(tmp_path):
    grid = S.load_grid(svhn_grid(tmp_path, [0]))
    with pytest.raises(F.MissingInputsError, match="dfbench fetch svhn"):
        R.run_grid(grid, tmp_path / "runs", progress=False, echo=lambda _: None)
    F.preflight([grid.cells[0].cfg], check_data=False)  # the caller brings the data: nothing to check
    # a grid with nothing left to run needs nothing
    F.preflight([])


def test_dry_run_lists_what_is_missing(tmp_path, capsys):
    assert main(["grid", str(svhn_grid(tmp_path, [0, 1])), "--out", str(tmp_path / "runs"), "--dry-run"]) == 0
    assert "svhn data (train), 2 run(s): MISSING: `dfbench fetch svhn` or --download" in capsys.readouterr().out
