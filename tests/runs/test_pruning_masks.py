"""results/paper-fmnist/pruning_masks.py: which weights a pruning run ever trained, read from its folder.

Its premise is that a weight no client trained keeps its initial value bit for bit, and one
that any client trained moves. Checked on tiny runs against masks rebuilt here: a one-round
top-k run trains exactly the top-k mask of the initial model; random masks over clients x
rounds leave a weight untrained with probability (1 - keep)^(clients x rounds).
"""

from __future__ import annotations


import pytest
import torch

from dfbench import datasets
from dfbench.benchmark.engine import lifecycle
from dfbench.benchmark.engine.context import build_context
from dfbench.methods.pruning import magnitude_mask, prunable_tensors
from helpers import load_script, final_params, tiny_config

pytestmark = pytest.mark.slow  # whole pruning runs



def _script():
    return load_script("results/paper-fmnist/pruning_masks.py")


@pytest.fixture
def synthetic(monkeypatch, tiny_data):
    monkeypatch.setattr(datasets, "load", lambda name, split="train", root=None, **kw: tiny_data)
    return tiny_data


def _prunable(ctx) -> torch.Tensor:
    out = torch.zeros(ctx.layout.total, dtype=torch.bool)
    for (_, sl, _), p in zip(ctx.layout.slices(), prunable_tensors(ctx.layout, False)):
        out[sl] = p
    return out


def test_one_round_of_topk_trains_exactly_the_initial_top_k_mask(tmp_path, synthetic):
    cfg = tiny_config("topk_prune", {"keep_ratio": 0.5}, {"train.rounds": 1})
    d = lifecycle.run(cfg, tmp_path / "runs", data=synthetic, progress=False)
    ctx = build_context(cfg)
    prunable = _prunable(ctx)
    init_mask = magnitude_mask(ctx.init_params, ctx.layout, 0.5, prunable_tensors(ctx.layout, False)).bool()
    moved = final_params(d) != ctx.init_params
    assert not (moved & prunable & ~init_mask).any()  # nothing outside the round's mask moved
    assert (moved & init_mask & prunable).sum() >= 0.99 * (init_mask & prunable).sum()  # (nearly) all of it did

    row = _script().trained_shares(d)
    assert row["trained"] == pytest.approx(float((moved & prunable).sum() / prunable.sum()))
    assert row["trained"] == pytest.approx(0.5, abs=0.01)
    assert row["outside"] == pytest.approx(0.5, abs=0.01)  # the final model's own top-k mask keeps half


def test_random_masks_leave_a_weight_untrained_with_the_expected_probability(tmp_path, synthetic):
    cfg = tiny_config("random_prune", {"keep_ratio": 0.5}, {"train.rounds": 2})  # 4 clients x 2 rounds
    d = lifecycle.run(cfg, tmp_path / "runs", data=synthetic, progress=False)
    row = _script().trained_shares(d)
    assert row["trained"] == pytest.approx(1 - 0.5 ** 8, abs=0.01)
    assert 0.0 < row["untrained_norm"] < 0.2


def test_the_table_covers_the_pruning_runs_of_a_root_and_refuses_an_empty_one(tmp_path, synthetic, capsys):
    for method in ("topk_prune", "fedavg"):
        lifecycle.run(tiny_config(method, {"keep_ratio": 0.5} if method != "fedavg" else {}), tmp_path / "runs",
                      data=synthetic, progress=False)
    script = _script()
    assert script.main([str(tmp_path / "runs"), "--out", str(tmp_path / "rows.csv")]) == 0
    rows = (tmp_path / "rows.csv").read_text().splitlines()
    assert len(rows) == 2 and rows[1].startswith("topk_prune,0.5,")  # header + the one pruning run
    assert script.main([str(tmp_path / "nothing")]) == 2
    assert "no finished random_prune / topk_prune run" in capsys.readouterr().err
