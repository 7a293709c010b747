"""The reporter over a results folder that workers are still writing: running cells are listed,
half-finished folders never crash it."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from dfbench.benchmark.engine import lifecycle
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.core.lock import RunLock
from dfbench.benchmark.report.build import build_report
from dfbench.benchmark.report.run_records import load_runs
from helpers import SMALL, TINY, start_workers, tiny_config, wait_workers, write_grid

pytestmark = pytest.mark.slow  # real grid workers and whole reports


def test_running_unfinished_and_half_written_folders_are_listed_not_fatal(tmp_path, tiny_data, monkeypatch):
    runs = tmp_path / "runs"
    # prepare: a done run; a run that died after round 1 (status "running", no lock); the same
    # config under a live owner (this process holds its lock); a folder a worker has only locked
    done = lifecycle.run(tiny_config(over={"train.rounds": 1}), runs, data=tiny_data, progress=False)
    real = lifecycle.train_round

    def train_round(method, state, ctx, r):
        if r == 2:
            raise KeyboardInterrupt  # killed: the status stays "running" (as after SIGKILL)
        return real(method, state, ctx, r)

    monkeypatch.setattr(lifecycle, "train_round", train_round)
    killed, live = (runfolder.run_dir(runs, tiny_config(over={"seed": s})) for s in (1, 2))
    for seed in (1, 2):
        try:
            lifecycle.run(tiny_config(over={"seed": seed}), runs, data=tiny_data, progress=False)
        except KeyboardInterrupt:
            pass
    with open(live / "rounds.jsonl", "a") as f:
        f.write('{"round": 2, "loss')  # a torn last line, as while a row is being appended
    lock = RunLock(live)
    lock.acquire()
    just_locked = RunLock(runs / "fmnist" / "iid" / "fedavg" / "s3-0000000000")
    just_locked.acquire()
    try:
        # execute
        records, failures = load_runs(runs)
        written = build_report(runs, tmp_path / "report")
    finally:
        lock.release()
        just_locked.release()
    # assert: the done run is a record; the live one is running with its owner; the dead one unfinished
    assert [r.path for r in records] == [done]
    by_path = {f.path: f for f in failures}
    assert set(by_path) == {killed, live}
    assert by_path[live].state == "running"
    assert f"running on {socket.gethostname()} (pid {os.getpid()}) since " in by_path[live].reason
    assert "reached round 1 of 2" in by_path[live].reason
    assert by_path[killed].state == "unfinished" and "not running (no lock" in by_path[killed].reason
    assert "a rerun resumes it" in by_path[killed].reason
    md = Path(written["leaderboard_md"]).read_text()
    assert "| running |" in md and "| unfinished |" in md


def test_report_while_grid_workers_write_never_crashes_and_sees_running_cells(tmp_path):
    # prepare: two real grid workers on a 4-cell grid, each round slowed down so the report
    # reads folders in every stage (locked only, config only, running, torn rows, done)
    path = write_grid(tmp_path / "four.toml", {**TINY, **SMALL, "train.rounds": 3}, {"seed": [0, 1, 2, 3]})
    runs = tmp_path / "runs"
    runs.mkdir()
    argv = ["grid", str(path), "--out", str(runs), "--no-progress"]
    procs = start_workers([{"argv": argv, "trace": str(tmp_path / "trace.txt"), "round_sleep": 0.3}] * 2, tmp_path, delay_s=2)
    # execute: read the folder over and over while they write
    seen: set[str] = set()
    reads, built = 0, False
    while any(p.poll() is None for p in procs):
        records, failures = load_runs(runs)
        seen |= {f.state for f in failures} | ({"done"} if records else set())
        reads += 1
        if "running" in seen and not built:  # the whole report once, mid-write (plots are slow)
            md = Path(build_report(runs, tmp_path / "mid")["leaderboard_md"]).read_text()
            built = "| running |" in md
        time.sleep(0.05)
    assert wait_workers(procs, tmp_path) == [0, 0]
    # assert: running cells were listed while they ran; at the end all four are done
    assert "running" in seen and built and reads > 10, (seen, reads)
    records, failures = load_runs(runs)
    assert len(records) == 4 and failures == []
    assert Path(build_report(runs, tmp_path / "final")["leaderboard_md"]).is_file()


def _hand_run(runs: Path, seed: int, state: str, rounds_text: str, metrics: dict | None = None) -> Path:
    cfg = tiny_config(over={"seed": seed})
    d = runfolder.run_dir(runs, cfg)
    d.mkdir(parents=True)
    runfolder.write_json(d / runfolder.CONFIG, {"run_id": cfg.run_id(), **cfg.to_dict()})
    runfolder.write_status(d, state)
    (d / runfolder.ROUNDS).write_text(rounds_text)
    if metrics is not None:
        runfolder.write_json(d / runfolder.METRICS, metrics)
    return d


def test_interrupted_run_is_listed_unfinished_and_damaged_rounds_lines_are_named(tmp_path):
    from dfbench.benchmark.report.frames import collect

    # prepare: a run stopped by SIGTERM after round 1 (status "interrupted", no lock), and a done
    # run whose rounds.jsonl has a damaged middle line and a non-object line
    runs = tmp_path / "runs"
    row = json.dumps({"round": 1, "clients": [0], "loss": 0.5, "w2": 0.0})
    stopped = _hand_run(runs, 1, runfolder.INTERRUPTED, row + "\n")
    done = _hand_run(runs, 2, runfolder.DONE, row + "\n" + '{"round": 2, "lo\n' + "[3]\n" + row.replace('1', '3', 1) + "\n",
                     {"evaluations": [{"metric": "fd_fmnist", "value": 10.0, "extractor": "fmnist"}], "rounds": 2})
    # execute
    records, failures = load_runs(runs)
    data = collect(runs)
    md = Path(build_report(runs, tmp_path / "report")["leaderboard_md"]).read_text()
    # assert: the interrupted run is unfinished, as a dead "running" one is, with its progress
    assert [f.path for f in failures] == [stopped]
    assert failures[0].state == "unfinished" and "not running (no lock" in failures[0].reason
    assert "reached round 1 of 2" in failures[0].reason and "a rerun resumes it" in failures[0].reason
    assert "| unfinished |" in md
    # the done run keeps the rows around the damaged lines; each skipped line is one read warning
    # with core/runfolder.py's words (the one reader of rounds.jsonl)
    assert [r.path for r in records] == [done] and [r["round"] for r in records[0].rounds] == [1, 3]
    expected = runfolder.read_rounds_checked(done)[1]
    assert len(expected) == 2 and expected[1] == "rounds.jsonl line 3 skipped: not a JSON object"
    assert records[0].warnings == expected
    run_id = records[0].run_id
    assert data.warnings == [f"{run_id}: {w}" for w in expected]
    assert f"- {run_id}: rounds.jsonl line 2 skipped: " in md
