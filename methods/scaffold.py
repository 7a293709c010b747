"""SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", ICML 2020), control variates of option II.

The server keeps a control variate c, client i keeps c_i (both start at 0). In round t,
client i starts from the global model x and takes K local steps, each corrected by c - c_i:

    y <- y - eta_l (d(y) + c - c_i)                     (Algorithm 1, line 10)
    c_i^+ = c_i - c + (x - y_i) / (K eta_l)             (option II, line 12)
    sends  Delta y_i = y_i - x  and  Delta c_i = c_i^+ - c_i

    server: x <- x + eta_g * mean_i(Delta y_i)          (line 16)
            c <- c + (1 / N) * sum_i Delta c_i          (line 17: |S|/N times the mean over S)

Deviation from the paper, and why: the benchmark's ONE local step is Adam (train.py), not SGD.
The correction is therefore added to the *step* (the optimizer's update direction d), after
the Adam update: y <- y - eta_l d_Adam(y) - eta_l (c - c_i). With that, option II gives
c_i^+ = mean_s d_s, the client's mean update direction, in the same units as the correction
(for SGD, d = the gradient and this is the paper's algorithm exactly). Adding the correction
to the gradient before Adam instead would mix units: option II's c_i are Adam directions of
size ~1, the diffusion gradients are orders of magnitude smaller.

Mean over clients: the sample-size-weighted mean of the loop (as every method here), with
eta_g = 1 by default, so SCAFFOLD with zero control variates is FedAvg bitwise; c uses the
paper's unweighted 1/N, which keeps c = mean_i c_i over all N clients. K is the client's own
local step count (stragglers run fewer).

State: c in `state.extra["scaffold_c"]`, c_i the per-client memory "scaffold_ci" of the
protocol (`state.client_state` / `set_client_state`: client -> [P]; absent = 0), all
checkpointed, so a resumed run continues bitwise. The c_i are client memory kept across
rounds, so this declares one process (clients move between ranks) and sequential clients
(the lockstep step has no step correction). A client whose local result is non-finite is
dropped by the round and keeps its old c_i.

Bits: the downlink carries x and c, the uplink Delta y_i and Delta c_i: 2 x 32 bits per
parameter each way, twice FedAvg (the ledger shows it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .base import FLOAT_BITS, Capabilities, ClientPlan, Method, ServerState, Upload, masked_weighted_mean
from .registry import register_method

if TYPE_CHECKING:
    from .context import MethodContext

SERVER_KEY = "scaffold_c"
CLIENT_KEY = "scaffold_ci"


@dataclass
class ScaffoldUpload(Upload):
    """FedAvg's upload plus Delta c_i (decoded at the server)."""

    delta_c: torch.Tensor | None = None


@register_method("scaffold")
class Scaffold(Method):
    """Drift-corrected local steps with server and per-client control variates (option II)."""

    capabilities = Capabilities(
        batched_clients=False,  # its LocalStep carries a step correction
        several_ranks=False,  # c_i is per-client memory
        mean_aggregation=False,  # its upload also carries the control-variate change delta_c
        asynchronous=False,  # c and c_i are one synchronous round's averages; its upload carries delta_c
        hierarchical=False,  # the server's c has no cloud average of edge copies
        needs="it corrects every local step by c - c_i and keeps each client's control variate c_i across rounds")

    @dataclass(frozen=True)
    class Config:
        global_lr: float = 1.0  # eta_g

        def validate(self) -> None:
            if not (math.isfinite(self.global_lr) and self.global_lr > 0):
                raise ValueError(f"invalid value for 'method.global_lr' of 'scaffold': {self.global_lr!r}; allowed: a finite number > 0")

    def _variates(self, state: ServerState, client: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(c, c_i); None stands for a control variate that is still 0."""
        return state.extra.get(SERVER_KEY), state.client_state(CLIENT_KEY, client)

    def client_view(self, state: ServerState, client: int, ctx: "MethodContext") -> ClientPlan:
        plan = super().client_view(state, client, ctx)
        plan.downlink_bits += FLOAT_BITS * state.params.numel()  # c travels with x
        c, ci = self._variates(state, client)
        if c is not None or ci is not None:  # both 0: no correction at all (FedAvg's local steps)
            zero = torch.zeros_like(state.params)
            plan.step.step_correction = (c if c is not None else zero) - (ci if ci is not None else zero)
        return plan

    def upload(self, local: torch.Tensor, plan: ClientPlan, client: int, state: ServerState, ctx: "MethodContext") -> Upload:
        c, ci = self._variates(state, client)
        steps, lr = int(ctx.local_steps[client]), ctx.client_lr()
        # option II: c_i^+ - c_i = (x - y_i) / (K eta_l) - c
        delta_c = (plan.start - local) / (steps * lr)
        if c is not None:
            delta_c = delta_c - c
        if bool(torch.isfinite(delta_c).all()):  # else the loop drops this client: keep its old c_i
            state.set_client_state(CLIENT_KEY, client, delta_c if ci is None else ci + delta_c)
        return ScaffoldUpload(params=local, weight=float(ctx.client_sizes[client]), uplink_bits=2 * FLOAT_BITS * local.numel(),
                              mask=plan.step.mask, group=plan.group, delta_c=delta_c)

    def new_accumulator(self, state: ServerState, ctx: "MethodContext") -> dict[str, torch.Tensor]:
        acc = super().new_accumulator(state, ctx)
        acc["dc_sum"] = torch.zeros_like(state.params, dtype=torch.float64)
        return acc

    def accumulate(self, acc: dict[str, torch.Tensor], up: Upload, ctx: "MethodContext") -> None:
        super().accumulate(acc, up, ctx)
        if isinstance(up, ScaffoldUpload) and up.delta_c is not None:
            acc["dc_sum"].add_(up.delta_c)

    def apply(self, state: ServerState, acc: dict[str, torch.Tensor], ctx: "MethodContext") -> ServerState:
        theta = state.params
        wt = float(acc["wtotal"][0])
        if wt <= 0:
            return ServerState(params=theta.clone(), extra=state.extra)
        mean = masked_weighted_mean(theta, acc["wsum"][0], acc["wcov"][0], wt, self.masked_mean)  # float64
        # x + eta_g (mean - x), written from the mean so that eta_g = 1 is FedAvg's mean bitwise
        new = (mean + (self.config.global_lr - 1.0) * (mean - theta.double())).to(theta.dtype)
        c = state.extra.get(SERVER_KEY)
        c64 = acc["dc_sum"] / ctx.num_clients if c is None else c.double() + acc["dc_sum"] / ctx.num_clients
        state.extra[SERVER_KEY] = c64.to(theta.dtype)
        return ServerState(params=new, extra=state.extra)
