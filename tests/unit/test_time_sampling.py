"""Flow matching's logit-normal training times (Esser et al. 2024): the draw, the config, the run id."""

from __future__ import annotations

import pytest
import torch

from dfbench.benchmark.core.config import ConfigError, RunConfig, config_hash, time_sampling_for
from dfbench.benchmark.engine.resolve import apply_overrides, config_from_dict
from dfbench.benchmark.engine.diffusion import FlowMatching
from helpers import tiny_config


def test_logit_normal_times_are_the_sigmoid_of_the_generators_normals():
    t, eps = FlowMatching("logit_normal").draw((5, 1, 2, 2), torch.Generator().manual_seed(3), "cpu")
    g = torch.Generator().manual_seed(3)
    n = torch.randn((5,), generator=g)
    assert torch.equal(t, torch.sigmoid(n))
    assert torch.equal(eps, torch.randn((5, 1, 2, 2), generator=g))  # the noise follows, from the same generator


def test_logit_normal_puts_more_mass_mid_path_than_uniform():
    g = torch.Generator().manual_seed(0)
    t, _ = FlowMatching("logit_normal").draw((200_000, 1), g, "cpu")
    mid = ((t > 0.25) & (t < 0.75)).double().mean().item()
    # P(|n| < logit(0.75)) for n ~ N(0, 1): erf(log(3) / sqrt(2)) = 0.72806 (uniform: 0.5)
    assert mid == pytest.approx(0.72806, abs=0.005)
    assert 0.0 < float(t.min()) and float(t.max()) < 1.0


def test_auto_is_the_default_and_is_logit_normal_for_flow_matching_only():
    fm = tiny_config(over={"train.objective": "fm"})
    ddpm = tiny_config(over={"train.objective": "ddpm"})
    assert fm.train.time_sampling == ddpm.train.time_sampling == "auto"
    assert time_sampling_for(fm.train, "fm") == "logit_normal" and time_sampling_for(fm.train, "ddpm") == "uniform"
    # DDPM draws its steps uniformly; so do the fm experts of a ddpm run under auto (they did before auto)
    assert time_sampling_for(ddpm.train, "ddpm") == time_sampling_for(ddpm.train, "fm") == "uniform"
    pinned = apply_overrides(fm, {"train.time_sampling": "uniform"})
    assert time_sampling_for(pinned.train, "fm") == "uniform"
    # the id names what trains: auto is the same run as the value it resolves to
    assert fm.run_id() == apply_overrides(fm, {"train.time_sampling": "logit_normal"}).run_id() != pinned.run_id()
    assert ddpm.run_id() == apply_overrides(ddpm, {"train.time_sampling": "uniform"}).run_id()
    assert torch.equal(FlowMatching().draw((4, 1), torch.Generator().manual_seed(1), "cpu")[0],
                       torch.rand((4,), generator=torch.Generator().manual_seed(1)))


def test_a_stored_config_from_before_the_field_keeps_its_uniform_times_and_its_run_id():
    pinned = tiny_config(over={"train.objective": "fm", "train.time_sampling": "uniform"})
    stored = pinned.to_dict()
    del stored["train"]["time_sampling"]  # a config.json written before the field existed
    from dfbench.benchmark.core.config import later_fields

    for key in list(later_fields())[2:]:  # ... and before every field added after it (the clock, curves, the driver)
        head, _, rest = key.partition(".")
        del stored[head][rest]
        if not stored[head]:  # a section added later (privacy): absent altogether before it
            del stored[head]
    old = config_from_dict(stored)
    assert old.train.time_sampling == "uniform" and old.run_id() == pinned.run_id()
    # uniform is left out of the hash, so that id is the one published before the field
    assert config_hash(pinned) == _hash_without(stored)


def _hash_without(d: dict) -> str:
    import hashlib
    import json

    from dfbench.benchmark.core.config import execution_keys

    d = json.loads(json.dumps(d, default=str))
    for key in execution_keys():
        head, _, rest = key.partition(".")
        (d[head] if rest else d).pop(rest or head, None)
    if d["train"].get("lr_decay") == "none":
        d["train"].pop("lr_decay")
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:10]


def test_logit_normal_is_refused_for_ddpm_and_unknown_names():
    with pytest.raises(ConfigError, match=r"train\.time_sampling.*flow matching"):
        tiny_config(over={"train.objective": "ddpm", "train.time_sampling": "logit_normal"})
    with pytest.raises(ConfigError, match=r"train\.time_sampling.*uniform, logit_normal"):
        tiny_config(over={"train.objective": "fm", "train.time_sampling": "beta"})


@pytest.mark.slow
def test_a_run_trains_with_logit_normal_times(tiny_data, tmp_path):
    from dfbench.benchmark.engine.lifecycle import run

    from helpers import final_params

    a = run(tiny_config(over={"train.objective": "fm", "train.time_sampling": "logit_normal"}), tmp_path / "a", progress=False, data=tiny_data)
    b = run(tiny_config(over={"train.objective": "fm", "train.time_sampling": "uniform"}), tmp_path / "a", progress=False, data=tiny_data)
    assert a != b and torch.isfinite(final_params(a)).all() and not torch.equal(final_params(a), final_params(b))
    auto = run(tiny_config(over={"train.objective": "fm"}), tmp_path / "auto", progress=False, data=tiny_data)  # the default
    assert auto.name == a.name and torch.equal(final_params(auto), final_params(a))
