"""The budget x width study's table and figure (results/paper-fmnist-budget/budget_width.py) on a runs.csv made here,
checked against hand-computed geometric means and collapse counts."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from helpers import load_script

B = load_script("results/paper-fmnist-budget/budget_width.py")


def _runs() -> pd.DataFrame:
    rows = []
    # (model, rounds, method, seed) -> fd; untrained at 800 for every seed of both widths
    fd = {("n28", 14, "fedavg"): [100.0, 120.0, 110.0], ("n28", 14, "random_prune"): [150.0, 700.0, 500.0],
          ("n32", 14, "fedavg"): [90.0, 95.0, 100.0], ("n32", 14, "random_prune"): [120.0, 130.0, 600.0]}
    for (model, rounds, method), values in fd.items():
        for seed, v in enumerate(values):
            rows.append({"method": method, "params": "keep_ratio=0.5" if method != "fedavg" else "", "seed": seed,
                         "baseline": False, "cfg.model": model, "cfg.rounds": rounds, "fd_fmnist": v,
                         "num_parameters": 10 if model == "n28" else 40, "dataset": "fmnist", "partition": "iid",
                         "param.keep_ratio": 0.5 if method != "fedavg" else math.nan})
    for model in ("n28", "n32"):
        for seed in range(3):
            rows.append({"method": "fedavg", "params": "", "seed": seed, "baseline": True, "cfg.model": model,
                         "cfg.rounds": 0, "fd_fmnist": 800.0, "num_parameters": 10 if model == "n28" else 40,
                         "dataset": "fmnist", "partition": "iid", "param.keep_ratio": math.nan})
    return pd.DataFrame(rows)


def test_table_by_hand(tmp_path):
    t = B.summarize(_runs())
    assert list(t["model"]) == ["n28"] * 3 + ["n32"] * 3 and list(t["rounds"]) == [0, 14, 14, 0, 14, 14]
    rp = t[(t["model"] == "n28") & (t["setting"].str.startswith("random_prune"))].iloc[0]
    assert rp["gmean"] == pytest.approx((150 * 700 * 500) ** (1 / 3))
    # seed 0: |log 150 - log 800| > |log 150 - log 100|: not collapsed; seeds 1, 2 nearer 800 than 120 / 110
    assert (rp["collapsed"], rp["collapse_seeds"]) == (2, 3)
    wide = t[(t["model"] == "n32") & (t["setting"].str.startswith("random_prune"))].iloc[0]
    assert (wide["collapsed"], wide["per_seed"]) == (1, "120.0;130.0;600.0")  # sqrt(100*800) = 283 < 600
    fedavg = t[(t["model"] == "n32") & (t["setting"] == "fedavg")].iloc[0]
    assert math.isnan(fedavg["collapsed"]) and fedavg["num_parameters"] == 40
    md = B.to_markdown(t, "fd_fmnist")
    assert "| n28 (10) | 14 | random_prune" in md and "| 2/3 |" in md and "s1 700.0" in md
    png = B.figure(t, "fd_fmnist", tmp_path / "f.png")
    assert png.stat().st_size > 10_000


def test_cli_writes_three_files_and_refuses_a_runs_csv_without_the_network(tmp_path, capsys):
    _runs().to_csv(tmp_path / "runs.csv", index=False)
    assert B.main([str(tmp_path)]) == 0
    assert {p.name for p in tmp_path.iterdir()} >= {"budget_width.csv", "budget_width.md", "budget_width.png"}
    assert pd.read_csv(tmp_path / "budget_width.csv")["collapsed"].sum() == 3
    _runs().drop(columns=["cfg.model"]).to_csv(tmp_path / "runs.csv", index=False)
    assert B.main([str(tmp_path)]) == 2
    assert "cfg.model" in capsys.readouterr().err
    assert B.main([str(tmp_path / "nowhere")]) == 2


def test_speed_is_the_median_of_images_per_training_second_from_the_run_folders(tmp_path):
    import json

    runs = _runs()
    runs["run_id"] = [f"s{s}-{i:010d}" for i, s in enumerate(runs["seed"])]
    for i, (rid, method) in enumerate(zip(runs["run_id"], runs["method"])):
        folder = tmp_path / "runs" / "fmnist" / "iid" / method / rid
        folder.mkdir(parents=True)
        m = {"client_images": 1000.0, "train_wall_seconds": 10.0 * (1 + i % 3)} if i < 12 else {"client_images": 0.0}
        (folder / "config.json").write_text("{}")  # what makes a folder a run folder (runfolder.iter_runs)
        (folder / "metrics.json").write_text(json.dumps(m))
    (tmp_path / "runs" / "broken").mkdir()
    (tmp_path / "runs" / "broken" / "config.json").write_text("{}")
    (tmp_path / "runs" / "broken" / "metrics.json").write_text("{not json")
    speed = B.speeds(tmp_path / "runs")
    assert len(speed) == 12 and speed[runs["run_id"][1]] == pytest.approx(50.0)
    t = B.summarize(runs, speed=speed)
    row = t[(t["model"] == "n28") & (t["setting"] == "fedavg")].iloc[0]
    assert row["images_per_s"] == pytest.approx(50.0)  # median of 100, 50, 33.3
    assert math.isnan(t[t["rounds"] == 0]["images_per_s"].iloc[0])  # untrained: no training time
