"""FedRolex: rolling sub-model extraction (Alam, Liu, Yan and Zhang, "FedRolex: Model-Heterogeneous
Federated Learning with Rolling Sub-Model Extraction", NeurIPS 2022).

A client of width rate r trains a real narrower UNet, as in HeteroFL (methods/heterofl.py: the same
narrow architecture, the same kept counts c' = ceil(r * C) per layer of C channels, the same
`SubModel` forward through `torch.func.functional_call`), but the kept channels are a window that
rolls by one channel per communication round instead of the leading ones. The paper's rolling
sub-model extraction (Sec. 3, the definition of S^(i)_{n,j} for layer i of K_i nodes, client n of
capacity beta_n, round j): with k = j mod K_i, the kept nodes are

    {k, k + 1, ..., k + c' - 1}                              if k + c' <= K_i,
    {k, ..., K_i - 1} U {0, ..., k + c' - 1 - K_i}            otherwise (the window wraps around),

i.e. {(j + i) mod K_i : i = 0..c'-1}. Here j = round - 1 (the benchmark counts rounds from 1; the
authors' code counts them from 0), so round 1 keeps the leading channels (HeteroFL's sub-model)
and the window starts one channel later each round; after K_i rounds every channel of the layer
has been trained by a client of each rate. The rule depends on (K_i, c', j) alone, so a layer's
outputs and the next layer's inputs (one channel space) keep the same channels; the two places with
several channel blocks roll within each block: the attention's [q | k | v] (each of q, k, v keeps
its own window) and an up-path ResBlock's cat([h, skip]) input (one window in h, one in the skip).
The sub-model's channel order is the window's (k first); the image channels and the sinusoidal
time features stay whole.

Kept counts: the paper writes floor(beta_n K_i); its code (built on HeteroFL's) and this module use
HeteroFL's ceil(r * C), so FedRolex and HeteroFL clients of one rate train networks of one size.
Scaling: the authors' code keeps HeteroFL's Scaler (its default config has scale = 1); so does this
module (`scaler = false` turns it off).

Aggregation (the paper's selective averaging, Sec. 3, after the extraction rule): each parameter is
averaged over the clients whose sub-model holds it in that round; a parameter nobody holds keeps its
value. The paper averages unweighted; here the mean is sample-size weighted, as every method of the
benchmark (the "covered" masked mean of methods/base.py).

Inference rule: the full global model (FedRolex evaluates the global server model, which is larger
than any client's; the rolling window trains every part of it).

Bits: 32 per kept parameter each way; no index is sent (the window's start follows from the round,
which both ends know). `rounds.jsonl` records each client's `trained_params` and `flop_fraction`
(measured once per rate: which channels are kept does not change the shapes). A client at rate 1.0
trains FedAvg's plan exactly (bitwise). Refuses train.clients_mode=batched when a client trains a
sub-model, and a network that is not width-aware (WidthSubModels.check).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .base import ClientPlan, ServerState
from .heterofl import Channels, SubModelInfo, WidthSubModels, build_submodel, validate_rate
from .registry import register_method

if TYPE_CHECKING:
    from .context import MethodContext


def rolling(j: int) -> Channels:
    """FedRolex's window in round j (0-based): of a channel space of C channels keep (j + i) mod C, i < c'."""

    def choose(full: int, kept: int) -> torch.Tensor:
        return (j + torch.arange(kept)) % full

    return choose


@register_method("fedrolex")
class FedRolex(WidthSubModels):
    """Each client trains a window of every layer's channels that rolls by one channel per round."""

    headline_params = ("rate",)

    @dataclass(frozen=True)
    class Config:
        rate: float = 0.5  # width rate of every client without capacity tiers (tiers override it)
        scaler: bool = True  # divide narrowed sums by the kept fraction (HeteroFL's Scaler, kept by FedRolex's code)

        def validate(self) -> None:
            validate_rate("fedrolex", self.rate)

    def __init__(self, config: "FedRolex.Config") -> None:
        super().__init__(config, config.scaler)
        self._round = -1
        self._windows: dict[float, SubModelInfo] = {}  # per rate, this round's window (rebuilt each round)

    def window(self, rate: float, round_: int, ctx: "MethodContext") -> SubModelInfo:
        """The rate-r sub-model of round `round_` (1-based): the rolling window with j = round_ - 1."""
        if round_ != self._round:
            self._round, self._windows = round_, {}
        if rate not in self._windows:
            lead = self.submodel(rate, ctx)  # the same shapes: its measured FLOP fraction holds for every window
            self._windows[rate] = build_submodel(ctx, rate, self.scaler, rolling(round_ - 1), lead.flop_fraction)
        return self._windows[rate]

    def client_view(self, state: ServerState, client: int, ctx: "MethodContext") -> ClientPlan:
        rate = self.rate_for(client, ctx)
        if rate >= 1.0:  # rate 1.0 == fedavg bitwise
            return self.full_plan(state, client, ctx)
        return self.sub_plan(state, self.window(rate, ctx.round, ctx))
