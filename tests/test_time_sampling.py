"""Flow matching's logit-normal training times (Esser et al. 2024): the draw, the config, the run id."""

from __future__ import annotations

import pytest
import torch

from dfbench.benchmark.core.config import ConfigError, apply_overrides
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


def test_uniform_stays_the_default_and_keeps_run_ids():
    cfg = tiny_config(over={"train.objective": "fm"})
    same = apply_overrides(cfg, {"train.time_sampling": "uniform"})
    other = apply_overrides(cfg, {"train.time_sampling": "logit_normal"})
    assert cfg.train.time_sampling == "uniform" and same.run_id() == cfg.run_id() != other.run_id()
    assert torch.equal(FlowMatching().draw((4, 1), torch.Generator().manual_seed(1), "cpu")[0],
                       torch.rand((4,), generator=torch.Generator().manual_seed(1)))


def test_logit_normal_is_refused_for_ddpm_and_unknown_names():
    with pytest.raises(ConfigError, match=r"train\.time_sampling.*flow matching"):
        tiny_config(over={"train.objective": "ddpm", "train.time_sampling": "logit_normal"})
    with pytest.raises(ConfigError, match=r"train\.time_sampling.*uniform, logit_normal"):
        tiny_config(over={"train.objective": "fm", "train.time_sampling": "beta"})


def test_a_run_trains_with_logit_normal_times(tiny_data, tmp_path):
    from dfbench.benchmark.engine.lifecycle import run

    from helpers import final_params

    a = run(tiny_config(over={"train.objective": "fm", "train.time_sampling": "logit_normal"}), tmp_path, progress=False, data=tiny_data)
    b = run(tiny_config(over={"train.objective": "fm"}), tmp_path, progress=False, data=tiny_data)
    assert a != b and torch.isfinite(final_params(a)).all() and not torch.equal(final_params(a), final_params(b))
