"""The ways out of a run, with real `dfbench` processes: SIGTERM, a full disk, a corrupt samples.npz.

Each process is this file run as a script (as in test_workers.py): it swaps the dataset for the
small synthetic one (conftest.make_imageset), optionally pauses right after logging a round (so
the test can send SIGTERM at a known moment: round logged, its checkpoint not yet written) or
makes the write of one file fail with a real ENOSPC (its temporary file is pointed at
/dev/full), then calls `dfbench` (cli.main) and exits with its status.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dfbench.benchmark.cli import build_parser, config_from_args
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.core.lock import read_lock
from dfbench.benchmark.engine import lifecycle
from helpers import final_params, write_grid

pytestmark = pytest.mark.slow  # real dfbench processes: SIGTERM, a full disk, corrupt files

HERE = Path(__file__).resolve().parents[1]  # tests/, where helpers.py is
LIMIT_S = 120
RUN_ARGS = ["--dataset", "fmnist", "--clients", "2", "--local-steps", "1", "--batch-size", "8", "--eval-samples", "16",
            "--sampler-steps", "3", "--rounds", "3", "--set", "train.model=tiny", "--set", "eval.metrics=none",
            "--set", "eval.grid=4", "--set", "data.min_client_size=4", "--set", "train.sigma1_probe_steps=0",
            "--set", "checkpoint_every=1", "--set", "train.ema=0.5", "--no-progress"]


# -- the worker (this file run as a script) ---------------------------------------------------

def _worker(spec: dict[str, Any]) -> int:
    torch.set_num_threads(1)
    import tempfile

    from conftest import make_imageset

    from dfbench import datasets
    from dfbench.benchmark.cli import main
    from dfbench.datasets import sources

    data = make_imageset()
    datasets.load = lambda name, split="train", root=None, **kw: data  # type: ignore[assignment]
    sources.missing = lambda *a, **kw: None  # the grid's preflight: no dataset files needed
    if spec.get("pause_after_round"):
        real_append = runfolder.append_round

        def append_round(d: Path, row: dict[str, Any]) -> None:
            real_append(d, row)
            if row["round"] == spec["pause_after_round"]:
                Path(spec["marker"]).write_text("paused")
                time.sleep(LIMIT_S)  # the test's SIGTERM arrives here

        runfolder.append_round = append_round  # type: ignore[assignment]
    if spec.get("enospc"):  # the write of this file finds the disk full (a real ENOSPC from /dev/full)
        real_mkstemp = tempfile.mkstemp

        def mkstemp(*args: Any, **kwargs: Any) -> tuple[int, str]:
            fd, tmp = real_mkstemp(*args, **kwargs)
            if Path(tmp).name.startswith(f".{spec['enospc']}."):
                full = os.open("/dev/full", os.O_WRONLY)
                os.dup2(full, fd)
                os.close(full)
            return fd, tmp

        tempfile.mkstemp = mkstemp  # type: ignore[assignment]
    return main(spec["argv"])


def _dfbench(spec: dict[str, Any], tmp_path: Path, name: str, *, sigterm_at: Path | None = None) -> subprocess.CompletedProcess:
    """Run one worker to its end; with `sigterm_at`, send it SIGTERM once that marker file exists."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    with open(out, "w") as fo, open(err, "w") as fe:
        proc = subprocess.Popen([sys.executable, __file__, json.dumps(spec)], stdout=fo, stderr=fe, env=env, cwd=HERE.parent)
    try:
        if sigterm_at is not None:
            deadline = time.monotonic() + LIMIT_S
            while not sigterm_at.exists():
                assert proc.poll() is None, f"the worker ended before the marker:\n{err.read_text()}"
                assert time.monotonic() < deadline, "the worker never reached the marker"
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=LIMIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, code, out.read_text(), err.read_text())


def _dfbench_here(argv: list[str], data: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    """`dfbench ARGV` in this process (cheaper than a new one: no torch import), on `data`."""
    from dfbench import datasets
    from dfbench.benchmark.cli import main

    monkeypatch.setattr(datasets, "load", lambda name, split="train", root=None, **kw: data)
    capsys.readouterr()
    before = signal.getsignal(signal.SIGTERM)
    try:
        code = main(argv)
    finally:
        signal.signal(signal.SIGTERM, before)  # cli installed its own handler
    said = capsys.readouterr()
    return code, said.out, said.err


def _rows(d: Path) -> list[dict]:
    """rounds.jsonl without the wall times (the only field that may differ between runs)."""
    return [runfolder.without_wall_clock(r) for r in runfolder.read_rounds(d)]


def _leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in [*root.rglob(runfolder.LOCK + "*"), *root.rglob("*.tmp")])


def _assert_same_result(d: Path, ref: Path) -> None:
    assert runfolder.read_status(d)["state"] == runfolder.DONE
    assert torch.equal(final_params(d), final_params(ref))
    assert torch.equal(runfolder.load_checkpoint(d)["ema"], runfolder.load_checkpoint(ref)["ema"])
    assert [r["round"] for r in _rows(d)] == [1, 2, 3] and _rows(d) == _rows(ref)
    with np.load(d / runfolder.SAMPLES) as a, np.load(ref / runfolder.SAMPLES) as b:
        assert np.array_equal(a["images"], b["images"])
    assert (d / runfolder.GRID).read_bytes() == (ref / runfolder.GRID).read_bytes()


@pytest.fixture(scope="module")
def ref(tmp_path_factory: pytest.TempPathFactory, tiny_data: Any) -> Path:
    """The uninterrupted run of RUN_ARGS, in this process (same data, one thread)."""
    out = tmp_path_factory.mktemp("ref")
    return lifecycle.run(_cfg(out), out, data=tiny_data, progress=False)


def _argv(out: Path) -> list[str]:
    return ["run", *RUN_ARGS, "--out", str(out)]


def _cfg(out: Path) -> Any:
    return config_from_args(build_parser().parse_args(_argv(out)))


# -- SIGTERM ----------------------------------------------------------------------------------

def test_sigterm_mid_run_leaves_it_interrupted_unlocked_and_the_rerun_ends_bitwise_equal(tmp_path, ref, tiny_data,
                                                                                          monkeypatch, capsys):
    out, marker = tmp_path / "runs", tmp_path / "paused"
    d = runfolder.run_dir(out, _cfg(out))
    # execute: SIGTERM once round 2 is logged, before its checkpoint is written
    p = _dfbench({"argv": _argv(out), "pause_after_round": 2, "marker": str(marker)}, tmp_path, "term", sigterm_at=marker)
    # assert: exit 128 + 15 through Python (not killed by the signal), said in one line, no traceback
    assert p.returncode == 128 + signal.SIGTERM, p.stderr
    assert "stopped by SIGTERM" in p.stderr and "Traceback" not in p.stderr, p.stderr
    status = runfolder.read_status(d)
    assert status["state"] == runfolder.INTERRUPTED and "SIGTERM" in status["error"]
    assert read_lock(d) is None and _leftovers(out) == []
    assert [r["round"] for r in _rows(d)] == [1, 2] and runfolder.load_checkpoint(d)["round"] == 1
    # the reporter lists it as unfinished (resumable), not as an unknown state
    from dfbench.benchmark.report.build import load_runs

    done, others = load_runs(out)
    assert not done and [(f.state, "a rerun resumes it" in f.reason) for f in others] == [("unfinished", True)]
    # execute: the same command again
    code, said, err = _dfbench_here(_argv(out), tiny_data, monkeypatch, capsys)
    # assert: it resumed from round 1's checkpoint and ended where the uninterrupted run ended
    assert code == 0, err
    assert said.strip().splitlines()[-1] == str(d)
    _assert_same_result(d, ref)
    assert _leftovers(out) == []


def test_sigterm_to_a_grid_worker_leaves_its_cell_interrupted_and_the_grid_resumes_it(tmp_path, tiny_data):
    from dfbench.benchmark.grid import plan, spec
    from dfbench.benchmark.grid.runner import run_grid
    from helpers import TINY

    path = write_grid(tmp_path / "one.toml", {**TINY, "data.clients": 2, "train.local_steps": 1, "checkpoint_every": 1,
                                              "train.sigma1_probe_steps": 0, "train.rounds": 3}, {"seed": [0]})
    grid = spec.load_grid(str(path))
    (cell,) = grid.cells
    out, marker = tmp_path / "runs", tmp_path / "paused"
    # execute: SIGTERM to `dfbench grid` while it trains the cell
    p = _dfbench({"argv": ["grid", str(path), "--out", str(out), "--no-progress"], "pause_after_round": 2,
                  "marker": str(marker)}, tmp_path, "grid", sigterm_at=marker)
    # assert: the cell's folder says interrupted, is unlocked, and the grid's policy reruns it
    assert p.returncode == 128 + signal.SIGTERM, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    d = cell.folder(out)
    assert runfolder.read_status(d)["state"] == runfolder.INTERRUPTED
    assert read_lock(d) is None and _leftovers(out) == []
    assert plan.cell_state(out, cell) == plan.UNFINISHED and plan.should_run(plan.cell_state(out, cell))
    # execute: the grid again (in this process); assert: resumed, equal to the uninterrupted cell
    summary = run_grid(grid, out, data=tiny_data, progress=False, echo=lambda line: None)
    assert summary.ok and [o.after for o in summary.outcomes] == [runfolder.DONE]
    clean = lifecycle.run(cell.cfg, tmp_path / "clean", data=tiny_data, progress=False)
    assert torch.equal(final_params(d), final_params(clean)) and _rows(d) == _rows(clean)


# -- a full disk ------------------------------------------------------------------------------

def test_full_disk_fails_the_run_with_one_paragraph_no_partial_file_and_the_rerun_resumes(tmp_path, ref, tiny_data,
                                                                                           monkeypatch, capsys):
    out = tmp_path / "runs"
    d = runfolder.run_dir(out, _cfg(out))
    target = d / runfolder.CHECKPOINTS / "ckpt-000002.pt"
    # execute: the write of round 2's checkpoint finds the disk full
    p = _dfbench({"argv": _argv(out), "enospc": target.name}, tmp_path, "full")
    # assert: exit 1, one paragraph on stderr naming the file and the fix, no traceback
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout, p.stderr
    (line,) = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert line.startswith("dfbench: error: no space left on device: could not write ")
    assert f"could not write {target}." in line
    assert "Free space on that filesystem" in line and "--out" in line and "resumes from its last checkpoint" in line
    # assert: status failed with the error; neither the checkpoint nor its temporary file is left
    status = runfolder.read_status(d)
    assert status["state"] == runfolder.FAILED and "No space left on device" in status["error"]
    assert sorted(q.name for q in (d / runfolder.CHECKPOINTS).iterdir()) == ["ckpt-000001.pt"]
    assert _leftovers(out) == []
    # execute: space is freed, the same command again; assert: it resumed and ended as the clean run
    code, _, err = _dfbench_here(_argv(out), tiny_data, monkeypatch, capsys)
    assert code == 0, err
    _assert_same_result(d, ref)


def test_disk_full_message_is_only_for_a_full_disk():
    import errno

    from dfbench.benchmark.cli import _disk_full_message

    assert _disk_full_message(OSError(errno.EACCES, "Permission denied", "/x/y"), "run") is None
    msg = _disk_full_message(OSError(errno.EDQUOT, "Disk quota exceeded", "/x/y/metrics.json"), "eval")
    assert msg == ("dfbench: error: disk quota exceeded: could not write /x/y/metrics.json. Free space on that "
                   "filesystem (`df -h /x/y` shows it), then rerun the same command.")


# -- a corrupt samples.npz --------------------------------------------------------------------

def test_corrupt_samples_npz_is_named_with_a_fix_that_works(tmp_path, ref, tiny_data, monkeypatch, capsys):
    d = Path(shutil.copytree(ref, tmp_path / "run"))
    samples = d / runfolder.SAMPLES
    with np.load(samples) as z:
        original = z["images"]
    samples.write_bytes(b"\x80\x04\x95garbage, not an archive" * 10)  # what numpy would offer to unpickle
    # execute: `dfbench eval` in a real process
    p = _dfbench({"argv": ["eval", str(d)]}, tmp_path, "eval")
    # assert: non-zero, names the file and the fix, never suggests unpickling
    said = p.stdout + p.stderr
    assert p.returncode != 0, said
    assert f"{samples} is corrupt" in said and f"delete it and run `dfbench eval {d}` again" in said, said
    assert "pickle" not in said and "Traceback" not in said, said
    assert runfolder.read_status(d)["state"] == runfolder.DONE  # nothing was changed
    # execute: the advice, literally; assert: the same samples are back and the run is scored
    samples.unlink()
    code, _, err = _dfbench_here(["eval", str(d)], tiny_data, monkeypatch, capsys)
    assert code == 0, err
    with np.load(samples) as z:
        assert np.array_equal(z["images"], original)
    assert runfolder.read_status(d)["state"] == runfolder.DONE


@pytest.mark.parametrize("damage", ["truncated", "no_images", "float_images", "empty"])
def test_other_damage_to_samples_npz_is_named_too(damage, tmp_path, ref):
    import io

    from dfbench.benchmark.engine.evaluate import evaluate_dir

    d = Path(shutil.copytree(ref, tmp_path / "run"))
    samples = d / runfolder.SAMPLES
    good = samples.read_bytes()
    buf = io.BytesIO()
    if damage == "no_images":
        np.savez_compressed(buf, other=np.zeros(3, np.uint8))
    elif damage == "float_images":
        np.savez_compressed(buf, images=np.zeros((2, 1, 4, 4), np.float32))
    bad = {"truncated": good[: len(good) // 2], "empty": b""}.get(damage, buf.getvalue())
    samples.write_bytes(bad)
    with pytest.raises(ValueError, match="is corrupt") as err:
        evaluate_dir(d)
    assert str(samples) in str(err.value) and "pickle" not in str(err.value)


def test_missing_samples_of_an_unfinished_run_say_rerun_the_run(tmp_path, ref):
    from dfbench.benchmark.engine.evaluate import evaluate_dir

    d = Path(shutil.copytree(ref, tmp_path / "run"))
    (d / runfolder.SAMPLES).unlink()
    runfolder.write_status(d, runfolder.INTERRUPTED)
    with pytest.raises(FileNotFoundError, match="has not finished; rerun `dfbench run`"):
        evaluate_dir(d)
    assert not (d / runfolder.SAMPLES).exists()


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(_worker(json.loads(sys.argv[1])))
