"""Quality curves (eval.every): points every N rounds, the untrained round-0 point, bitwise-neutral
for training, kept across a SIGKILL and resume, refused where the model cannot be sampled mid-run."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch

from dfbench import datasets
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.core.config import ConfigError, config_hash
from dfbench.benchmark.engine.lifecycle import run
from helpers import final_params, run_then_sigkill, tiny_config

pytestmark = pytest.mark.slow  # whole runs with quality curves, one killed and resumed

TESTS = Path(__file__).parents[1]  # tests/, where helpers.py is
ROOT = TESTS.parent
CURVE = {"eval.metrics": "fd_fmnist", "eval.every": 2, "eval.curve_samples": 12, "train.rounds": 4, "checkpoint_every": 2}


@pytest.fixture(autouse=True)
def _synthetic_loads(monkeypatch, tiny_data) -> None:
    monkeypatch.setattr(datasets, "load", lambda name, split="train", root=None, **kw: tiny_data)


def _curve(d: Path) -> list[dict]:
    return [json.loads(line) for line in (d / runfolder.CURVE).read_text().splitlines()]


def _rows(d: Path) -> list[dict]:
    return [runfolder.without_wall_clock(r) for r in runfolder.read_rounds(d)]


def _no_wall(rows: list[dict]) -> list[dict]:
    return [runfolder.without_wall_clock(r) for r in rows]


def test_curve_points_and_a_run_with_them_trains_bitwise_as_one_without(tmp_path, tiny_data):
    with_curve = run(tiny_config(over=CURVE), tmp_path / "on", data=tiny_data, progress=False)
    without = run(tiny_config(over={**CURVE, "eval.every": 0}), tmp_path / "off", data=tiny_data, progress=False)
    assert torch.equal(final_params(with_curve), final_params(without))
    assert _rows(with_curve) == _rows(without)
    assert not (without / runfolder.CURVE).exists()
    curve = _curve(with_curve)
    assert [p["round"] for p in curve] == [0, 2, 4]
    assert {p["metric"] for p in curve} == {"fd_fmnist"} and {p["num_samples"] for p in curve} == {12}
    rounds = runfolder.read_rounds(with_curve)
    for p in curve[1:]:  # the cumulative axes at that round
        upto = [r for r in rounds if r["round"] <= p["round"]]
        assert p["uplink_bits"] == sum(r["uplink_bits"] for r in upto)
        assert p["sim_seconds"] == pytest.approx(sum(r["round_seconds"] for r in upto))
        assert p["client_images"] == pytest.approx(sum(r["client_images"] for r in upto))
    assert curve[0]["uplink_bits"] == 0 and curve[0]["sim_seconds"] == 0
    # the final evaluation is what it is without the curve
    same = lambda d: [r for r in json.loads((d / "metrics.json").read_text())["evaluations"]]  # noqa: E731
    assert same(with_curve) == same(without)
    # curves get their own run id (their folder holds more), at 0 the old one
    assert config_hash(tiny_config(over=CURVE)) != config_hash(tiny_config(over={**CURVE, "eval.every": 0}))


def test_round_zero_point_is_the_untrained_model_scored_on_the_first_noises(tmp_path, tiny_data):
    curve = _curve(run(tiny_config(over=CURVE), tmp_path / "c", data=tiny_data, progress=False))
    # an untrained run evaluated on eval.samples = curve_samples: the same noises, sampler and metric
    untrained = run(tiny_config(over={**CURVE, "eval.every": 0, "train.rounds": 0, "eval.samples": 12, "eval.grid": 3}),
                    tmp_path / "u", data=tiny_data, progress=False)
    fd = next(r for r in json.loads((untrained / "metrics.json").read_text())["evaluations"] if r["metric"] == "fd_fmnist")
    assert curve[0]["value"] == pytest.approx(fd["value"], rel=1e-9)
    assert curve[-1]["value"] != curve[0]["value"]




def test_sigkill_after_a_curve_point_and_resume_gives_the_uninterrupted_curve(tmp_path, tiny_data):
    cfg = tiny_config(over=CURVE)
    ref = run(cfg, tmp_path / "ref", data=tiny_data, progress=False)
    out = tmp_path / "killed"
    proc = run_then_sigkill(out, CURVE, 4, runfolder.CURVE)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    d = runfolder.run_dir(out, cfg)
    assert [p["round"] for p in _curve(d)] == [0, 2, 4] and runfolder.load_checkpoint(d)["round"] == 2
    run(cfg, out, data=tiny_data, progress=False)
    assert [p["round"] for p in _curve(d)] == [0, 2, 4]  # round 4 redone once, not duplicated
    assert _no_wall(_curve(d)) == _no_wall(_curve(ref))
    assert torch.equal(final_params(d), final_params(ref))


def test_methods_that_cannot_sample_mid_run_and_unscored_runs_are_refused_before_any_work():
    with pytest.raises(ConfigError, match="cannot draw a quality curve.*router"):
        tiny_config("experts", over=CURVE)
    with pytest.raises(ConfigError, match="eval.every.*eval.metrics=none"):
        tiny_config(over={**CURVE, "eval.metrics": "none"})
    with pytest.raises(ConfigError, match="eval.curve_samples"):
        tiny_config(over={**CURVE, "eval.curve_samples": 1})


# -- the reporter ----------------------------------------------------------------------------

def test_report_draws_the_curves_and_the_time_to_a_target_from_curve_jsonl(tmp_path, tiny_data):
    from dfbench.benchmark.report.build import build_report, collect
    from dfbench.benchmark.report.frames import parse_target

    over = {**CURVE, "eval.every": 1, "train.rounds": 3, "system.speed": "1.0:0.5,0.25:0.5", "system.compute_rate": 16.0}
    runs = tmp_path / "runs"
    dirs = [run(tiny_config(over={**over, "seed": s}), runs, data=tiny_data, progress=False) for s in (0, 1)]
    curves = {d.name: _curve(d) for d in dirs}
    # a target between the untrained point and the best one: reached by whichever curves get there
    best = min(p["value"] for c in curves.values() for p in c)
    target = (best + curves[dirs[0].name][0]["value"]) / 2
    want = {}
    for name, c in curves.items():
        hit = [p for p in c if p["value"] <= target]
        if hit:
            want[name] = hit[0]["sim_seconds"]
    data = collect(runs, ("fd_fmnist", target))
    got = dict(zip(data.runs["run_id"], data.runs["time_to_target"]))
    assert {k: v for k, v in got.items() if v == v} == pytest.approx(want)  # (NaN: never reached)
    row = data.table.iloc[0]
    assert row["time_to_target_reached"] == len(want)
    assert row["sim_seconds_mean"] == pytest.approx(sum(json.loads((d / "metrics.json").read_text())["sim_seconds"] for d in dirs) / 2)
    assert len(data.curves) == sum(len(c) for c in curves.values())
    out = build_report(runs, tmp_path / "report", ("fd_fmnist", target))
    assert out["plot_quality_curves"].is_file()
    md = (tmp_path / "report" / "leaderboard.md").read_text()
    assert f"sim time to fd_fmnist ≤ {target:g}" in md and "| sim time |" in md
    with pytest.raises(ValueError, match="METRIC=VALUE"):
        parse_target("fd_fmnist")


def test_report_cli_refuses_a_bad_target_before_writing_anything(tmp_path, capsys):
    from dfbench.benchmark.cli import main

    assert main(["report", "--runs", str(tmp_path / "none"), "--out", str(tmp_path / "out"), "--target", "fd=abc"]) == 2
    assert "METRIC=VALUE" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_curve_lines_are_told_apart_by_the_config_the_method_does_not_name():
    import pandas as pd

    from dfbench.benchmark.report.frames import curve_labels

    runs = pd.DataFrame({"run_id": ["a", "b", "c"], "dataset": "fmnist", "partition": "iid", "setting": ["fedavg", "fedavg", "fedavg"],
                         "cfg.driver": ["sync", "fedbuff", "sync"], "cfg.buffer": [0.0, 2.0, 0.0], "cfg.rounds": [4, 4, 4],
                         "cfg.seed": [0, 0, 1]})
    labels = curve_labels(runs)
    # the block's usual values (driver=sync, buffer=0: two runs of three) go unsaid; seeds are not a setting
    assert labels["a"] == labels["c"] == "fedavg"
    assert labels["b"] == "fedavg (driver=fedbuff, buffer=2)"
    # a third setting differing from the usual one in another key is named by that key alone
    runs = pd.concat([runs, pd.DataFrame({"run_id": ["d", "e"], "dataset": "fmnist", "partition": "iid",
                                          "setting": "fedavg", "cfg.driver": "sync", "cfg.buffer": 0.0,
                                          "cfg.rounds": 8, "cfg.seed": [0, 1]})], ignore_index=True)
    labels = curve_labels(runs)
    assert labels["d"] == labels["e"] == "fedavg (rounds=8)" and labels["b"] == "fedavg (driver=fedbuff, buffer=2)"
    assert labels["a"] == "fedavg"
