"""The rounds.jsonl row is declared once (benchmark/core/rounds.py): every driver's row holds the declared fields
in the declared order, then only the fields its driver, the life cycle or a mechanism is declared to add."""

from __future__ import annotations

import pytest

from dfbench.benchmark.core import rounds as R
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.engine import privacy
from dfbench.benchmark.engine.lifecycle import run
from helpers import tiny_config

EVAL = {"eval.samples": 4, "eval.grid": 2, "eval.sampler_steps": 2, "train.rounds": 2}
LIFE = ["gamma_star", "sim_seconds"]  # what the life cycle adds to every row
HIERARCHY = ["client_edges", "client_edge_rounds", "edge_weights", "edge_uplink_bits", "edge_downlink_bits"]


@pytest.mark.parametrize("over,added", [
    ({}, LIFE),
    ({"train.driver": "fedbuff"}, ["staleness", *LIFE]),
    ({"system.edges": 2}, [*HIERARCHY, *LIFE]),
    ({"privacy.clip": 1.0, "privacy.noise": 0.5}, [*privacy.ROUND_FIELDS, *LIFE]),
], ids=["flat", "fedbuff", "edges", "privacy"])
def test_every_driver_writes_the_declared_row(over, added, tmp_path, tiny_data):
    # execute
    d = run(tiny_config("fedavg", over={**EVAL, **over}), tmp_path, data=tiny_data, progress=False)
    rows = runfolder.read_rounds(d)
    # assert: the declared fields in their order, then what is declared to follow
    assert [r["round"] for r in rows] == [1, 2]
    for row in rows:
        assert list(row) == [*R.FIELDS, *added]
        assert all(k in R.ADDED for k in added if k not in privacy.ROUND_FIELDS)
        assert all(len(row[k]) == len(row["clients"]) for k in R.PER_CLIENT)


def test_a_field_no_one_declared_is_refused():
    row = R.RoundRow(round=1).as_dict()
    assert list(row) == list(R.FIELDS) and R.fill(row, late_clients=[2], staleness=[0])["late_clients"] == [2]
    with pytest.raises(KeyError, match="rounds.jsonl has no field late_client"):
        R.fill(row, late_client=[2])
    with pytest.raises(ValueError, match="would overwrite"):
        R.RoundRow(round=1).as_dict(loss=0.5)
    with pytest.raises(TypeError):
        R.RoundRow(round=1, client_image=3.0)  # type: ignore[call-arg]
