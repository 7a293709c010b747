"""train.lr_decay: the clients' learning rate over rounds, and the run ids it must not move."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math

import pytest
import torch

from dfbench.benchmark.engine import lifecycle
from dfbench.benchmark.engine import training
from dfbench.benchmark.core.config import ConfigError, TrainConfig, config_hash, execution_keys, later_fields, round_lr
from dfbench.benchmark.engine.context import build_context
from dfbench.benchmark.core.seeds import torch_gen
from helpers import final_params, local_train_kw, tiny_config


def test_cosine_decay_matches_hand_computed_values():
    t = TrainConfig(rounds=4, lr=0.01, lr_decay="cosine")
    # (1 + cos(pi * (r - 1) / 4)) / 2 for r = 1..4: 1, (1 + 1/sqrt(2)) / 2, 1/2, (1 - 1/sqrt(2)) / 2
    want = [0.01, 0.01 * (1 + 2 ** -0.5) / 2, 0.005, 0.01 * (1 - 2 ** -0.5) / 2]
    got = [round_lr(t, r) for r in range(1, 5)]
    assert got == pytest.approx(want, rel=1e-12)
    assert all(g > 0 for g in got)  # the last round still trains


def test_no_decay_is_constant():
    t = TrainConfig(rounds=5, lr=0.003)
    assert [round_lr(t, r) for r in range(1, 6)] == [0.003] * 5


def test_unknown_decay_is_refused_before_any_work():
    with pytest.raises(ConfigError, match="'train.lr_decay': 'step'; allowed: none, cosine"):
        tiny_config(over={"train.lr_decay": "step"})  # from --set / a grid
    cfg = tiny_config()
    with pytest.raises(ConfigError, match="'train.lr_decay': 'step'; allowed: none, cosine"):  # built in Python
        dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, lr_decay="step"))


def test_default_decay_leaves_run_ids_unchanged():
    # the hash of a config without the field (as every run made before it) equals today's
    cfg = tiny_config()
    d = cfg.to_dict()
    for key in execution_keys():
        head, _, rest = key.partition(".")
        (d[head] if rest else d).pop(rest or head, None)
    for key in later_fields():  # lr_decay, and every field added after it at its neutral value
        head, _, rest = key.partition(".")
        del d[head][rest]
        if not d[head]:  # a section added later (privacy): absent altogether before it
            del d[head]
    legacy = hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:10]
    assert config_hash(cfg) == legacy
    assert config_hash(tiny_config(over={"train.lr_decay": "cosine"})) != legacy


def test_loop_trains_each_round_at_its_decayed_rate(tmp_path, tiny_data, monkeypatch):
    seen: list[float] = []
    real = training.local_train

    def spy(*args, **kwargs):
        seen.append(args[7].lr)  # the StepSettings of the round
        return real(*args, **kwargs)

    monkeypatch.setattr(training, "local_train", spy)
    cfg = tiny_config(over={"data.clients": 1, "train.rounds": 3, "train.lr": 0.004, "train.lr_decay": "cosine"})
    lifecycle.run(cfg, tmp_path, data=tiny_data, progress=False)
    want = [0.004 * (1 + math.cos(math.pi * r / 3)) / 2 for r in range(3)]
    assert seen == pytest.approx(want, rel=1e-12)


def test_decayed_round_equals_plain_training_at_that_rate(tmp_path, tiny_data):
    # two rounds, one client: round 2 continues from round 1 at lr * (1 + cos(pi / 2)) / 2 = lr / 2
    cfg = tiny_config(over={"data.clients": 1, "train.rounds": 2, "train.local_steps": 3, "train.lr_decay": "cosine"})
    d = lifecycle.run(cfg, tmp_path, data=tiny_data, progress=False)
    ctx = build_context(cfg, data=tiny_data)
    obj = ctx.get_objective(None)
    params = ctx.init_params
    for r, lr in ((1, cfg.train.lr), (2, cfg.train.lr / 2)):
        params = local_train_kw(ctx.model, ctx.flat, params, ctx.images, ctx.client_indices[0], obj, steps=3,
                             batch_size=cfg.train.batch_size, lr=lr, gen=torch_gen(cfg.seed, "client", r, 0),
                             grad_clip=cfg.train.grad_clip, probe_steps=cfg.train.sigma1_probe_steps).params.clone()
    assert torch.equal(final_params(d), params)
