"""`make demo`'s reproduction line: scores matched by run id, compared exactly, the largest difference named."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from helpers import load_script

R = load_script("results/demo/reproduce.py")


def _runs_csv(folder: Path, rows: list[dict], hardware: str) -> None:
    folder.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(folder / "runs.csv", index=False)
    for row in rows:
        run = folder / "runs" / row["run_id"]
        run.mkdir(parents=True)
        (run / "config.json").write_text("{}")  # what makes a folder a run folder (runfolder.iter_runs)
        (run / "metrics.json").write_text(json.dumps({"environment": {"hardware": hardware}}))


def _row(run_id: str, setting: str, fd: float, loss: float | None) -> dict:
    return {"run_id": run_id, "setting": setting, "fd_fmnist": fd, "fd_fmnist__lo": fd - 1, "fd_fmnist__hi": fd + 1,
            "denoise_loss": loss, "denoise_loss__lo": loss, "denoise_loss__hi": loss, "wall_seconds": 12.0}


def test_equal_scores_are_counted_and_said_bit_for_bit(tmp_path: Path) -> None:
    # prepare: the same two runs on the same machine
    rows = [_row("s0-a", "fedavg", 236.0, 0.5), _row("s0-b", "untrained", 816.8, None)]
    _runs_csv(tmp_path / "fresh", rows, "CPU X, 2 cores")
    _runs_csv(tmp_path / "ref", rows, "CPU X, 2 cores")
    # execute
    r = R.reproduce(tmp_path / "fresh", tmp_path / "ref")
    line = R.describe(r, tmp_path / "ref")
    # assert: 3 scores (a metric neither run has is not a score), all equal; wall time is no score
    assert (r.compared, r.equal, r.close, r.worst, r.missing_runs) == (3, 3, 3, None, ())
    assert "all 3 scores equal" in line and "bit for bit" in line
    assert R.main([str(tmp_path / "fresh"), str(tmp_path / "ref")]) == 0


def test_a_difference_names_the_largest_and_both_machines(tmp_path: Path) -> None:
    # prepare: top-k's fd moved by 1 %, fedavg's by 1e-7 (float64 rounding), top-k's loss by 10 %; another CPU
    _runs_csv(tmp_path / "ref", [_row("s0-a", "fedavg", 200.0, 0.5), _row("s0-c", "topk", 400.0, 0.6)], "AMD EPYC, 2 cores")
    _runs_csv(tmp_path / "fresh", [_row("s0-a", "fedavg", 200.00002, 0.5), _row("s0-c", "topk", 404.0, 0.66)], "Intel Xeon, 2 cores")
    pd.DataFrame({"primary_metric": ["fd_fmnist", "fd_fmnist"]}).to_csv(tmp_path / "ref" / "leaderboard.csv", index=False)
    # execute
    r = R.reproduce(tmp_path / "fresh", tmp_path / "ref")
    line = R.describe(r, tmp_path / "ref")
    # assert: 4 scores, 1 equal (fedavg's loss), 2 within 1e-6; the ranking metric's worst and the overall worst
    assert (r.compared, r.equal, r.close) == (4, 1, 2)
    assert r.primary == "fd_fmnist" and r.primary_worst == ("topk", "fd_fmnist", 400.0, 404.0)
    assert r.worst == ("topk", "denoise_loss", 0.6, 0.66)
    assert "ranking metric: fd_fmnist of topk: 400 committed, 404 now (+1.00%)" in line
    assert "any score: denoise_loss of topk" in line and "(+10.00%)" in line
    assert "AMD EPYC, 2 cores" in line and "Intel Xeon, 2 cores" in line
    assert "round differently" in line
    assert R.main([str(tmp_path / "fresh"), str(tmp_path / "ref")]) == 0  # another CPU: said, not failed


def test_a_reference_run_without_a_fresh_run_fails(tmp_path: Path, capsys) -> None:
    _runs_csv(tmp_path / "ref", [_row("s0-a", "fedavg", 200.0, 0.5), _row("s0-c", "topk", 400.0, 0.6)], "CPU X")
    _runs_csv(tmp_path / "fresh", [_row("s0-a", "fedavg", 200.0, 0.5)], "CPU X")
    assert R.main([str(tmp_path / "fresh"), str(tmp_path / "ref")]) == 1
    assert "1 committed run(s) have no fresh run: topk (s0-c)" in capsys.readouterr().out


def test_a_missing_runs_csv_says_how_to_make_it(tmp_path: Path, capsys) -> None:
    (tmp_path / "ref").mkdir()
    assert R.main([str(tmp_path / "fresh"), str(tmp_path / "ref")]) == 1
    assert "dfbench report --runs" in capsys.readouterr().err
