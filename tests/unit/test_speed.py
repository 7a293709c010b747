"""A study's speed table (benchmark/report/speed.py, scripts/speed.py) from run folders made here: medians by hand."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from helpers import load_script

main = load_script("speed").main


def _study(tmp_path):
    rows = []
    for i, (method, seconds) in enumerate([("fedavg", 10.0), ("fedavg", 20.0), ("fedavg", 40.0), ("quantized", 8.0)]):
        rid = f"s{i}-{i:010d}"
        folder = tmp_path / "runs" / "fmnist" / "iid" / method / rid
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")  # what makes a folder a run folder (runfolder.iter_runs)
        (folder / "metrics.json").write_text(json.dumps({"client_images": 1000.0, "train_wall_seconds": seconds,
                                                         "environment": {"hardware": "CPU X, 2 cores", "torch_threads": 1}}))
        rows.append({"run_id": rid, "method": method, "seed": i, "baseline": False, "dataset": "fmnist", "partition": "iid",
                     "params": "bits=4" if method == "quantized" else "", "param.bits": 4 if method == "quantized" else None})
    untrained = tmp_path / "runs" / "fmnist" / "iid" / "fedavg" / "s0-untrained00"
    untrained.mkdir(parents=True)
    (untrained / "config.json").write_text("{}")
    (untrained / "metrics.json").write_text(json.dumps({"client_images": 0.0, "train_wall_seconds": 0.0}))
    rows.append({"run_id": "s0-untrained00", "method": "fedavg", "seed": 0, "baseline": True, "dataset": "fmnist",
                 "partition": "iid", "params": "", "param.bits": None})
    pd.DataFrame(rows).to_csv(tmp_path / "runs.csv", index=False)


def test_medians_by_hand_and_the_untrained_run_left_out(tmp_path):
    _study(tmp_path)
    assert main([str(tmp_path)]) == 0
    t = pd.read_csv(tmp_path / "speed.csv")
    assert list(t["setting"]) == ["fedavg", "quantized (bits=4)"]
    fedavg = t.iloc[0]
    assert fedavg["runs"] == 3 and fedavg["images_per_s"] == pytest.approx(50.0)  # median of 100, 50, 25
    assert fedavg["train_minutes"] == pytest.approx(20.0 / 60)
    md = (tmp_path / "speed.md").read_text()
    assert "| fedavg | 3 | 50 | 0.3 |" in md and "CPU X, 2 cores, 1 torch thread(s)" in md


def test_refuses_a_study_without_runs_csv_or_timed_runs(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    pd.DataFrame({"run_id": ["x"], "method": ["fedavg"], "seed": [0], "baseline": [False], "dataset": ["fmnist"],
                  "partition": ["iid"], "params": [""]}).to_csv(tmp_path / "runs.csv", index=False)
    assert main([str(tmp_path)]) == 2
    assert "records client_images" in capsys.readouterr().err


def test_two_settings_one_name_in_two_blocks_stay_two_rows_that_say_their_partition(tmp_path):
    # prepare: "fedavg" names one config at dirichlet:0.1 (2 runs) and another at dirichlet:0.5 (1 run), as in
    # results/confirmatory-2, where each block names its settings by what differs inside it
    rows = []
    for i, (partition, key, seconds) in enumerate([("dirichlet:0.1", "a", 10.0), ("dirichlet:0.1", "a", 30.0),
                                                   ("dirichlet:0.5", "b", 100.0)]):
        rid = f"s{i}-{i:010d}"
        folder = tmp_path / "runs" / "fmnist" / partition.replace(":", "-") / "fedavg" / rid
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        (folder / "metrics.json").write_text(json.dumps({"client_images": 1000.0, "train_wall_seconds": seconds}))
        rows.append({"run_id": rid, "method": "fedavg", "seed": i, "baseline": False, "dataset": "fmnist",
                     "partition": partition, "params": "", "group_key": key})
    pd.DataFrame(rows).to_csv(tmp_path / "runs.csv", index=False)
    # execute
    assert main([str(tmp_path)]) == 0
    # assert: one row per setting, medians by hand (100 and 33.3 images/s -> 66.7; 10 images/s)
    t = pd.read_csv(tmp_path / "speed.csv").set_index("setting")
    assert list(t.index) == ["fedavg (dirichlet:0.1)", "fedavg (dirichlet:0.5)"]
    assert t.loc["fedavg (dirichlet:0.1)", "runs"] == 2 and t.loc["fedavg (dirichlet:0.1)", "images_per_s"] == pytest.approx(200 / 3)
    assert t.loc["fedavg (dirichlet:0.5)", "images_per_s"] == pytest.approx(10.0)
