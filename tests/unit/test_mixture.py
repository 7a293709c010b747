"""GaussianMixture (datasets/mixture.py) against independent references: scipy densities, autograd of a
dense-covariance density, closed-form Gaussian posteriors, quadrature, Monte Carlo."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
import torch
from scipy import integrate
from scipy.stats import multivariate_normal

from dfbench.datasets.mixture import GaussianMixture, fm_eps, fm_velocity, fm_x0, vp_eps

F64 = torch.float64


def random_mixture(K: int, d: int, r: int, seed: int, spread: float = 2.0, scale: float = 0.5) -> GaussianMixture:
    """A mixture with random weights (>= 0.2 / K-ish), means, factors and iso in [0.1, 0.4]."""
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(K, generator=g, dtype=F64) + 0.5
    return GaussianMixture(
        weights=w / w.sum(),
        means=spread * torch.randn(K, d, generator=g, dtype=F64),
        factors=scale * torch.randn(K, d, r, generator=g, dtype=F64),
        iso=0.1 + 0.3 * torch.rand(K, generator=g, dtype=F64),
    )


def dense_log_prob(mix: GaussianMixture, x: torch.Tensor) -> torch.Tensor:
    """log p(x) from dense covariances with torch.distributions (no Woodbury), differentiable in x."""
    cov = mix.covariance()
    comps = [mix.weights[k].log() + torch.distributions.MultivariateNormal(mix.means[k], cov[k]).log_prob(x)
             for k in range(mix.K)]
    return torch.logsumexp(torch.stack(comps, dim=1), dim=1)


def mc_tolerance(values: torch.Tensor, sigmas: float = 5.0) -> torch.Tensor:
    """sigmas x the Monte Carlo standard error of the mean of `values` along dim 0."""
    return sigmas * values.std(dim=0) / math.sqrt(values.shape[0])


# -- densities and score -------------------------------------------------------------------------


@pytest.mark.parametrize("rank", [2, 0])
def test_log_prob_matches_scipy(rank: int) -> None:
    # prepare
    mix = random_mixture(K=3, d=5, r=rank, seed=1)
    x, _ = mix.sample(50, torch.Generator().manual_seed(2))
    x = torch.cat([x, 3.0 * torch.randn(10, 5, generator=torch.Generator().manual_seed(3), dtype=F64)])  # tails too
    # execute
    comp = mix.component_log_prob(x).numpy()
    total = mix.log_prob(x).numpy()
    # assert
    ref = np.stack([math.log(float(mix.weights[k])) + multivariate_normal(mix.means[k].numpy(), mix.covariance(k).numpy())
                    .logpdf(x.numpy()) for k in range(mix.K)], axis=1)
    np.testing.assert_allclose(comp, ref, rtol=0, atol=1e-10)
    np.testing.assert_allclose(total, np.logaddexp.reduce(ref, axis=1), rtol=0, atol=1e-10)
    np.testing.assert_allclose(mix.responsibilities(x).sum(1).numpy(), 1.0, atol=1e-14)
    assert (mix.assign(x).numpy() == ref.argmax(1)).all()


def test_float32_input_is_computed_in_float64() -> None:
    # prepare
    mix = random_mixture(K=3, d=5, r=2, seed=1)
    x32 = torch.randn(20, 5, generator=torch.Generator().manual_seed(4)).to(torch.float32)
    # execute
    got = mix.log_prob(x32)
    # assert: the same as the float64 copy of the same numbers
    assert got.dtype == F64
    assert torch.equal(got, mix.log_prob(x32.to(F64)))


@pytest.mark.parametrize("rank", [2, 0])
def test_score_matches_autograd_of_dense_density(rank: int) -> None:
    # prepare
    mix = random_mixture(K=3, d=5, r=rank, seed=5)
    x, _ = mix.sample(40, torch.Generator().manual_seed(6))
    xr = x.clone().requires_grad_(True)
    # execute
    got = mix.score(x)
    (ref,) = torch.autograd.grad(dense_log_prob(mix, xr).sum(), xr)
    # assert
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-8)


def test_woodbury_at_mnist_size() -> None:
    """d = 784, K = 10, r = 16: the capacitance route equals a dense float64 Cholesky computation."""
    # prepare
    K, d, r = 10, 784, 16
    g = torch.Generator().manual_seed(7)
    mix = GaussianMixture(torch.full((K,), 1.0 / K, dtype=F64), torch.rand(K, d, generator=g, dtype=F64),
                          0.1 * torch.randn(K, d, r, generator=g, dtype=F64), 0.005 + 0.01 * torch.rand(K, generator=g, dtype=F64))
    x, _ = mix.sample(4, g)
    x = torch.cat([x, torch.rand(1, d, generator=g, dtype=F64)])
    # execute
    comp = mix.component_log_prob(x)
    score = mix.score(x)
    # assert: dense reference, Sigma_k = L L^T
    cov = mix.covariance()
    chol = torch.linalg.cholesky(cov)
    v = x[None] - mix.means[:, None]  # [K, n, d]
    half = torch.linalg.solve_triangular(chol, v.transpose(1, 2), upper=False)  # L^-1 v, [K, d, n]
    logdet = 2.0 * chol.diagonal(dim1=1, dim2=2).log().sum(1)
    ref = (mix.weights.log()[:, None] - 0.5 * (d * math.log(2 * math.pi) + logdet[:, None] + (half ** 2).sum(1))).T
    torch.testing.assert_close(comp, ref, rtol=1e-12, atol=0)  # log densities ~ 1e3: relative rounding
    prec_v = torch.cholesky_solve(v.transpose(1, 2), chol).transpose(1, 2)  # Sigma_k^-1 v, [K, n, d]
    ref_score = -(torch.softmax(ref, 1).T[:, :, None] * prec_v).sum(0)
    torch.testing.assert_close(score, ref_score, rtol=1e-8, atol=1e-8 * float(ref_score.abs().max()))


# -- moments and sampling ------------------------------------------------------------------------


def test_sample_matches_weights_mean_and_covariance() -> None:
    """200k draws: each estimate within 5 Monte Carlo standard errors (estimated from the draws
    themselves; false alarm < 1e-6 per entry, and the seed is fixed)."""
    # prepare
    mix = random_mixture(K=3, d=3, r=2, seed=8)
    n = 200_000
    # execute
    x, comp = mix.sample(n, torch.Generator().manual_seed(9))
    # assert
    onehot = torch.nn.functional.one_hot(comp, mix.K).to(F64)
    assert ((onehot.mean(0) - mix.weights).abs() <= mc_tolerance(onehot)).all()
    mean, cov = mix.moments()
    assert ((x.mean(0) - mean).abs() <= mc_tolerance(x)).all()
    centred = x - mean
    products = (centred[:, :, None] * centred[:, None, :]).reshape(n, -1)  # E of each is cov_ij
    assert ((products.mean(0) - cov.reshape(-1)).abs() <= mc_tolerance(products)).all()
    # the draws of one component have that component's mean
    for k in range(mix.K):
        xk = x[comp == k]
        assert ((xk.mean(0) - mix.means[k]).abs() <= mc_tolerance(xk)).all()


def test_sample_is_a_function_of_the_generator() -> None:
    # prepare
    mix = random_mixture(K=3, d=4, r=2, seed=10)
    # execute
    a = mix.sample(100, torch.Generator().manual_seed(11))
    b = mix.sample(100, torch.Generator().manual_seed(11))
    c = mix.sample(100, torch.Generator().manual_seed(12))
    # assert
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_moments_match_dense_formula() -> None:
    # prepare
    mix = random_mixture(K=4, d=3, r=1, seed=13)
    # execute
    mean, cov = mix.moments()
    # assert: cov = sum pi (Sigma + mu mu^T) - m m^T, the textbook form
    ref_mean = (mix.weights[:, None] * mix.means).sum(0)
    ref_cov = sum(mix.weights[k] * (mix.covariance(k) + torch.outer(mix.means[k], mix.means[k])) for k in range(mix.K))
    ref_cov = ref_cov - torch.outer(ref_mean, ref_mean)
    torch.testing.assert_close(mean, ref_mean, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(cov, ref_cov, rtol=1e-12, atol=1e-12)


def test_noised_is_the_law_of_a_x0_plus_s_eps() -> None:
    # prepare
    mix = random_mixture(K=3, d=3, r=2, seed=14)
    a, s = 0.6, 0.7
    n = 100_000
    g = torch.Generator().manual_seed(15)
    x0, _ = mix.sample(n, g)
    y = a * x0 + s * torch.randn(n, mix.d, generator=g, dtype=F64)
    # execute
    noisy = mix.noised(a, s)
    # assert: exact covariances a^2 Sigma_k + s^2 I, and the mixture's moments
    eye = torch.eye(mix.d, dtype=F64)
    torch.testing.assert_close(noisy.covariance(), a * a * mix.covariance() + s * s * eye, rtol=1e-14, atol=1e-15)
    mean, cov = mix.moments()
    nmean, ncov = noisy.moments()
    torch.testing.assert_close(nmean, a * mean, rtol=1e-14, atol=1e-15)
    torch.testing.assert_close(ncov, a * a * cov + s * s * eye, rtol=1e-13, atol=1e-14)
    # Monte Carlo: mean and second moments of the simulated a x0 + s eps
    assert ((y.mean(0) - nmean).abs() <= mc_tolerance(y)).all()
    centred = y - nmean
    products = (centred[:, :, None] * centred[:, None, :]).reshape(n, -1)
    assert ((products.mean(0) - ncov.reshape(-1)).abs() <= mc_tolerance(products)).all()
    # the named paths
    t, abar = 0.3, 0.8
    assert torch.equal(mix.fm(t).iso, mix.noised(1 - t, t).iso)
    torch.testing.assert_close(mix.vp(abar).iso, abar * mix.iso + (1 - abar), rtol=1e-15, atol=0)


# -- exact posterior means -----------------------------------------------------------------------


@pytest.mark.parametrize("t", [0.05, 0.5, 0.95])
def test_fm_posterior_of_one_gaussian_is_the_linear_formula(t: float) -> None:
    # prepare: K = 1, where E[x0 | x_t] = mu + a Sigma (a^2 Sigma + t^2 I)^-1 (x_t - a mu), a = 1 - t
    mix = random_mixture(K=1, d=4, r=2, seed=16)
    x_t = torch.randn(30, 4, generator=torch.Generator().manual_seed(17), dtype=F64) * 2.0
    a = 1.0 - t
    sigma, mu = mix.covariance(0), mix.means[0]
    gain = a * sigma @ torch.linalg.inv(a * a * sigma + t * t * torch.eye(4, dtype=F64))
    ref_x0 = mu + (x_t - a * mu) @ gain.T
    ref_eps = (x_t - a * ref_x0) / t  # x_t = a x0 + t eps, linear in (x0, eps)
    # execute
    got_x0, got_eps, got_v = fm_x0(mix, x_t, t), fm_eps(mix, x_t, t), fm_velocity(mix, x_t, t)
    # assert
    torch.testing.assert_close(got_x0, ref_x0, rtol=0, atol=1e-10)
    torch.testing.assert_close(got_eps, ref_eps, rtol=0, atol=1e-10)
    torch.testing.assert_close(got_v, ref_eps - ref_x0, rtol=0, atol=1e-10)


def test_fm_posterior_of_1d_mixture_by_quadrature() -> None:
    # prepare: K = 2, d = 1 (bimodal), posterior moments by numerical integration over x0
    mix = GaussianMixture(torch.tensor([0.3, 0.7], dtype=F64), torch.tensor([[-1.5], [1.0]], dtype=F64),
                          torch.zeros(2, 1, 0, dtype=F64), torch.tensor([0.04, 0.25], dtype=F64))

    def gauss(x: float, mean: float, sd: float) -> float:
        return math.exp(-0.5 * ((x - mean) / sd) ** 2) / (sd * math.sqrt(2 * math.pi))

    comps = [(float(mix.weights[k]), float(mix.means[k, 0]), math.sqrt(float(mix.iso[k]))) for k in range(2)]

    def prior(x0: float) -> float:
        return sum(w * gauss(x0, m, sd) for w, m, sd in comps)

    for t in (0.1, 0.4, 0.8):
        for xt in (-2.0, -0.3, 0.5, 1.7):
            like = lambda x0: prior(x0) * gauss(xt, (1 - t) * x0, t)  # noqa: E731
            z = integrate.quad(like, -12, 12, points=[-1.5, 1.0], epsabs=1e-14, epsrel=1e-12, limit=200)[0]
            m = integrate.quad(lambda x0: x0 * like(x0), -12, 12, points=[-1.5, 1.0], epsabs=1e-14,
                               epsrel=1e-12, limit=200)[0] / z
            x = torch.tensor([[xt]], dtype=F64)
            # execute
            got_x0, got_v = float(fm_x0(mix, x, t)), float(fm_velocity(mix, x, t))
            # assert: E[eps | x_t] = (x_t - (1 - t) E[x0 | x_t]) / t
            assert got_x0 == pytest.approx(m, abs=1e-6)
            assert got_v == pytest.approx((xt - (1 - t) * m) / t - m, abs=1e-6)


def test_the_ends_of_the_paths() -> None:
    # prepare
    mix = random_mixture(K=2, d=2, r=1, seed=18)
    x = torch.randn(5, 2, generator=torch.Generator().manual_seed(24), dtype=F64)
    # execute / assert: x0 and the velocity need t in (0, 1); eps is known at the ends (pure noise: eps = x)
    for t in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match="flow-matching time"):
            fm_x0(mix, x, t)
        with pytest.raises(ValueError, match="flow-matching time"):
            fm_velocity(mix, x, t)
    torch.testing.assert_close(fm_eps(mix, x, 1.0), x, rtol=0, atol=1e-15)
    torch.testing.assert_close(vp_eps(mix, x, 0.0), x, rtol=0, atol=1e-15)
    assert torch.equal(fm_eps(mix, x, 0.0), torch.zeros_like(x)) and torch.equal(vp_eps(mix, x, 1.0), torch.zeros_like(x))
    with pytest.raises(ValueError, match="abar"):
        vp_eps(mix, x, 1.5)


@pytest.mark.parametrize("t", [0.1, 0.5, 0.9])
def test_vp_eps_equals_fm_eps_at_matched_snr(t: float) -> None:
    # prepare: abar / (1 - abar) = (1 - t)^2 / t^2, and x_vp = x_fm sqrt(abar) / (1 - t) is the same (x0, eps)
    mix = random_mixture(K=3, d=4, r=2, seed=19)
    snr = (1 - t) ** 2 / t ** 2
    abar = snr / (1 + snr)
    x_fm = torch.randn(25, 4, generator=torch.Generator().manual_seed(20), dtype=F64)
    x_vp = x_fm * math.sqrt(abar) / (1 - t)
    # execute / assert
    torch.testing.assert_close(vp_eps(mix, x_vp, abar), fm_eps(mix, x_fm, t), rtol=1e-10, atol=1e-12)


def _posterior_x0(mix: GaussianMixture, x_t: torch.Tensor, t: float) -> tuple[torch.Tensor, torch.Tensor]:
    """E[x0 | x_t] [n, d] and tr Cov(x0 | x_t) [n], from the per-component Gaussian posteriors (dense,
    no Tweedie): x0 | x_t, k ~ N(m_k, V_k), V_k = (Sigma_k^-1 + a^2 / t^2 I)^-1,
    m_k = V_k (Sigma_k^-1 mu_k + a x_t / t^2); P(k | x_t) from N(x_t; a mu_k, a^2 Sigma_k + t^2 I)."""
    a, d = 1.0 - t, mix.d
    eye = torch.eye(d, dtype=F64)
    logs, ms, trs = [], [], []
    for k in range(mix.K):
        sigma = mix.covariance(k)
        prec = torch.linalg.inv(sigma)
        V = torch.linalg.inv(prec + (a * a / (t * t)) * eye)
        ms.append((prec @ mix.means[k] + a * x_t / (t * t)) @ V.T)
        trs.append(torch.trace(V))
        logs.append(math.log(float(mix.weights[k])) + torch.from_numpy(
            multivariate_normal(a * mix.means[k].numpy(), (a * a * sigma + t * t * eye).numpy()).logpdf(x_t.numpy())))
    resp = torch.softmax(torch.stack(logs, 1), 1)  # [n, K]
    m = torch.stack(ms, 1)  # [n, K, d]
    mean = (resp[:, :, None] * m).sum(1)
    second = (resp * (torch.stack(trs)[None] + (m * m).sum(2))).sum(1)
    return mean, second - (mean * mean).sum(1)


def test_exact_velocity_minimises_the_flow_matching_regression() -> None:
    # prepare: 50k pairs (x0, eps), target eps - x0, at t = 0.4
    mix = random_mixture(K=2, d=3, r=1, seed=21)
    t, n = 0.4, 50_000
    g = torch.Generator().manual_seed(22)
    x0, _ = mix.sample(n, g)
    eps = torch.randn(n, mix.d, generator=g, dtype=F64)
    x_t = (1 - t) * x0 + t * eps
    target = eps - x0
    # execute
    v = fm_velocity(mix, x_t, t)
    post_mean, post_tr = _posterior_x0(mix, x_t, t)
    # assert: v* = E[eps - x0 | x_t] = (x_t - E[x0 | x_t]) / t, from the dense posterior
    torch.testing.assert_close(v, (x_t - post_mean) / t, rtol=1e-9, atol=1e-9)
    # the loss of v* is the irreducible one, E tr Cov(eps - x0 | x_t) = E tr Cov(x0 | x_t) / t^2
    resid = ((target - v) ** 2).sum(1)
    irreducible = post_tr / t ** 2
    assert abs(float(resid.mean() - irreducible.mean())) <= float(mc_tolerance(resid - irreducible))
    # any other field loses: a constant shift c adds |c|^2, a scaled field (1 + h) v* adds h^2 E|v*|^2
    # (the cross terms vanish in expectation; 5 MC standard errors of them as tolerance)
    c = torch.tensor([0.3, -0.2, 0.1], dtype=F64)
    shifted = ((target - v - c) ** 2).sum(1)
    scaled = ((target - 1.1 * v) ** 2).sum(1)
    assert float(shifted.mean()) > float(resid.mean()) and float(scaled.mean()) > float(resid.mean())
    assert float((shifted - resid).mean()) == pytest.approx(float(c @ c), abs=float(mc_tolerance(shifted - resid)))
    assert float((scaled - resid).mean()) == pytest.approx(0.01 * float((v * v).sum(1).mean()),
                                                           abs=float(mc_tolerance(scaled - resid)))


# -- records and validation ----------------------------------------------------------------------


@pytest.mark.parametrize("rank", [2, 0])
def test_to_dict_round_trip_and_digest(rank: int) -> None:
    # prepare
    mix = random_mixture(K=3, d=4, r=rank, seed=23)
    # execute
    back = GaussianMixture.from_dict(json.loads(json.dumps(mix.to_dict())))
    # assert: bit-for-bit, same digest; the digest is the documented sha256
    for name in ("weights", "means", "factors", "iso"):
        assert torch.equal(getattr(back, name), getattr(mix, name))
    assert back.digest() == mix.digest()
    h = hashlib.sha256(np.array([3, 4, rank], dtype="<i8").tobytes())
    for name in ("weights", "means", "factors", "iso"):
        h.update(getattr(mix, name).numpy().astype("<f8").tobytes())
    assert mix.digest() == h.hexdigest()
    # one ulp anywhere changes it
    nudged = mix.means.clone()
    nudged[1, 2] = torch.nextafter(nudged[1, 2], torch.tensor(math.inf, dtype=F64))
    assert GaussianMixture(mix.weights, nudged, mix.factors, mix.iso).digest() != mix.digest()


def test_digest_is_pinned() -> None:
    """A fixed mixture's digest never changes (run folders record it)."""
    mix = GaussianMixture([0.25, 0.75], [[0.0, 1.0], [-1.0, 0.5]], [[[1.0], [0.0]], [[0.5], [0.5]]], [0.1, 0.2])
    expected = hashlib.sha256(
        np.array([2, 2, 1], "<i8").tobytes() + np.array([0.25, 0.75], "<f8").tobytes()
        + np.array([0.0, 1.0, -1.0, 0.5], "<f8").tobytes() + np.array([1.0, 0.0, 0.5, 0.5], "<f8").tobytes()
        + np.array([0.1, 0.2], "<f8").tobytes()).hexdigest()
    assert mix.digest() == expected


@pytest.mark.parametrize("change, match", [
    ({"weights": [0.5, 0.6]}, "sum to 1"),
    ({"weights": [1.5, -0.5]}, "positive"),
    ({"weights": [[0.5, 0.5]]}, "weights must be"),
    ({"means": [[0.0, 0.0, 0.0]]}, "means must be"),
    ({"factors": [[[1.0]], [[1.0]]]}, "factors must be"),
    ({"iso": [0.1, 0.0]}, "iso"),
    ({"iso": [0.1]}, "iso must be"),
    ({"means": [[0.0, math.nan], [1.0, 1.0]]}, "means has non-finite"),
])
def test_validation_names_the_problem(change: dict, match: str) -> None:
    fields = {"weights": [0.5, 0.5], "means": [[0.0, 0.0], [1.0, 1.0]], "factors": [[[1.0], [0.0]], [[0.0], [1.0]]],
              "iso": [0.1, 0.2]}
    fields.update(change)
    with pytest.raises(ValueError, match=match):
        GaussianMixture(**fields)
