"""The method interface: hooks the shared loop calls, with FedAvg as the default.

Parameters travel as ONE flat float32 vector (see `benchmark.model.Layout`), so
masks, quantisation, aggregation and all_reduce are single tensor operations.

Round r, as the loop sees a method (every hook has a FedAvg default):

    plan   = method.client_view(state, k, ctx)      start point, mask, proximal term
    ...      the shared local training step runs S steps from plan.start ...
    upload = method.upload(local, plan, k, state, ctx)     encode/decode, count bits
    method.accumulate(acc, upload, ctx)               add into sums (all_reduce-able)
    state  = method.apply(state, acc, ctx)            new server state
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

if TYPE_CHECKING:
    from torch import nn

    from dfbench.benchmark.context import RunContext

FLOAT_BITS = 32


@dataclass
class ServerState:
    """What the server holds between rounds; everything in it is checkpointed."""

    params: torch.Tensor  # flat global parameters [P] (an expert mixture holds [K, P])
    extra: dict[str, Any] = field(default_factory=dict)  # method-specific tensors / numbers


@dataclass
class ClientPlan:
    """What client k starts from this round."""

    start: torch.Tensor  # flat parameters [P] the client trains from (already masked if pruned)
    mask: torch.Tensor | None = None  # float 0/1 [P]: 1 = the client trains this parameter
    prox_mu: float = 0.0  # FedProx: mu/2 * ||w - start||^2 added to the local loss
    objective: str | None = None  # None = the run's objective (experts may differ per expert)
    group: int = 0  # aggregation group (expert index); 0 for federated methods
    downlink_bits: int = 0  # bits the server sent the client to build `start`
    info: dict[str, float] = field(default_factory=dict)  # e.g. trained parameter count, keep ratio
    # Optional, for methods whose client trains a different network or corrects its steps
    # (sequential clients only; a method that sets them refuses train.clients_mode=batched):
    model: nn.Module | None = None  # the network to train (parameters: ctx.model's, views of ctx.flat); None = ctx.model
    step_correction: torch.Tensor | None = None  # [P]; every local step also moves y <- y - lr * this (SCAFFOLD's c - c_i)


@dataclass
class Upload:
    """What the server decodes from client k's message.

    `params` is the client's model as the server reconstructs it (start + decoded update;
    the local parameters themselves when nothing is lost on the wire). Aggregating models
    rather than updates keeps FedAvg with one client bitwise equal to local training.
    """

    params: torch.Tensor  # decoded client parameters [P]; only entries with mask 1 are used
    weight: float  # aggregation weight n_k (client sample count)
    uplink_bits: int  # exact bits on the wire: values, scales, masks or seeds, headers
    mask: torch.Tensor | None = None
    group: int = 0


def masked_weighted_mean(
    theta: torch.Tensor, wsum: torch.Tensor, wcov: torch.Tensor, wtotal: float, mode: str = "covered"
) -> torch.Tensor:
    """New global parameters from accumulated sums (p_k = n_k / sum of the round's n_j).

    wsum  = sum_k p_k m_k theta_k      (m_k = client k's mask, 1 everywhere without pruning)
    wcov  = sum_k p_k m_k              (per parameter)
    wtotal= sum_k p_k
    covered:   theta_new = wsum / wcov where wcov > 0; theta (unchanged) where no client trained it.
               = the p-weighted mean over the clients that trained each parameter.
    zero_fill: theta_new = theta + sum_k p_k m_k (theta_k - theta) / wtotal
               = (wsum + (wtotal - wcov) theta) / wtotal: a pruned coordinate counts as a zero update.
    Without masks both equal FedAvg's weighted mean.
    """
    if mode == "covered":
        return torch.where(wcov > 0, wsum / wcov.clamp_min(1e-30), theta)
    if mode == "zero_fill":
        return (wsum + (wtotal - wcov) * theta) / wtotal if wtotal > 0 else theta.clone()
    raise ValueError(f"unknown aggregation {mode!r}; allowed: covered, zero_fill")


class Method:
    """Base class: FedAvg behaviour. Subclasses override only what differs."""

    name: ClassVar[str] = "base"
    # Methods that differ only in a rule share a family (e.g. the four server optimizers): the
    # demo grid covers every family, the full grid every method. Default: the method's own name.
    family: ClassVar[str | None] = None

    @dataclass(frozen=True)
    class Config:
        pass

    #: "covered" or "zero_fill" — how masked updates are averaged (see masked_weighted_mean)
    aggregation: str = "covered"

    def __init__(self, config: Any) -> None:
        self.config = config

    # -- server ------------------------------------------------------------------
    def init_state(self, params: torch.Tensor, ctx: "RunContext") -> ServerState:
        return ServerState(params=params.clone())

    def client_view(self, state: ServerState, client: int, ctx: "RunContext") -> ClientPlan:
        return ClientPlan(start=state.params, downlink_bits=FLOAT_BITS * state.params.numel())

    # -- client ------------------------------------------------------------------
    def upload(self, local: torch.Tensor, plan: ClientPlan, client: int, state: ServerState, ctx: "RunContext") -> Upload:
        """Encode the client's result for the wire; return what the server decodes. FedAvg: raw float32."""
        return Upload(params=local, weight=float(ctx.client_sizes[client]), uplink_bits=FLOAT_BITS * local.numel(), mask=plan.mask, group=plan.group)

    # -- aggregation (sums only, so that torch.distributed can all_reduce them) ------
    def new_accumulator(self, state: ServerState, ctx: "RunContext") -> dict[str, torch.Tensor]:
        # float64 sums: the order in which clients are added (1 process or N ranks) then changes
        # nothing once the mean is rounded back to float32, so N ranks reproduce one process.
        p = state.params.reshape(-1, ctx.layout.total)
        groups = p.shape[0]
        return {
            "wsum": torch.zeros_like(p, dtype=torch.float64),
            "wcov": torch.zeros_like(p, dtype=torch.float64),
            "wtotal": torch.zeros(groups, dtype=torch.float64, device=p.device),
        }

    def accumulate(self, acc: dict[str, torch.Tensor], up: Upload, ctx: "RunContext") -> None:
        """Add p_k m_k theta_k and p_k m_k, with p_k = n_k / (sum of n over the round's clients)."""
        g, p = up.group, up.weight / ctx.round_weight
        if up.mask is None:
            acc["wsum"][g].add_(up.params, alpha=p)
            acc["wcov"][g].add_(p)
        else:
            acc["wsum"][g].add_(up.params * up.mask, alpha=p)
            acc["wcov"][g].add_(up.mask, alpha=p)
        acc["wtotal"][g] += p

    def apply(self, state: ServerState, acc: dict[str, torch.Tensor], ctx: "RunContext") -> ServerState:
        """Server step: the (masked) weighted mean of the client models, per group."""
        theta = state.params.reshape(-1, ctx.layout.total)
        rows = []
        for g in range(theta.shape[0]):
            wt = float(acc["wtotal"][g])
            rows.append(masked_weighted_mean(theta[g], acc["wsum"][g], acc["wcov"][g], wt, self.aggregation).to(theta.dtype)
                        if wt > 0 else theta[g].clone())
        return ServerState(params=torch.stack(rows).reshape(state.params.shape), extra=state.extra)

    # -- end of training and sampling ------------------------------------------------
    def finalize(self, state: ServerState, ctx: "RunContext") -> dict[str, Any]:
        """Called once after the last round (e.g. to train a router). Returns extra metrics."""
        return {}

    def sample(self, params: torch.Tensor, noise: torch.Tensor, ctx: "RunContext") -> torch.Tensor:
        """Generate images in [-1, 1] from the fixed noise with the run's sampler."""
        return ctx.sample_single(params, noise, ctx.objective)
