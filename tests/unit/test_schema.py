"""The declared experiment schema (benchmark/core/schema.py): one declaration of a config field is all the
run id, the report's grouping, a setting's name and the drift reference's pairing need.

A dummy field is added to the train section by one `declare(...)` (a subclass of TrainConfig put in
config.SECTIONS, the hook the schema walks), and every consumer follows from it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from dfbench.benchmark.core import config as C
from dfbench.benchmark.core.schema import SCHEMA_VERSION, declare
from dfbench.benchmark.engine.resolve import apply_overrides, config_from_dict, resolve
from dfbench.benchmark.metrics import drift

DEFAULT_ID = "s0-207c7bc670"  # RunConfig()'s run id (pinned in tests/results/test_run_ids.py)


def _with_dummy(monkeypatch, **declaration) -> type:
    """TrainConfig plus `dummy: float = 0.0`, declared as given, installed as the train section."""
    train = dataclasses.make_dataclass("TrainConfig", [("dummy", float, declare(0.0, **declaration))],
                                       bases=(C.TrainConfig,), frozen=True)
    monkeypatch.setitem(C.SECTIONS, "train", train)
    return train


def _cfg(train: type, dummy: float, seed: int = 0) -> C.RunConfig:
    return resolve(C.RunConfig(seed=seed, train=train(dummy=dummy)))


LATER = {"since": SCHEMA_VERSION + 1, "neutral": 0.0, "label": "dmy"}


def test_a_later_result_field_moves_the_id_only_off_its_neutral_value(monkeypatch):
    train = _with_dummy(monkeypatch, **LATER)
    assert _cfg(train, 0.0).run_id() == DEFAULT_ID  # every run made before the field keeps its id
    assert _cfg(train, 0.5).run_id() != DEFAULT_ID
    assert _cfg(train, 0.5).run_id() == _cfg(train, 0.5).run_id() != _cfg(train, 0.25).run_id()
    # a stored config without the field reads back at the neutral value, with the same id
    stored = resolve(C.RunConfig()).record()
    assert "dummy" not in stored["train"]
    back = config_from_dict(stored)
    assert back.train.dummy == 0.0 and back.run_id() == DEFAULT_ID
    assert "train.dummy" in C.later_fields() and "train.dummy" not in C.execution_keys()


def test_an_execution_field_never_moves_the_id(monkeypatch):
    train = _with_dummy(monkeypatch, role="execution")
    assert _cfg(train, 0.0).run_id() == _cfg(train, 0.5).run_id() == DEFAULT_ID
    assert "train.dummy" in C.execution_keys()


def test_an_inactive_field_never_moves_the_id(monkeypatch):
    train = _with_dummy(monkeypatch, **LATER, active=lambda get: get("train.driver") != "sync")
    assert _cfg(train, 0.5).run_id() == DEFAULT_ID  # synchronous rounds: the field changes nothing
    fedbuff = apply_overrides(_cfg(train, 0.0), {"train.driver": "fedbuff"})
    assert apply_overrides(fedbuff, {"train.dummy": 0.5}).run_id() != fedbuff.run_id()


def test_a_result_field_added_later_must_say_its_neutral_value():
    with pytest.raises(ValueError, match="neutral"):
        declare(0.0, since=SCHEMA_VERSION + 1)


def test_config_json_records_the_schema_version_outside_the_id():
    record = resolve(C.RunConfig()).record()
    assert record["schema"] == SCHEMA_VERSION and record["run_id"] == DEFAULT_ID
    assert config_from_dict(record).run_id() == DEFAULT_ID


def _write_run(root: Path, record: dict, value: float) -> Path:
    d = root / "fmnist" / "iid" / "fedavg" / record["run_id"]
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(record))
    (d / "status.json").write_text(json.dumps({"state": "done"}))
    (d / "metrics.json").write_text(json.dumps({"evaluations": [{"metric": "fd_fmnist", "value": value}], "rounds": 10}))
    return d


def _report(tmp_path: Path, train: type, cells: list[tuple[float, int]]):
    """One run per (dummy, seed), and seed 2 written before the field (or any later field) existed."""
    from dfbench.benchmark.report.frames import collect

    records = [_cfg(train, dummy, seed).record() for dummy, seed in cells]
    old = C.RunConfig(seed=2).to_dict()
    old.pop("privacy")  # as config.json read before the later fields
    del old["train"]["lr_decay"]
    old["train"]["amp"] = "off"  # what a run wrote before train.amp=auto (a config.json holds the resolved choice)
    records.append({"run_id": "s2-before", **old})
    for i, rec in enumerate(records):
        _write_run(tmp_path, rec, 100.0 + i)
    return records, collect(tmp_path)


def test_grouping_names_and_drift_pairing_follow_a_result_field(tmp_path, monkeypatch):
    train = _with_dummy(monkeypatch, **LATER)
    records, data = _report(tmp_path, train, [(0.5, 0), (0.5, 1), (0.0, 0), (0.0, 1)])
    # grouping: the field separates settings; at its neutral value (or absent) it does not
    assert len(data.table) == 2 and sorted(data.table["n"]) == [2, 3]
    # the setting's name names the field by its declared label, off the block's usual value only
    from dfbench.benchmark.report.frames import curve_labels

    names = curve_labels(data.runs)
    assert names[records[0]["run_id"]] == "fedavg (dmy=0.5)"
    assert names[records[2]["run_id"]] == names["s2-before"] == "fedavg"
    # drift: a run pairs with a reference only where the field agrees (absent = neutral)
    assert drift._budget(records[0]) != drift._budget(records[2])
    assert drift._budget(records[2] | {"seed": 2}) == drift._budget({k: v for k, v in records[4].items()})


def test_grouping_and_drift_ignore_an_execution_field(tmp_path, monkeypatch):
    train = _with_dummy(monkeypatch, role="execution")
    records, data = _report(tmp_path, train, [(0.5, 0), (0.0, 1)])
    assert len(data.table) == 1 and int(data.table["n"].iloc[0]) == 3  # seeds 0, 1, 2: one setting
    assert not any(c.endswith("dummy") for c in data.table.columns)  # nor a leaderboard column
    assert drift._budget(records[0] | {"seed": 1}) == drift._budget(records[1])


def test_only_a_resolved_config_has_a_run_id_and_resolving_fills_in_the_methods_hyperparameters():
    from dfbench import methods

    raw = C.RunConfig(method="fedprox")  # core checks its own fields; the method's are resolve.py's
    assert not raw.resolved and dict(raw.method_params) == {}
    with pytest.raises(C.ConfigError, match="not resolved.*resolve"):
        raw.run_id()
    cfg = resolve(raw)
    assert cfg.resolved and dict(cfg.method_params) == dataclasses.asdict(methods.method_config("fedprox", {}))
    assert cfg.run_id() == apply_overrides(C.RunConfig(), {"method": "fedprox"}).run_id() == resolve(cfg).run_id()
    assert dataclasses.replace(cfg, seed=1).resolved  # the same method: its hyperparameters still hold
    assert not dataclasses.replace(cfg, method="fedavg").resolved  # another method: resolved anew
    with pytest.raises(C.ConfigError, match="unknown hyperparameter"):
        resolve(C.RunConfig(method="fedprox", method_params={"mu_": 1}))
