"""Every invalid value fails with one clear error (key + allowed values) before any work or folder."""

from __future__ import annotations

from typing import Any

import pytest

from dfbench.benchmark.grid import spec as S
from dfbench.benchmark.cli import main
from dfbench.benchmark.core.config import ConfigError
from dfbench.benchmark.engine.lifecycle import run
from helpers import tiny_config

# (method, method params, overrides, text the error must contain: the key and what is allowed)
INVALID: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    ("fedavg", {}, {"train.roundz": 3}, "unknown key 'train.roundz'; valid keys in 'train': train.rounds"),
    ("fedavg", {}, {"bogus": 1}, "unknown key 'bogus'; valid keys: "),
    ("fedavg", {}, {"train.rounds": "many"}, "invalid value for 'train.rounds': 'many'; expected int"),
    ("fedavg", {}, {"train.rounds": 2.5}, "invalid value for 'train.rounds': 2.5; expected int"),
    ("fedavg", {}, {"train.rounds": -1}, "'train.rounds': -1; allowed: an integer >= 0"),
    ("fedavg", {}, {"data.clients": 0}, "'data.clients': 0; allowed: an integer >= 1"),
    ("fedavg", {}, {"data.clients": 70000}, "'data.clients': 70000; allowed: at most"),
    ("fedavg", {}, {"train.lr": 0}, "'train.lr': 0.0; allowed: a finite number > 0"),
    ("fedavg", {}, {"train.lr": -0.1}, "'train.lr': -0.1; allowed: a finite number > 0"),
    ("fedavg", {}, {"data.partition": "dirichlet:0"}, "'data.partition': invalid partition spec 'dirichlet:0': ALPHA must be > 0"),
    ("fedavg", {}, {"data.partition": "dirichlet:-0.5"}, "ALPHA must be > 0; valid forms: 'iid'"),
    ("fedavg", {}, {"data.dataset": "mnist"}, "'data.dataset': 'mnist'; allowed: fmnist, svhn, cifar10"),
    ("nope", {}, {}, "unknown method 'nope'; registered methods: balanced_prune, experts, fedadagrad, fedadam, fedavg"),
    ("fedprox", {"mu_": 1}, {}, "unknown hyperparameter(s) method.mu_ for method 'fedprox'; valid: method.mu"),
    ("random_prune", {"keep_ratio": 0}, {}, "'method.keep_ratio' of 'random_prune': 0.0; allowed: a number in (0, 1]"),
    ("topk_prune", {"keep_ratio": 1.5}, {}, "'method.keep_ratio' of 'topk_prune': 1.5; allowed: a number in (0, 1]"),
    ("quantized", {"bits": 0}, {}, "'method.bits' of 'quantized': 0; allowed: an integer in 1..16"),
    ("quantized", {"bits": 17}, {}, "'method.bits' of 'quantized': 17; allowed: an integer in 1..16"),
]
IDS = [f"{m}-{next(iter({**p, **o}), 'name')}-{next(iter({**p, **o}.values()), m)}" for m, p, o, _ in INVALID]


@pytest.mark.parametrize("method,params,over,needle", INVALID, ids=IDS)
def test_invalid_value_is_one_clear_config_error(method, params, over, needle):
    with pytest.raises(ConfigError) as err:
        tiny_config(method, params, over)
    assert needle in str(err.value)


@pytest.mark.parametrize("method,params,over,needle", INVALID, ids=IDS)
def test_cli_run_refuses_invalid_values_before_any_folder(method, params, over, needle, tmp_path, capsys):
    out = tmp_path / "runs"
    sets = [f"--set=method.{k}={v}" for k, v in params.items()] + [f"--set={k}={v}" for k, v in over.items()]
    assert main(["run", "--method", method, "--out", str(out), "--no-progress", *sets]) == 2
    assert needle in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("method,params,over,needle", INVALID, ids=IDS)
def test_grid_refuses_invalid_values_before_any_folder(method, params, over, needle, tmp_path):
    from helpers import TINY

    spec = {"base": {**TINY, **over, **{f"method.{k}": v for k, v in params.items()}}, "axes": {"method": [method]}}
    with pytest.raises(ConfigError) as err:
        S.parse_grid(spec)
    msg = str(err.value)
    # the grid words unknown keys its own way (with suggestions); the key and the offence match
    assert needle.split(";")[0] in msg
    assert any(w in msg for w in ("allowed:", "valid keys", "valid:", "valid forms:", "registered methods:", "expected"))


def test_more_clients_than_loaded_samples_creates_no_run_folder(tmp_path, tiny_data):
    # 300 clients pass the static check (fmnist has 60000 samples) but not the 256 loaded here
    cfg = tiny_config(over={"data.clients": 300, "data.min_client_size": 1})
    with pytest.raises(ConfigError, match="'data.clients': 300; allowed: at most the 256 training samples"):
        run(cfg, tmp_path / "runs", data=tiny_data, progress=False)
    assert not (tmp_path / "runs").exists()


def test_rounds_zero_is_valid(tmp_path):
    assert tiny_config(over={"train.rounds": 0}).train.rounds == 0
