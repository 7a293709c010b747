"""FjORD: ordered dropout (Horváth, Laskaridis, Almeida, Leontiadis, Venieris and Lane, "FjORD: Fair and
Accurate Federated Learning under heterogeneous targets with Ordered Dropout", NeurIPS 2021).

Ordered dropout (the paper's Sec. 2): a width p in a discrete set P keeps the first ceil(p * K_l)
units of every layer l of K_l units, so the sub-models are nested leading-channel prefixes, here
HeteroFL's sub-models (methods/heterofl.py: the same narrow UNet at width p, the same blocks of
[q | k | v] and cat([h, skip]) each keeping their own leading channels, the image channels and the
sinusoidal time features whole). Ordered dropout does not rescale (no Scaler: the authors' OD
layers slice the weights and nothing else).

Training (Sec. 3, Algorithm 1): a client of capacity p_max trains, at every local step (mini-batch),
the sub-model of a width p drawn uniformly from P_i = {p in P : p <= p_max}; P is `widths`, by
default the paper's uniform-5 setting {0.2, 0.4, 0.6, 0.8, 1.0} (Sec. 5). The widths come from the
run's seeded generator ctx.rng("fjord", round, client), one draw per local step, made when the
client's plan is built, so a run (and a resumed run) draws the same widths and the plan's
`flop_fraction` is the mean of the drawn widths' measured FLOP fractions. The shared local step
calls the network once per step (objective.loss); `OrderedDropout` refuses a call past its draws.
The client's Adam state is per round and shared by the widths: a unit outside this step's width
gets a zero gradient but may still move by Adam's momentum, as under any dropout with Adam (the
paper trains with SGD, where it would not move). The paper's optional self-distillation from the
p_max model (FjORD with KD) is not implemented.

Diagnostics (docs/diagnostics.md): a client trains, in a round, the union of the prefixes it drew, i.e. the
prefix of the widest width it drew (the plan's `trained_mask`; the local step runs every drawn width, one per
step, which `OrderedDropout` enforces), so a unit beyond every drawn width is untrained that round even
inside the prefix the client holds; Γ, the uncovered fraction and w² count that, over the network `sample`
runs (`deployed_mask`, methods/heterofl.py: the prefix at `inference_rate`).

A client holds and sends the prefix of the largest width it can draw, max P_i (= p_max when p_max
is in P, as in the paper's tiers; a capacity between two widths trains the smaller one): 32 bits
per parameter of that prefix each way; `trained_params` is its size. Capacities come from
`system.capacity` tiers, else every client has `rate`; a capacity below min(P) is refused.

Aggregation (Sec. 3): each nested block of the model is averaged over the clients whose p_max
prefix holds it, i.e. each parameter over the clients that hold it; a parameter nobody holds keeps
its value. This is the "covered" masked mean of methods/base.py, sample-size
weighted as the authors' Flower baseline weights it by the clients' examples.

Inference rule: the largest width any client can draw, with a capacity-1 client the full model (p = 1,
the global model FjORD deploys to its top tier); with no such client the full model's outer
channels were never trained, so the widest trained prefix is sampled instead.

`widths = 1.0` (with capacities of 1) is FedAvg bitwise: every client trains the full model with
FedAvg's plan. Refuses train.clients_mode=batched when a client trains a narrower width, and a
network that is not width-aware (WidthSubModels.check).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import nn

from dfbench.benchmark.core.parsing import parse_capacity

from .base import ClientPlan, ServerState
from .heterofl import WidthSubModels, validate_rate
from .registry import register_method

if TYPE_CHECKING:
    from dfbench.benchmark.core.config import RunConfig

    from .context import MethodContext


def parse_widths(text: str) -> tuple[float, ...]:
    """method.widths "0.2,0.4,..." -> the discrete set P, ascending; each a number in (0, 1], no repeats."""
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        values = [math.nan]
    if not values or not all(math.isfinite(v) and 0.0 < v <= 1.0 for v in values) or len(set(values)) != len(values):
        raise ValueError(f"invalid value for 'method.widths' of 'fjord': {text!r}; allowed: a comma list of distinct "
                         "numbers in (0, 1], e.g. '0.2,0.4,0.6,0.8,1.0'")
    return tuple(sorted(values))


def allowed_widths(widths: tuple[float, ...], p_max: float) -> tuple[float, ...]:
    """P_i = {p in P : p <= p_max}: the widths a client of capacity p_max draws from (Algorithm 1)."""
    return tuple(p for p in widths if p <= p_max + 1e-9)  # the epsilon: a capacity parsed as 0.6000000000000001


def draw_widths(allowed: tuple[float, ...], steps: int, rng: np.random.Generator) -> list[float]:
    """One width per local step, uniform over `allowed` (the paper's uniform D_P restricted to p <= p_max)."""
    return [allowed[i] for i in rng.integers(len(allowed), size=steps)]


class OrderedDropout(nn.Module):
    """A client's network for one round: its s-th call runs the network of the s-th drawn width.

    Its parameters are the full model's (views of ctx.flat, as the shared local step needs); the
    per-step networks (sub-models, or the full model at p = 1) are held in a tuple, unregistered.
    """

    def __init__(self, full: nn.Module, per_step: list[nn.Module], widths: list[float]) -> None:
        super().__init__()
        self.full = full
        self._per_step = tuple(per_step)
        self.widths = tuple(widths)  # the drawn width of each step (what the per-step networks are)
        self._calls = 0

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if self._calls >= len(self._per_step):
            raise RuntimeError(f"fjord drew {len(self._per_step)} widths (one per local step) and the network was called "
                               "once more: the local step must call it once per step")
        net = self._per_step[self._calls]
        self._calls += 1
        return net(x, t)


@register_method("fjord")
class FjORD(WidthSubModels):
    """Each local step trains a nested leading-channel prefix of a width drawn up to the client's capacity."""

    headline_params = ("rate",)
    full_width_setting: ClassVar[str] = "method.widths=1.0"

    @dataclass(frozen=True)
    class Config:
        rate: float = 1.0  # p_max of every client without capacity tiers (tiers override it)
        widths: str = "0.2,0.4,0.6,0.8,1.0"  # P, the widths ordered dropout draws from (the paper's uniform-5)

        def validate(self) -> None:
            validate_rate("fjord", self.rate)
            parse_widths(self.widths)

    def __init__(self, config: "FjORD.Config") -> None:
        super().__init__(config, scaler=False)  # ordered dropout does not rescale
        self.widths = parse_widths(config.widths)

    @classmethod
    def narrowest(cls, config: Any, run: "RunConfig") -> float:
        """min(P): every client's capacity is at least min(P) (`check`), so each can draw it."""
        return parse_widths(config.widths)[0]

    @classmethod
    def check(cls, config: Any, run: "RunConfig", world: int = 1) -> None:
        """Every client can hold a width of P (its capacity is at least min(P)); then WidthSubModels.check."""
        tiers = parse_capacity(run.system.capacity)
        lowest = min(k for k, _ in tiers) if tiers else config.rate
        smallest = parse_widths(config.widths)[0]
        if lowest < smallest - 1e-9:
            raise ValueError(f"method 'fjord': a client of capacity {lowest:g} can hold none of the widths "
                             f"method.widths={config.widths} (the smallest is {smallest:g}); add a width of at most "
                             f"{lowest:g} to method.widths, or raise the capacity (system.capacity or method.rate)")
        super().check(config, run, world)

    def allowed(self, client: int, ctx: "MethodContext") -> tuple[float, ...]:
        """P_i of `client` (its capacity from the tiers, else method.rate)."""
        return allowed_widths(self.widths, self.rate_for(client, ctx))

    def client_view(self, state: ServerState, client: int, ctx: "MethodContext") -> ClientPlan:
        allowed = self.allowed(client, ctx)
        if allowed == (1.0,):  # only the full width: FedAvg's plan, bitwise
            return self.full_plan(state, client, ctx)
        drawn = draw_widths(allowed, int(ctx.local_steps[client]), ctx.rng("fjord", ctx.round, client))
        nets = [ctx.model if p >= 1.0 else self.submodel(p, ctx).model for p in drawn]
        flops = [1.0 if p >= 1.0 else self.submodel(p, ctx).flop_fraction for p in (drawn or allowed)]
        network = OrderedDropout(ctx.model, nets, drawn)
        top = allowed[-1]
        if top >= 1.0:  # the client holds (and sends) the whole model
            plan = self.full_plan(state, client, ctx)
            plan.step.network, plan.flop_fraction = network, float(np.mean(flops))
        else:
            plan = self.sub_plan(state, self.submodel(top, ctx), network=network, flop_fraction=float(np.mean(flops)))
        # what its steps train (the diagnostics' mask): the union of the drawn prefixes, i.e. the widest one's
        widest = max(drawn, default=1.0)
        plan.trained_mask = None if widest >= 1.0 else self.submodel(widest, ctx).mask
        return plan

    def inference_rate(self, ctx: "MethodContext") -> float:
        """The largest width any client can draw (1.0, the full model, when a client has capacity 1)."""
        return max(self.allowed(k, ctx)[-1] for k in range(ctx.num_clients))
