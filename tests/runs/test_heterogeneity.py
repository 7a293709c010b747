"""System heterogeneity: participation, dropout, stragglers and capacity tiers, as rounds.jsonl shows them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dfbench.benchmark.core.config import ConfigError
from dfbench.benchmark.engine.context import assign_local_steps, assign_tiers, sample_round_clients
from dfbench.benchmark.engine.lifecycle import run
from helpers import tiny_config

OVER = {"data.clients": 8, "data.min_client_size": 4, "train.rounds": 4, "train.local_steps": 4,
        "system.participation": 0.5, "system.dropout": 0.3, "system.stragglers": 0.5, "system.straggler_steps": 0.5}


def _rows(d):
    return [json.loads(x) for x in (d / "rounds.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_participation_dropout_and_stragglers_show_up_in_rounds_jsonl(tmp_path, tiny_data):
    # execute
    d = run(tiny_config(over=OVER), tmp_path / "a", data=tiny_data, progress=False)
    rows = _rows(d)
    # assert: each round sampled round(0.5 * 8) = 4 clients, split into trained and dropped
    stragglers = set(np.flatnonzero(assign_local_steps(8, 4, 0.5, 0.5, 0) < 4).tolist())
    assert len(stragglers) == 4
    for row in rows:
        assert len(row["clients"]) + len(row["dropped_clients"]) == 4
        assert not set(row["clients"]) & set(row["dropped_clients"])
        # stragglers run ceil(0.5 * 4) = 2 steps, the others 4
        assert row["steps"] == [2 if k in stragglers else 4 for k in row["clients"]]
        assert row["gamma"] == len(row["clients"])
    assert sum(len(r["dropped_clients"]) for r in rows) > 0, "dropout 0.3 over 16 draws dropped nobody"
    assert len({tuple(r["clients"] + r["dropped_clients"]) for r in rows}) > 1, "participation never varied"
    # same seed, same rounds; another seed, other clients
    again = _rows(run(tiny_config(over=OVER), tmp_path / "b", data=tiny_data, progress=False))
    assert [(r["clients"], r["dropped_clients"], r["steps"]) for r in again] == [(r["clients"], r["dropped_clients"], r["steps"]) for r in rows]
    other = _rows(run(tiny_config(over={**OVER, "seed": 1}), tmp_path / "c", data=tiny_data, progress=False))
    assert [r["clients"] for r in other] != [r["clients"] for r in rows]


def test_round_sampling_depends_only_on_seed_and_round():
    a = sample_round_clients(100, 0.1, 0.2, seed=3, round_=7)
    assert a == sample_round_clients(100, 0.1, 0.2, seed=3, round_=7)
    assert a != sample_round_clients(100, 0.1, 0.2, seed=3, round_=8)
    sampled = a[0] + a[1]
    assert len(sampled) == 10 and len(set(sampled)) == 10


def test_capacity_tiers_give_exact_counts_and_a_seeded_order():
    keeps = assign_tiers(10, "1.0:0.5,0.5:0.3,0.25:0.2", seed=0)
    assert sorted(keeps.tolist()) == [0.25] * 2 + [0.5] * 3 + [1.0] * 5
    assert np.array_equal(keeps, assign_tiers(10, "1.0:0.5,0.5:0.3,0.25:0.2", seed=0))
    assert any(not np.array_equal(keeps, assign_tiers(10, "1.0:0.5,0.5:0.3,0.25:0.2", seed=s)) for s in range(1, 5))
    assert assign_tiers(10, "", seed=0) is None


@pytest.mark.parametrize("key,value,needle", [
    ("system.participation", 0.0, "system.participation"),
    ("system.dropout", 1.0, "system.dropout"),
    ("system.stragglers", 1.5, "system.stragglers"),
    ("system.capacity", "1.0:0.6,0.5:0.6", "sum to 1"),
    ("system.capacity", "fast", "KEEP:FRACTION"),
])
def test_bad_system_settings_are_refused_with_the_key(key, value, needle):
    with pytest.raises(ConfigError, match=needle):
        tiny_config(over={key: value})
