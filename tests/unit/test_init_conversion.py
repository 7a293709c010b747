"""train.init_objective=ddpm (benchmark/engine/diffusion.py `EpsAsVelocity`): a DDPM (epsilon-prediction) network
used as a flow-matching velocity network through the experts' schedule-aware conversion is exact at initialization.

On the ground-truth track the exact DDPM epsilon is known in closed form (datasets/mixture.py `vp_eps`), and so is
the exact flow-matching velocity (`fm_velocity`): the first, converted, is the second (float64, to rounding), inside
the schedule's SNR range. And a converted network samples what the DDPM network samples: the converted exact
network's Heun samples equal the DDPM network's DDIM samples from the same noises within the samplers' own
difference (each sampler against itself at twice the steps), and in the limit of many steps they meet.
"""

from __future__ import annotations

import pytest
import torch

from dfbench import datasets
from dfbench.benchmark.engine import diffusion
from dfbench.datasets.mixture import fm_velocity, vp_eps

F64 = torch.float64
MIX = "gmm:dim4"  # the ground-truth track's low-dimensional mixture (samples [1, 1, 4])


class ExactEps(torch.nn.Module):
    """The exact DDPM network of a mixture: eps*(x, s / T) at the (fractional) step s, abar_s on the log-SNR
    interpolation the conversion matches (`diffusion.ddpm_abar_at`; at an integer step, the schedule's abar)."""

    def __init__(self, mix: datasets.GaussianMixture, ddpm: diffusion.DDPM) -> None:
        super().__init__()
        self.mix, self.ddpm = mix, ddpm

    def forward(self, x: torch.Tensor, tin: torch.Tensor) -> torch.Tensor:
        abar = diffusion.ddpm_abar_at(tin.double() * self.ddpm.T, self.ddpm.abar64)
        assert bool((abar == abar[0]).all()), "one time per call (the samplers' and this test's)"
        return vp_eps(self.mix, x.reshape(x.shape[0], -1), float(abar[0])).reshape(x.shape).to(x.dtype)


def _rms(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).square().mean().sqrt())


def _heun(net: torch.nn.Module, noise: torch.Tensor, steps: int) -> torch.Tensor:
    """Flow matching's sampler (the velocity-space ODE, Heun) on an unbounded mixture: nothing clipped."""
    return diffusion.sample_ode(lambda x, t: net(x, torch.full((x.shape[0],), t, dtype=x.dtype)), noise, steps, "heun",
                                clip=False)


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_the_exact_ddpm_epsilon_converted_is_the_exact_flow_matching_velocity(schedule):
    # prepare: states of the flow-matching path at times across the schedule's SNR range (outside it the step is
    # clamped to the schedule's ends: the documented stabilizer, off the exact path)
    mix = datasets.mixture(MIX)
    ddpm = diffusion.DDPM(schedule, 1000)
    converted = diffusion.EpsAsVelocity(ExactEps(mix, ddpm), ddpm, clamp=False)
    t_min, t_max = diffusion.fm_time_of_step(ddpm.abar64[[0, -1]]).tolist()
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for t in torch.linspace(t_min, t_max, 33, dtype=F64).tolist():
        x0, _ = mix.sample(64, gen)
        eps = torch.randn(64, mix.d, generator=gen, dtype=F64)
        xt = ((1 - t) * x0 + t * eps).reshape(64, 1, 1, mix.d)
        # execute
        v = converted(xt, torch.full((64,), t, dtype=F64)).reshape(64, -1)
        # assert: equal to rounding (relative to the velocity's size at that time)
        exact = fm_velocity(mix, xt.reshape(64, -1), t)
        worst = max(worst, float((v - exact).abs().max() / exact.abs().max()))
    assert worst < 1e-7, f"{schedule}: the converted exact epsilon is off the exact velocity by {worst:.2e} (relative)"


class TimedLinear(torch.nn.Module):
    """A small network of (x, t): a linear map of the sample, scaled by the time."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(d, d)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.lin(x.flatten(1)).reshape(x.shape) * (1 + t.view(-1, *[1] * (x.dim() - 1)))


def test_the_wrapper_is_the_experts_conversion():
    # the conversion a run trains through is the one the expert mixtures sample through (ctx.velocity: DDPM.velocity),
    # and its parameters are the network's
    ddpm = diffusion.DDPM("cosine", 1000)
    torch.manual_seed(0)
    net = TimedLinear(4)
    wrapped = diffusion.EpsAsVelocity(net, ddpm, clamp=True)
    x, t = torch.randn(8, 1, 1, 4), torch.rand(8)
    assert torch.equal(wrapped(x, t), ddpm.velocity(net, x, t, clamp=True))
    assert [n for n, _ in wrapped.named_parameters()] == [f"net.{n}" for n, _ in net.named_parameters()]


def test_a_converted_network_samples_what_the_ddpm_network_samples():
    # prepare: the exact DDPM network of the mixture, and it converted to a velocity network (nothing trained)
    mix = datasets.mixture(MIX)
    ddpm = diffusion.DDPM("cosine", 1000)
    net = ExactEps(mix, ddpm)
    converted = diffusion.EpsAsVelocity(net, ddpm, clamp=False)
    noise = torch.randn(64, 1, 1, mix.d, generator=torch.Generator().manual_seed(5), dtype=F64)
    n = 20  # eval.sampler_steps' default
    # execute: DDIM on the DDPM network, Heun on the converted one, from the same noises
    with torch.no_grad():
        ddim, ddim2 = ddpm.sample(net, noise, n, clip=False), ddpm.sample(net, noise, 2 * n, clip=False)
        heun, heun2 = _heun(converted, noise, n), _heun(converted, noise, 2 * n)
        unconverted = _heun(net, noise, n)  # the epsilon network taken for a velocity network
        ddim_all, heun_many = ddpm.sample(net, noise, ddpm.T, clip=False), _heun(converted, noise, 200)
    # assert: within the samplers' own difference (each against itself at twice the steps; for a first-order
    # sampler the error of n steps is about its change to 2n steps, so the two errors together bound the gap)
    own = _rms(ddim, ddim2) + _rms(heun, heun2)
    gap = _rms(heun, ddim)
    assert gap <= 2 * own, f"converted vs DDPM samples differ by {gap:.4f}, the samplers by themselves by {own:.4f}"
    # the conversion is what makes them agree: without it the same network samples something else
    assert _rms(unconverted, ddim) > 4 * gap
    # and with many steps the two samplers meet (DDIM through every step of the schedule, Heun with 200)
    assert _rms(heun_many, ddim_all) < 0.1 * _rms(ddim, ddim2)
