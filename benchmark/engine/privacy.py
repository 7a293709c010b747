"""User-level differential privacy as a mechanism on top of any method (DP-FedAvg).

McMahan, Ramage, Talwar, Zhang, "Learning differentially private recurrent language models",
ICLR 2018, Algorithm 1 with the fixed-denominator estimator; compare Flower's server-side
fixed clipping. In round r, with the clients drawn by Poisson sampling at rate q
(system.sampling=poisson; every client when q = 1):

    Delta_k   = theta_k - theta                    client k's decoded update (masked where it pruned)
    Delta_k  <- Delta_k * min(1, C / ||Delta_k||)  clipped to L2 norm C          (on_upload)
    S         = sum_k w_k Delta_k + N(0, (z C w_max)^2 I)                        (on_aggregate)
    theta    <- theta + S / D,   D = q * sum_{all clients j} w_j                  (fixed: not the round's count)

w_k = 1 (privacy.weighting=uniform) or n_k (size). Sensitivity: adding or removing one client
(all of its data: user-level adjacency) adds or removes one term w_k Delta_k of norm <= w_k C <=
w_max C, and D is a constant, so the sum S has L2 sensitivity w_max C and the noise multiplier
of the Gaussian mechanism is z. With `uniform` this holds as stated. With `size`, w_max is the
largest client's sample count in this partition: the bound holds for neighbours whose clients
hold at most that many samples (McMahan et al. cap w_k at a fixed w-hat for the same reason).
Each round is one Poisson-subsampled Gaussian mechanism; R rounds compose, and Opacus' RDP
accountant (maintained, not written here) turns (q, z, R, delta) into epsilon.

The method never sees this: it receives clipped uploads whose weights make its p_k = w_k / D,
and its sums are completed to the fixed denominator before its `apply` (coordinates no client
trained count as zero updates, i.e. zero-fill aggregation). Only methods that declare
`mean_aggregation` run under it (Method.check). The server and its aggregation are trusted
(central DP): the guarantee is for the sequence of global models, and so for everything
computed from them (samples, evaluation, EMA).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import TYPE_CHECKING, Any

import torch

from dfbench import methods
from dfbench.benchmark.core.config import RunConfig

if TYPE_CHECKING:
    from dfbench.benchmark.engine.context import RunContext

ACCOUNTANT = "opacus RDP (Poisson-subsampled Gaussian)"
#: the rounds.jsonl fields this mechanism adds (Mechanism.on_aggregate; benchmark/core/rounds.py names the rest)
ROUND_FIELDS = ("dp_epsilon", "dp_clipped_fraction", "dp_update_norm")


def epsilon(q: float, noise: float, steps: int, delta: float) -> float:
    """epsilon of `steps` Poisson-subsampled Gaussian mechanisms (rate q, noise multiplier z) at delta,
    from Opacus' RDP accountant; inf without noise, 0 before the first step."""
    if steps <= 0:
        return 0.0
    if noise <= 0:
        return math.inf
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    for _ in range(steps):  # one subsampled Gaussian mechanism per round
        accountant.step(noise_multiplier=noise, sample_rate=q)
    with warnings.catch_warnings():  # "optimal order is the smallest alpha": a valid, slightly loose bound
        warnings.simplefilter("ignore", UserWarning)
        return float(accountant.get_epsilon(delta=delta))


class UserLevelDP(methods.Mechanism):
    """Clip every client's update to C and noise the round's weighted sum (module docstring)."""

    name = "dp"

    def __init__(self, cfg: RunConfig, client_sizes: Any) -> None:
        p = cfg.privacy
        self.clip, self.noise, self.delta = float(p.clip), float(p.noise), float(p.delta)
        self.uniform = p.weighting == "uniform"
        sizes = [float(n) for n in client_sizes]
        self.w_max = 1.0 if self.uniform else max(sizes)
        self.q = float(cfg.system.participation)
        self.denominator = self.q * (len(sizes) if self.uniform else sum(sizes))  # D, the same every round

    def std(self) -> float:
        """Standard deviation of the noise added to each coordinate of the sum S."""
        return self.noise * self.clip * self.w_max

    def new_sums(self, state: methods.ServerState, ctx: "RunContext") -> dict[str, torch.Tensor]:
        # [clipped, updates, sum of the updates' norms before clipping]
        return {"dp_clipped": torch.zeros(3, dtype=torch.float64, device=state.params.device)}

    def on_upload(self, up: methods.Upload, plan: methods.ClientPlan, acc: dict[str, torch.Tensor],
                  ctx: "RunContext") -> methods.Upload:
        update = up.params - plan.start if up.mask is None else (up.params - plan.start) * up.mask
        norm = float(update.double().norm())
        acc["dp_clipped"][1] += 1
        acc["dp_clipped"][2] += norm
        params = up.params
        if norm > self.clip:  # scaled only above C: within the bound the upload stays bit for bit as it was
            acc["dp_clipped"][0] += 1
            params = _clipped(plan.start, update, self.clip / norm, up.mask)
        w = 1.0 if self.uniform else float(up.weight)  # the methods weigh by n_k (Upload.weight)
        # the method's p_k is weight / round_weight: make it w_k / D (exact when D = round_weight)
        return dataclasses.replace(up, params=params, weight=w * ctx.round_weight / self.denominator)

    def on_aggregate(self, acc: dict[str, torch.Tensor], state: methods.ServerState, ctx: "RunContext") -> dict[str, Any]:
        theta = state.params.reshape(acc["wsum"].shape).double()
        # wsum = sum_k p_k m_k theta_k; completing the missing weight 1 - wcov with theta itself gives
        # theta + sum_k w_k m_k Delta_k / D: the fixed denominator D for every coordinate
        acc["wsum"] += (1 - acc["wcov"]) * theta
        if self.noise > 0:
            z = torch.randn(theta.shape, generator=ctx.gen("privacy", ctx.round), dtype=torch.float64, device=theta.device)
            acc["wsum"] += z * (self.std() / self.denominator)
        acc["wcov"].fill_(1.0)
        acc["wtotal"].fill_(1.0)
        clipped, updates, norms = (float(x) for x in acc["dp_clipped"])
        return dict(zip(ROUND_FIELDS, (_finite(epsilon(self.q, self.noise, ctx.round, self.delta)),
                                       round(clipped / updates, 6) if updates else None,
                                       round(norms / updates, 6) if updates else None)))  # mean, before clipping (to choose C)


def _clipped(start: torch.Tensor, update: torch.Tensor, factor: float, mask: torch.Tensor | None) -> torch.Tensor:
    """start + update * factor, with ||result - start|| <= C = factor * ||update|| as float32 stores it:
    rounding start + scaled update to float32 can land a hair above C (relative 1e-4 when C is small
    against the weights), so shrink again, by a growing margin, until it does not."""
    target, margin = factor * float(update.double().norm()), 1e-6
    for _ in range(40):
        params = start + update * factor
        got = params - start if mask is None else (params - start) * mask
        if (achieved := float(got.double().norm())) <= target:
            return params
        factor *= target / achieved * (1 - margin)
        margin *= 2
    return start.clone()  # (never reached in practice) a zero update is within any bound


def _finite(x: float) -> float | None:
    """JSON-safe: inf (no noise) is written as null."""
    return x if math.isfinite(x) else None


def mechanisms(cfg: RunConfig, ctx: "RunContext") -> list[methods.Mechanism]:
    """The mechanisms the run's config asks for, in the order they wrap the round."""
    return [UserLevelDP(cfg, ctx.client_sizes)] if cfg.privacy.clip > 0 else []


def summary(cfg: RunConfig, rounds: int) -> dict[str, Any] | None:
    """metrics.json's `privacy` entry: the guarantee after `rounds` rounds (None when DP is off)."""
    p = cfg.privacy
    if not p.clip:
        return None
    q = float(cfg.system.participation)
    eps = epsilon(q, p.noise, rounds, p.delta)
    return {"epsilon": _finite(eps), "delta": p.delta, "noise_multiplier": p.noise, "clip": p.clip,
            "weighting": p.weighting, "sample_rate": q, "rounds": rounds, "accountant": ACCOUNTANT,
            "adjacency": "user-level (add or remove one client's data)"}
