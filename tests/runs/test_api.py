"""The notebook API: dfbench.make_config / dfbench.run / dfbench.load_runs."""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import pytest

import dfbench
from dfbench.benchmark.engine import training
from dfbench.benchmark.engine import lifecycle
from dfbench.benchmark.cli import add_run_args, config_from_args
from dfbench.benchmark.core.config import ConfigError, config_hash
from helpers import TINY, fd, make_run, write_grid


def test_make_config_matches_the_cli(tmp_path: Path) -> None:
    # prepare: the same settings as `dfbench run --method fedprox --rounds 3 --lr 0.002 --set method.mu=0.1`
    parser = argparse.ArgumentParser()
    add_run_args(parser)
    args = parser.parse_args(["--method", "fedprox", "--rounds", "3", "--lr", "0.002", "--set", "method.mu=0.1"])
    # execute
    from_cli = config_from_args(args)
    from_api = dfbench.make_config(method="fedprox", rounds=3, lr=0.002, **{"method.mu": 0.1})
    # assert: one config, hence one run folder name
    assert from_api == from_cli
    assert config_hash(from_api) == config_hash(from_cli)
    assert from_api.method_params["mu"] == 0.1 and from_api.train.rounds == 3


def test_every_run_flag_gives_the_cli_config_and_the_flag_table_is_the_parser() -> None:
    # prepare: every `dfbench run` flag of the one table (run_flags.FLAG_KEYS) at a value that is not its default
    from dfbench.benchmark.core.config import RunConfig
    from dfbench.benchmark.run_flags import FLAG_KEYS

    parser = argparse.ArgumentParser()
    add_run_args(parser)
    defaults = parser.parse_args([])
    assert set(vars(defaults)) == set(FLAG_KEYS) | {"method", "overrides"}
    config = RunConfig().to_dict()
    for dest, key in FLAG_KEYS.items():  # a flag's default is the config's: make_config() starts from RunConfig()
        head, _, rest = key.partition(".")
        assert getattr(defaults, dest) == (config[head][rest] if rest else config[head]), dest
    values = {"dataset": "svhn", "clients": 6, "partition": "dirichlet:0.5", "data_root": "/tmp/data", "rounds": 2,
              "local_steps": 3, "batch_size": 16, "lr": 0.002, "eval_samples": 100, "sampler_steps": 5, "seed": 4,
              "device": "cuda:1"}
    assert set(values) == set(FLAG_KEYS)
    argv = [t for dest, v in values.items() for t in (f"--{dest.replace('_', '-')}", str(v))]
    # execute
    from_cli = config_from_args(parser.parse_args([*argv, "--method", "quantized", "--set", "method.bits=4"]))
    from_api = dfbench.make_config(method="quantized", **values, **{"method.bits": 4})
    # assert
    assert from_api == from_cli and from_api.to_dict() == from_cli.to_dict()
    assert dfbench.make_config() == config_from_args(defaults)


@pytest.mark.slow
def test_run_grid_from_python_selects_overrides_and_skips_done_cells(tmp_path: Path, tiny_data) -> None:
    # prepare: a grid of two seeds; `only` takes one, a plain keyword overrides its rounds
    path = write_grid(tmp_path / "g.toml", {**TINY, "train.rounds": 2}, {"seed": [0, 1]})
    out = tmp_path / "runs"
    # execute
    summary = dfbench.run_grid(path, out=out, only="*/1", rounds=1, data=tiny_data)
    # assert: one cell, run with the override, done; a rerun skips it
    assert summary.ok and [o.cell.cfg.seed for o in summary.outcomes] == [1]
    assert [(o.ran, o.after) for o in summary.outcomes] == [(True, "done")]
    assert summary.outcomes[0].cell.cfg == dfbench.make_config(**TINY, rounds=1, seed=1)
    assert summary.text().startswith("grid t: 1 cell(s) selected, 1 run now; 1 done")
    again = dfbench.run_grid(str(path), out=out, only=["*/1"], rounds=1, data=tiny_data)
    assert [(o.ran, o.after) for o in again.outcomes] == [(False, "done")]


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"roundz": 1}, "roundz"),
    ({"train.roundz": 1}, "train.roundz"),
    ({"rounds": -1}, "train.rounds"),
    ({"workers": 0}, "'--workers': 0"),
    ({"workers": 2, "shard": "0/2"}, "--workers shares the cells"),
    ({"shard": "2/2"}, "'--shard'"),
])
def test_run_grid_refuses_bad_settings_before_any_work(tmp_path: Path, kwargs: dict, named: str) -> None:
    path = write_grid(tmp_path / "g.toml", TINY, {"seed": [0]})
    with pytest.raises(ConfigError, match=re.escape(named)):
        dfbench.run_grid(path, out=tmp_path / "runs", **kwargs)
    assert not (tmp_path / "runs").exists()


def test_make_config_from_a_config_switches_method_and_keeps_the_rest() -> None:
    base = dfbench.make_config(rounds=4, **{"train.objective": "fm", "method.keep_ratio": 0.5}, method="random_prune")
    other = dfbench.make_config(base, method="fedprox", **{"method.mu": 0.01})
    assert other.method == "fedprox" and dict(other.method_params)["mu"] == 0.01
    assert "keep_ratio" not in other.method_params  # the old method's hyperparameters are dropped
    assert other.train.rounds == 4 and other.train.objective == "fm"
    assert dfbench.make_config(base, seed=3).seed == 3 and dfbench.make_config(base, seed=3).method == "random_prune"


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"roundz": 2}, "roundz"),  # not a flag, not dotted
        ({"train.roundz": 2}, "train.roundz"),  # unknown dotted key
        ({"rounds": -1}, "train.rounds"),  # bad value
        ({"method": "fedprox", "method.mu": "lots"}, "method.mu"),  # bad hyperparameter value
        ({"method": "fedavg", "method.mu": 0.1}, "method.mu"),  # hyperparameter of another method
        ({"method": "nope"}, "nope"),  # unknown method
    ],
)
def test_bad_settings_raise_config_error_naming_the_key(tmp_path: Path, settings: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        dfbench.make_config(**settings)
    # run() checks before it writes anything
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        dfbench.run(out=tmp_path / "runs", **settings)
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_run_returns_the_folder_and_a_rerun_skips_training(tmp_path: Path, tiny_data, monkeypatch) -> None:
    # prepare
    settings = {**TINY, "method": "fedavg", "seed": 1}
    # execute
    folder = dfbench.run(out=tmp_path / "runs", data=tiny_data, **settings)
    # assert: the folder the config names, finished
    cfg = dfbench.make_config(**settings)
    assert folder.is_dir() and folder.parent == tmp_path / "runs" / "fmnist" / "iid" / "fedavg"
    assert folder.name.endswith(config_hash(cfg)[: len(folder.name.split("-")[-1])])
    assert json.loads((folder / "status.json").read_text())["state"] == "done"
    metrics_before = (folder / "metrics.json").read_bytes()

    # execute: the same call again must not train (local training would raise here)
    def no_training(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(training, "local_train", no_training)
    again = dfbench.run(out=tmp_path / "runs", data=tiny_data, **settings)
    # assert
    assert again == folder
    assert (folder / "metrics.json").read_bytes() == metrics_before

    # a finished run without scores (eval.metrics=none) is one row with no metric
    frame = dfbench.load_runs(tmp_path / "runs")
    assert len(frame) == 1
    row = frame.iloc[0]
    assert row["run_id"] == folder.name and row["method"] == "fedavg" and row["seed"] == 1
    assert isinstance(row["metric"], float) and math.isnan(row["metric"])
    assert row["cfg.rounds"] == TINY["train.rounds"] and row["cfg.local_steps"] == TINY["train.local_steps"]
    assert row["cfg.clients"] == TINY["data.clients"]


def test_load_runs_one_row_per_evaluation_with_config_columns(tmp_path: Path) -> None:
    # prepare: run folders as the loop writes them (two scores in one run, one failed run)
    root = tmp_path / "runs"
    make_run(root, "a", seed=0, evaluations=[fd(12.5), {"metric": "kid", "value": 0.01, "std_err": 0.002}])
    make_run(root, "b", method="random_prune", params={"keep_ratio": 0.5}, seed=1, evaluations=[fd(20.0)])
    make_run(root, "c", state="failed", error="boom")
    # execute
    frame = dfbench.load_runs(root)
    # assert: 2 + 1 evaluations; the failed run is not a row
    assert len(frame) == 3
    assert sorted(zip(frame["run_id"], frame["metric"], frame["value"])) == [
        ("a", "fd_fmnist", 12.5), ("a", "kid", 0.01), ("b", "fd_fmnist", 20.0)]
    kid = frame[frame["metric"] == "kid"].iloc[0]
    assert kid["std_err"] == 0.002
    pruned = frame[frame["run_id"] == "b"].iloc[0]
    assert pruned["method"] == "random_prune" and pruned["param.keep_ratio"] == 0.5 and pruned["seed"] == 1
    assert pruned["extractor"] == "fmnist_cnn" and pruned["num_samples"] == 1000
    assert {"cfg.rounds", "cfg.clients", "cfg.lr", "dataset", "partition", "uplink_mb"} <= set(frame.columns)
    assert (frame["cfg.rounds"] == 3).all()
    # the wide per-metric columns of the reporter's run table are replaced by the long rows
    assert "fd_fmnist" not in frame.columns and "kid__stderr" not in frame.columns


def test_load_runs_on_an_empty_root_and_a_missing_one(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    frame = dfbench.load_runs(tmp_path / "empty")
    assert frame.empty and {"run_id", "method", "metric", "value"} <= set(frame.columns)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        dfbench.load_runs(tmp_path / "missing")


def test_run_refuses_a_device_this_machine_lacks_before_any_work(tmp_path: Path, monkeypatch) -> None:
    # before: CUDA failed deep inside the run ("Found no NVIDIA driver"), after the data had loaded
    def no_work(*a, **kw):
        raise AssertionError("the run started")

    monkeypatch.setattr(lifecycle, "run", no_work)
    with pytest.raises(ConfigError, match=r"device 'cuda:99' is not available on this machine .*device='cpu'"):
        dfbench.run(out=tmp_path, rounds=1, device="cuda:99")
    assert not any(tmp_path.iterdir())  # nothing written
