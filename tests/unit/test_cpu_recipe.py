"""results/cpu-recipe/cpu_recipe.py (quality per CPU-second) and the determinism of the bf16 path on a CPU."""

from __future__ import annotations

import argparse
import json

import torch

from helpers import load_script, local_train_kw



def _script():
    return load_script("results/cpu-recipe/cpu_recipe.py")


def test_bf16_local_training_is_deterministic_run_to_run(tiny_data, monkeypatch):
    """Two identical bf16 local trainings give the same parameters bitwise (emulated here when the CPU
    has no native bfloat16: the same kernels either way)."""
    from dfbench.benchmark.core.config import RunConfig
    from dfbench.benchmark.engine.resolve import apply_overrides
    from dfbench.benchmark.engine.context import build_context
    from dfbench.benchmark.core.seeds import torch_gen

    monkeypatch.setenv("DFBENCH_CPU_BF16", "emulate")
    cfg = apply_overrides(RunConfig(), {"data.clients": 2, "data.min_client_size": 4, "train.model": "small28",
                                        "train.amp": "bf16", "eval.metrics": "none"})
    ctx = build_context(cfg, data=tiny_data)
    runs = [local_train_kw(ctx.model, ctx.flat, ctx.init_params, ctx.images, ctx.client_indices[0], ctx.get_objective("fm"),
                           steps=2, batch_size=4, lr=1e-3, amp="bf16", gen=torch_gen(0, "bf16-repeat")).params
            for _ in range(2)]
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], ctx.init_params)


def test_the_grid_gives_every_candidate_the_same_budget_and_names_its_runs(tmp_path):
    mod = _script()
    speed = {"machine": "test CPU", "torch": torch.__version__,
             "candidates": {name: {"images_per_s": 100.0 * (2 if name == "tiny" else 1)} for name in mod.CANDIDATES}}
    (tmp_path / "speed.json").write_text(json.dumps(speed))
    mod.cmd_grid(argparse.Namespace(out=tmp_path, budget=240.0, seeds=[7, 8]))
    from dfbench.benchmark.grid.spec import load_grid

    cells = load_grid(tmp_path / "cpu-recipe.toml").cells
    names = json.loads((tmp_path / "candidates.json").read_text())
    assert len(cells) == 2 * len(mod.CANDIDATES) + 2 and set(names.values()) == {*mod.CANDIDATES, "untrained"}
    for c in cells:
        name = names[c.cfg.run_id()]
        if name == "untrained":
            assert c.cfg.train.rounds == 0
            continue
        t = c.cfg.train
        # rounds = budget x images/s / (clients x steps x batch), rounded: the same training time for every candidate
        images = speed["candidates"][name]["images_per_s"] * 240.0
        assert t.rounds == max(1, round(images / (c.cfg.data.clients * t.local_steps * t.batch_size)))
        assert c.cfg.seed in (7, 8) and c.cfg.method == "fedavg"
        for key, value in mod.CANDIDATES[name][1].items():
            sec, _, field = key.partition(".")
            assert getattr(getattr(c.cfg, sec), field) == value
    base = next(c for c in cells if names[c.cfg.run_id()] == "baseline")
    assert (base.cfg.train.rounds, base.cfg.train.batch_size) == (round(24000 / (4 * 30 * 32)), 32)
