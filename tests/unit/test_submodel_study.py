"""results/cpu-submodels/submodel_study.py: the pre-registered time rule on hand-made times (never reaching is
infinitely late, a tie counts against the structured scheme, one seed the other way fails it), the measured
clock of a hand-made run, and the committed tables regenerated from the committed run folders."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from helpers import load_script

study = load_script("results/cpu-submodels/submodel_study.py")
ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "results" / "cpu-submodels"


def _times(structured: list[float], mask: list[float]) -> pd.DataFrame:
    rows = [{"scheme": "heterofl", "seed": s, "measured_seconds": t} for s, t in zip(range(5), structured)]
    rows += [{"scheme": "random_prune", "seed": s, "measured_seconds": t} for s, t in zip(range(5), mask)]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("structured,mask,sooner,verdict", [
    ([1, 2, 3, 4, 5], [2, 3, 4, 5, 6], 5, "faster"),  # sooner on all 5 seeds: p = 1/32
    ([1, 2, 3, 4, 5], [2, 3, 4, 5, math.inf], 5, "faster"),  # the mask never reaches it on one seed
    ([1, 2, 3, 4, math.inf], [2, 3, 4, 5, math.inf], 4, "not shown"),  # both never: a tie, against
    ([1, 2, 3, 4, 5], [2, 3, 4, 5, 5], 4, "not shown"),  # equal time: not strictly sooner
    ([1, 2, 3, 4, 7], [2, 3, 4, 5, 6], 4, "not shown"),  # one seed the other way
])
def test_the_registered_sign_rule(structured, mask, sooner, verdict):
    row = study.sign_rule(_times(structured, mask)).iloc[0]
    assert (row["structured"], row["mask"], row["seeds"]) == ("heterofl", "random_prune", 5)
    assert row["structured_sooner"] == sooner and row["verdict"] == verdict
    assert (row["p_one_sided"] == pytest.approx(1 / 32)) if verdict == "faster" else row["p_one_sided"] is None


def test_the_measured_clock_waits_for_the_slowest_client_at_its_simulated_speed():
    # 4 clients, speed tiers 1.0 / 0.5 on the seed's clients: a round lasts max_k seconds_k / speed_k
    cfg = {"data": {"clients": 4}, "seed": 231, "system": {"speed": "1.0:0.5,0.5:0.5", "capacity": ""}}
    _, speed = study.tiers_of(cfg)
    assert sorted(speed.tolist()) == [0.5, 0.5, 1.0, 1.0]
    secs = [[1.0, 2.0, 1.5, 1.2], [3.0, 1.0, 1.0, 1.0]]
    run = {"cfg": cfg, "rounds": [{"round": r + 1, "clients": [0, 1, 2, 3], "client_train_seconds": s} for r, s in enumerate(secs)]}
    clock = study.measured_clock(run)
    first = max(s / v for s, v in zip(secs[0], speed))
    assert clock == {0: 0.0, 1: pytest.approx(first), 2: pytest.approx(first + max(s / v for s, v in zip(secs[1], speed)))}


@pytest.mark.slow
def test_the_committed_tables_are_what_the_committed_runs_give(tmp_path):
    if not (FOLDER / "tier_speed.csv").is_file():
        pytest.fail("results/cpu-submodels/tier_speed.csv is not committed: run `make bench-cpu-submodels`")
    assert study.main(["--runs", str(FOLDER / "runs"), "--out", str(tmp_path)]) == 0
    for name in ("tier_speed.md", "time_to_fedavg.md", "curves.md", "communication.md", "time_rule.csv", "communication.csv"):
        assert (tmp_path / name).read_text() == (FOLDER / name).read_text(), name
