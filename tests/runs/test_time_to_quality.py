"""Time to a quality the reference reaches (results/cpu-stragglers/time_to_quality.py) on hand-computed
curves, and end to end on run folders made by the engine."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from dfbench import datasets
from helpers import load_script

ttq = load_script("results/cpu-stragglers/time_to_quality.py")
default_reference, main, time_to_quality_table = ttq.default_reference, ttq.main, ttq.time_to_quality_table

# (run id, driver, seed, final fd, [(round, value, client_images, sim_seconds), ...])
RUNS = [
    ("r0", "sync", 0, 250.0, [(0, 800, 0, 0), (2, 400, 100, 10), (4, 300, 200, 20)]),
    ("r1", "sync", 1, 270.0, [(0, 800, 0, 0), (2, 420, 100, 10), (4, 310, 200, 20)]),
    ("b0", "fedbuff", 0, 240.0, [(0, 800, 0, 0), (1, 410, 50, 4), (2, 305, 100, 8), (3, 290, 150, 12)]),
    ("b1", "fedbuff", 1, 300.0, [(0, 800, 0, 0), (1, 430, 50, 4), (2, 415, 100, 8), (3, 350, 150, 12)]),
]


def _frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    runs = pd.DataFrame([{"run_id": rid, "dataset": "fmnist", "partition": "iid", "setting": "fedavg", "baseline": False,
                          "seed": seed, "fd": final, "cfg.driver": driver, "cfg.seed": seed,
                          "sim_seconds": pts[-1][3], "client_images": pts[-1][2]} for rid, driver, seed, final, pts in RUNS])
    curves = pd.DataFrame([{"run_id": rid, "dataset": "fmnist", "partition": "iid", "seed": seed, "metric": "fd_fmnist",
                            "round": r, "value": v, "client_images": w, "sim_seconds": t}
                           for rid, _, seed, _, pts in RUNS for r, v, w, t in pts])
    return runs, curves


def test_targets_times_ratios_and_paired_final_differences_by_hand():
    runs, curves = _frames()
    table = time_to_quality_table(runs, curves, "fd", "fd_fmnist")
    # two settings, two runs each: the first seen (sync) is the usual one and goes unnamed
    assert table["label"].tolist() == ["fedavg"] * 2 + ["fedavg (driver=fedbuff)"] * 2  # the reference first
    buff = table[table["label"] == "fedavg (driver=fedbuff)"]
    assert (buff["final"] == 270.0).all()  # (240 + 300) / 2
    half, full = buff[buff["target_fraction"] == 0.5].iloc[0], buff[buff["target_fraction"] == 1.0].iloc[0]
    # targets: the reference at >= half (100 images) of its 200: 400, 420 -> the worse, 420; at all of it: 300, 310 -> 310
    assert half["target"] == 420 and full["target"] == 310
    # fedbuff reaches 420 at 4 s (seed 0: 410) and 8 s (seed 1: 415); the reference at 10 s on both
    assert half["reached"] == "2/2" and half["seconds_to_target"] == pytest.approx(6.0)
    assert half["images_to_target"] == pytest.approx(75.0) and half["time_ratio"] == pytest.approx((0.4 + 0.8) / 2)
    assert half["per_seed_seconds"] == "4 / 8"
    # 310: seed 0 at 8 s (305; the reference's seed 0 at 20 s: 300), seed 1 never (best 350)
    assert full["reached"] == "1/2" and full["seconds_to_target"] == pytest.approx(8.0) and full["time_ratio"] == pytest.approx(0.4)
    assert full["per_seed_seconds"] == "8 / -"
    # final scores paired by seed: -10, +30 -> mean +10, t interval with 1 degree of freedom (12.706 * 28.28 / sqrt 2)
    assert half["final_diff"] == pytest.approx(10.0)
    assert half["final_high"] - half["final_diff"] == pytest.approx(12.7062 * math.sqrt(800) / math.sqrt(2), rel=1e-4)
    assert half["final_verdict"] == "inconclusive"  # the interval holds 0 and the equivalence test fails too
    reference = table[table["label"] == "fedavg"]
    assert reference["time_ratio"].tolist() == pytest.approx([1.0, 1.0]) and reference["final_verdict"].tolist() == ["", ""]


def test_the_default_reference_is_plain_fedavg_and_ambiguity_names_the_fix():
    runs, curves = _frames()
    labels = {"r0": "fedavg", "r1": "fedavg", "b0": "fedavg (driver=fedbuff)", "b1": "fedavg (driver=fedbuff)"}
    assert default_reference(runs, labels) == "fedavg"
    runs.loc[:, "cfg.driver"] = "fedbuff"
    with pytest.raises(ValueError, match="--reference"):
        default_reference(runs, labels)
    # a named reference the block lacks: its settings are listed
    with pytest.raises(ValueError, match="no runs of the reference 'nope'.*settings"):
        time_to_quality_table(*_frames(), "fd", "fd_fmnist", reference="nope")


@pytest.mark.slow
def test_end_to_end_on_run_folders_sync_against_fedbuff(tmp_path, monkeypatch, tiny_data, capsys):
    from dfbench.benchmark.engine.lifecycle import run
    from helpers import tiny_config

    monkeypatch.setattr(datasets, "load", lambda name, split="train", root=None, **kw: tiny_data)
    over = {"eval.metrics": "fd_fmnist", "eval.every": 1, "eval.curve_samples": 12, "train.rounds": 2,
            "system.speed": "1.0:0.5,0.25:0.5", "system.compute_rate": 16.0}
    runs = tmp_path / "runs"
    run(tiny_config(over=over), runs, data=tiny_data, progress=False)
    run(tiny_config(over={**over, "train.driver": "fedbuff", "train.buffer": 2, "train.rounds": 4}), runs, data=tiny_data, progress=False)
    run(tiny_config(over={**over, "train.rounds": 0, "eval.every": 0}), runs, data=tiny_data, progress=False)  # untrained: skipped
    assert main(["--runs", str(runs), "--out", str(tmp_path / "out")]) == 0
    table = pd.read_csv(tmp_path / "out" / "time_to_quality.csv")
    # the page's order: the budget (rounds) after the other keys (names.setting_names)
    assert sorted(table["label"].unique()) == ["fedavg", "fedavg (buffer=2, driver=fedbuff, rounds=4)"]
    ref = table[table["label"] == "fedavg"]
    assert (ref["reached"] == "1/1").all() and ref["time_ratio"].tolist() == [1.0, 1.0]
    md = (tmp_path / "out" / "time_to_quality.md").read_text()
    assert "| fedavg (buffer=2, driver=fedbuff, rounds=4) |" in md and "(reference)" in md
    with pytest.raises(SystemExit):
        main(["--runs", str(runs), "--out", str(tmp_path / "x"), "--at", "0,2"])
    assert "fractions in (0, 1]" in capsys.readouterr().err and not (tmp_path / "x").exists()
    with pytest.raises(SystemExit, match="does not exist"):
        main(["--runs", str(tmp_path / "none"), "--out", str(tmp_path / "y")])
    only_untrained = tmp_path / "untrained"
    run(tiny_config(over={**over, "train.rounds": 0, "eval.every": 0}), only_untrained, data=tiny_data, progress=False)
    with pytest.raises(SystemExit, match="no quality curves.*eval.every"):
        main(["--runs", str(only_untrained), "--out", str(tmp_path / "y")])
    assert not (tmp_path / "y").exists()
