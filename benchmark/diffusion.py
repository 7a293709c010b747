"""Diffusion objectives, schedules and samplers.

DDPM (Ho et al., 2020): x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) eps, the network predicts eps.
Flow matching / rectified flow (Lipman et al., 2023; Liu et al., 2023):
    x_t = (1 - t) x0 + t eps, t in [0, 1], the network predicts v = eps - x0.
Samplers: DDIM (Song et al., 2021, eta = 0) for DDPM; Euler and Heun for flow matching.
Both networks take a continuous time in [0, 1]: DDPM step i in {0..T-1} is fed as i / T.
"""

from __future__ import annotations

import hashlib
import math
from typing import Callable, Literal

import torch

Net = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


# Sampling batch. Measured on the 2-core CPU machine (small28, 1000 samples, 8 Heun steps, 2
# threads): batch 500 took 50.7 s, 256 36.3 s, 128 24.3 s, 64 26.0 s; large batches spend their
# time allocating and faulting in activations that no longer fit in the cache. A sample depends
# on its batch neighbours only through the convolution kernels' choice of algorithm: identical in
# that measurement, within ~1e-6 in general (a rare pixel can round to the next uint8 level), so
# a changed batch can move a score in its last digits and committed results name the one used.
SAMPLE_BATCH = 128


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
        self.abar64 = torch.cumprod(1 - betas, dim=0)  # float64 [T]
        self.abar = self.abar64.float()

    def loss(self, net: Net, x0: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """Simple loss ||eps - eps_hat(x_t, t)||^2 with t ~ U{0..T-1} (Ho et al., eq. 14)."""
        b = x0.shape[0]
        i = torch.randint(0, self.T, (b,), generator=gen, device=x0.device)
        eps = torch.randn(x0.shape, generator=gen, device=x0.device, dtype=x0.dtype)
        a = self.abar.to(x0.device)[i].view(b, 1, 1, 1)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * eps
        return (net(xt, i.float() / self.T) - eps).square().mean()

    @torch.no_grad()
    def sample(self, net: Net, noise: torch.Tensor, steps: int) -> torch.Tensor:
        """DDIM, eta = 0: x_{s} = sqrt(abar_s) x0_hat + sqrt(1 - abar_s) eps_hat over `steps` even steps."""
        idx = torch.linspace(self.T - 1, 0, steps).round().long().tolist()
        abar = self.abar64.to(noise.device)
        x = noise
        for j, i in enumerate(idx):
            t = torch.full((x.shape[0],), i / self.T, device=x.device)
            eps = net(x, t).double()
            a = abar[i]
            x0 = ((x.double() - (1 - a).sqrt() * eps) / a.sqrt()).clamp(-1, 1)
            a_next = abar[idx[j + 1]] if j + 1 < len(idx) else torch.ones((), dtype=torch.float64, device=x.device)
            eps = (x.double() - a.sqrt() * x0) / (1 - a).sqrt()  # re-derive eps after the clamp
            x = (a_next.sqrt() * x0 + (1 - a_next).sqrt() * eps).to(noise.dtype)
        return x


class FlowMatching:
    """Linear-path flow matching: x_t = (1 - t) x0 + t eps, target v = eps - x0."""

    def loss(self, net: Net, x0: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        b = x0.shape[0]
        t = torch.rand((b,), generator=gen, device=x0.device)
        eps = torch.randn(x0.shape, generator=gen, device=x0.device, dtype=x0.dtype)
        tt = t.view(b, 1, 1, 1)
        xt = (1 - tt) * x0 + tt * eps
        return (net(xt, t) - (eps - x0)).square().mean()

    @torch.no_grad()
    def sample(self, net: Net, noise: torch.Tensor, steps: int, method: Literal["euler", "heun"] = "heun") -> torch.Tensor:
        """Integrate dx/dt = v from t = 1 (noise) to t = 0 (data)."""
        ts = torch.linspace(1.0, 0.0, steps + 1).tolist()
        x = noise
        for t, t_next in zip(ts[:-1], ts[1:]):
            tb = torch.full((x.shape[0],), t, device=x.device)
            v = net(x, tb)
            x_euler = x + (t_next - t) * v
            if method == "heun" and t_next > 0:
                v2 = net(x_euler, torch.full_like(tb, t_next))
                x = x + (t_next - t) * 0.5 * (v + v2)
            else:
                x = x_euler
        return x.clamp(-1, 1)


def make_objective(name: str, schedule: str = "cosine", T: int = 1000) -> DDPM | FlowMatching:
    if name == "ddpm":
        return DDPM(schedule, T)  # type: ignore[arg-type]
    if name == "fm":
        return FlowMatching()
    raise ValueError(f"unknown objective {name!r}; allowed: ddpm, fm")


def default_sampler(objective: str) -> str:
    return "ddim" if objective == "ddpm" else "heun"


def sample(obj: DDPM | FlowMatching, net: Net, noise: torch.Tensor, sampler: str, steps: int) -> torch.Tensor:
    if isinstance(obj, DDPM):
        if sampler not in ("auto", "ddim"):
            raise ValueError(f"sampler {sampler!r} does not apply to DDPM; use ddim")
        return obj.sample(net, noise, steps)
    if sampler not in ("auto", "euler", "heun"):
        raise ValueError(f"sampler {sampler!r} does not apply to flow matching; use euler or heun")
    return obj.sample(net, noise, steps, "heun" if sampler == "auto" else sampler)  # type: ignore[arg-type]


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
