"""scripts/compare_runs.py: the refactor check says equal for the same runs, and names a changed tensor."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
import torch

from dfbench.benchmark.engine.lifecycle import run
from helpers import tiny_config

pytestmark = pytest.mark.slow  # whole runs compared by the script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "compare_runs.py"


def _load():
    spec = importlib.util.spec_from_file_location("compare_runs", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_same_runs_compare_equal_and_a_changed_checkpoint_does_not(tmp_path, tiny_data, capsys):
    cmp = _load()
    cfg = tiny_config(over={"train.rounds": 2, "checkpoint_every": 1})
    run(cfg, tmp_path / "a", data=tiny_data, progress=False)
    run(cfg, tmp_path / "b", data=tiny_data, progress=False)  # trained again: bitwise the same
    assert cmp.main([str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert "all runs equal" in capsys.readouterr().out
    # one float nudged in the newest checkpoint of a copy
    shutil.copytree(tmp_path / "b", tmp_path / "c")
    (ck,) = sorted((tmp_path / "c").rglob("ckpt-000002.pt"))
    payload = torch.load(ck, weights_only=True)
    payload["params"][0] = torch.nextafter(payload["params"][0], torch.tensor(float("inf")))
    torch.save(payload, ck)
    assert cmp.main([str(tmp_path / "a"), str(tmp_path / "c")]) == 1
    assert "ckpt-000002.pt: tensors differ" in capsys.readouterr().out
