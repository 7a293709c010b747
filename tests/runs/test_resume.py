"""Resume after a kill, checkpoint fallback, and divergence handling of the shared lifecycle."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch

from dfbench import methods
from dfbench.benchmark.engine import lifecycle
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.engine.lifecycle import run
from helpers import final_params, interrupt_at, run_then_sigkill, tiny_config

pytestmark = pytest.mark.slow  # whole runs, killed and resumed, for every method

TESTS = Path(__file__).parents[1]  # tests/, where helpers.py is
ROOT = TESTS.parent

RESUME = {"train.rounds": 4, "checkpoint_every": 1, "train.ema": 0.5, "system.participation": 0.5}


def _rows(d: Path) -> list[dict]:
    """rounds.jsonl without the measured wall times (runfolder.WALL_CLOCK: the only fields that may differ between runs)."""
    return [runfolder.without_wall_clock(r) for r in map(json.loads, (d / "rounds.jsonl").read_text().splitlines())]


def _state(d: Path) -> str:
    return json.loads((d / "status.json").read_text())["state"]


def test_sigkill_mid_run_then_rerun_is_bitwise_equal_to_uninterrupted(tmp_path, tiny_data):
    # prepare: the uninterrupted reference
    cfg = tiny_config(over=RESUME)
    ref = run(cfg, tmp_path / "ref", data=tiny_data, progress=False)
    # execute: a subprocess killed by SIGKILL after appending round 3, before checkpointing it
    out = tmp_path / "killed"
    proc = run_then_sigkill(out, RESUME, 3)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    d = runfolder.run_dir(out, cfg)
    assert _state(d) == "running"
    assert [r["round"] for r in _rows(d)] == [1, 2, 3]  # round 3 is logged but not checkpointed
    assert runfolder.load_checkpoint(d)["round"] == 2
    resumed = run(cfg, out, data=tiny_data, progress=False)
    # assert: same folder, bitwise equal model and EMA, no duplicate rows, same samples
    assert resumed == d and _state(d) == "done"
    assert torch.equal(final_params(d), final_params(ref))
    assert torch.equal(runfolder.load_checkpoint(d)["ema"], runfolder.load_checkpoint(ref)["ema"])
    assert [r["round"] for r in _rows(d)] == [1, 2, 3, 4]
    assert _rows(d) == _rows(ref)
    assert (d / "grid.png").read_bytes() == (ref / "grid.png").read_bytes()


# every registered method resumes exactly (its extra server state is checkpointed); router kept short
SMALL = {"experts": {"router_steps": 3, "router_batch": 8}, "quantized": {"error_feedback": True}}


@pytest.mark.parametrize("name", methods.list_methods())
def test_interrupted_run_resumes_bitwise_for_every_method(name, tmp_path, tiny_data, monkeypatch):
    cfg = tiny_config(name, SMALL.get(name), {"train.rounds": 3, "checkpoint_every": 1})
    ref = run(cfg, tmp_path / "ref", data=tiny_data, progress=False)
    with monkeypatch.context() as m:
        interrupt_at(m, 3)
        with pytest.raises(KeyboardInterrupt):
            run(cfg, tmp_path / "cut", data=tiny_data, progress=False)
    d = runfolder.run_dir(tmp_path / "cut", cfg)
    assert _state(d) == "running"  # Ctrl-C is not a failure: the run stays resumable
    run(cfg, tmp_path / "cut", data=tiny_data, progress=False)
    assert _state(d) == "done"
    assert torch.equal(final_params(d), final_params(ref))
    assert _rows(d) == _rows(ref)


def test_truncated_checkpoint_is_detected_and_the_previous_one_used(tmp_path, tiny_data):
    # prepare: a finished run with checkpoints 2 and 3; pretend it died before evaluating
    cfg = tiny_config(over={"train.rounds": 3, "checkpoint_every": 1})
    ref = final_params(run(cfg, tmp_path / "ref", data=tiny_data, progress=False))
    d = run(cfg, tmp_path / "run", data=tiny_data, progress=False)
    newest = d / "checkpoints" / "ckpt-000003.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    runfolder.write_status(d, "running")
    with open(d / "rounds.jsonl", "a") as f:
        f.write('{"round": 4, "tor')  # a torn line from the crash
    # execute / assert: detection
    with pytest.warns(UserWarning, match="unreadable"):
        assert runfolder.load_checkpoint(d)["round"] == 2
    # execute / assert: the rerun resumes from round 2 and ends where the clean run ended
    with pytest.warns(UserWarning, match="ckpt-000003.pt is unreadable"):
        run(cfg, tmp_path / "run", data=tiny_data, progress=False)
    assert _state(d) == "done"
    assert [r["round"] for r in _rows(d)] == [1, 2, 3]
    assert torch.equal(final_params(d), ref)


def test_no_readable_checkpoint_means_a_fresh_start(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "ckpt-000001.pt").write_bytes(b"not a checkpoint")
    with pytest.warns(UserWarning, match="unreadable"):
        assert runfolder.load_checkpoint(tmp_path) is None


def test_nan_client_update_is_dropped_and_counted(tmp_path, tiny_data, monkeypatch):
    # prepare: client 1's upload in round 1 is NaN
    real = methods.Method.upload

    def upload(self, local, plan, client, state, ctx):
        up = real(self, local, plan, client, state, ctx)
        if client == 1 and ctx.round == 1:
            up.params = torch.full_like(up.params, float("nan"))
        return up

    monkeypatch.setattr(methods.Method, "upload", upload)
    # execute
    d = run(tiny_config(), tmp_path, data=tiny_data, progress=False)
    # assert: dropped, counted per round and in total, and the model stayed finite
    rows = _rows(d)
    assert [r["dropped_updates"] for r in rows] == [1, 0]
    assert json.loads((d / "metrics.json").read_text())["dropped_updates"] == 1
    assert _state(d) == "done"
    assert torch.isfinite(final_params(d)).all()


def _diverge_at_round_2(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server step of round 2 produces NaN."""
    real = methods.Method.apply

    def apply(self, state, acc, ctx):
        new = real(self, state, acc, ctx)
        if ctx.round == 2:
            new.params = torch.full_like(new.params, float("nan"))
        return new

    monkeypatch.setattr(methods.Method, "apply", apply)


def test_nan_global_model_marks_the_run_diverged(tmp_path, tiny_data, monkeypatch):
    # prepare
    _diverge_at_round_2(monkeypatch)
    cfg = tiny_config(over={"train.rounds": 3, "checkpoint_every": 1})
    # execute
    d = run(cfg, tmp_path, data=tiny_data, progress=False)
    # assert: diverged with a reason, stopped at round 2, not evaluated
    status = json.loads((d / "status.json").read_text())
    assert status["state"] == "diverged" and "round 2" in status["error"]
    rows = _rows(d)
    assert [r["round"] for r in rows] == [1, 2] and rows[-1]["diverged"] is True
    assert not (d / "metrics.json").exists()
    # a rerun leaves a diverged run alone (it would diverge again)
    monkeypatch.setattr(lifecycle, "train_round", lambda *a: pytest.fail("a diverged run was retrained"))
    assert run(cfg, tmp_path, data=tiny_data, progress=False) == d


def test_report_lists_a_real_diverged_run_with_its_reason(tmp_path, tiny_data, monkeypatch):
    from dfbench.benchmark.report.build import load_runs

    _diverge_at_round_2(monkeypatch)
    run(tiny_config(), tmp_path, data=tiny_data, progress=False)
    done, failures = load_runs(tmp_path)
    assert not done and [(f.state, "round 2" in f.reason) for f in failures] == [("diverged", True)]
