"""benchmark/report/paper_figures.py on hand-built run folders: FedAvg as keep 1.0 of both families,
means and t-intervals over seeds, drift against FedAvg, every figure written."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dfbench.benchmark.report import paper_figures
from helpers import tiny_config

T_975_DF2 = 4.302652729911275  # Student t quantile 0.975 with 2 degrees of freedom (tables)


def _run(root: Path, method: str, params: dict, seed: int, score: float, value: int, rounds: int = 2,
         w2: float = 0.0, gamma: int = 4) -> Path:
    cfg = tiny_config(method, params, {"seed": seed, "train.rounds": rounds})
    d = root / "fmnist" / "iid" / method / cfg.run_id()
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"run_id": cfg.run_id(), **cfg.to_dict()}))
    (d / "status.json").write_text(json.dumps({"state": "done"}))
    rows = [{"round": r + 1, "clients": [0, 1, 2, 3], "loss": 0.1, "w2": w2, "gamma": gamma, "gamma_star": gamma, "uplink_bits": 8}
            for r in range(rounds)]
    (d / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics = {"evaluations": [{"metric": "fd_fmnist", "value": score, "extractor": "fmnist", "num_samples": 40}],
               "rounds": rounds, "gamma_star": gamma if rounds else None, "w2_mean": w2, "uplink_bits": 8 * rounds,
               "downlink_bits": 8 * rounds, "wall_seconds": 1.0}
    (d / "metrics.json").write_text(json.dumps(metrics))
    np.savez_compressed(d / "samples.npz", images=np.full((40, 1, 28, 28), value, dtype=np.uint8))
    return d


@pytest.fixture()
def study_root(tmp_path: Path) -> Path:
    from dfbench.benchmark.metrics.drift import record_missing_drift

    root = tmp_path / "runs"
    runs = []
    for seed in (0, 1, 2):
        runs.append(_run(root, "fedavg", {}, seed, 100.0 + seed, value=0))
        runs.append(_run(root, "fedavg", {}, seed, 800.0, value=128, rounds=0))  # untrained
        runs.append(_run(root, "random_prune", {"keep_ratio": 0.5}, seed, [200.0, 210.0, 230.0][seed], value=51, w2=0.5, gamma=1))
        runs.append(_run(root, "topk_prune", {"keep_ratio": 0.5}, seed, 150.0, value=102, w2=0.1, gamma=2))
    # the drift record a grid leaves in metrics.json (paper_figures, like the reporter, only reads it)
    assert len(record_missing_drift(runs)) == len(runs)
    return root


def test_study_rows_put_fedavg_at_keep_one_for_both_families(study_root):
    study, metric = paper_figures.study_runs(study_root)
    assert metric == "fd_fmnist"
    dense = study[study["keep"] == 1.0]
    assert sorted(dense["family"].unique()) == ["random", "top-k"] and len(dense) == 6
    assert (study["family"] == "untrained").sum() == 3
    # drift against FedAvg of the same seed: samples 51 vs 0 everywhere -> 51/255 in pixels
    rnd = study[(study["family"] == "random") & (study["keep"] == 0.5)]
    assert np.allclose(rnd["drift_pixel"], 51 / 255)
    assert np.allclose(dense["drift_pixel"], 0.0) and np.allclose(dense["drift_features"], 0.0)


def test_summary_means_and_t_intervals_equal_hand_computation(study_root, tmp_path):
    paths = paper_figures.build(study_root, tmp_path / "out")
    table = pd_read(tmp_path / "out" / "paper_summary.csv")
    row = table[(table["family"] == "random") & (table["keep"] == 0.5)].iloc[0]
    values = np.array([200.0, 210.0, 230.0])
    sd = math.sqrt(((values - values.mean()) ** 2).sum() / 2)
    half = T_975_DF2 * sd / math.sqrt(3)
    assert row["n"] == 3 and row["metric_mean"] == pytest.approx(values.mean(), rel=1e-5)
    assert row["metric_low"] == pytest.approx(values.mean() - half, rel=1e-5)
    assert row["metric_high"] == pytest.approx(values.mean() + half, rel=1e-5)
    assert row["w2_mean"] == pytest.approx(0.5) and row["gamma_star_mean"] == pytest.approx(1.0)
    fed = table[(table["family"] == "top-k") & (table["keep"] == 1.0)].iloc[0]
    assert fed["metric_mean"] == pytest.approx(101.0)
    md = (tmp_path / "out" / "paper_summary.md").read_text()
    assert "| random | 0.5 | 3 | 213.3 [" in md and "| untrained | – | 3 | 800.0" in md
    claims = (tmp_path / "out" / "paper_claims.md").read_text()
    assert "- keep 0.5: top-k 150.0 [150.0, 150.0] vs random 213.3 [" in claims and "top-k better" in claims
    assert "- random, keep 0.5: +111%" in claims  # 213.33 / 101 - 1
    # paired by seed: 150 - (200, 210, 230) = -50, -60, -80; t-interval by hand
    diff = np.array([-50.0, -60.0, -80.0])
    half_d = T_975_DF2 * diff.std(ddof=1) / math.sqrt(3)
    assert (f"top-k − random: seed 0: -50.0, seed 1: -60.0, seed 2: -80.0; top-k better at 3 of 3; "
            f"mean {diff.mean():+.1f} [{diff.mean() - half_d:+.1f}, {diff.mean() + half_d:+.1f}]") in claims
    assert "random keep 0.5 / untrained = 0.27" in claims  # 213.33 / 800
    for key in ("metric_vs_keep", "drift_vs_keep", "metric_vs_bound", "samples"):
        with Image.open(paths[key]) as img:
            assert img.size[0] > 300 and img.size[1] > 200


def test_tile_puts_sample_k_at_row_k_div_10_column_k_mod_10():
    images = np.zeros((40, 1, 2, 2), dtype=np.uint8)
    for k in range(40):
        images[k] = k
    tile = paper_figures._tile(images)
    assert tile.shape == (3 * 3 - 1, 10 * 3 - 1)
    assert tile[0, 0] == 0 and tile[3, 0] == 10 and tile[6, 27] == 29 and tile[2, 0] == 255  # gap row


def test_no_scored_runs_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="make bench-paper-fmnist"):
        paper_figures.study_runs(tmp_path / "empty")


def pd_read(path: Path):
    import pandas as pd

    return pd.read_csv(path)
