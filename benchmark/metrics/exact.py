"""Exact errors of a diffusion model trained on a Gaussian mixture whose score is known.

A model is a velocity field on the flow-matching path x_t = (1 - t) x0 + t eps (``velocity(x, t)``,
float32 ``[B, *shape]`` in and out: the suite's ``Method.velocity(params, ctx)``; DDPM networks are
evaluated in that same space). Its exact target is ``v*(x, t) = E[eps - x0 | x_t = x]``
(`dfbench.datasets.mixture.fm_velocity`), so its error needs no samples and no feature extractor.

**The score term of the KL bound.** For the forward SDE dx = f(t) x dt + g(t) dw whose marginals are
those of x_t = alpha_t x0 + sigma_t eps (here alpha = 1 - t, sigma = t),

    f = d log(alpha)/dt,   g^2 = d(sigma^2)/dt - 2 f sigma^2 = 2t + 2t^2 / (1 - t) = 2t / (1 - t),

and KL(p_data || p_model) <= KL(p_1 || N(0, I)) + 1/2 int_0^1 g(t)^2 E|s_hat - s*|^2 dt (Song et al.
2021, "Maximum likelihood training of score-based diffusion models"; Chen et al. 2023 for the
discretised sampler). With the log signal-to-noise ratio lambda = log(alpha^2 / sigma^2)
= 2 log((1 - t) / t) (Kingma et al. 2021, VDM), d lambda / dt = -2 / (t (1 - t)), and the score error
in terms of the noise prediction, s_hat - s* = -(eps_hat - eps*) / sigma, the integrand becomes

    g^2 |s_hat - s*|^2 dt = (2t / (1 - t)) |eps_hat - eps*|^2 / t^2 dt = |eps_hat - eps*|^2 |d lambda|,

so the score term is 1/2 int E|eps_hat - eps*|^2 d lambda (true on any Gaussian path: VDM eq. 17).
On the flow-matching path eps = x_t + (1 - t) v, hence eps_hat - eps* = (1 - t)(v_hat - v*) and
s_hat - s* = -((1 - t) / t)(v_hat - v*). `score_kl` integrates over lambda in [lambda(T_MAX),
lambda(T_MIN)] (the ends are cut: both tails need the model where it is never trained), with the
midpoint rule on `EXACT_BANDS` equal bands, `EXACT_DRAWS` fixed exact draws of x_t per node.

`sample_metrics` scores a sampler's output against the mixture: the shares of the mixture's components
(`component_tv`), the Frechet distance to the exact mixture moments (`frechet_exact`) and the mean
log density (`nll_gap`). `reference_sample_metrics` is what a perfect sampler scores with n samples.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np
import torch
from scipy import stats

from dfbench.datasets.mixture import GaussianMixture, fm_velocity

__all__ = [
    "EXACT_SEED", "EXACT_DRAWS", "EXACT_BANDS", "T_MIN", "T_MAX", "REFERENCE_DRAWS",
    "log_snr", "exact_times", "exact_draws", "score_error", "exact_velocity_fn",
    "frechet_gaussian", "sample_metrics", "reference_sample_metrics", "true_mean_log_density",
]

VelocityFn = Callable[[torch.Tensor, float], torch.Tensor]

EXACT_SEED = 20250101  # fixed for every run of a mixture: the draws are part of the metric's definition
EXACT_DRAWS = 256  # points per band
EXACT_BANDS = 16  # log-SNR bands (one node each)
T_MIN = 0.01
T_MAX = 0.99
REFERENCE_DRAWS = 20000  # draws behind E_p[log p], the reference of nll_gap
_REFERENCE_SEED = EXACT_SEED + 1  # its own stream: not the draws of score_error
_TRUE_MEAN_LOG_DENSITY: dict[tuple[str, int, int], float] = {}  # (digest, n, seed) -> value


def log_snr(t: float | np.ndarray) -> float | np.ndarray:
    """lambda(t) = log(alpha^2 / sigma^2) = 2 log((1 - t) / t) on the flow-matching path."""
    return 2.0 * np.log((1.0 - np.asarray(t, dtype=np.float64)) / np.asarray(t, dtype=np.float64))


def exact_times(bands: int = EXACT_BANDS) -> tuple[np.ndarray, float]:
    """Nodes t (ascending) and the band width d lambda of `bands` equal log-SNR bands of [lambda(T_MAX), lambda(T_MIN)].

    One node per band at the band's lambda-midpoint (midpoint rule), mapped back by t = 1 / (1 + e^(lambda / 2)).
    """
    if bands < 1:
        raise ValueError(f"bands must be >= 1, got {bands}")
    lo, hi = float(log_snr(T_MAX)), float(log_snr(T_MIN))
    dlam = (hi - lo) / bands
    lam = lo + (np.arange(bands, dtype=np.float64) + 0.5) * dlam
    t = 1.0 / (1.0 + np.exp(lam / 2.0))
    return t[::-1].copy(), dlam


def exact_draws(mix: GaussianMixture, times: Sequence[float], n: int, seed: int) -> list[tuple[torch.Tensor, float]]:
    """For each node t: n fresh exact draws x_t = (1 - t) x0 + t eps (float64 [n, d]), all from one generator."""
    gen = torch.Generator().manual_seed(int(seed))
    out = []
    for t in times:
        x0, _ = mix.sample(n, gen)
        eps = torch.randn(n, mix.d, dtype=torch.float64, generator=gen)
        out.append(((1.0 - float(t)) * x0 + float(t) * eps, float(t)))
    return out


def _check_shape(mix: GaussianMixture, shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(int(s) for s in shape)
    if math.prod(shape) != mix.d:
        raise ValueError(f"shape {shape} has {math.prod(shape)} entries, the mixture has d = {mix.d}")
    return shape


@torch.no_grad()
def _evaluate(velocity: VelocityFn, x: torch.Tensor, t: float, shape: tuple[int, ...], device: str | torch.device,
              batch: int) -> torch.Tensor:
    """velocity(x as float32 [b, *shape] on device, t) in batches of `batch` rows, back as float64 [n, d]."""
    parts = []
    for i in range(0, x.shape[0], batch):
        xb = x[i:i + batch].to(torch.float32).reshape(-1, *shape).to(device)
        vb = velocity(xb, t)
        if tuple(vb.shape) != tuple(xb.shape):
            raise ValueError(f"velocity returned shape {tuple(vb.shape)} for input {tuple(xb.shape)}")
        parts.append(vb.detach().to("cpu", torch.float64).reshape(xb.shape[0], -1))
    return torch.cat(parts)


def score_error(velocity: VelocityFn, mix: GaussianMixture, shape: Sequence[int], *, n: int = EXACT_DRAWS,
                bands: int = EXACT_BANDS, seed: int = EXACT_SEED, device: str | torch.device = "cpu",
                batch: int = 256) -> dict[str, Any]:
    """The model's exact error against the mixture's velocity, per log-SNR band and integrated (module docstring).

    Per band b (node t_b): velocity_mse = mean_i |v_hat - v*|^2 / d, eps_mse = (1 - t)^2 of that,
    score_mse = ((1 - t) / t)^2 of that. score_kl = 1/2 sum_b E|eps_hat - eps*|^2 d lambda (summed over
    coordinates), the score term of the KL bound; score_kl_ci: its 95 % t-interval over the n points
    (point i's value: its band-sum; point i of every band pairs up, the bands being independent draws).

    v* is evaluated at the float32-rounded x_t the model is given (not at the float64 draw): the model is
    judged at the point it sees, so input rounding is not charged to it. It would be amplified by the
    velocity's Jacobian -(I + t H_t) / (1 - t) (H_t: the Hessian of log p_t, |H_t| up to 1 / ((1 - t)^2 iso + t^2)),
    up to ~1 / (2 sqrt(iso)) for thin components: with iso = 1e-5 the exact model would score ~400x its
    float32 output rounding.
    """
    shape = _check_shape(mix, shape)
    times, dlam = exact_times(bands)
    d = mix.d
    per_point = torch.zeros(n, dtype=torch.float64)  # 1/2 sum_b |eps_hat - eps*|^2 d lambda, point by point
    vel, eps, score = [], [], []
    for x_t, t in exact_draws(mix, times, n, seed):
        x_seen = x_t.to(torch.float32).to(torch.float64)
        dv2 = ((_evaluate(velocity, x_seen, t, shape, device, batch) - fm_velocity(mix, x_seen, t)) ** 2).sum(1)
        de2 = (1.0 - t) ** 2 * dv2  # eps_hat - eps* = (1 - t)(v_hat - v*)
        per_point += 0.5 * de2 * dlam
        vel.append(float(dv2.mean()) / d)
        eps.append(float(de2.mean()) / d)
        score.append(float(((1.0 - t) / t) ** 2 * dv2.mean()) / d)  # s_hat - s* = -((1 - t) / t)(v_hat - v*)
    score_kl = float(per_point.mean())
    if n > 1:
        half = float(stats.t.ppf(0.975, n - 1)) * float(per_point.std(unbiased=True)) / math.sqrt(n)
        ci = [score_kl - half, score_kl + half]
    else:
        ci = [float("nan"), float("nan")]
    return {
        "score_kl": score_kl,
        "score_kl_per_dim": score_kl / d,
        "score_kl_ci": ci,
        "velocity_mse": float(np.mean(vel)),
        "times": [float(t) for t in times],
        "per_band": {"velocity_mse": vel, "eps_mse": eps, "score_mse": score},
        "lambda_range": [float(log_snr(T_MAX)), float(log_snr(T_MIN))],
        "draws": n,
        "seed": seed,
    }


def exact_velocity_fn(mix: GaussianMixture, shape: Sequence[int]) -> VelocityFn:
    """The exact model v*(x, t) as a network would be called: float32 [B, *shape] in and out, float64 inside (the
    exact-score anchor's own velocity, methods/exact_score.py)."""
    from dfbench.methods.exact_score import exact_velocity

    return exact_velocity(mix, _check_shape(mix, shape))


# -- sample metrics ------------------------------------------------------------------------------


def _psd_sqrt(a: torch.Tensor) -> torch.Tensor:
    """Symmetric square root through eigh; tiny negative eigenvalues (rounding) clamped to 0."""
    w, q = torch.linalg.eigh(0.5 * (a + a.T))
    return (q * w.clamp(min=0.0).sqrt()) @ q.T


def frechet_gaussian(m1: np.ndarray, c1: np.ndarray, m2: np.ndarray, c2: np.ndarray) -> float:
    """|m1 - m2|^2 + tr(C1 + C2 - 2 (C2^1/2 C1 C2^1/2)^1/2), float64, by symmetric eigendecompositions
    (Dowson & Landau 1982; tr (C2^1/2 C1 C2^1/2)^1/2 = tr (C1 C2)^1/2, with no non-symmetric sqrtm).

    torch's eigh, not numpy's: it follows torch's thread setting (numpy's BLAS threads took 3-8 s
    for one 784 x 784 eigh on a loaded two-core machine, torch 0.3 s).
    """
    m1, m2 = (torch.as_tensor(np.asarray(m, np.float64)) for m in (m1, m2))
    c1, c2 = (torch.as_tensor(np.atleast_2d(np.asarray(c, np.float64))) for c in (c1, c2))
    root2 = _psd_sqrt(c2)
    inner = root2 @ c1 @ root2
    cross = torch.linalg.eigvalsh(0.5 * (inner + inner.T)).clamp(min=0.0).sqrt().sum()
    return float(((m1 - m2) ** 2).sum() + c1.trace() + c2.trace() - 2.0 * cross)


def true_mean_log_density(mix: GaussianMixture, n: int = REFERENCE_DRAWS, seed: int = _REFERENCE_SEED) -> float:
    """E_p[log p] (minus the entropy) by Monte Carlo on n seeded draws, cached per (digest, n, seed)."""
    key = (mix.digest(), int(n), int(seed))
    if key not in _TRUE_MEAN_LOG_DENSITY:
        x, _ = mix.sample(n, torch.Generator().manual_seed(int(seed)))
        _TRUE_MEAN_LOG_DENSITY[key] = float(mix.log_prob(x).mean())
    return _TRUE_MEAN_LOG_DENSITY[key]


def sample_metrics(samples: torch.Tensor, mix: GaussianMixture) -> dict[str, Any]:
    """A sampler's output [n, *shape] scored against the mixture (flattened to [n, d], float64).

    component_tv = 1/2 sum_k |share_k - pi_k| (share_k: fraction assigned to component k by mix.assign;
    overlapping components make it > 0 even for exact draws: compare with `reference_sample_metrics`);
    frechet_exact: Frechet distance between N(sample mean, sample cov (ddof 1)) and N(mixture moments);
    mean_log_density = mean log p(x); nll_gap = E_p[log p] - mean log p(samples) (0 for a perfect sampler;
    > 0: samples where p is low; < 0: samples crowd its high-density regions, e.g. too narrow).
    Rows with a non-finite entry are counted (``nonfinite``) and left out of every metric (``note`` says so).
    """
    x = torch.as_tensor(samples).detach().to("cpu", torch.float64)
    x = x.reshape(x.shape[0], -1)
    if x.shape[1] != mix.d:
        raise ValueError(f"samples have {x.shape[1]} entries each, the mixture has d = {mix.d}")
    finite = torch.isfinite(x).all(1)
    nonfinite = int((~finite).sum())
    x = x[finite]
    n = x.shape[0]
    out: dict[str, Any] = {"n": n, "nonfinite": nonfinite}
    if nonfinite:
        out["note"] = f"{nonfinite} of {n + nonfinite} samples non-finite: scored the {n} finite ones"
    reference = true_mean_log_density(mix)
    out["true_mean_log_density"] = reference
    if n < 2:  # no sample covariance
        nan = float("nan")
        out.update(component_tv=nan, component_shares=[nan] * mix.K, frechet_exact=nan, frechet_exact_per_dim=nan,
                   mean_log_density=nan, nll_gap=nan)
        return out
    shares = torch.bincount(mix.assign(x), minlength=mix.K).to(torch.float64) / n
    mean, cov = mix.moments()
    xn = x.numpy()
    fd = frechet_gaussian(xn.mean(0), np.cov(xn, rowvar=False, ddof=1), mean.numpy(), cov.numpy())
    mld = float(mix.log_prob(x).mean())
    out.update(
        component_tv=0.5 * float((shares - mix.weights).abs().sum()),
        component_shares=shares.tolist(),
        frechet_exact=fd,
        frechet_exact_per_dim=fd / mix.d,
        mean_log_density=mld,
        nll_gap=reference - mld,
    )
    return out


def reference_sample_metrics(mix: GaussianMixture, n: int, seed: int) -> dict[str, Any]:
    """`sample_metrics` of n fresh exact draws: what a perfect sampler scores with n samples (the floor)."""
    x, _ = mix.sample(n, torch.Generator().manual_seed(int(seed)))
    return sample_metrics(x, mix)
