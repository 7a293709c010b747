"""FedBuff, the asynchronous driver (benchmark/engine/asynchronous.py): bitwise a synchronous round
when nothing is stale, staleness from versions with the stated weight, resume mid-flight, refusals."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from dfbench.benchmark.core import runfolder
from dfbench.benchmark.core.config import ConfigError, config_hash
from dfbench.benchmark.engine.resolve import resolve
from dfbench.benchmark.engine.asynchronous import staleness_weight
from dfbench.benchmark.engine.lifecycle import run
from helpers import final_params, run_then_sigkill, tiny_config

pytestmark = pytest.mark.slow  # whole asynchronous runs, one killed and resumed

TESTS = Path(__file__).parents[1]  # tests/, where helpers.py is
ROOT = TESTS.parent
FEDBUFF = {"train.driver": "fedbuff"}


def _rows(d: Path) -> list[dict]:
    return runfolder.read_rounds(d)


@pytest.mark.parametrize("method,params", [("fedavg", {}), ("random_prune", {"keep_ratio": 0.5}),
                                           ("quantized", {"bits": 4, "error_feedback": True}), ("fedavgm", {})])
def test_equal_speeds_and_k_equal_c_equal_every_client_is_a_synchronous_round_bitwise(method, params, tmp_path, tiny_data):
    over = {"train.rounds": 3}
    sync = run(tiny_config(method, params, over), tmp_path / "sync", data=tiny_data, progress=False)
    buff = run(tiny_config(method, params, {**over, **FEDBUFF}), tmp_path / "buff", data=tiny_data, progress=False)
    assert torch.equal(final_params(buff), final_params(sync))
    for a, b in zip(_rows(sync), _rows(buff)):
        assert a["clients"] == b["clients"] and a["client_loss"] == b["client_loss"] and a["uplink_bits"] == b["uplink_bits"]
        assert b["staleness"] == [0] * len(b["clients"])
        assert b["round_seconds"] == pytest.approx(a["round_seconds"])  # every client reports at the slowest one's time
    assert config_hash(tiny_config(method, params, over)) != config_hash(tiny_config(method, params, {**over, **FEDBUFF}))


# two clients, the second 4x slower; one report per server step: the fast client reports at
# t = a, 2a, 3a, 4a (versions 1..4 it starts from 0, 1, 2, 3); the slow one started from version
# 0 and reports at 4a, before the fast one's 4th report (the earlier start wins the tie), when
# the server is at version 3: staleness 3, weight (1 + 3)^-0.5 = 0.5
STALE = {**FEDBUFF, "data.clients": 2, "train.concurrency": 2, "train.buffer": 1, "train.rounds": 4, "checkpoint_every": 1,
         "system.speed": "1.0:0.5,0.25:0.5"}


def test_staleness_is_counted_in_versions_and_weights_the_update(tmp_path, tiny_data):
    assert staleness_weight(3, 0.5) == 0.5 and staleness_weight(0, 0.5) == 1.0 and staleness_weight(5, 0.0) == 1.0
    poly = run(tiny_config(over=STALE), tmp_path / "poly", data=tiny_data, progress=False)
    const = run(tiny_config(over={**STALE, "train.staleness": "constant"}), tmp_path / "const", data=tiny_data, progress=False)
    rows = _rows(poly)
    slow = [r for r in rows if r["staleness"] != [0]]
    assert [r["round"] for r in slow] == [4] and slow[0]["staleness"] == [3]
    assert [r["sim_seconds"] for r in rows] == pytest.approx([rows[0]["sim_seconds"] * k for k in (1, 2, 3, 4)])
    # steps 1-3 are the same fresh updates in both runs; step 4 adds 0.5 x the constant-weight delta
    ck = lambda d, r: torch.load(d / "checkpoints" / f"ckpt-{r:06d}.pt", weights_only=True)["params"].double()  # noqa: E731
    assert torch.equal(ck(poly, 3), ck(const, 3))
    assert torch.allclose(ck(poly, 4) - ck(poly, 3), 0.5 * (ck(const, 4) - ck(const, 3)), atol=1e-6)
    assert not torch.equal(ck(poly, 4), ck(const, 4))




def test_sigkill_mid_flight_and_resume_gives_the_same_final_model(tmp_path, tiny_data):
    over = {**STALE, "train.rounds": 5, "checkpoint_every": 2}
    cfg = tiny_config(over=over)
    ref = run(cfg, tmp_path / "ref", data=tiny_data, progress=False)
    out = tmp_path / "killed"
    proc = run_then_sigkill(out, over, 3)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    d = runfolder.run_dir(out, cfg)
    ck = runfolder.load_checkpoint(d)
    assert ck["round"] == 2 and len(ck["driver"]["in_flight"]) == 2  # the slow client is mid-flight at the checkpoint
    run(cfg, out, data=tiny_data, progress=False)
    assert torch.equal(final_params(d), final_params(ref))
    strip = lambda rows: [runfolder.without_wall_clock(r) for r in rows]  # noqa: E731
    assert strip(_rows(d)) == strip(_rows(ref))


@pytest.mark.parametrize("method,over,match", [
    ("scaffold", {}, "cannot run with train.driver=fedbuff.*control variate"),
    ("experts", {}, "cannot run with train.driver=fedbuff"),
    ("fedavg", {"system.participation": 0.5}, "system.participation"),
    ("fedavg", {"system.dropout": 0.1}, "system.dropout"),
    ("fedavg", {"system.deadline": 3.0}, "system.deadline"),
    ("fedavg", {"train.clients_mode": "batched"}, "train.clients_mode"),
    ("fedavg", {"train.concurrency": 2, "train.buffer": 3}, "train.buffer"),
    ("fedavg", {"train.concurrency": 9}, "train.concurrency"),
    ("fedavg", {"train.staleness": "exp:1"}, "train.staleness"),
])
def test_what_fedbuff_cannot_run_is_refused_before_any_data_is_loaded(method, over, match, monkeypatch):
    from dfbench import datasets

    monkeypatch.setattr(datasets, "load", lambda *a, **k: pytest.fail("data was loaded"))
    with pytest.raises(ConfigError, match=match):
        tiny_config(method, None, {**FEDBUFF, **over})


def test_fedbuff_under_several_ranks_is_refused():
    with pytest.raises(ConfigError, match="one process"):
        resolve(tiny_config(over=FEDBUFF), 2)


def test_a_steps_wall_time_counts_every_client_it_trains(tmp_path, tiny_data, monkeypatch):
    # a run's summed wall_seconds must hold the time of every local training it started (the refill after a
    # step's aggregation had been timed outside the step: with K=1 and C=2, 2 of the 5 jobs were counted)
    import time as _time

    from dfbench.benchmark.engine import asynchronous

    spent: list[float] = []
    real = asynchronous.local_train

    def timed_train(*args, **kwargs):
        t0 = _time.perf_counter()
        _time.sleep(0.02)
        out = real(*args, **kwargs)
        spent.append(_time.perf_counter() - t0)
        return out

    monkeypatch.setattr(asynchronous, "local_train", timed_train)
    d = run(tiny_config(over={**STALE, "system.speed": "1.0:1.0"}), tmp_path / "w", data=tiny_data, progress=False)
    wall = sum(r["wall_seconds"] for r in _rows(d))
    assert len(spent) >= 5 and wall >= sum(spent) - 1e-3 * len(_rows(d)), (len(spent), wall, sum(spent))
