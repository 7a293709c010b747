"""The ground-truth floor: a Gaussian mixture's exact score used as the network (an anchor, not a method).

On the ground-truth track (``data.dataset = gmm:...``, datasets/gmm.py) the score of every noised
marginal is known in closed form (datasets/mixture.py). This anchor trains nothing (train.rounds = 0)
and samples with the run's own objective and sampler from the exact network: for flow matching the
exact velocity E[eps - x0 | x_t], for DDPM the exact epsilon E[eps | x_t] at each step's abar. Its
score error is 0 by construction; its sample metrics are the sampler's own discretization error
(the floor no trained network can beat with that sampler and step count). The untrained network
(any method at train.rounds = 0) is the ceiling beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from dfbench import datasets
from dfbench.datasets.mixture import fm_velocity, vp_eps

from .base import Method
from .registry import register_method

if TYPE_CHECKING:
    from dfbench.benchmark.core.config import RunConfig

    from .context import MethodContext


def _mixture(ctx: "MethodContext") -> datasets.GaussianMixture:
    return datasets.mixture(ctx.cfg.data.dataset)  # type: ignore[attr-defined]


def exact_velocity(mix: datasets.GaussianMixture, shape: tuple[int, ...]) -> Callable[[torch.Tensor, float], torch.Tensor]:
    """v*(x, t) on the flow-matching path, as a network would give it (x's dtype and shape, float64 inside).
    t is clipped into (0, 1): the sampler's first and last times (1 and 0) are limits of the closed form."""
    def velocity(x: torch.Tensor, t: float) -> torch.Tensor:
        tt = min(max(float(t), 1e-6), 1.0 - 1e-6)
        return fm_velocity(mix, x.reshape(x.shape[0], -1), tt).reshape(x.shape).to(device=x.device, dtype=x.dtype)
    return velocity


@register_method("exact_score")
class ExactScore(Method):
    """Anchor: the mixture's exact score as the network (gmm: data only, train.rounds = 0)."""

    anchor = "floor"

    @dataclass(frozen=True)
    class Config:
        pass

    @classmethod
    def check(cls, config: Any, run: "RunConfig", world: int = 1) -> None:
        super().check(config, run, world)
        if not datasets.is_mixture(run.data.dataset):
            raise ValueError(f"method 'exact_score' needs data whose score is known: a gmm: dataset, not "
                             f"{run.data.dataset!r}; use e.g. --set data.dataset=gmm:fmnist16 (datasets/gmm.py)")
        if run.train.rounds != 0:
            raise ValueError(f"method 'exact_score' trains nothing (it is the exact score); use --set train.rounds=0, "
                             f"not {run.train.rounds}")

    def velocity(self, params: torch.Tensor, ctx: "MethodContext") -> Callable[[torch.Tensor, float], torch.Tensor]:
        return exact_velocity(_mixture(ctx), ctx.image_shape)

    @torch.no_grad()
    def sample(self, params: torch.Tensor, noise: torch.Tensor, ctx: "MethodContext") -> torch.Tensor:
        """The run's own sampler (DDIM for DDPM, Heun or Euler for flow matching), on the exact network."""
        net = _ExactNet(_mixture(ctx), ctx.objective, ctx.get_objective(ctx.objective))
        return ctx.sample_single(params, noise, ctx.objective, network=net)


class _ExactNet(torch.nn.Module):
    """The exact network of a run's objective: v*(x, t) for flow matching; eps*(x, i / T) for DDPM (abar_i of the
    run's schedule). No parameters."""

    def __init__(self, mix: datasets.GaussianMixture, objective: str, obj: Any) -> None:
        super().__init__()
        self.mix, self.objective, self.obj = mix, objective, obj

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(x.shape[0], -1)
        t0 = float(t.reshape(-1)[0])  # the samplers feed one time per call
        if self.objective == "ddpm":
            i = min(int(round(t0 * self.obj.T)), self.obj.T - 1)
            out = vp_eps(self.mix, flat, min(float(self.obj.abar64[i]), 1.0 - 1e-12))
        else:
            out = fm_velocity(self.mix, flat, min(max(t0, 1e-6), 1.0 - 1e-6))
        return out.reshape(x.shape).to(device=x.device, dtype=x.dtype)
