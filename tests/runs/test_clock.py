"""The simulated clock (benchmark/engine/clock.py): client and round seconds, the deadline, speeds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dfbench.benchmark.core.config import ConfigError, RunConfig, config_hash
from dfbench.benchmark.core.parsing import parse_speed
from dfbench.benchmark.engine.clock import Clock, assign_speeds
from dfbench.benchmark.engine.context import assign_tiers
from dfbench.benchmark.engine.lifecycle import run
from dfbench.benchmark.engine.resolve import config_from_dict
from dfbench.benchmark.engine.model import flatten_
from helpers import final_params, tiny_config


def _rows(d: Path) -> list[dict]:
    return [json.loads(line) for line in (d / "rounds.jsonl").read_text().splitlines()]


def test_three_clients_by_hand():
    # speeds 1, 0.5, 0.25; 100 images/s at speed 1; downlink 2 Mbit/s, uplink 1 Mbit/s
    clock = Clock(speed=np.array([1.0, 0.5, 0.25]), compute_rate=100.0, uplink_mbps=1.0, downlink_mbps=2.0, deadline=0.0)
    # 10 steps x batch 8 = 80 images: 0.8 / 1.6 / 3.2 s of compute; 2e6 bits down = 1 s; 1e6 bits up = 1 s
    secs = [clock.with_upload(clock.before_upload(k, 10, 8, 1.0, 2e6), 1e6) for k in range(3)]
    assert secs == pytest.approx([2.8, 3.6, 5.2])
    assert clock.round_seconds(secs, any_late=False) == pytest.approx(5.2)  # waits for the slowest
    # a sub-model with half the FLOPs computes in half the time
    assert clock.compute_seconds(2, 10, 8, 0.5) == pytest.approx(1.6)
    # deadline 4 s: client 2 is late (after 5.2 s), the round lasts the deadline
    timed = Clock(speed=clock.speed, compute_rate=100.0, uplink_mbps=1.0, downlink_mbps=2.0, deadline=4.0)
    assert [timed.late(s) for s in secs] == [False, False, True]
    assert timed.round_seconds(secs[:2], any_late=True) == 4.0
    # links at 0 Mbit/s are instantaneous
    free = Clock(speed=clock.speed, compute_rate=100.0, uplink_mbps=0.0, downlink_mbps=0.0, deadline=0.0)
    assert free.with_upload(free.before_upload(1, 10, 8, 1.0, 2e6), 1e6) == pytest.approx(1.6)


def test_speed_tiers_follow_the_capacity_tiers_and_lognormal_is_seeded():
    for seed in range(4):
        speed = assign_speeds(10, "1.0:0.5,0.25:0.5", seed)
        keep = assign_tiers(10, "1.0:0.5,0.25:0.5", seed)
        assert np.array_equal(speed == 0.25, keep == 0.25) and (speed == 0.25).sum() == 5  # a slow client is a small one
    a, b = assign_speeds(50, "lognormal:0.5", 3), assign_speeds(50, "lognormal:0.5", 3)
    assert np.array_equal(a, b) and (a > 0).all() and not np.array_equal(a, assign_speeds(50, "lognormal:0.5", 4))
    assert np.median(np.log(assign_speeds(4000, "lognormal:0.5", 0))) == pytest.approx(0.0, abs=0.05)
    assert np.log(assign_speeds(4000, "lognormal:0.5", 0)).std() == pytest.approx(0.5, rel=0.05)
    assert np.array_equal(assign_speeds(3, "", 0), np.ones(3))


@pytest.mark.parametrize("key,value,match", [
    ("system.speed", "fast", "SPEED:FRACTION"),
    ("system.speed", "1.0:0.5,0.0:0.5", "values > 0"),
    ("system.speed", "1.0:0.5,0.5:0.2", "sum to 1"),
    ("system.speed", "lognormal:-1", "SIGMA >= 0"),
    ("system.compute_rate", 0.0, "images per second"),
    ("system.deadline", -1.0, ">= 0"),
    ("system.uplink_mbps", float("inf"), ">= 0"),
])
def test_bad_clock_settings_are_refused_before_any_work(key, value, match):
    with pytest.raises(ConfigError, match=match):
        tiny_config(over={key: value})


def test_clock_fields_at_their_defaults_keep_every_run_id():
    cfg = tiny_config()
    assert config_hash(cfg) == config_hash(config_from_dict({k: v for k, v in cfg.to_dict().items()}))
    d = cfg.to_dict()
    for key in ("speed", "compute_rate", "uplink_mbps", "downlink_mbps", "deadline"):
        d["system"].pop(key)
    assert config_hash(config_from_dict(d)) == config_hash(cfg)  # a config written before the clock
    assert config_hash(tiny_config(over={"system.speed": "1.0:0.5,0.25:0.5"})) != config_hash(cfg)


SLOW = {"data.clients": 4, "system.speed": "1.0:0.5,0.25:0.5", "train.rounds": 2, "train.local_steps": 2,
        "train.batch_size": 8, "system.compute_rate": 16.0, "system.uplink_mbps": 8.0, "system.downlink_mbps": 16.0}


def test_a_run_records_the_hand_computed_round_times(tmp_path, tiny_data):
    cfg = tiny_config(over=SLOW)
    d = run(cfg, tmp_path, data=tiny_data, progress=False)
    rows = _rows(d)
    speed = assign_speeds(4, SLOW["system.speed"], cfg.seed)
    model = __import__("dfbench.benchmark.engine.model", fromlist=["build_model"]).build_model("tiny", 1)
    bits = 32 * flatten_(model)[0].numel()  # FedAvg: every float both ways
    # client k: bits / 16e6 down + 2 steps x 8 images / (16 images/s x speed) + bits / 8e6 up
    want = [bits / 16e6 + 16 / (16.0 * speed[k]) + bits / 8e6 for k in range(4)]
    for r in rows:
        assert r["client_seconds"] == pytest.approx([want[k] for k in r["clients"]], rel=1e-6)
        assert r["round_seconds"] == pytest.approx(max(want), rel=1e-6) and r["late_clients"] == []
        assert r["client_images"] == pytest.approx(4 * 16)
    assert rows[-1]["sim_seconds"] == pytest.approx(2 * max(want), rel=1e-6)
    metrics = json.loads((d / "metrics.json").read_text())
    assert metrics["sim_seconds"] == pytest.approx(2 * max(want), rel=1e-6) and metrics["client_images"] == pytest.approx(128)


@pytest.mark.slow
def test_the_deadline_drops_the_slow_tier_and_a_loose_one_changes_nothing(tmp_path, tiny_data):
    base = run(tiny_config(over=SLOW), tmp_path / "base", data=tiny_data, progress=False)
    fast_secs = min(_rows(base)[0]["client_seconds"])
    slow_secs = max(_rows(base)[0]["client_seconds"])
    loose = run(tiny_config(over={**SLOW, "system.deadline": slow_secs * 1.01}), tmp_path / "loose", data=tiny_data, progress=False)
    assert torch.equal(final_params(loose), final_params(base))  # nobody is late: the same training, bitwise
    tight = run(tiny_config(over={**SLOW, "system.deadline": (fast_secs + slow_secs) / 2}), tmp_path / "tight", data=tiny_data,
                progress=False)
    slow = sorted(int(k) for k in np.flatnonzero(assign_speeds(4, SLOW["system.speed"], 0) < 1))
    for r in _rows(tight):
        assert r["late_clients"] == slow and sorted(r["clients"]) == sorted(set(range(4)) - set(slow))
        assert r["round_seconds"] == pytest.approx((fast_secs + slow_secs) / 2)
        assert r["client_images"] == pytest.approx(2 * 16)  # the late clients' work is not counted
    assert not torch.equal(final_params(tight), final_params(base))


def test_a_client_late_only_because_of_its_upload_is_trained_and_dropped(tmp_path, tiny_data, monkeypatch):
    from dfbench.benchmark.engine import training

    trained = []
    real = training.local_train
    monkeypatch.setattr(training, "local_train", lambda *a, **kw: trained.append(1) or real(*a, **kw))
    base = run(tiny_config(over={**SLOW, "train.rounds": 1}), tmp_path / "base", data=tiny_data, progress=False)
    n = len(trained)
    row = _rows(base)[0]
    slow_secs = max(row["client_seconds"])
    model = __import__("dfbench.benchmark.engine.model", fromlist=["build_model"]).build_model("tiny", 1)
    up = 32 * flatten_(model)[0].numel() / 8e6
    # a deadline between "slow client before its upload" and "after": it trains, then misses
    d = run(tiny_config(over={**SLOW, "train.rounds": 1, "system.deadline": slow_secs - up / 2}), tmp_path / "late", data=tiny_data,
            progress=False)
    assert len(trained) == 2 * n  # every client trained in both runs
    assert _rows(d)[0]["late_clients"] == sorted(int(k) for k in np.flatnonzero(assign_speeds(4, SLOW["system.speed"], 0) < 1))


def test_parse_speed_kinds():
    assert parse_speed("") == ("none", None)
    assert parse_speed("lognormal:0.25") == ("lognormal", 0.25)
    assert parse_speed("2.0:0.5,0.5:0.5") == ("tiers", [(2.0, 0.5), (0.5, 0.5)])
