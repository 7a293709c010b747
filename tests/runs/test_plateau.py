"""The plateau rule (benchmark/engine/plateau.py): checks at doublings of rounds on the EMA model, a stop at the
first doubling that improves the plateau metric by less than the tolerance, the cap otherwise, both recorded;
the checked value is the exact error of the checkpointed EMA model; a stopped run does not train on when resumed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dfbench import datasets
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.core.config import ConfigError, RunConfig
from dfbench.benchmark.engine import plateau
from dfbench.benchmark.engine.lifecycle import run
from dfbench.benchmark.engine.resolve import apply_overrides
from dfbench.benchmark.metrics import exact

SPEC = "gmm:dim2?n=1000&test=200&k=3"
BASE = {"method": "fedavg", "data.dataset": SPEC, "data.clients": 2, "train.model": "mlp-tiny", "train.local_steps": 5,
        "train.batch_size": 32, "train.objective": "fm", "train.ema": 0.5, "eval.samples": 64, "eval.grid": 4,
        "eval.sampler_steps": 4, "train.plateau_start": 2, "train.lr": 3e-3}


def _cfg(**over) -> RunConfig:
    return apply_overrides(RunConfig(), {**BASE, **over})


def _metrics(d: Path) -> dict:
    return json.loads((d / "metrics.json").read_text())


def test_checks_are_at_doublings_up_to_the_cap_and_the_rule_compares_the_last_two():
    assert plateau.check_rounds(4, 40) == [4, 8, 16, 32] and plateau.check_rounds(3, 3) == [3]
    checks = [{"round": 2, "value": 10.0}, {"round": 4, "value": 9.6}]
    assert plateau.improvement(10.0, 9.6) == pytest.approx(0.04)
    assert plateau.should_stop(checks, 0.05) and not plateau.should_stop(checks, 0.03)
    assert not plateau.should_stop(checks[:1], 0.5)  # one check says nothing about a doubling
    assert plateau.metric_name(SPEC) == "score_kl" and plateau.metric_name("fmnist") == "denoise_loss"


def test_the_rule_needs_an_ema_and_a_first_check_within_the_cap():
    with pytest.raises(ConfigError, match="train.ema"):
        _cfg(**{"train.plateau": 0.05, "train.ema": 0.0, "train.rounds": 8})
    with pytest.raises(ConfigError, match="train.plateau_start"):
        _cfg(**{"train.plateau": 0.05, "train.rounds": 1})
    with pytest.raises(ConfigError, match="train.plateau"):
        _cfg(**{"train.plateau": 1.5, "train.rounds": 8})
    # off, the rule's knobs are not part of the run
    assert _cfg(**{"train.rounds": 8}).run_id() == _cfg(**{"train.rounds": 8, "train.plateau_start": 4}).run_id()


@pytest.mark.slow
def test_a_run_stops_at_the_first_small_doubling_and_records_it(tmp_path):
    # prepare: a tolerance no doubling can beat (90 %): the rule must stop at the second check (round 4)
    cfg = _cfg(**{"train.plateau": 0.9, "train.rounds": 64})
    # execute
    d = run(cfg, tmp_path, progress=False)
    # assert: trained 4 rounds of the 64 allowed, and says so
    m = _metrics(d)
    p = m["plateau"]
    assert m["rounds"] == p["rounds"] == 4 and p["reached"] is True and p["cap"] == 64
    assert [c["round"] for c in p["checks"]] == [2, 4] and p["last_improvement"] < 0.9
    assert len(runfolder.read_rounds(d)) == 4
    # the checked value is the exact score error of the EMA model the checkpoint holds (recomputed independently)
    ck = runfolder.load_checkpoint(d)
    from dfbench import methods
    from dfbench.benchmark.engine.context import build_context

    ctx = build_context(cfg)
    velocity = methods.create_method("fedavg").velocity(ck["ema"], ctx)
    again = exact.score_error(velocity, datasets.mixture(SPEC), ctx.image_shape)["score_kl"]
    assert again == pytest.approx(p["checks"][-1]["value"], rel=1e-9)
    # the evaluation scored the same (EMA) model: its score_kl is the last check's
    scores = {r["metric"]: r["value"] for r in m["evaluations"]}
    assert scores["score_kl"] == pytest.approx(p["checks"][-1]["value"], rel=1e-9)
    # resumed (as after a kill between the stop and the evaluation), it does not train on
    runfolder.write_status(d, runfolder.FAILED, error="simulated")
    run(cfg, tmp_path, progress=False)
    assert len(runfolder.read_rounds(d)) == 4 and _metrics(d)["rounds"] == 4


@pytest.mark.slow
def test_the_cap_comes_first_when_training_still_improves_and_the_improvement_is_recorded(tmp_path):
    # prepare: a tolerance of 0: every doubling improves by more, so the cap (8 rounds) ends the run
    d = run(_cfg(**{"train.plateau": 1e-12, "train.rounds": 8}), tmp_path, progress=False)
    # assert
    p = _metrics(d)["plateau"]
    assert p["reached"] is False and p["rounds"] == 8 and [c["round"] for c in p["checks"]] == [2, 4, 8]
    first, *_, last = [c["value"] for c in p["checks"]]
    assert last < first and p["last_improvement"] == pytest.approx(plateau.improvement(*[c["value"] for c in p["checks"][-2:]]))


def test_a_method_sampled_only_after_its_last_round_refuses_the_rule_up_front():
    # an expert mixture's router is trained after the last round: the rule could not score it between rounds
    with pytest.raises(ConfigError, match="cannot train to the plateau"):
        _cfg(**{"method": "experts", "train.plateau": 0.05, "train.rounds": 8})
    assert _cfg(**{"method": "experts", "train.rounds": 8}).train.plateau == 0.0
