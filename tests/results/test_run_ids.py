"""Run ids are published: a run folder is named by its id, and committed studies list them.

These tests pin ids LITERALLY (computed once, on 2026-12-04, before the config schema was declared)
so that a refactor of how ids are derived cannot move one. A failure here is not a value to update:
a changed id orphans every run folder made under the old one (a rerun trains again beside it, a
report pools nothing). Changing an id needs a migration (a schema version and a neutral value that
keeps the old runs' ids), never a new literal.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from dfbench.benchmark.core.config import RunConfig, config_hash
from dfbench.benchmark.engine.resolve import apply_overrides, config_from_dict

ROOT = Path(__file__).resolve().parents[2]
MIGRATION = "changing a run id needs a migration (see the module docstring), not a new literal"

# One config per row: the defaults, every method family, the partitions, the system heterogeneity,
# DP, compression, the asynchronous driver, experts with mixed objectives, and the device's numerics.
PINNED = {
    "defaults": ({}, "s0-207c7bc670"),
    "seed 3": ({"seed": 3}, "s3-30092892a1"),
    "fedprox": ({"method": "fedprox", "method.mu": 0.1}, "s0-8142822e5e"),
    "fedadam": ({"method": "fedadam", "method.server_lr": 0.03}, "s0-e8a94f262d"),
    "scaffold dirichlet": ({"method": "scaffold", "data.partition": "dirichlet:0.1", "data.clients": 5}, "s0-e520218ac2"),
    "random_prune capacity": ({"method": "random_prune", "method.keep_ratio": 0.25, "system.capacity": "1.0:0.5,0.5:0.5"},
                              "s0-28d067d09e"),
    "topk_prune global shards": ({"method": "topk_prune", "method.scope": "global", "data.partition": "shards:2"},
                                 "s0-79edee1258"),
    "heterofl capacity": ({"method": "heterofl", "system.capacity": "1.0:0.5,0.5:0.5"}, "s0-8a866a5ff5"),
    "quantized quantity": ({"method": "quantized", "method.bits": 4, "data.partition": "quantity:1.0"}, "s0-a4c3ddd3b9"),
    "topk_update": ({"method": "topk_update", "method.fraction": 0.05}, "s0-e49742433d"),
    "signsgd": ({"method": "signsgd"}, "s0-9a7a7b80ee"),
    "qsgd": ({"method": "qsgd", "method.levels": 7}, "s0-0662e55fe6"),
    "powersgd": ({"method": "powersgd", "method.rank": 2}, "s0-347cffd20a"),
    "experts mixed objectives": ({"method": "experts", "method.objectives": "ddpm,fm", "data.partition": "clusters:2",
                                  "data.clients": 2}, "s0-a7d83eb812"),
    "stragglers": ({"system.stragglers": 0.5, "system.straggler_steps": 0.25}, "s0-d385c2d625"),
    "participation poisson": ({"system.participation": 0.5, "system.sampling": "poisson"}, "s0-62d8ae7592"),
    "participation dropout": ({"system.participation": 0.5, "system.dropout": 0.1}, "s0-4d1f441fcb"),
    "dp": ({"privacy.clip": 1.0, "privacy.noise": 0.0, "privacy.weighting": "size"}, "s0-8f69abc0be"),
    "fedbuff": ({"train.driver": "fedbuff", "train.concurrency": 5, "train.buffer": 2, "train.staleness": "constant"},
                "s0-98a2dfc643"),
    "clock deadline": ({"system.speed": "1.0:0.5,0.25:0.5", "system.uplink_mbps": 10.0, "system.deadline": 30.0},
                       "s0-71f820e2c9"),
    "fm auto times": ({"train.objective": "fm"}, "s0-c30d30de15"),
    "fm logit_normal times": ({"train.objective": "fm", "train.time_sampling": "logit_normal"}, "s0-c30d30de15"),
    "fm uniform times": ({"train.objective": "fm", "train.time_sampling": "uniform"}, "s0-dca828a5fc"),
    "lr cosine ema": ({"train.lr_decay": "cosine", "train.ema": 0.5}, "s0-589df8129e"),
    "curve": ({"eval.every": 2, "eval.curve_samples": 100}, "s0-c0c7701660"),
    "leakage metrics": ({"eval.leakage_metrics": True, "eval.leakage_members": 64}, "s0-f915edabb0"),
    "images per client": ({"data.images_per_client": 500}, "s0-da3dc02584"),
    "bf16": ({"train.amp": "bf16"}, "s0-4a4e47cb68"),
    "cuda": ({"device": "cuda"}, "s0-d549d8384c"),
    "cuda fast": ({"device": "cuda:1", "train.deterministic": False}, "s0-122da94df8"),
    # what must not change the id: execution knobs, and knobs that are inactive where they are set
    "execution knobs": ({"train.channels_last": True, "data.root": "/tmp/x", "checkpoint_every": 2, "eval.sample_batch": 7,
                         "eval.feature_batch": 9, "eval.inference_variants": False}, "s0-207c7bc670"),
    "batched clients": ({"train.clients_mode": "batched", "train.client_batch": 2}, "s0-207c7bc670"),
    "curve samples without a curve": ({"eval.curve_samples": 50}, "s0-207c7bc670"),
    "leakage members without leakage metrics": ({"eval.leakage_members": 8}, "s0-207c7bc670"),
    "dp knobs while dp is off": ({"privacy.delta": 1e-3, "privacy.weighting": "size"}, "s0-207c7bc670"),
    "fedbuff knobs under sync": ({"train.concurrency": 3, "train.buffer": 2, "train.staleness": "constant"}, "s0-207c7bc670"),
    "ddpm times pinned uniform": ({"train.time_sampling": "uniform"}, "s0-207c7bc670"),
    "cuda index": ({"device": "cuda:3"}, "s0-d549d8384c"),
}


@pytest.mark.parametrize("name", list(PINNED))
def test_a_pinned_config_keeps_its_run_id_and_hash(name):
    over, expected = PINNED[name]
    cfg = apply_overrides(RunConfig(), over)
    assert cfg.run_id() == expected, f"{name}: run id {cfg.run_id()} != pinned {expected}; {MIGRATION}"
    assert config_hash(cfg) == expected.split("-", 1)[1], MIGRATION


def test_a_stored_config_from_before_the_later_fields_keeps_its_id():
    """config.json written before lr_decay, time_sampling, the clock, curves, the driver, images_per_client,
    DP and the leakage metrics (none of those keys, no privacy section) reads back with the id it had."""
    old = RunConfig().to_dict()
    for section, gone in {"train": ("lr_decay", "time_sampling", "driver", "concurrency", "buffer", "staleness"),
                          "system": ("speed", "compute_rate", "uplink_mbps", "downlink_mbps", "deadline", "sampling"),
                          "eval": ("every", "curve_samples", "leakage_metrics", "leakage_members"),
                          "data": ("images_per_client",)}.items():
        for key in gone:
            old[section].pop(key)
    old.pop("privacy")
    assert config_from_dict(old).run_id() == "s0-207c7bc670", MIGRATION
    assert config_from_dict(json.loads(json.dumps({"run_id": "x", **RunConfig().to_dict()}))).run_id() == "s0-207c7bc670"


# Every committed study: its grid, expanded by today's planner, gives exactly the run ids its
# leaderboard lists (no more, no fewer).
STUDIES = [
    ("demo", "results/demo/reference/leaderboard.csv"),
    ("results/paper-fmnist/paper-fmnist.toml", "results/paper-fmnist/leaderboard.csv"),
    ("results/paper-fmnist/rules/paper-fmnist-rules.toml", "results/paper-fmnist/rules/leaderboard.csv"),
    ("results/cpu-aggregation/cpu-aggregation.toml", "results/cpu-aggregation/leaderboard.csv"),
    ("results/cpu-aggregation/tune/cpu-aggregation-tune.toml", "results/cpu-aggregation/tune/leaderboard.csv"),
    ("results/cpu-stragglers/cpu-stragglers.toml", "results/cpu-stragglers/leaderboard.csv"),
    ("results/cpu-compression/cpu-compression.toml", "results/cpu-compression/leaderboard.csv"),
    ("results/cpu-privacy/cpu-privacy.toml", "results/cpu-privacy/leaderboard.csv"),
    ("results/cpu-experts/cpu-experts.toml", "results/cpu-experts/leaderboard.csv"),
    ("results/cpu-recipe/demo-tune.toml", "results/cpu-recipe/demo-tune/leaderboard.csv"),
    # seeds 7/8 were pinned in tests/data/run_ids.json until the study committed its leaderboard (issue 43 added 9/10)
    ("results/cpu-recipe/cpu-recipe.toml", "results/cpu-recipe/leaderboard.csv"),
]


def _grid_ids(study: str) -> list[str]:
    from dfbench.benchmark.grid.spec import load_grid

    return [c.cfg.run_id() for c in load_grid(_grid_source(study)).cells]


def _grid_source(study: str) -> str:
    """A grid file (relative to the root), a shipped grid's name, or a study's name: tests/data/run_ids.json pins
    paper-fmnist-budget by the name it had before each study's grid moved into its results folder."""
    from dfbench.benchmark.grid.spec import builtin_grids

    if study.endswith(".toml"):
        return str(ROOT / study)
    return study if study in builtin_grids() else str(ROOT / "results" / study / f"{study}.toml")


@pytest.mark.parametrize("study,csv_path", STUDIES)
def test_a_committed_study_grid_gives_exactly_its_leaderboard_run_ids(study, csv_path):
    with open(ROOT / csv_path, newline="") as f:
        committed = {rid for row in csv.DictReader(f) for rid in row["run_ids"].split(";") if rid}
    ids = _grid_ids(study)
    assert len(ids) == len(set(ids)), f"{study}: two cells share a run id"
    assert set(ids) == committed, (f"{study}: ids the grid gives but the leaderboard lacks {sorted(set(ids) - committed)}, "
                                   f"ids the leaderboard lists but the grid no longer gives {sorted(committed - set(ids))}; "
                                   + MIGRATION)


def test_the_cpu_recipe_grid_gives_its_candidates_run_ids():
    committed = set(json.loads((ROOT / "results/cpu-recipe/candidates.json").read_text()))
    assert set(_grid_ids("results/cpu-recipe/cpu-recipe.toml")) == committed, MIGRATION


PINNED_GRIDS = json.loads((Path(__file__).parents[1] / "data" / "run_ids.json").read_text())["grids"]


@pytest.mark.slow
@pytest.mark.parametrize("study", list(PINNED_GRIDS))
def test_a_grid_without_a_committed_leaderboard_keeps_its_pinned_ids(study):
    """tests/data/run_ids.json was written once from the planner; it is compared against, never rewritten."""
    ids = _grid_ids(study)
    assert sorted(set(ids)) == PINNED_GRIDS[study] and len(ids) == len(set(ids)), f"{study}: {MIGRATION}"
