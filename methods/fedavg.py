"""FedAvg (McMahan et al., 2017) and FedProx (Li et al., 2020) — FedDM-vanilla and FedDM-prox."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .base import ClientPlan, Method, ServerState
from .registry import register_method

if TYPE_CHECKING:
    from .context import MethodContext


@register_method("fedavg")
class FedAvg(Method):
    """Full model on every client; the server takes the sample-size-weighted mean of the updates."""

    reference = True  # what every other method is compared with by default

    @dataclass(frozen=True)
    class Config:
        pass


@register_method("fedprox")
class FedProx(Method):
    """FedAvg plus the proximal term mu/2 * ||w - w_global||^2 in each client's local loss."""

    headline_params = ("mu",)

    @dataclass(frozen=True)
    class Config:
        mu: float = 0.01

        def validate(self) -> None:
            if not (math.isfinite(self.mu) and self.mu >= 0):
                raise ValueError(f"invalid value for 'method.mu' of 'fedprox': {self.mu!r}; allowed: a finite number >= 0")

    def client_view(self, state: ServerState, client: int, ctx: "MethodContext") -> ClientPlan:
        plan = super().client_view(state, client, ctx)
        plan.step.proximal_mu = self.config.mu
        return plan
