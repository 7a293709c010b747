"""Run-folder locks (benchmark/core/lock.py): exclusive, named owner, heartbeat, stale takeover, every exit path."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dfbench.benchmark.core import lock as L
from dfbench.benchmark.engine import lifecycle
from dfbench.benchmark.core import runfolder
from helpers import tiny_config

ROOT = Path(__file__).resolve().parents[2]


def _write_lock(folder: Path, *, host: str, pid: int, age_s: float = 0.0, token: str = "old") -> Path:
    """A lock file as another process would have left it, with a heartbeat `age_s` seconds old."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / L.LOCK_NAME
    started = time.time() - age_s
    path.write_text(json.dumps({"host": host, "pid": pid, "boot_id": L._boot_id(), "started": started, "token": token}))
    os.utime(path, (started, started))
    return path


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# -- the primitive -----------------------------------------------------------------------------------

def test_one_owner_named_in_the_refusal_and_release_cleans_up(tmp_path):
    folder = tmp_path / "runs" / "fmnist" / "run"
    a, b = L.RunLock(folder), L.RunLock(folder)
    assert a.try_acquire() and a.created == [folder, folder.parent, folder.parent.parent]
    info = L.read_lock(folder)
    assert (info.host, info.pid, info.token) == (socket.gethostname(), os.getpid(), a.token)
    assert not b.try_acquire()  # a live owner (this very process) holds it
    with pytest.raises(L.LockHeld) as err:
        b.acquire()
    msg = str(err.value)
    assert f"host {socket.gethostname()}, pid {os.getpid()}, since {info.since}" in msg and "--wait" in msg
    a.release()
    assert L.read_lock(folder) is None and not (tmp_path / "runs").exists()  # the empty folders it made are gone too
    a.release()  # twice is harmless
    (tmp_path / "runs" / "fmnist" / "other").mkdir(parents=True)  # another run beside it
    with b:  # free now
        assert b.held and L.read_lock(folder).token == b.token
    assert not folder.exists() and (tmp_path / "runs" / "fmnist" / "other").is_dir()


def test_release_keeps_a_folder_with_content_and_a_lock_not_its_own(tmp_path):
    folder = tmp_path / "run"
    a = L.RunLock(folder)
    a.acquire()
    (folder / "status.json").write_text("{}")
    a.release()
    assert folder.is_dir() and not (folder / L.LOCK_NAME).exists()
    # a lock that was taken over is not deleted by the old owner's release
    a.acquire()
    _write_lock(folder, host="elsewhere", pid=1, token="new")
    a.release()
    assert L.read_lock(folder).token == "new"


def test_same_host_dead_pid_is_taken_over_at_once_with_a_warning(tmp_path):
    folder = tmp_path / "run"
    pid = _dead_pid()
    _write_lock(folder, host=socket.gethostname(), pid=pid, age_s=1.0)
    assert "no longer exists" in L.read_lock(folder).stale_reason(stale_s=1e6)
    lk = L.RunLock(folder, stale_s=1e6)  # the heartbeat rule alone would wait for days
    with pytest.warns(UserWarning, match=f"took over the stale lock .* pid {pid} no longer exists on this host"):
        assert lk.try_acquire()
    assert L.read_lock(folder).token == lk.token and not list(folder.glob(".lock.stale-*"))
    lk.release()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="zombies are read from /proc (Linux)")
def test_a_sigkilled_holder_not_yet_reaped_is_taken_over_at_once(tmp_path):
    # issue 61: a SIGKILLed grid worker whose parent has not reaped it is a zombie; os.kill(pid, 0)
    # still succeeds on it, so the lock counted it alive and the cell stayed taken until the heartbeat rule
    folder = tmp_path / "run"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        child.kill()  # SIGKILL, and no wait(): the child stays a zombie of this process
        def state() -> str:  # the third field of /proc/<pid>/stat, read here as the test's own witness
            return Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()[0]

        deadline = time.time() + 10
        while state() != "Z" and time.time() < deadline:
            time.sleep(0.01)
        assert state() == "Z", "the killed child should be a zombie until it is reaped"
        os.kill(child.pid, 0)  # what the old check asked: it still succeeds on a zombie
        _write_lock(folder, host=socket.gethostname(), pid=child.pid, age_s=0.0)
        reason = L.read_lock(folder).stale_reason(stale_s=1e6)  # the heartbeat rule alone would wait for days
        assert reason is not None and f"pid {child.pid} no longer exists" in reason and "zombie" in reason
        lk = L.RunLock(folder, stale_s=1e6)
        with pytest.warns(UserWarning, match=f"took over the stale lock .* pid {child.pid} no longer exists"):
            assert lk.try_acquire()
        lk.release()
    finally:
        child.wait()
    assert L._pid_alive(os.getpid())  # a live process is still alive


def test_other_host_is_stale_only_after_the_heartbeat_threshold(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    _write_lock(folder, host="node-17", pid=os.getpid() + 10**6, age_s=50)
    monkeypatch.setenv(L.STALE_ENV, "60")
    assert L.stale_from_env() == 60.0
    assert not L.RunLock(folder).try_acquire()  # 50 s quiet < 60 s: alive (its pid means nothing here)
    monkeypatch.setenv(L.STALE_ENV, "40")
    lk = L.RunLock(folder)
    with pytest.warns(UserWarning, match="host node-17.*no heartbeat for 50 s"):
        assert lk.try_acquire()
    lk.release()
    for bad in ("soon", "0", "-1", "inf"):
        monkeypatch.setenv(L.STALE_ENV, bad)
        with pytest.raises(ValueError, match=L.STALE_ENV):
            L.stale_from_env()


def test_a_half_written_lock_counts_as_held_until_its_mtime_is_stale(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    path = folder / L.LOCK_NAME
    path.write_text("")  # the owner died between O_EXCL create and write, or is writing now
    assert L.read_lock(folder).host == "?"
    assert not L.RunLock(folder, stale_s=30).try_acquire()
    old = time.time() - 60
    os.utime(path, (old, old))
    lk = L.RunLock(folder, stale_s=30)
    with pytest.warns(UserWarning, match="no heartbeat"):
        assert lk.try_acquire()
    lk.release()


def test_heartbeat_refreshes_the_mtime_and_notices_a_takeover(tmp_path):
    folder = tmp_path / "run"
    lk = L.RunLock(folder, stale_s=60, heartbeat_s=0.05)
    lk.acquire()
    old = time.time() - 30
    os.utime(lk.path, (old, old))
    deadline = time.time() + 5
    while L.read_lock(folder).heartbeat < time.time() - 10 and time.time() < deadline:
        time.sleep(0.02)
    assert time.time() - L.read_lock(folder).heartbeat < 10 and not lk.lost
    # another process presumed it dead and took over: the owner learns it at its next beat
    thief = L.RunLock(folder, stale_s=1e-3)
    with pytest.warns(UserWarning, match="took over"):
        assert thief.try_acquire()
    while not lk.lost and time.time() < deadline + 5:
        time.sleep(0.02)
    assert lk.lost
    lk.release()  # leaves the thief's lock alone
    assert L.read_lock(folder).token == thief.token
    thief.release()


CONTEND = """
import sys, time, warnings
from dfbench.benchmark.core.lock import RunLock
warnings.simplefilter("ignore")
lk = RunLock(sys.argv[1], stale_s=30)
while time.time() < float(sys.argv[2]):
    time.sleep(0.001)
won = lk.try_acquire()
print("WON" if won else "LOST", flush=True)
from pathlib import Path
marks = Path(sys.argv[3])
(marks / str(time.time_ns())).touch()
deadline = time.time() + 30
while won and len(list(marks.iterdir())) < int(sys.argv[4]) and time.time() < deadline:
    time.sleep(0.01)  # the winner holds the lock until every contender has tried (however slow its start)
lk.release()
"""


@pytest.mark.slow
def test_concurrent_takeover_of_one_stale_lock_has_exactly_one_winner(tmp_path):
    # six processes judge the same stale lock at the same moment; rename-aside + check + O_EXCL lets one win
    folder = tmp_path / "run"
    _write_lock(folder, host="node-3", pid=1, age_s=120)
    start = time.time() + 2.0  # they all start trying at once, after importing
    marks = tmp_path / "tried"
    marks.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", CONTEND, str(folder), str(start), str(marks), "6"],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT) for _ in range(6)]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert sorted(outs) == ["LOST"] * 5 + ["WON"], outs
    assert L.read_lock(folder) is None and not list(folder.glob(".lock*"))


# -- every exit path of a run releases its lock ------------------------------------------------------

def _leftovers(d: Path) -> list[str]:
    """Lock files, temporary files and unparsable JSON in a run folder (none may be left)."""
    bad = [p.name for p in d.rglob(".lock*")] + [p.name for p in d.rglob("*.tmp")]
    for p in d.glob("*.json"):
        try:
            json.loads(p.read_text())
        except ValueError:
            bad.append(p.name)
    return bad


@pytest.mark.slow
def test_run_releases_its_lock_when_done_failed_or_interrupted(tmp_path, tiny_data, monkeypatch):
    cfg = tiny_config(over={"train.rounds": 2})
    d = lifecycle.run(cfg, tmp_path / "ok", data=tiny_data, progress=False)
    assert runfolder.read_status(d)["state"] == "done" and not _leftovers(d)
    real = lifecycle.train_round
    for exc, state in ((RuntimeError("boom"), "failed"), (KeyboardInterrupt(), "running")):
        def train_round(method, st, ctx, r, exc=exc):
            if r == 2:
                raise exc
            return real(method, st, ctx, r)

        monkeypatch.setattr(lifecycle, "train_round", train_round)
        with pytest.raises(type(exc)):
            lifecycle.run(cfg, tmp_path / state, data=tiny_data, progress=False)
        d = runfolder.run_dir(tmp_path / state, cfg)
        assert runfolder.read_status(d)["state"] == state and not _leftovers(d)


@pytest.mark.slow
def test_a_locked_run_is_refused_on_entry_and_waited_for_with_wait(tmp_path, tiny_data):
    cfg = tiny_config(over={"train.rounds": 1})
    d = runfolder.run_dir(tmp_path, cfg)
    other = L.RunLock(d)
    other.acquire()
    with pytest.raises(L.LockHeld, match=f"pid {os.getpid()}"):
        lifecycle.run(cfg, tmp_path, data=tiny_data, progress=False)
    assert sorted(p.name for p in d.iterdir()) == [L.LOCK_NAME]  # nothing was written
    # --wait: polls until the owner releases, then runs
    import threading

    threading.Timer(0.5, other.release).start()
    t0 = time.perf_counter()
    assert lifecycle.run(cfg, tmp_path, data=tiny_data, progress=False, wait=True) == d
    assert time.perf_counter() - t0 >= 0.4 and runfolder.read_status(d)["state"] == "done"


@pytest.mark.slow
def test_gpu_out_of_memory_fails_the_run_naming_the_settings_and_leaves_nothing_behind(tmp_path, tiny_data, monkeypatch):
    # prepare: the training step runs out of GPU memory in round 2 (raised on the CPU)
    cfg = tiny_config(over={"train.rounds": 3, "train.batch_size": 8, "train.clients_mode": "batched", "train.client_batch": 2,
                             "checkpoint_every": 1})
    import dfbench.benchmark.engine.batched as batched

    real = batched.train_clients

    def train_clients(ctx, plans, r, settings):
        if r == 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(ctx, plans, r, settings)

    monkeypatch.setattr(batched, "train_clients", train_clients)
    # execute
    with pytest.raises(lifecycle.OutOfMemory) as err:
        lifecycle.run(cfg, tmp_path, data=tiny_data, progress=False)
    # assert: failed, with what to lower and their current values; round 1 kept; no lock, no temp file
    d = runfolder.run_dir(tmp_path, cfg)
    status = runfolder.read_status(d)
    assert status["state"] == "failed" and status["error"].startswith("OutOfMemory: out of GPU memory on cpu")
    for needle in ("train.batch_size (now 8)", "train.model (now 'tiny' = tiny", "train.client_batch", "(now 2)",
                   "--set train.batch_size=4", "Tried to allocate 2.00 GiB"):
        assert needle in str(err.value) and needle in status["error"], needle
    assert "\n" not in str(err.value)
    assert [r["round"] for r in runfolder.read_rounds(d)] == [1]
    assert runfolder.load_checkpoint(d)["round"] == 1
    assert not _leftovers(d)


@pytest.mark.slow
def test_a_run_whose_lock_was_taken_over_stops_writing(tmp_path, tiny_data, monkeypatch):
    # prepare: in round 2 another process presumes this one dead and takes its lock over
    monkeypatch.setenv(L.STALE_ENV, "2")  # heartbeat every 0.2 s
    cfg = tiny_config(over={"train.rounds": 3, "checkpoint_every": 1})
    d = runfolder.run_dir(tmp_path, cfg)
    real = lifecycle.train_round

    def train_round(method, st, ctx, r):
        if r == 2:
            (d / L.LOCK_NAME).unlink()
            _write_lock(d, host="node-9", pid=4242, token="thief")
            time.sleep(0.6)  # the owner's heartbeat sees the new token
        return real(method, st, ctx, r)

    monkeypatch.setattr(lifecycle, "train_round", train_round)
    # execute / assert: it stops before writing round 2, leaves the status and the thief's lock alone
    with pytest.raises(L.LockLost, match="taken over by another process"):
        lifecycle.run(cfg, tmp_path, data=tiny_data, progress=False)
    assert [r["round"] for r in runfolder.read_rounds(d)] == [1]
    assert runfolder.read_status(d)["state"] == "running"
    assert L.read_lock(d).token == "thief"
