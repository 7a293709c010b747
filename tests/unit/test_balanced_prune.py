"""balanced_prune: windows of one shared permutation per round and tensor, laid end to end, so every
entry is covered floor(K/n) or ceil(K/n) times (Gamma* as high as the keep ratios allow) while each
client's mask stays a uniform subset of random_prune's size (the same w^2)."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch

from dfbench import methods
from dfbench.benchmark.core.seeds import torch_gen
from dfbench.benchmark.engine import lifecycle
from dfbench.benchmark.engine.context import build_context, sample_round_clients
from dfbench.benchmark.engine.model import Layout
from dfbench.methods.balanced_prune import balanced_mask, round_clients, round_roster, window_starts
from dfbench.methods.pruning import SEED_BITS, keep_count, prunable_tensors
from helpers import final_params, tiny_config

ONE = Layout(names=("w.weight",), shapes=((2, 4),), offsets=(0,), total=8)  # one prunable tensor of n = 8
# a.weight [2,3] (prunable), a.bias [3] (kept), b.weight [5,2] (prunable): 19 entries
TWO = Layout(names=("a.weight", "a.bias", "b.weight"), shapes=((2, 3), (3,), (5, 2)), offsets=(0, 6, 9), total=19)


def masks_of_round(layout: Layout, keeps: list[float], gen_of: Callable[[], torch.Generator]) -> torch.Tensor:
    """[J, P] masks of every roster position, each from the round's generator in its fresh state."""
    prunable = prunable_tensors(layout, False)
    return torch.stack([balanced_mask(layout, keeps, j, prunable, gen_of()) for j in range(len(keeps))])


# -- hand-computed ---------------------------------------------------------------------------

def test_n8_four_clients_keep_half_hand_computed():
    # prepare: the permutation torch draws from a generator seeded 0 (randperm(8)) is [4, 0, 7, 3, 2, 5, 1, 6]
    assert torch.randperm(8, generator=torch.Generator().manual_seed(0)).tolist() == [4, 0, 7, 3, 2, 5, 1, 6]
    # windows of keep_count(8, 0.5) = 4 laid end to end: starts 0, 4, 8 = 0, 12 = 4
    assert window_starts([4, 4, 4, 4], 8) == [0, 4, 0, 4]
    # execute
    masks = masks_of_round(ONE, [0.5] * 4, lambda: torch.Generator().manual_seed(0))
    # assert: positions 0 and 2 keep pi[0:4] = {4, 0, 7, 3}; positions 1 and 3 keep pi[4:8] = {2, 5, 1, 6}
    first, second = [1, 0, 0, 1, 1, 0, 0, 1], [0, 1, 1, 0, 0, 1, 1, 0]
    assert masks.tolist() == [first, second, first, second]
    assert masks.sum(0).tolist() == [2] * 8  # every entry trained by exactly q * J = 2 clients


def test_unequal_keeps_end_to_end_covers_evenly_where_spread_starts_do_not():
    # keeps 0.9, 0.1, 0.9, 0.1 on n = 10: windows of 9, 1, 9, 1 (K = 20) end to end start at 0, 9, 0, 9
    counts = [keep_count(10, q) for q in (0.9, 0.1, 0.9, 0.1)]
    assert counts == [9, 1, 9, 1] and window_starts(counts, 10) == [0, 9, 0, 9]
    layout = Layout(names=("w.weight",), shapes=((10, 1),), offsets=(0,), total=10)
    masks = masks_of_round(layout, [0.9, 0.1, 0.9, 0.1], lambda: torch_gen(3, "balanced_mask", 1))
    assert masks.sum(1).tolist() == [9, 1, 9, 1]
    assert masks.sum(0).tolist() == [2] * 10  # K / n = 2 everywhere
    # the evenly spread starts floor(j n / J) = 0, 2, 5, 7 would leave entries at positions 4 and 9 covered once
    cover = np.zeros(10, dtype=int)
    for start, k in zip([0, 2, 5, 7], counts):
        cover[(start + np.arange(k)) % 10] += 1
    assert cover.min() == 1 and sorted(np.flatnonzero(cover == 1).tolist()) == [4, 9]


def test_coverage_is_floor_or_ceil_of_k_over_n_for_any_keeps():
    g = np.random.default_rng(0)
    for trial in range(50):
        keeps = [float(x) for x in g.choice([0.1, 0.25, 0.3, 0.5, 0.75, 0.9], size=int(g.integers(1, 7)))]
        masks = masks_of_round(TWO, keeps, lambda: torch_gen(trial, "balanced_mask", 1))
        for sl in (slice(0, 6), slice(9, 19)):
            n = sl.stop - sl.start
            K = sum(keep_count(n, q) for q in keeps)
            cover = masks[:, sl].sum(0)
            assert int(cover.min()) == K // n and int(cover.max()) == math.ceil(K / n), (keeps, cover.tolist())
        assert masks[:, 6:9].eq(1).all()  # biases are not pruned


# -- each mask marginally random_prune's -------------------------------------------------------

def test_each_position_keeps_every_entry_with_frequency_keep_and_uniform_subsets():
    # prepare: 3000 rounds of n = 6, keeps 0.5, 0.5, 0.3, 0.7 (windows 3, 3, 2, 4 of 6: K = 12)
    layout = Layout(names=("w.weight",), shapes=((6, 1),), offsets=(0,), total=6)
    keeps, rounds = [0.5, 0.5, 0.3, 0.7], 3000
    freq = torch.zeros(len(keeps), 6)
    subsets: Counter = Counter()
    # execute
    for r in range(rounds):
        masks = masks_of_round(layout, keeps, lambda: torch_gen(0, "balanced_mask", r))
        assert masks.sum(0).tolist() == [2] * 6  # exact coverage every round
        freq += masks
        subsets[tuple(masks[1].tolist())] += 1
    # assert: entry i kept at position j with frequency k_j / n (5.5 binomial sd: fails for a biased window)
    want = torch.tensor([keep_count(6, q) / 6 for q in keeps])[:, None]
    sd = torch.sqrt(want * (1 - want) / rounds)
    assert ((freq / rounds - want).abs() <= 5.5 * sd).all(), freq / rounds
    # position 1's mask is a uniform 3-subset of 6: all 20 appear, chi-square (19 df) below its 0.9999 quantile
    assert len(subsets) == math.comb(6, 3)
    expected = rounds / math.comb(6, 3)
    assert sum((c - expected) ** 2 / expected for c in subsets.values()) < 50.0


# -- through the method -------------------------------------------------------------------------

def test_same_keep_counts_as_random_prune_exact_coverage_and_seeded(tiny_data):
    ctx = build_context(tiny_config("balanced_prune"), data=tiny_data)
    bal, rnd = methods.create_method("balanced_prune", keep_ratio=0.5), methods.create_method("random_prune", keep_ratio=0.5)
    state = methods.ServerState(params=ctx.init_params.clone())
    prunable = torch.cat([torch.full((n,), p) for n, p in zip(ctx.layout.numels, prunable_tensors(ctx.layout, False))])
    by_round = {}
    for r in (1, 2):
        c = ctx.at_round(r)
        plans = [bal.client_view(state, k, c) for k in range(4)]
        # the same sub-model size as random_prune (same w^2 in expectation), per client
        assert [p.trained_params for p in plans] == [rnd.client_view(state, k, c).trained_params for k in range(4)]
        cover = torch.stack([p.step.mask for p in plans]).sum(0)
        assert cover[~prunable].eq(4).all()
        # every prunable tensor: keep_count(n, 0.5) = ceil(n / 2), so 2 or 3 clients per entry, never fewer
        assert int(cover[prunable].min()) == 2 and int(cover[prunable].max()) <= 3
        assert torch.equal(bal.client_view(state, 2, c).step.mask, plans[2].step.mask)  # rebuilt from the seed
        by_round[r] = plans
    assert not torch.equal(by_round[1][0].step.mask, by_round[2][0].step.mask)  # fresh per round


def test_capacity_tiers_give_random_prune_sizes_and_floor_coverage(tiny_data):
    ctx = build_context(tiny_config("balanced_prune", over={"system.capacity": "0.75:0.5,0.25:0.5"}), data=tiny_data).at_round(1)
    bal, rnd = methods.create_method("balanced_prune"), methods.create_method("random_prune")
    state = methods.ServerState(params=ctx.init_params.clone())
    plans = [bal.client_view(state, k, ctx) for k in range(4)]
    assert [p.trained_params for p in plans] == [rnd.client_view(state, k, ctx).trained_params for k in range(4)]
    masks = torch.stack([p.step.mask for p in plans])
    for (_, sl, _), p in zip(ctx.layout.slices(), prunable_tensors(ctx.layout, False)):
        if p:
            n = sl.stop - sl.start
            K = sum(keep_count(n, float(q)) for q in ctx.capacity)
            assert int(masks[:, sl].sum(0).min()) == K // n  # 2 x 0.75 + 2 x 0.25: about 2 clients per entry


def test_bits_uplink_as_random_prune_downlink_adds_each_tensors_window_start(tiny_data):
    ctx = build_context(tiny_config("balanced_prune"), data=tiny_data).at_round(1)
    bal, rnd = methods.create_method("balanced_prune"), methods.create_method("random_prune")
    state = methods.ServerState(params=ctx.init_params.clone())
    pb, pr = bal.client_view(state, 1, ctx), rnd.client_view(state, 1, ctx)
    tensors = sum(prunable_tensors(ctx.layout, False))
    assert pb.downlink_bits == 32 * pb.trained_params + SEED_BITS + 32 * tensors
    assert pb.downlink_bits - pr.downlink_bits == 32 * tensors  # equal keep counts
    up_b = bal.upload(pb.start, pb, 1, state, ctx).uplink_bits
    assert up_b == 32 * pb.trained_params + SEED_BITS == rnd.upload(pr.start, pr, 1, state, ctx).uplink_bits


@pytest.mark.parametrize("participation,sampling", [(1.0, "fixed"), (0.5, "fixed"), (0.3, "fixed"), (0.5, "poisson")])
def test_round_clients_are_the_rounds_sample_before_dropout(tiny_data, participation, sampling):
    for seed in range(3):
        cfg = tiny_config("balanced_prune", over={"data.clients": 10, "seed": seed, "system.participation": participation,
                                                  "system.sampling": sampling, "system.dropout": 0.3})
        ctx = build_context(cfg, data=tiny_data)
        for r in range(1, 6):
            kept, dropped = sample_round_clients(10, participation, 0.3, seed, r, sampling)
            assert round_clients(ctx.at_round(r)) == sorted(kept + dropped)
            roster = round_roster(ctx.at_round(r))
            assert sorted(roster) == sorted(kept + dropped) and roster == round_roster(ctx.at_round(r))


def test_partial_participation_lays_the_windows_over_the_sampled_clients(tiny_data):
    # 2 of 4 clients at keep 0.5: their masks split every even-sized tensor in two (each entry trained once)
    ctx = build_context(tiny_config("balanced_prune", over={"system.participation": 0.5}), data=tiny_data).at_round(1)
    sampled = round_clients(ctx)
    assert len(sampled) == 2
    m = methods.create_method("balanced_prune")
    state = methods.ServerState(params=ctx.init_params.clone())
    a, b = (m.client_view(state, k, ctx).step.mask for k in sampled)
    for (_, sl, _), p in zip(ctx.layout.slices(), prunable_tensors(ctx.layout, False)):
        if p and (sl.stop - sl.start) % 2 == 0:
            assert torch.equal(a[sl] + b[sl], torch.ones_like(a[sl]))
    outsider = next(k for k in range(4) if k not in sampled)
    with pytest.raises(RuntimeError, match="not among the clients the round sampled"):
        m.client_view(state, outsider, ctx)


# -- Gamma* in the round's row, and keep 1.0 ----------------------------------------------------

def test_gamma_of_balanced_is_at_least_randoms_and_a_dropout_leaves_its_window_short(tiny_data):
    gammas = {}
    for name in ("balanced_prune", "random_prune"):
        ctx = build_context(tiny_config(name), data=tiny_data)
        method = methods.create_method(name, keep_ratio=0.5)
        state = method.init_state(ctx.init_params, ctx)
        gammas[name] = []
        for r in (1, 2):
            state, row = lifecycle.train_round(method, state, ctx, r)
            gammas[name].append(row["gamma"])
    assert gammas["balanced_prune"] == [2, 2]  # q J = 2, the most these keep ratios allow
    assert all(b >= r for b, r in zip(gammas["balanced_prune"], gammas["random_prune"]))
    # seed 0, dropout 0.3: round 1 samples all 4 clients and client 0 drops out (pinned below); its window
    # was assigned, so the entries only it and one other client held are trained once
    assert sample_round_clients(4, 1.0, 0.3, 0, 1) == ([1, 2, 3], [0])
    ctx = build_context(tiny_config("balanced_prune", over={"system.dropout": 0.3}), data=tiny_data)
    method = methods.create_method("balanced_prune", keep_ratio=0.5)
    _, row = lifecycle.train_round(method, method.init_state(ctx.init_params, ctx), ctx, 1)
    assert row["dropped_clients"] == [0] and row["clients"] == [1, 2, 3] and row["gamma"] == 1


def _rows(d: Path) -> list[dict]:
    return [json.loads(x) for x in (d / "rounds.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_keep_ratio_one_equals_fedavg_bitwise(tmp_path, tiny_data):
    base = lifecycle.run(tiny_config("fedavg"), tmp_path / "a", data=tiny_data, progress=False)
    bal = lifecycle.run(tiny_config("balanced_prune", {"keep_ratio": 1.0}), tmp_path / "b", data=tiny_data, progress=False)
    assert torch.equal(final_params(base), final_params(bal))
    with np.load(base / "samples.npz") as a, np.load(bal / "samples.npz") as b:
        assert np.array_equal(a["images"], b["images"])
    for ra, rb in zip(_rows(base), _rows(bal)):
        assert (ra["uplink_bits"], ra["downlink_bits"], ra["client_loss"]) == (rb["uplink_bits"], rb["downlink_bits"], rb["client_loss"])
        assert rb["gamma"] == 4 and rb["w2"] == 0.0


def test_it_shares_random_prunes_family_and_inference_default():
    cls = methods.get_method_class("balanced_prune")
    assert methods.method_families()["random_prune"] == ["balanced_prune", "random_prune"]
    assert cls.Config().inference == methods.get_method_class("random_prune").Config().inference == "scaled"
