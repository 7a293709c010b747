"""Velocity space: one ODE sampler for experts trained with different objectives.

Heterogeneous decentralized diffusion (2026) unifies epsilon-prediction (DDPM) and
flow-matching experts by expressing every prediction as a velocity on the
flow-matching path

    x_t = (1 - t) x0 + t eps,   t in [0, 1],   v = eps - x0            (FM, Lipman et al. 2023)

A DDPM expert was trained on y_i = sqrt(abar_i) x0 + sqrt(1 - abar_i) eps. The two paths
have the same signal-to-noise ratio when

    abar / (1 - abar) = (1 - t)^2 / t^2,                                (SNR matching)

and then y = x_t / sqrt((1 - t)^2 + t^2) exactly (divide x_t by its signal + noise norm).
So the DDPM expert is queried at the (fractional) step s whose SNR matches, with the rescaled
input, and its epsilon is turned into a velocity:

    x0_hat = (x_t - t eps_hat) / (1 - t),   v = eps_hat - x0_hat.

Stabilizers (documented, both off the exact path only at the edges):
  * the step s is clamped to [0, T-1]: outside the SNR range of the DDPM schedule the
    expert is queried at its nearest trained step;
  * a floor on 1 - t in the x0_hat denominator: 1 - t_max, where t_max is the FM time whose SNR
    matches the schedule's last step (about 1.6e-3 for cosine, T = 1000). Above t_max the DDPM
    expert has never seen that noise level and eps -> x0 is ill-conditioned (division by ~0);
  * x0_hat clamped to [-1, 1] (the data range), as DDIM does: v changes only where |x0_hat| > 1,
    which in practice is the first step or two near t = 1.
"""

from __future__ import annotations

from typing import Callable, Literal

import torch

Net = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
VelocityFn = Callable[[torch.Tensor, float], torch.Tensor]


# -- SNR matching -----------------------------------------------------------------------------

def ddpm_logsnr(abar64: torch.Tensor) -> torch.Tensor:
    """log SNR of each DDPM step: log(abar / (1 - abar)), strictly decreasing in the step index."""
    a = abar64.double()
    return a.log() - torch.log1p(-a)


def fm_logsnr(t: torch.Tensor) -> torch.Tensor:
    """log SNR of the FM path at time t: 2 log((1 - t) / t) (+inf at t = 0, -inf at t = 1)."""
    t = t.double()
    return 2.0 * (torch.log1p(-t) - t.log())


def fm_time_of_logsnr(lam: torch.Tensor) -> torch.Tensor:
    """Inverse of fm_logsnr: t = 1 / (1 + exp(lam / 2)) = sigmoid(-lam / 2)."""
    return torch.sigmoid(-0.5 * lam.double())


def match_ddpm_index(t: torch.Tensor, abar64: torch.Tensor) -> torch.Tensor:
    """Fractional DDPM step s in [0, T-1] whose SNR equals the FM SNR at time t (float64).

    log SNR is interpolated linearly between integer steps, so at t_i = fm_time(abar_i) the
    result is exactly i; outside the schedule's SNR range s is clamped to 0 or T-1.
    """
    lam_steps = ddpm_logsnr(abar64).to(t.device)  # decreasing in i
    xs = lam_steps.flip(0)  # increasing: knot j <-> step T-1-j
    T = xs.numel()
    q = fm_logsnr(t).clamp(float(xs[0]), float(xs[-1]))
    j = torch.searchsorted(xs, q, right=True).clamp(1, T - 1)
    x0, x1 = xs[j - 1], xs[j]
    w = (q - x0) / (x1 - x0).clamp_min(1e-300)
    knot = (j - 1).double() + w  # fractional position among the increasing knots
    return (T - 1) - knot


def ddpm_abar_at(s: torch.Tensor, abar64: torch.Tensor) -> torch.Tensor:
    """abar at a fractional step s, on the same log-SNR interpolation as match_ddpm_index."""
    lam = ddpm_logsnr(abar64).to(s.device)
    T = lam.numel()
    s = s.double().clamp(0, T - 1)
    i0 = s.floor().long().clamp(0, T - 2)
    w = s - i0.double()
    return torch.sigmoid(lam[i0] + w * (lam[i0 + 1] - lam[i0]))


def fm_time_of_step(abar64: torch.Tensor) -> torch.Tensor:
    """FM time t_i with the same SNR as DDPM step i: sqrt(1 - abar) / (sqrt(abar) + sqrt(1 - abar))."""
    a = abar64.double()
    return (1 - a).sqrt() / (a.sqrt() + (1 - a).sqrt())


# -- epsilon -> velocity --------------------------------------------------------------------

def _col(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[B] -> [B, 1, ..., 1] broadcastable against `like`."""
    return v.reshape(-1, *([1] * (like.dim() - 1)))


def eps_to_velocity(eps_hat: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor, one_minus_t_floor: float = 0.0,
                    clamp: bool = True) -> torch.Tensor:
    """v = eps_hat - x0_hat with x0_hat = (x_t - t eps_hat) / max(1 - t, floor), optionally clamped to [-1, 1].

    Computed in float64; t is [B] (one time per sample). Returns float64.
    """
    tt = _col(t.double(), x_t)
    eps = eps_hat.double()
    x0 = (x_t.double() - tt * eps) / (1 - tt).clamp_min(max(one_minus_t_floor, 1e-12))
    if clamp:
        x0 = x0.clamp(-1.0, 1.0)
    return eps - x0


def ddpm_velocity(net: Net, x_t: torch.Tensor, t: torch.Tensor, abar64: torch.Tensor, clamp: bool = True) -> torch.Tensor:
    """Velocity of a DDPM (epsilon) network at FM state (x_t, t) by SNR matching; same dtype as x_t.

    The network is fed the rescaled state x_t / sqrt((1 - t)^2 + t^2) and its continuous step
    s / T (training fed step i as i / T).
    """
    T = abar64.numel()
    t64 = t.double().to(x_t.device)
    s = match_ddpm_index(t64, abar64)
    scale = _col(((1 - t64).square() + t64.square()).sqrt(), x_t)
    eps_hat = net((x_t.double() / scale).to(x_t.dtype), (s / T).to(x_t.dtype))
    floor = 1.0 - float(fm_time_of_step(abar64[-1:])[0])  # 1 - t_max (see the module docstring)
    return eps_to_velocity(eps_hat, x_t, t64, floor, clamp).to(x_t.dtype)


# -- the one velocity-space ODE sampler -----------------------------------------------------

@torch.no_grad()
def sample_ode(velocity: VelocityFn, noise: torch.Tensor, steps: int, method: Literal["euler", "heun"] = "heun") -> torch.Tensor:
    """Integrate dx/dt = v(x, t) from t = 1 (noise) to t = 0 (data) on an even grid, then clip to [-1, 1].

    The same update as FlowMatching.sample (Euler; Heun = trapezoid with an Euler predictor,
    no corrector on the last step into t = 0), so one FM model sampled here gives the same result.
    """
    ts = torch.linspace(1.0, 0.0, steps + 1).tolist()
    x = noise
    for t, t_next in zip(ts[:-1], ts[1:]):
        v = velocity(x, t)
        x_euler = x + (t_next - t) * v
        if method == "heun" and t_next > 0:
            v2 = velocity(x_euler, t_next)
            x = x + (t_next - t) * 0.5 * (v + v2)
        else:
            x = x_euler
    return x.clamp(-1, 1)
