"""results/paper-fmnist/paper_figures.py on hand-built run folders: FedAvg as keep 1.0 of both families,
means and t-intervals over seeds, drift against FedAvg, every figure written."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from helpers import load_script, tiny_config

paper_figures = load_script("results/paper-fmnist/paper_figures.py")

T_975_DF2 = 4.302652729911275  # Student t quantile 0.975 with 2 degrees of freedom (tables)


def _run(root: Path, method: str, params: dict, seed: int, score: float, value: int, rounds: int = 2,
         w2: float = 0.0, gamma: int = 4, rules: dict[str, float] | None = None) -> Path:
    """A finished run folder; `rules` (rule -> score) tags the score as the configured rule's (the
    first) and adds the others as variant rows, as eval.inference_variants writes them."""
    cfg = tiny_config(method, params, {"seed": seed, "train.rounds": rounds})
    d = root / "fmnist" / "iid" / method / cfg.run_id()
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"run_id": cfg.run_id(), **cfg.to_dict()}))
    (d / "status.json").write_text(json.dumps({"state": "done"}))
    rows = [{"round": r + 1, "clients": [0, 1, 2, 3], "loss": 0.1, "w2": w2, "gamma": gamma, "gamma_star": gamma, "uplink_bits": 8}
            for r in range(rounds)]
    (d / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evals = [{"metric": "fd_fmnist", "value": score, "extractor": "fmnist", "num_samples": 40}]
    if rules:
        first = next(iter(rules))
        evals = [{**evals[0], "value": v, "inference": rule, "configured": rule == first} for rule, v in rules.items()]
    metrics = {"evaluations": evals,
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


def test_model_keeps_the_runs_of_one_network(study_root):
    every, _ = paper_figures.study_runs(study_root)
    tiny, _ = paper_figures.study_runs(study_root, model="tiny")  # tiny_config's network: every run
    assert sorted(tiny["path"].astype(str)) == sorted(every["path"].astype(str)) and len(every) == 15
    with pytest.raises(ValueError, match="no scored runs"):
        paper_figures.study_runs(study_root, model="ddpm32")  # another network's: none here


@pytest.mark.slow
def test_summary_means_and_t_intervals_equal_hand_computation(study_root, tmp_path):
    paths = paper_figures.build(study_root, tmp_path / "out")
    table = pd_read(tmp_path / "out" / "paper_summary.csv")
    row = table[(table["family"] == "random") & (table["keep"] == 0.5)].iloc[0]
    values = np.array([200.0, 210.0, 230.0])
    logs = np.log(values)  # a distance: the geometric mean and the t-interval of the logs, mapped back
    half = T_975_DF2 * math.sqrt(((logs - logs.mean()) ** 2).sum() / 2) / math.sqrt(3)
    gmean = math.exp(logs.mean())  # 212.99
    assert row["n"] == 3 and row["metric_mean"] == pytest.approx(gmean, rel=1e-5)
    assert row["metric_low"] == pytest.approx(math.exp(logs.mean() - half), rel=1e-5)
    assert row["metric_high"] == pytest.approx(math.exp(logs.mean() + half), rel=1e-5)
    assert row["w2_mean"] == pytest.approx(0.5) and row["gamma_star_mean"] == pytest.approx(1.0)
    fed = table[(table["family"] == "top-k") & (table["keep"] == 1.0)].iloc[0]
    assert fed["metric_mean"] == pytest.approx((100.0 * 101.0 * 102.0) ** (1 / 3), rel=1e-5)  # geometric (CSV: 3 decimals)
    md = (tmp_path / "out" / "paper_summary.md").read_text()
    assert "| random | 0.5 | 3 | 213.0 [" in md and "| untrained | – | 3 | 800.0" in md
    claims = (tmp_path / "out" / "paper_claims.md").read_text()
    assert "- keep 0.5: top-k 150.0 [150.0, 150.0] vs random 213.0 [" in claims and "verdicts in claims.md" in claims
    assert "- random, keep 0.5: +111%" in claims  # 212.99 / 101 - 1
    # paired by seed: 150 - (200, 210, 230) = -50, -60, -80; t-interval by hand
    diff = np.array([-50.0, -60.0, -80.0])
    half_d = T_975_DF2 * diff.std(ddof=1) / math.sqrt(3)
    assert (f"top-k − random: seed 0: -50.0, seed 1: -60.0, seed 2: -80.0; top-k better at 3 of 3; "
            f"mean {diff.mean():+.1f} [{diff.mean() - half_d:+.1f}, {diff.mean() + half_d:+.1f}]") in claims
    assert "random keep 0.5 / untrained = 0.27" in claims  # 212.99 / 800
    for key in ("metric_vs_keep", "drift_vs_keep", "metric_vs_bound", "samples"):
        with Image.open(paths[key]) as img:
            assert img.size[0] > 300 and img.size[1] > 200


@pytest.fixture()
def rules_root(tmp_path: Path) -> Path:
    """Pruning runs at keep 0.75 and 0.5 on seeds 7 and 8, each scored under three rules."""
    root = tmp_path / "rule-runs"
    scores = {  # (method, keep) -> rule -> (seed 7, seed 8)
        ("random_prune", 0.75): {"scaled": (200, 210), "full": (300, 320), "submodel": (250, 250)},
        ("random_prune", 0.5): {"scaled": (400, 420), "full": (390, 380), "submodel": (500, 520)},
        ("topk_prune", 0.75): {"full": (180, 190), "scaled": (600, 640), "submodel": (185, 185)},
        ("topk_prune", 0.5): {"full": (300, 320), "scaled": (700, 720), "submodel": (250, 260)},
    }
    for (method, keep), by_rule in scores.items():
        for i, seed in enumerate((7, 8)):
            rules = {rule: float(v[i]) for rule, v in by_rule.items()}
            _run(root, method, {"keep_ratio": keep}, seed, next(iter(rules.values())), value=0, rules=rules)
    return root


def test_rules_are_summarized_per_keep_and_chosen_by_their_mean_over_keeps(rules_root, tmp_path):
    rules = paper_figures.rule_runs(rules_root)
    assert len(rules) == 4 * 2 * 3 and rules["configured"].sum() == 8
    summary = paper_figures.rule_summary(rules)
    row = summary[(summary["family"] == "top-k") & (summary["keep"] == 0.5) & (summary["rule"] == "submodel")].iloc[0]
    logs = np.log([250.0, 260.0])  # the geometric mean, its interval on the logs; t(0.975, 1 df) = 12.706
    half = 12.706204736174707 * np.std(logs, ddof=1) / math.sqrt(2)
    assert row["n"] == 2 and row["metric_mean"] == pytest.approx(math.sqrt(250.0 * 260.0))
    assert row["metric_high"] == pytest.approx(math.exp(logs.mean() + half), rel=1e-6)
    choice = paper_figures.choose_rules(summary)
    chosen = choice[choice["chosen"]].set_index("family")["rule"].to_dict()
    # random: scaled (205 + 410) / 2 = 307.5 < full 347.5 < submodel 380; top-k: submodel 220 < full 247.5
    assert chosen == {"random": "scaled", "top-k": "submodel"}
    means = choice.set_index(["family", "rule"])["mean_over_keeps"]
    # the mean over keeps of each keep's geometric mean over the two seeds
    assert means[("random", "scaled")] == pytest.approx((math.sqrt(200 * 210) + math.sqrt(400 * 420)) / 2)
    assert means[("top-k", "full")] == pytest.approx((math.sqrt(180 * 190) + math.sqrt(300 * 320)) / 2)
    best_at = choice.set_index(["family", "rule"])["best_at"]
    assert best_at[("random", "full")] == "0.5" and best_at[("top-k", "full")] == "0.75"

    paths = paper_figures.choose(rules_root, tmp_path / "out")
    text = paths["choice"].read_text()
    assert "seed(s) 7, 8" in text and "| top-k | `submodel` | 220.0 | 2 | 0.5 | **yes** |" in text
    md = paths["rules"].read_text()
    assert "| top-k | 0.5 | 2 | 309.8 [" in md and "fd_fmnist, `submodel`" in md
    # C1 under each rule: paired by seed, top-k - random under `full` at keep 0.5: (300 - 390, 320 - 380)
    lines = "\n".join(paper_figures.rule_claims(rules))
    assert "- `full`:" in lines and "seed 7: -90.0, seed 8: -60.0; top-k better at 2 of 2" in lines


def test_choosing_rules_without_scored_rules_is_a_clear_error(study_root, tmp_path):
    with pytest.raises(ValueError, match="eval.inference_variants=true"):
        paper_figures.choose(study_root, tmp_path / "out")


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


def test_samples_figure_is_left_alone_without_the_runs_samples(study_root, tmp_path):
    # a committed study keeps its run folders without samples.npz: the figure is not redrawn, the rest is
    for npz in study_root.rglob("samples.npz"):
        npz.unlink()
    paths = paper_figures.build(study_root, tmp_path / "out")
    assert isinstance(paths["samples"], str) and "no samples.npz" in paths["samples"]
    assert not (tmp_path / "out" / "paper_samples.png").exists() and paths["metric_vs_keep"].is_file()


def _study(rows: list[tuple[str, float, int, float]]) -> pd.DataFrame:
    """A study frame (paper_figures.study_runs' columns) from (family, keep, seed, metric) rows."""
    return pd.DataFrame([{"family": f, "keep": k, "seed": s, "metric": m, "w2": 1 - k if k == k else math.nan,
                          "gamma_star": 1.0, "drift_pixel": 0.0, "drift_features": 0.0, "path": ""} for f, k, s, m in rows])


def test_claims_compare_settings_only_on_the_seeds_they_share():
    # prepare: random keep 0.5 ran 6 seeds (600 on seeds 0-2, 300 on 3-5), keep 0.25 only seeds 0-2 (540):
    # over their own seeds 0.5 (424) looks better than 0.25, over the 3 seeds both ran it is worse
    rows = [(fam, 1.0, s, 100.0) for fam in ("random", "top-k") for s in range(6)]
    rows += [("random", 0.5, s, 600.0 if s < 3 else 300.0) for s in range(6)]
    rows += [("random", 0.25, s, 540.0) for s in range(3)]
    rows += [("top-k", 0.5, s, 200.0) for s in range(6)] + [("top-k", 0.25, s, 250.0) for s in range(3)]
    rows += [("untrained", math.nan, s, 800.0) for s in range(6)]
    study = _study(rows)
    # execute
    table = paper_figures.summarize(study)
    lines = "\n".join(paper_figures.claims(table, study, "fd_fmnist"))
    # assert: C2 over the 3 shared seeds says so and is not monotone for random; the summary keeps the own-seed
    # mean beside the shared one
    assert "- random, 3 shared seeds: 1: 100.0 → 0.5: 600.0 → 0.25: 540.0 (not monotone)" in lines
    assert "- top-k, 3 shared seeds: 1: 100.0 → 0.5: 200.0 → 0.25: 250.0 (monotone)" in lines
    row = table[(table["family"] == "random") & (table["keep"] == 0.5)].iloc[0]
    assert row["n"] == 6 and row["metric_mean"] == pytest.approx(math.sqrt(600.0 * 300.0))
    assert row["shared_n"] == 3 and row["metric_shared"] == pytest.approx(600.0)
    # C3 against FedAvg over the 6 seeds both ran (paired), the floor over the 6 they share with the untrained model
    assert f"- random, keep 0.5: {math.sqrt(600.0 * 300.0) / 100 - 1:+.0%} (6 paired seeds)" in lines
    assert "- random, keep 0.25: +440% (3 paired seeds)" in lines
    assert "random keep 0.5 / untrained = 0.53 (6 paired seeds)" in lines
    assert "(each over its own seeds: 3 and 3)" not in lines and "(each over its own seeds: 6 and 6)" not in lines
