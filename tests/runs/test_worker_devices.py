"""`dfbench grid --workers N --device cuda` spreads the workers over the GPUs: worker i (this
process is worker 0) on cuda:(i mod GPUs); explicit cuda:K cells and CPU cells stay as given.

No GPU and no process is needed: torch.cuda is mocked, subprocess.Popen records the extra
workers' command lines, and run_grid (this process's share) records the grid it was given.
"""

from __future__ import annotations

import pytest
import torch

from dfbench.benchmark.cli import main
from dfbench.benchmark.grid import fetch, workers
from dfbench.benchmark.grid import spec as S
from dfbench.benchmark.grid.runner import GridSummary
from helpers import TINY, write_grid


class _Proc:
    def __init__(self, argv, env=None):
        self.argv, self.pid = list(argv), 4242

    def wait(self):
        return 0


@pytest.fixture()
def launched(monkeypatch):
    """A machine with `gpus` GPUs (set by the test); returns (extra workers' argvs, this process's grids)."""
    started: list[list[str]] = []
    grids: list[S.Grid] = []

    def popen(argv, env=None):
        started.append(list(argv))
        return _Proc(argv, env)

    def run_grid(grid, out, **kw):
        grids.append(grid)
        return GridSummary(grid)

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # worker_env leaves this process's torch threads alone
    monkeypatch.setattr(workers.subprocess, "Popen", popen)
    monkeypatch.setattr(workers, "run_grid", run_grid)
    monkeypatch.setattr(fetch, "preflight", lambda *a, **kw: None)
    return started, grids


def _gpus(monkeypatch, n: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


def _device_flags(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--device"]


def _grid_file(tmp_path, device=None):
    base = {**TINY, **({"device": device} if device else {})}
    return write_grid(tmp_path / "g.toml", base, {"seed": [0, 1]})


@pytest.mark.parametrize("from_cells", [False, True], ids=["--device cuda", "cells say cuda"])
def test_three_workers_on_two_gpus_go_to_cuda_0_1_0_and_share_the_cells(tmp_path, monkeypatch, launched, from_cells):
    started, grids = launched
    _gpus(monkeypatch, 2)
    path = _grid_file(tmp_path, device="cuda" if from_cells else None)
    flags = [] if from_cells else ["--device", "cuda"]
    # the old code started every worker with the grid's own --device cuda: all on cuda:0
    assert main(["grid", str(path), "--out", str(tmp_path / "runs"), "--workers", "3", *flags, "--no-progress"]) == 0
    assert [_device_flags(a) for a in started] == [["cuda:1"], ["cuda:0"]]
    assert {c.cfg.device for c in grids[0].cells} == {"cuda:0"}  # this process: worker 0
    same = S.load_grid(path, extra={"device": "cuda"})
    assert [c.run_id for c in grids[0].cells] == [c.run_id for c in same.cells]  # the index is not in the run id
    for argv in started:  # everything else as before: the same grid file, --out, quiet
        assert argv[argv.index("grid") + 1] == str(path) and argv[-1] == "--no-progress"


@pytest.mark.parametrize("gpus, device", [(2, "cuda:1"), (1, "cuda"), (0, "cpu")])
def test_explicit_gpu_one_gpu_and_cpu_cells_keep_their_device(tmp_path, monkeypatch, launched, gpus, device):
    started, grids = launched
    _gpus(monkeypatch, gpus)
    path = _grid_file(tmp_path)
    assert main(["grid", str(path), "--out", str(tmp_path / "runs"), "--workers", "3", "--device", device,
                 "--no-progress"]) == 0
    assert [_device_flags(a) for a in started] == [[device], [device]]
    assert {c.cfg.device for c in grids[0].cells} == {device}


def test_worker_devices_is_the_pure_rule():
    from dfbench.benchmark.grid.workers import worker_devices

    assert worker_devices(["cuda", "cuda"], 3, 2) == ["cuda:0", "cuda:1", "cuda:0"]
    assert worker_devices(["cuda"], 4, 4) == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert worker_devices(["cuda"], 3, 1) == [None] * 3  # one GPU: "cuda" is it
    assert worker_devices(["cuda:1", "cuda:1"], 2, 2) == [None] * 2  # explicit: as given
    assert worker_devices(["cuda", "cpu"], 2, 2) == [None] * 2  # a --device would move the cpu cells (another run id)
    assert worker_devices(["cpu"], 2, 0) == [None] * 2


def test_a_grid_on_a_gpu_this_machine_lacks_is_refused_before_any_cell(tmp_path, monkeypatch, tiny_data):
    from dfbench.benchmark.core.config import ConfigError
    from dfbench.benchmark.grid.runner import run_grid

    _gpus(monkeypatch, 2)
    grid = S.load_grid(_grid_file(tmp_path), extra={"device": "cuda:3"})
    # the old code ran every cell into "invalid device ordinal"
    with pytest.raises(ConfigError, match=r"device 'cuda:3' is not available on this machine \(available: cpu, cuda:0, cuda:1\)"):
        run_grid(grid, tmp_path / "runs", data=tiny_data, progress=False)
    assert not (tmp_path / "runs").exists()
