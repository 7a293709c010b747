"""Balanced-coverage random masks: random pruning whose masks, within a round, cover every weight evenly.

Qiao et al., "How Distributed Collaboration Influences the Diffusion Model Training?" (ICML 2025),
bound the training error of pruned sub-model FL by two mask terms: w^2, how much of the model each
client prunes, and Gamma*, the least number of clients that trained any one parameter in a round
(the error grows as Gamma* falls; a parameter no client trained, Gamma* = 0, is the worst case).
`random_prune` draws each client's mask independently, so at keep 0.5 with 4 clients an entry is
skipped by all of them with probability 1/16 and a layer of a few thousand weights almost surely has
one: Gamma* is 0 (rounds.jsonl's `gamma`). This scheme targets **Gamma***, and holds **w^2 equal to
random_prune's** at the same keep ratios: every client keeps exactly keep_count(n, q) entries of
each prunable tensor, and its mask is marginally a uniformly random subset of that size, as in
random_prune (so E[w^2], the `scaled` inference rule's argument and the bound's unbiasedness hold
as they are). Only the masks' joint distribution within a round changes.

The masks of round r (per prunable tensor, the scope of random_prune):
  1. The round's roster: the clients the server sampled for round r (system.participation and
     system.sampling, before dropout; `round_clients`), put in an order seeded by (run seed, r).
  2. One uniform random permutation pi of the tensor's n entries, from the generator (run seed,
     "balanced_mask", r), shared by all the round's clients (tensors drawn in layout order).
  3. With k_i = keep_count(n, q_i) for the roster's clients in order, client j keeps the entries
     pi[(o_j + t) mod n] for t < k_j, with o_j = (k_0 + ... + k_{j-1}) mod n: the windows are laid
     end to end around the cycle of the permuted entries.
Each client's window is a fixed set of positions of a uniform permutation, so its entries are a
uniform random k_j-subset (marginally random_prune's mask). Laid end to end, the windows wrap the
cycle K/n times (K = sum_j k_j), so every entry is covered floor(K/n) or ceil(K/n) times: the
largest least coverage any masks of these sizes can have (the coverages sum to K). With equal keep
ratios q and qJ whole (J clients), every entry is trained by exactly qJ clients.

Why end to end, and not the evenly spread starts o_j = floor(j n / J): with equal keep ratios both
reach the same coverage, but with capacity tiers (unequal q_j, e.g. 0.9, 0.1, 0.9, 0.1 on n = 10)
spread starts can leave an entry covered once where end to end covers each twice (tested). Why a
seeded order and not the sorted client ids: with full participation the sorted order would put the
same clients side by side (sharing or adjoining windows) every round; a fresh order per round
varies which clients train an entry together, while the coverage stays as balanced.

What breaks the balance (each client's mask stays marginally uniform, so nothing is biased; only
Gamma* falls back towards random_prune's):
- dropout (system.dropout) and the deadline (system.deadline): the windows are assigned to the
  sampled clients before the round, as a real server must; a client that drops out or reports late
  leaves its window one client short (with qJ whole, those entries are trained qJ - 1 times).
- partial participation (system.participation < 1) is fine: the roster is the round's sample, so J
  is the number of clients sampled, not the number of clients.
- the asynchronous driver (train.driver=fedbuff) has no rounds of clients: the roster is then every
  client (fedbuff refuses participation < 1), and clients that start from the same server version
  are balanced only as far as they are that roster.
The mask is rebuilt, never stored: from (run seed, round) and the config, client and server derive
the roster, the permutations and the windows, on any rank and after a resume.

Keep ratios: keep_ratio, or a client's capacity tier (system.capacity, which overrides it), as in
random_prune. Keep ratios set from the clients' speeds (system.speed) are not offered: the speeds are
drawn by the engine's clock, which a method does not see; give system.capacity the tiers of
system.speed (same fractions: the same clients, benchmark/engine/clock.py) to train slow clients small.

Bits (32-bit floats): uplink as random_prune, 32 per kept value plus the 64-bit seed echoed back;
downlink 32 per kept value plus the round's 64-bit seed and the window's start in each prunable
tensor (32 bits each): a client cannot derive its start, which depends on the other clients' keep
ratios. Inference rules (`full`, `scaled`, `submodel`) are random_prune's, as is the default
(`scaled`), and keep 1.0 is FedAvg bitwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

import numpy as np
import torch

from .base import FLOAT_BITS, ServerState
from .pruning import SEED_BITS, Inference, RandomPrune, keep_count
from .registry import register_method

if TYPE_CHECKING:
    from .context import MethodContext, ParamLayout

OFFSET_BITS = FLOAT_BITS  # a window's start in one tensor, as a 32-bit integer


def round_clients(ctx: "MethodContext") -> list[int]:
    """The clients sampled for round ctx.round before dropout, as the round draws them
    (benchmark/engine/context.py, sample_round_clients: the same generator and rule; a test pins
    that both agree), sorted by client id."""
    system, n = ctx.cfg.system, ctx.num_clients
    rng = ctx.rng("participation", ctx.round)
    if system.sampling == "poisson":
        chosen = np.flatnonzero(rng.random(n) < system.participation)
    else:
        chosen = np.sort(rng.choice(n, size=max(1, int(round(system.participation * n))), replace=False))
    return [int(c) for c in chosen]


def round_roster(ctx: "MethodContext") -> list[int]:
    """The round's sampled clients in the order their windows are laid out, seeded by (run seed, round)."""
    return [int(c) for c in ctx.rng("balanced_order", ctx.round).permutation(round_clients(ctx))]


def window_starts(counts: Sequence[int], n: int) -> list[int]:
    """Start of each window laid end to end on a cycle of n: o_j = (k_0 + ... + k_{j-1}) mod n."""
    starts, at = [], 0
    for k in counts:
        starts.append(at % n)
        at += k
    return starts


def balanced_mask(layout: "ParamLayout", keeps: Sequence[float], position: int, prunable: list[bool],
                  gen: torch.Generator, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Mask [P] of the roster's client at `position` (keeps: the roster's keep ratios in order).

    Per prunable tensor, in layout order: pi = randperm(n, gen); the client keeps pi at its window,
    keep_count(n, keeps[position]) cyclic positions from window_starts(...)[position]. Every client of
    the round must pass a generator in the same state (the round's) to get windows of one permutation.
    """
    mask = torch.ones(layout.total, dtype=dtype, device=gen.device)
    for (_, sl, _), p in zip(layout.slices(), prunable):
        if not p:
            continue
        n = sl.stop - sl.start
        perm = torch.randperm(n, generator=gen, device=gen.device)
        counts = [keep_count(n, q) for q in keeps]
        start = window_starts(counts, n)[position]
        kept = perm[(start + torch.arange(counts[position], device=gen.device)) % n]
        mask[sl] = 0
        mask[sl.start + kept] = 1
    return mask


@register_method("balanced_prune")
class BalancedPrune(RandomPrune):
    """Random sub-networks whose windows of one shared permutation cover every weight evenly (max Gamma*)."""

    # the same family as random_prune: the one rule that differs is how a round's masks are placed
    # together, so the demo grid's random_prune cell covers the mechanics both share
    family: ClassVar[str | None] = "random_prune"

    @dataclass(frozen=True)
    class Config(RandomPrune.Config):
        METHOD: ClassVar[str] = "balanced_prune"
        inference: Inference = "scaled"  # random_prune's rule: each client's mask is marginally uniform

    def make_mask(self, state: ServerState, client: int, keep: float, ctx: "MethodContext") -> torch.Tensor:
        roster = round_roster(ctx)
        if client not in roster:
            raise RuntimeError(f"balanced_prune: client {client} trains in round {ctx.round} but is not among the clients "
                               f"the round sampled as the method derives them ({sorted(roster)}); round_clients must follow "
                               "benchmark/engine/context.py's sample_round_clients")
        keeps = [self.keep_for(c, ctx) for c in roster]
        return balanced_mask(ctx.layout, keeps, roster.index(client), self.prunable(ctx.layout),
                             ctx.gen("balanced_mask", ctx.round), state.params.dtype)

    def mask_bits(self, layout: "ParamLayout", direction: Literal["down", "up"]) -> int:
        if direction == "up":
            return SEED_BITS  # as random_prune: the seed echoed back names the mask
        return SEED_BITS + OFFSET_BITS * sum(self.prunable(layout))  # the round's seed and each tensor's window start
