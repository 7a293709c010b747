"""What `dfbench` tells its user (issue 51, item 3): scores and folder at the end of a run, "already done",
Ctrl-C, a device that is not there, missing weights, damaged finished runs, an empty report, file modes,
--version, "did you mean", and `python -m dfbench` from a checkout without an install.

Each test runs `dfbench` (cli.main) in this process on the small synthetic image set, except the Ctrl-C
test (a real process: this file run as a script, as in test_lifecycle.py) and the `python -S -m dfbench`
test (a Python that does not see the install).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dfbench import datasets
from dfbench.benchmark.cli import build_parser, config_from_args, main
from dfbench.benchmark.core import runfolder
from helpers import one_line

REAL_LOAD = datasets.load  # (the fixture below swaps in the synthetic images)
HERE = Path(__file__).resolve().parents[1]  # tests/, where helpers.py is
ROOT = HERE.parent
LIMIT_S = 120
RUN_ARGS = ["--dataset", "fmnist", "--clients", "2", "--local-steps", "1", "--batch-size", "8", "--eval-samples", "16",
            "--sampler-steps", "3", "--rounds", "2", "--set", "train.model=tiny", "--set", "eval.metrics=none",
            "--set", "eval.grid=4", "--set", "data.min_client_size=4", "--set", "train.sigma1_probe_steps=0",
            "--no-progress"]


def _argv(out: Path, *extra: str) -> list[str]:
    return ["run", *RUN_ARGS, "--out", str(out), *extra]


def _folder(argv: list[str]) -> Path:
    a = build_parser().parse_args(argv)
    return runfolder.run_dir(a.out, config_from_args(a))


def _done_folder(argv: list[str], evaluations: list[dict[str, Any]]) -> Path:
    """A finished run folder of `argv`'s config, as the run would leave it, with `evaluations` as its scores."""
    a = build_parser().parse_args(argv)
    cfg = config_from_args(a)
    d = runfolder.run_dir(a.out, cfg)
    d.mkdir(parents=True)
    runfolder.write_json(d / runfolder.CONFIG, cfg.record())
    runfolder.write_json(d / runfolder.METRICS, {"evaluations": evaluations, "wall_seconds": 12.5})
    runfolder.write_status(d, runfolder.DONE)
    return d


FD_ROW = {"metric": "fd_fmnist", "value": 236.123, "ci_low": 220.08, "ci_high": 250.2, "ci_level": 0.95,
          "extractor": "fmnist", "num_samples": 400}
OTHER_ROW = {"metric": "kid_fmnist", "value": 0.0123, "extractor": "fmnist", "num_samples": 400}


# -- 1. the end of `dfbench run`: headline scores, "already done", the folder last ----------------------

def test_run_ends_with_its_scores_and_its_folder_and_says_when_it_was_already_done(tmp_path, dfbench):
    argv = _argv(tmp_path / "runs")
    d = _done_folder(argv, [OTHER_ROW, FD_ROW])
    code, out, err = dfbench(argv)
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[-1] == str(d)  # the folder stays the last line (scripts/gpu_check.py reads it)
    text = "\n".join(lines[:-1])
    assert "already done" in text and "--force" in text
    # the ranking metric, with its interval; the other metric is in metrics.json, not in the headline
    assert "fd_fmnist 236.12" in text and "220.08" in text and "250.20" in text, out
    assert "kid_fmnist" not in text and "1 more metric" in text


@pytest.mark.slow  # trains (about 2 s with the first imports)
def test_a_fresh_run_ends_with_what_it_did_and_its_folder(tmp_path, dfbench):
    argv = _argv(tmp_path / "runs")
    code, out, err = dfbench(argv)
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[-1] == str(_folder(argv))
    assert "already done" not in out
    assert any(ln.startswith("done") for ln in lines[:-1]) and "no scores (eval.metrics=none)" in out, out


# -- 2. Ctrl-C ---------------------------------------------------------------------------------------

def _worker(argv: list[str]) -> int:
    """This file run as a script: `dfbench ARGV` on the synthetic image set (no dataset files needed)."""
    torch.set_num_threads(1)
    from conftest import make_imageset

    from dfbench import datasets

    data = make_imageset()
    datasets.load = lambda name, split="train", root=None, **kw: data  # type: ignore[assignment]
    return main(argv)


@pytest.mark.slow  # a real process (imports torch, trains until the signal)
def test_ctrl_c_stops_a_run_in_one_line_leaves_it_interrupted_and_exits_130(tmp_path):
    argv = ["run", *RUN_ARGS, "--rounds", "100000", "--set", "checkpoint_every=1", "--out", str(tmp_path / "runs")]
    d = _folder(argv)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    with open(tmp_path / "out", "w") as fo, open(tmp_path / "err", "w") as fe:
        proc = subprocess.Popen([sys.executable, __file__, json.dumps(argv)], stdout=fo, stderr=fe, env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + LIMIT_S
        while not runfolder.read_rounds(d):  # the first round's row is written: the run is training
            assert proc.poll() is None, (tmp_path / "err").read_text()
            assert time.monotonic() < deadline, "no round was written"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=LIMIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = (tmp_path / "err").read_text()
    assert code == 130, err  # 128 + SIGINT, through Python (not killed by the signal)
    line = one_line(err)
    assert "SIGINT" in line and "the same command resumes it" in line, line
    status = runfolder.read_status(d)
    assert status["state"] == runfolder.INTERRUPTED and "SIGINT" in status["error"], status
    from dfbench.benchmark.core.lock import read_lock

    assert read_lock(d) is None  # released on the way out


# -- 3. a device that is not there --------------------------------------------------------------------

def _gpus(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


@pytest.mark.parametrize("device,gpus", [("cuda", 0), ("cuda:0", 0), ("cuda:7", 1), ("mps", 0)])
def test_a_device_that_is_not_there_is_refused_in_one_line_before_any_work(device, gpus, tmp_path, dfbench, monkeypatch):
    _gpus(monkeypatch, gpus)
    out = tmp_path / "runs"
    code, said, err = dfbench(_argv(out, "--device", device))
    assert code == 2
    line = one_line(err)
    assert repr(device) in line and "--device cpu" in line, line
    assert not out.exists()  # refused before any folder


@pytest.mark.parametrize("argv", [["fid", "A", "B"], ["fid-ref", "--dataset", "fmnist"], ["perf"]])
def test_the_other_commands_with_a_device_refuse_one_that_is_not_there(argv, tmp_path, dfbench, monkeypatch):
    _gpus(monkeypatch, 0)
    code, said, err = dfbench([*argv, "--device", "cuda"])
    assert code == 2
    line = one_line(err)
    assert "'cuda'" in line and "--device cpu" in line, line


@pytest.mark.parametrize("device,gpus", [("cuda", 0), ("cuda:7", 2)])
def test_grid_refuses_a_device_that_is_not_there_before_any_cell(device, gpus, tmp_path, dfbench, monkeypatch):
    from helpers import TINY, write_grid

    _gpus(monkeypatch, gpus)
    path = write_grid(tmp_path / "one.toml", TINY, {"seed": [0]})
    code, said, err = dfbench(["grid", str(path), "--out", str(tmp_path / "runs"), "--device", device])
    assert code == 2, (said, err)
    line = one_line(err)
    assert repr(device) in line and "--device cpu" in line, line
    assert not (tmp_path / "runs").exists()


# -- 4. missing weights --------------------------------------------------------------------------------

def test_fid_without_the_inception_weights_says_which_file_where_and_how_inone_line(tmp_path, dfbench, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))  # no torch hub copy either
    monkeypatch.delenv("DFBENCH_INCEPTION_WEIGHTS", raising=False)
    g = np.random.default_rng(0)
    for name in ("a", "b"):
        np.savez(tmp_path / f"{name}.npz", images=g.integers(0, 255, (8, 3, 32, 32), dtype=np.uint8))
    code, said, err = dfbench(["fid", str(tmp_path / "a.npz"), str(tmp_path / "b.npz")])
    assert code == 1
    line = one_line(err)
    from dfbench.benchmark.metrics.weight_files import weights_dir

    for needle in ("pt_inception-2015-12-05-6726825d.pth", str(weights_dir()), "dfbench fetch inception",
                   "DFBENCH_INCEPTION_WEIGHTS"):
        assert needle in line, line


def test_fid_of_a_path_that_is_not_there_says_so(tmp_path, dfbench):
    np.savez(tmp_path / "b.npz", images=np.zeros((8, 28, 28), dtype=np.uint8))
    code, said, err = dfbench(["fid", str(tmp_path / "a"), str(tmp_path / "b.npz"), "--extractor", "fmnist"])
    assert code == 2
    line = one_line(err)
    assert f"{tmp_path / 'a'} does not exist" in line, line


# -- 5. a finished run whose files do not parse is not done ---------------------------------------------

@pytest.mark.parametrize("name", [runfolder.CONFIG, runfolder.METRICS, runfolder.STATUS])
def test_a_done_run_with_a_truncated_file_runs_again(name, tmp_path, dfbench):
    argv = _argv(tmp_path / "runs")
    code, _, err = dfbench(argv)
    assert code == 0, err
    d = _folder(argv)
    text = (d / name).read_text()
    (d / name).write_text(text[: len(text) // 2])  # truncated: a copy cut short, a damaged disk
    code, out, err = dfbench(argv)
    assert code == 0, err
    assert "already done" not in out
    assert name in err and "runs it again" in err, err  # said once, naming the file
    for f in (runfolder.CONFIG, runfolder.METRICS, runfolder.STATUS):
        json.loads((d / f).read_text())  # every file whole again
    assert runfolder.read_status(d)["state"] == runfolder.DONE
    assert [r["round"] for r in runfolder.read_rounds(d)] == [1, 2]


def test_the_grid_counts_a_done_cell_with_a_truncated_config_as_unfinished(tmp_path, dfbench):
    from dfbench.benchmark.grid import plan, spec
    from helpers import TINY, write_grid

    path = write_grid(tmp_path / "one.toml", {**TINY, "data.clients": 2, "train.local_steps": 1}, {"seed": [0]})
    (cell,) = spec.load_grid(str(path)).cells
    out = tmp_path / "runs"
    d = cell.folder(out)
    d.mkdir(parents=True)
    runfolder.write_json(d / runfolder.METRICS, {"evaluations": []})
    runfolder.write_status(d, runfolder.DONE)
    (d / runfolder.CONFIG).write_text('{"seed": 0, "tra')
    assert plan.cell_state(out, cell) == plan.UNFINISHED
    runfolder.write_json(d / runfolder.CONFIG, cell.cfg.record())
    assert plan.cell_state(out, cell) == runfolder.DONE


# -- 6. a report of nothing ---------------------------------------------------------------------------

def test_report_on_a_folder_without_runs_says_so_and_writes_nothing(tmp_path, dfbench):
    runs, out = tmp_path / "runs", tmp_path / "report"
    runs.mkdir()
    code, said, err = dfbench(["report", "--runs", str(runs), "--out", str(out)])
    assert code != 0
    line = one_line(err)
    assert str(runs) in line and "no run" in line and "dfbench run" in line, line
    assert not out.exists()


def test_eval_of_a_complete_run_says_what_it_checked_and_that_nothing_needed_rescoring(tmp_path, dfbench):
    argv = _argv(tmp_path / "runs")
    assert dfbench(argv)[0] == 0
    code, out, err = dfbench(["eval", str(tmp_path / "runs")])
    assert code == 0, err
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"{tmp_path / 'runs'}: checked 1 run folder(s) for metrics") and "metrics.json lacks" in last
    assert last.endswith("all 1 up to date, nothing needed re-scoring"), last


# -- 7. file modes follow the umask ---------------------------------------------------------------------

@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_files_written_atomically_follow_the_umask(umask, tmp_path):
    from dfbench.benchmark.metrics.scoring import _atomic_savez

    before = os.umask(umask)
    try:
        runfolder.write_json(tmp_path / "a.json", {"a": 1})
        _atomic_savez(tmp_path / "b.npz", {"x": np.zeros(2)})
    finally:
        os.umask(before)
    for name in ("a.json", "b.npz"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~umask, name


# -- 8. --version --------------------------------------------------------------------------------------

def test_version_prints_the_installed_version(dfbench):
    from importlib.metadata import version

    code, out, err = dfbench(["--version"])
    assert code == 0 and out.strip() == f"dfbench {version('dfbench')}", (out, err)


# -- 9. did you mean ----------------------------------------------------------------------------------

@pytest.mark.parametrize("argv,suggestion", [
    (["run", "--method", "fedavgg", "--dry-run"], "'fedavg'"),
    (["run", "--dataset", "fminst", "--dry-run"], "'fmnist'"),
    (["run", "--partition", "dirichelt:0.5", "--dry-run"], "'dirichlet'"),
    (["run", *RUN_ARGS, "--set", "eval.metrics=fd_fmnst"], "'fd_fmnist'"),  # refused before training
    (["run", "--set", "train.rouds=3", "--dry-run"], "'train.rounds'"),
    (["grid", "dmeo", "--dry-run"], "'demo'"),
    (["partition", "--dataset", "fminst"], "'fmnist'"),
    (["runn", "--method", "fedavg"], "'run'"),
])
def test_a_misspelt_name_gets_a_suggestion_in_itsone_line(argv, suggestion, tmp_path, dfbench, monkeypatch):
    from dfbench import datasets

    monkeypatch.setattr(datasets, "load", REAL_LOAD)  # the name is checked by the real loader, before any file
    code, out, err = dfbench([*argv, *(["--out", str(tmp_path / "runs")] if argv[0] in ("run", "grid") else [])])
    assert code == 2
    line = one_line(err)
    assert f"did you mean {suggestion}?" in line, line
    assert not (tmp_path / "runs").exists()


# -- 10. `python -m dfbench` from a checkout, in a Python without the install -----------------------------

def test_python_m_dfbench_without_the_install_says_how_to_reach_it(tmp_path):
    # -S: no site-packages (where the editable install's path hook lives); the checkout's dfbench/ is found
    # from the current folder, as with a system python3 in the repository root
    p = subprocess.run([sys.executable, "-S", "-m", "dfbench", "methods"], cwd=ROOT, capture_output=True, text=True,
                       timeout=LIMIT_S, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert p.returncode == 1, p.stderr
    line = one_line(p.stderr)
    assert "not installed" in line and "source .venv/bin/activate" in line and "pip install -e ." in line, line


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(_worker(json.loads(sys.argv[1])))
