"""Diffusion objectives, schedules and samplers, and the velocity space that unifies them.

DDPM (Ho et al., 2020): x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) eps, the network predicts eps.
Flow matching / rectified flow (Lipman et al., 2023; Liu et al., 2023):
    x_t = (1 - t) x0 + t eps, t in [0, 1], the network predicts v = eps - x0.
Samplers: DDIM (Song et al., 2021, eta = 0) for DDPM; Euler and Heun for flow matching.
Both networks take a continuous time in [0, 1]: DDPM step i in {0..T-1} is fed as i / T.

Each objective exposes its noising in two parts: `draw(...)` (the random time, then the
noise, from one generator) and `noised(x0, time, eps)` (elementwise maths that broadcast
over leading dimensions). `loss` is those two plus the regression, so the batched clients
(one generator per client, benchmark/engine/batched.py) reuse exactly the same maths. A
third objective implements the same three methods and `sample`.

The velocity space (second half of this file) turns any objective's prediction into a
velocity on the flow-matching path, for the expert mixtures of methods/experts.py, and
`sample_ode` is the one velocity-space ODE integrator (FlowMatching.sample is it too).
"""

from __future__ import annotations

import hashlib
import math
from typing import Callable, Literal

import torch

Net = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


# -- schedules (named factories) --------------------------------------------------------

def linear_betas(T: int) -> torch.Tensor:
    """Ho et al. (2020): beta linear from 1e-4 to 0.02 (scaled for T != 1000)."""
    scale = 1000.0 / T
    return torch.linspace(scale * 1e-4, scale * 0.02, T, dtype=torch.float64)


def cosine_betas(T: int, s: float = 0.008) -> torch.Tensor:
    """Nichol & Dhariwal (2021), eq. 17: abar(t) = cos^2(((t/T + s)/(1 + s)) pi/2), betas clipped at 0.999."""
    steps = torch.arange(T + 1, dtype=torch.float64) / T
    f = torch.cos((steps + s) / (1 + s) * math.pi / 2) ** 2
    abar = f / f[0]
    return (1 - abar[1:] / abar[:-1]).clamp(max=0.999)


SCHEDULES: dict[str, Callable[[int], torch.Tensor]] = {"linear": linear_betas, "cosine": cosine_betas}


class DDPM:
    """Epsilon-prediction DDPM with a discrete schedule of T steps."""

    def __init__(self, schedule: Literal["linear", "cosine"] = "cosine", T: int = 1000) -> None:
        self.T = T
        betas = SCHEDULES[schedule](T)
        self.abar64 = torch.cumprod(1 - betas, dim=0)  # float64 [T], on the CPU
        self.abar = self.abar64.float()
        # the schedule on each device it is used on, copied once: indexing a CPU schedule from a
        # GPU loss would copy it host-to-device (and synchronise the stream) at every local step
        self._on: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
        # 1 - t_max of the velocity conversion (see the velocity space below), as a Python float
        self.velocity_floor = 1.0 - float(fm_time_of_step(self.abar64[-1:])[0])

    def schedule_on(self, device: torch.device | str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """abar as `dtype` on `device`, cached (float32: the training schedule; float64: sampling)."""
        key = (torch.device(device), dtype)
        if key not in self._on:
            self._on[key] = (self.abar if dtype == torch.float32 else self.abar64).to(device=key[0], dtype=dtype)
        return self._on[key]

    def draw(self, shape: tuple[int, ...], gen: torch.Generator, device: torch.device | str,
             dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """(step i ~ U{0..T-1} per image, eps ~ N(0, I)) for a batch of `shape`, time first."""
        i = torch.randint(0, self.T, (shape[0],), generator=gen, device=device)
        eps = torch.randn(shape, generator=gen, device=device, dtype=dtype)
        return i, eps

    def noised(self, x0: torch.Tensor, i: torch.Tensor, eps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(x_t, the network's time i / T, the regression target eps); i has x0's leading dims."""
        a = self.schedule_on(x0.device)[i].view(*i.shape, *[1] * (x0.dim() - i.dim()))
        return a.sqrt() * x0 + (1 - a).sqrt() * eps, i.float() / self.T, eps

    def loss(self, net: Net, x0: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """Simple loss ||eps - eps_hat(x_t, t)||^2 with t ~ U{0..T-1} (Ho et al., eq. 14)."""
        xt, tin, target = self.noised(x0, *self.draw(tuple(x0.shape), gen, x0.device, x0.dtype))
        return (net(xt, tin) - target).square().mean()

    def velocity(self, net: Net, x_t: torch.Tensor, t: torch.Tensor, clamp: bool = True) -> torch.Tensor:
        """`ddpm_velocity` of this schedule, from its copy on x_t's device."""
        return ddpm_velocity(net, x_t, t, self.schedule_on(x_t.device, torch.float64), clamp, floor=self.velocity_floor)

    @torch.no_grad()
    def sample(self, net: Net, noise: torch.Tensor, steps: int, clip: bool = True) -> torch.Tensor:
        """DDIM, eta = 0: x_{s} = sqrt(abar_s) x0_hat + sqrt(1 - abar_s) eps_hat over `steps` even steps.
        `clip`: x0_hat clamped to the pixel range [-1, 1] (images); False for unbounded data (gmm: mixtures)."""
        idx = torch.linspace(self.T - 1, 0, steps).round().long().tolist()
        abar = self.schedule_on(noise.device, torch.float64)
        x = noise
        for j, i in enumerate(idx):
            t = torch.full((x.shape[0],), i / self.T, device=x.device)
            eps = net(x, t).double()
            a = abar[i]
            x0 = (x.double() - (1 - a).sqrt() * eps) / a.sqrt()
            if clip:
                x0 = x0.clamp(-1, 1)
            a_next = abar[idx[j + 1]] if j + 1 < len(idx) else torch.ones((), dtype=torch.float64, device=x.device)
            eps = (x.double() - a.sqrt() * x0) / (1 - a).sqrt()  # re-derive eps after the clamp
            x = (a_next.sqrt() * x0 + (1 - a_next).sqrt() * eps).to(noise.dtype)
        return x


class FlowMatching:
    """Linear-path flow matching: x_t = (1 - t) x0 + t eps, target v = eps - x0.

    time_sampling: "uniform" (t ~ U[0, 1)) or "logit_normal" (t = sigmoid(n), n ~ N(0, 1): Esser et
    al. 2024, section 3.1, with m = 0, s = 1; the same regression, more samples of mid-path times).
    """

    def __init__(self, time_sampling: Literal["uniform", "logit_normal"] = "uniform") -> None:
        if time_sampling not in ("uniform", "logit_normal"):
            raise ValueError(f"unknown time_sampling {time_sampling!r}; allowed: uniform, logit_normal")
        self.time_sampling = time_sampling

    def draw(self, shape: tuple[int, ...], gen: torch.Generator, device: torch.device | str,
             dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """(t per image, eps ~ N(0, I)) for a batch of `shape`, time first (one generator, in that order)."""
        if self.time_sampling == "logit_normal":
            t = torch.sigmoid(torch.randn((shape[0],), generator=gen, device=device))
        else:
            t = torch.rand((shape[0],), generator=gen, device=device)
        eps = torch.randn(shape, generator=gen, device=device, dtype=dtype)
        return t, eps

    def noised(self, x0: torch.Tensor, t: torch.Tensor, eps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(x_t = (1 - t) x0 + t eps, the network's time t, the target v = eps - x0); t has x0's leading dims."""
        tt = t.view(*t.shape, *[1] * (x0.dim() - t.dim()))
        return (1 - tt) * x0 + tt * eps, t, eps - x0

    def loss(self, net: Net, x0: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        xt, tin, target = self.noised(x0, *self.draw(tuple(x0.shape), gen, x0.device, x0.dtype))
        return (net(xt, tin) - target).square().mean()

    @torch.no_grad()
    def sample(self, net: Net, noise: torch.Tensor, steps: int, method: Literal["euler", "heun"] = "heun",
               clip: bool = True) -> torch.Tensor:
        """Integrate dx/dt = v from t = 1 (noise) to t = 0 (data): the velocity-space ODE of `sample_ode`."""
        return sample_ode(lambda x, t: net(x, torch.full((x.shape[0],), t, device=x.device)), noise, steps, method, clip)


def make_objective(name: str, schedule: str = "cosine", T: int = 1000, time_sampling: str = "uniform") -> DDPM | FlowMatching:
    if name == "ddpm":
        return DDPM(schedule, T)  # type: ignore[arg-type]
    if name == "fm":
        return FlowMatching(time_sampling)  # type: ignore[arg-type]
    raise ValueError(f"unknown objective {name!r}; allowed: ddpm, fm")


def default_sampler(objective: str) -> str:
    return "ddim" if objective == "ddpm" else "heun"


def sample(obj: DDPM | FlowMatching, net: Net, noise: torch.Tensor, sampler: str, steps: int,
           clip: bool = True) -> torch.Tensor:
    """`obj`'s sampler; `clip`: samples (and DDIM's x0 estimates) kept in the pixel range [-1, 1]."""
    if isinstance(obj, DDPM):
        if sampler not in ("auto", "ddim"):
            raise ValueError(f"sampler {sampler!r} does not apply to DDPM; use ddim")
        return obj.sample(net, noise, steps, clip)
    if sampler not in ("auto", "euler", "heun"):
        raise ValueError(f"sampler {sampler!r} does not apply to flow matching; use euler or heun")
    return obj.sample(net, noise, steps, "heun" if sampler == "auto" else sampler, clip)  # type: ignore[arg-type]


# -- the fixed noises ---------------------------------------------------------------------

def noise_seed(base: int, index: int) -> int:
    """Seed of sample `index`'s starting noise: a hash, so seeds never collide across bases."""
    return int.from_bytes(hashlib.sha256(f"noise:{base}:{index}".encode()).digest()[:8], "little") >> 1


def fixed_noise(n: int, shape: tuple[int, ...], base: int = 0, start: int = 0) -> torch.Tensor:
    """Noise for samples start..start+n-1, each from its own seed: the same seeds give the same
    starting noise for every method and every batch size (float32, CPU)."""
    out = torch.empty((n, *shape))
    g = torch.Generator()
    for j in range(n):
        g.manual_seed(noise_seed(base, start + j))
        out[j] = torch.randn(shape, generator=g)
    return out


# == velocity space =========================================================================
# Velocity space: one ODE sampler for experts trained with different objectives.
#
# Heterogeneous decentralized diffusion (2026) unifies epsilon-prediction (DDPM) and
# flow-matching experts by expressing every prediction as a velocity on the
# flow-matching path
#
#     x_t = (1 - t) x0 + t eps,   t in [0, 1],   v = eps - x0            (FM, Lipman et al. 2023)
#
# A DDPM expert was trained on y_i = sqrt(abar_i) x0 + sqrt(1 - abar_i) eps. The two paths
# have the same signal-to-noise ratio when
#
#     abar / (1 - abar) = (1 - t)^2 / t^2,                                (SNR matching)
#
# and then y = x_t / sqrt((1 - t)^2 + t^2) exactly (divide x_t by its signal + noise norm).
# So the DDPM expert is queried at the (fractional) step s whose SNR matches, with the rescaled
# input, and its epsilon is turned into a velocity:
#
#     x0_hat = (x_t - t eps_hat) / (1 - t),   v = eps_hat - x0_hat.
#
# Stabilizers (documented, both off the exact path only at the edges):
#   * the step s is clamped to [0, T-1]: outside the SNR range of the DDPM schedule the
#     expert is queried at its nearest trained step;
#   * a floor on 1 - t in the x0_hat denominator: 1 - t_max, where t_max is the FM time whose SNR
#     matches the schedule's last step (about 1.6e-3 for cosine, T = 1000). Above t_max the DDPM
#     expert has never seen that noise level and eps -> x0 is ill-conditioned (division by ~0);
#   * x0_hat clamped to [-1, 1] (the data range), as DDIM does: v changes only where |x0_hat| > 1,
#     which in practice is the first step or two near t = 1.

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
    q = fm_logsnr(t).clamp(xs[0], xs[-1])  # tensor bounds: no device-to-host sync
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


def ddpm_velocity(net: Net, x_t: torch.Tensor, t: torch.Tensor, abar64: torch.Tensor, clamp: bool = True,
                  floor: float | None = None) -> torch.Tensor:
    """Velocity of a DDPM (epsilon) network at FM state (x_t, t) by SNR matching; same dtype as x_t.

    The network is fed the rescaled state x_t / sqrt((1 - t)^2 + t^2) and its continuous step
    s / T (training fed step i as i / T). `floor`: 1 - t_max, computed from abar64 when not given
    (DDPM.velocity passes its cached one and the schedule already on x_t's device, so a GPU
    sampling step neither copies the schedule nor waits for the device).
    """
    T = abar64.numel()
    t64 = t.double().to(x_t.device)
    s = match_ddpm_index(t64, abar64)
    scale = _col(((1 - t64).square() + t64.square()).sqrt(), x_t)
    eps_hat = net((x_t.double() / scale).to(x_t.dtype), (s / T).to(x_t.dtype))
    if floor is None:
        floor = 1.0 - float(fm_time_of_step(abar64[-1:])[0])  # 1 - t_max (see the module docstring)
    return eps_to_velocity(eps_hat, x_t, t64, floor, clamp).to(x_t.dtype)


class EpsAsVelocity(torch.nn.Module):
    """A DDPM (epsilon-prediction) network used as a flow-matching velocity network: forward(x_t, t) is the velocity
    the expert mixtures convert its epsilon to at sampling time (`ddpm_velocity` of `ddpm`'s schedule, SNR matching),
    differentiable, so the network trains under flow matching from there (train.init_objective=ddpm: Heterogeneous
    DDM's experts started from a DDPM checkpoint). Exact at initialization: on data whose epsilon is known, the
    converted exact epsilon is the exact velocity (tests/unit/test_init_conversion.py). Its parameters are `net`'s,
    named "net.<name>"; `clamp`: x0_hat kept in the pixel range [-1, 1] (images), as the mixtures do."""

    def __init__(self, net: torch.nn.Module, ddpm: DDPM, clamp: bool = True) -> None:
        super().__init__()
        self.net = net
        self.ddpm = ddpm  # the schedule the weights were trained with (train.schedule, train.timesteps)
        self.clamp = clamp

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.ddpm.velocity(self.net, x, t, clamp=self.clamp)


# -- the one velocity-space ODE sampler -----------------------------------------------------

@torch.no_grad()
def sample_ode(velocity: VelocityFn, noise: torch.Tensor, steps: int, method: Literal["euler", "heun"] = "heun",
               clip: bool = True) -> torch.Tensor:
    """Integrate dx/dt = v(x, t) from t = 1 (noise) to t = 0 (data) on an even grid, then clip to [-1, 1]
    (`clip`; unbounded data, the gmm: mixtures, are left as they are).

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
    return x.clamp(-1, 1) if clip else x
