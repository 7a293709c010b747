"""Many processes, one results folder: real `dfbench` processes racing on runs and grids.

Each process is tests/helpers.py run as a script (helpers.start_workers): it swaps the dataset for
the small synthetic one (conftest.make_imageset), records every round it trains in a shared trace
file, optionally sleeps in each round (so that runs overlap however slowly the machine starts them)
or SIGKILLs itself after a checkpoint, waits for a common start time, then calls `dfbench` (cli.main).
"""

from __future__ import annotations

import signal
import socket
from collections import Counter
from pathlib import Path

import pytest
import torch

from dfbench.benchmark.grid import plan as P, spec as S
from dfbench.benchmark.engine import lifecycle
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.cli import build_parser, config_from_args
from dfbench.benchmark.core.config import ConfigError
from dfbench.benchmark.core.lock import LOCK_NAME, read_lock
from helpers import SMALL, TINY, start_workers, wait_workers, write_grid

pytestmark = pytest.mark.slow  # real dfbench processes racing on one results folder

RUN_ARGS = ["--dataset", "fmnist", "--clients", "2", "--local-steps", "1", "--batch-size", "8", "--eval-samples", "16",
            "--sampler-steps", "3", "--set", "train.model=tiny", "--set", "eval.metrics=none", "--set", "eval.grid=4",
            "--set", "data.min_client_size=4", "--set", "train.sigma1_probe_steps=0", "--set", "checkpoint_every=1",
            "--no-progress"]


def _trace(path: Path) -> list[tuple[int, str, int]]:
    return [(int(a), b, int(c)) for a, b, c in (line.split() for line in path.read_text().splitlines())]


def _no_leftovers(root: Path) -> None:
    assert not list(root.rglob(LOCK_NAME + "*")) and not list(root.rglob("*.tmp"))


# -- tests --------------------------------------------------------------------------------------

def test_two_processes_racing_on_one_run_train_it_once(tmp_path):
    # prepare / execute: the same `dfbench run` twice, started at the same moment
    out, trace = tmp_path / "runs", tmp_path / "trace.txt"
    argv = ["run", *RUN_ARGS, "--rounds", "3", "--out", str(out)]
    procs = start_workers([{"argv": argv, "trace": str(trace), "round_sleep": 0.5}] * 2, tmp_path)
    codes = wait_workers(procs, tmp_path)
    # assert: one trained (exit 0), the other stopped at once (exit 1) naming the owner
    logs = [(tmp_path / f"p{i}.log").read_text() for i in range(2)]
    assert sorted(codes) == [0, 1], logs
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    assert "dfbench: error: run folder" in logs[loser]
    assert f"is in use by host {socket.gethostname()}, pid {procs[winner].pid}, since " in logs[loser]
    rows = _trace(trace)
    assert {pid for pid, _, _ in rows} == {procs[winner].pid} and [r for _, _, r in rows] == [1, 2, 3]
    d = runfolder.run_dir(out, config_from_args(build_parser().parse_args(argv)))
    assert [r["round"] for r in runfolder.read_rounds(d)] == [1, 2, 3]
    assert runfolder.read_status(d)["state"] == "done"
    _no_leftovers(out)


def test_three_grid_workers_share_six_cells_each_run_once_longest_first(tmp_path):
    # prepare: 6 cells, three of 2 rounds and three of 1 (so the cost order is visible)
    path = write_grid(tmp_path / "six.toml", {**TINY, **SMALL}, {"train.rounds": [1, 2], "seed": [0, 1, 2]})
    grid = S.load_grid(path)
    out, trace = tmp_path / "runs", tmp_path / "trace.txt"
    # execute: three workers, no --shard
    argv = ["grid", str(path), "--out", str(out), "--no-progress"]
    procs = start_workers([{"argv": argv, "trace": str(trace), "round_sleep": 0.4}] * 3, tmp_path)
    codes = wait_workers(procs, tmp_path)
    logs = "\n".join((tmp_path / f"p{i}.log").read_text() for i in range(3))
    assert codes == [0, 0, 0], logs
    # assert: every round of every cell trained exactly once; all done; no duplicate rows
    rows = _trace(trace)
    assert Counter((rid, r) for _, rid, r in rows) == Counter(
        (c.run_id, r) for c in grid.cells for r in range(1, c.cfg.train.rounds + 1))
    for c in grid.cells:
        d = c.folder(out)
        assert runfolder.read_status(d)["state"] == "done"
        assert [r["round"] for r in runfolder.read_rounds(d)] == list(range(1, c.cfg.train.rounds + 1))
    # the work was shared, and each worker began with one of the long cells
    first = {}
    for pid, rid, _ in rows:
        first.setdefault(pid, rid)
    long_ids = {c.run_id for c in grid.cells if c.cfg.train.rounds == 2}
    assert len(first) >= 2 and set(first.values()) <= long_ids, rows
    assert logs.count(" done     ") == 6  # each cell reported done by exactly one worker
    _no_leftovers(out)
    assert all(P.cell_state(out, c) == "done" for c in grid.cells)


def test_grid_workers_flag_starts_cooperating_processes_that_run_each_cell_once(tmp_path):
    # prepare: 4 cells of 3 rounds of 1 s each, so the work outlasts the extra workers' start-up
    # (a Python + torch import, several seconds on a loaded 2-core machine)
    path = write_grid(tmp_path / "four.toml", {**TINY, **SMALL}, {"train.rounds": [3], "seed": [0, 1, 2, 3]})
    grid = S.load_grid(path)
    out, trace = tmp_path / "runs", tmp_path / "trace.txt"
    # execute: ONE command asking for three workers
    argv = ["grid", str(path), "--out", str(out), "--workers", "3", "--no-progress"]
    procs = start_workers([{"argv": argv, "trace": str(trace), "round_sleep": 1.0}], tmp_path)
    codes = wait_workers(procs, tmp_path)
    log = (tmp_path / "p0.log").read_text()
    assert codes == [0], log
    # assert: three processes trained, every round of every cell exactly once, all done
    assert "dfbench grid: 3 workers on" in log and "OMP_NUM_THREADS=1" in log
    rows = _trace(trace)
    assert Counter((rid, r) for _, rid, r in rows) == Counter((c.run_id, r) for c in grid.cells for r in (1, 2, 3))
    assert len({pid for pid, _, _ in rows}) >= 2, rows
    assert log.count(" done     ") == 4, log
    assert all(P.cell_state(out, c) == "done" for c in grid.cells)
    # the command's own summary comes last, after its workers exited: every cell done, none "running"
    last = log.rstrip().splitlines()[-1]
    assert last.startswith("grid t: 4 cell(s) selected") and last.endswith("; 4 done"), log
    # the two extra workers print only what they ran (they do not wait for the others: a full summary of
    # theirs listed the cells still running elsewhere as "running")
    assert log.count("(extra worker, pid ") == 2 and "running:" not in log, log
    _no_leftovers(out)


def test_python_api_run_grid_with_two_workers_runs_each_cell_once(tmp_path):
    # prepare: 2 cells of 1 round, made 2 rounds (of 1 s each) by an override, which every worker must apply
    path = write_grid(tmp_path / "two.toml", {**TINY, **SMALL, "train.rounds": 1}, {"seed": [0, 1]})
    out, trace = tmp_path / "runs", tmp_path / "trace.txt"
    grid = S.load_grid(path, extra={"train.rounds": 2})
    # execute: dfbench.run_grid(..., workers=2) from Python (in a process with the synthetic data)
    call = {"grid": str(path), "out": str(out), "workers": 2, "rounds": 2}
    procs = start_workers([{"python": call, "trace": str(trace), "round_sleep": 1.0}], tmp_path, delay_s=0)
    codes = wait_workers(procs, tmp_path)
    log = (tmp_path / "p0.log").read_text()
    assert codes == [0], log
    # assert: two processes, every round of every cell once, all done, and the summary says so
    assert "dfbench grid: 2 workers on" in log and "OMP_NUM_THREADS=1" in log
    rows = _trace(trace)
    assert Counter((rid, r) for _, rid, r in rows) == Counter((c.run_id, r) for c in grid.cells for r in (1, 2))
    assert all(P.cell_state(out, c) == "done" for c in grid.cells)
    last = log.rstrip().splitlines()[-1]
    assert last.startswith("grid t: 2 cell(s) selected") and last.endswith("; 2 done"), log
    _no_leftovers(out)


def test_worker_command_line_keeps_grid_selection_and_overrides_drops_workers_and_download_and_is_quiet(tmp_path):
    from dfbench.benchmark.core.config import parse_value
    from dfbench.benchmark.grid.workers import set_text, worker_argv
    path = write_grid(tmp_path / "one.toml", {**TINY, **SMALL}, {"seed": [0]})
    grid = S.load_grid(path, extra={"train.lr": 0.002, "method": "fedprox?mu=0.1", "data.root": "1", "device": "cpu"})
    assert worker_argv(grid, tmp_path / "o", only=["*/0"], retry_failed=True) == [
        "grid", str(path), "--out", str(tmp_path / "o"), "--only", "*/0", "--set", "train.lr=0.002",
        "--set", "method=fedprox?mu=0.1", "--set", 'data.root="1"', "--device", "cpu", "--retry-failed", "--no-progress"]
    # a worker's grid is the same grid: --set values read back as the values given
    for value in ("dirichlet:0.1", "1", "true", "NaN", "", 3, 0.1, 1e-9, True, None):
        assert parse_value(set_text(value)) == value and type(parse_value(set_text(value))) is type(value)
    with pytest.raises(ConfigError, match="grid workers read the grid from its file"):
        worker_argv(S.parse_grid({"axes": {"seed": [0]}}), tmp_path / "o")


@pytest.mark.parametrize("extra, message", [
    (["--workers", "2", "--shard", "0/2"], "--workers shares the cells by locking them"),
    (["--workers", "2", "--force"], "--workers shares the cells by locking them"),
    (["--workers", "0"], "invalid value for '--workers': 0"),
])
def test_grid_workers_flag_refuses_what_it_cannot_share(tmp_path, capsys, extra, message):
    from dfbench.benchmark.cli import main
    path = write_grid(tmp_path / "one.toml", {**TINY, **SMALL}, {"seed": [0]})
    assert main(["grid", str(path), "--out", str(tmp_path / "runs"), *extra]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # refused before any work


def test_a_lock_left_by_a_sigkilled_owner_is_taken_over_and_the_run_resumes_bitwise(tmp_path, tiny_data):
    # prepare: a `dfbench run` SIGKILLs itself right after its round-2 checkpoint (of 3)
    out, trace = tmp_path / "runs", tmp_path / "trace.txt"
    argv = ["run", *RUN_ARGS, "--rounds", "3", "--out", str(out)]
    cfg = config_from_args(build_parser().parse_args(argv))
    procs = start_workers([{"argv": argv, "trace": str(trace), "kill_after_checkpoint": 2}], tmp_path, delay_s=0)
    assert wait_workers(procs, tmp_path) == [-signal.SIGKILL]
    d = runfolder.run_dir(out, cfg)
    owner = read_lock(d)
    assert owner is not None and owner.pid == procs[0].pid  # the dead owner's lock is still there
    assert runfolder.read_status(d)["state"] == "running" and runfolder.load_checkpoint(d)["round"] == 2
    # execute: the next run takes the lock over (the pid is gone) and resumes from round 2
    with pytest.warns(UserWarning, match=f"took over the stale lock .* pid {owner.pid} no longer exists"):
        assert lifecycle.run(cfg, out, data=tiny_data, progress=False) == d
    # assert: bitwise the uninterrupted run; every round once; lock released
    ref = lifecycle.run(cfg, tmp_path / "ref", data=tiny_data, progress=False)
    assert torch.equal(runfolder.load_checkpoint(d)["params"], runfolder.load_checkpoint(ref)["params"])
    assert [r["round"] for r in runfolder.read_rounds(d)] == [1, 2, 3]
    assert runfolder.read_status(d)["state"] == "done" and read_lock(d) is None

