"""Exact metrics against a known mixture (benchmark/metrics/exact.py): hand-computed errors of perturbed
exact models, the KL weight by quadrature in t, Frechet by scipy's sqrtm, sample metrics of exact draws."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import pytest
import torch
from scipy import integrate, linalg

from dfbench.benchmark.metrics.exact import (EXACT_BANDS, T_MAX, T_MIN, exact_draws, exact_times, exact_velocity_fn,
                                             frechet_gaussian, reference_sample_metrics, sample_metrics, score_error)
from dfbench.datasets.mixture import GaussianMixture, fm_velocity

F64 = torch.float64
SHAPE = (1, 1, 8)


def random_mixture(K: int, d: int, r: int, seed: int, spread: float = 1.0) -> GaussianMixture:
    """Random weights, means (N(0, spread^2)), factors (scale 0.3) and iso in [0.01, 0.05]."""
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(K, generator=g, dtype=F64) + 0.5
    return GaussianMixture(w / w.sum(), spread * torch.randn(K, d, generator=g, dtype=F64),
                           0.3 * torch.randn(K, d, r, generator=g, dtype=F64), 0.01 + 0.04 * torch.rand(K, generator=g, dtype=F64))


@pytest.fixture(scope="module")
def mix() -> GaussianMixture:
    return random_mixture(K=3, d=8, r=2, seed=0)


def lambda_grid(bands: int) -> tuple[np.ndarray, float, float, float]:
    """Independent of exact_times: band midpoints in t (any order), d lambda, lambda_lo, lambda_hi."""
    lo, hi = 2 * math.log((1 - T_MAX) / T_MAX), 2 * math.log((1 - T_MIN) / T_MIN)
    dlam = (hi - lo) / bands
    mids = np.array([lo + (b + 0.5) * dlam for b in range(bands)])
    return 1 / (1 + np.exp(mids / 2)), dlam, lo, hi


def perturbed(mix: GaussianMixture, delta: Callable[[float], torch.Tensor]) -> Callable[[torch.Tensor, float], torch.Tensor]:
    """The exact model plus delta(t) (a [d] tensor), in float32 like a network."""
    exact = exact_velocity_fn(mix, SHAPE)

    def velocity(x: torch.Tensor, t: float) -> torch.Tensor:
        return exact(x, t) + delta(t).to(torch.float32).reshape(SHAPE)

    return velocity


# -- the time grid and the draws -----------------------------------------------------------------


def test_exact_times_are_log_snr_midpoints() -> None:
    # execute
    t, dlam = exact_times(8)
    # assert
    ref_t, ref_dlam, lo, hi = lambda_grid(8)
    assert dlam == pytest.approx(ref_dlam, rel=1e-14) and dlam * 8 == pytest.approx(hi - lo, rel=1e-14)
    np.testing.assert_allclose(t, np.sort(ref_t), rtol=1e-13)
    assert (np.diff(t) > 0).all() and T_MIN < t[0] and t[-1] < T_MAX


def test_exact_draws_are_fixed_and_have_the_path_law(mix: GaussianMixture) -> None:
    # execute
    a = exact_draws(mix, [0.3, 0.7], 20_000, seed=5)
    b = exact_draws(mix, [0.3, 0.7], 20_000, seed=5)
    # assert: same seed, same draws; fresh draws per node; the mean of x_t is (1 - t) E[x0]
    assert all(torch.equal(xa, xb) and ta == tb for (xa, ta), (xb, tb) in zip(a, b))
    mean, _ = mix.moments()
    for x_t, t in a:
        assert ((x_t.mean(0) - (1 - t) * mean).abs() <= 5 * x_t.std(0) / math.sqrt(x_t.shape[0])).all()
    assert not torch.equal(a[0][0] / 0.7, a[1][0] / 0.3)


# -- score_error ---------------------------------------------------------------------------------


@pytest.mark.parametrize("thin", [False, True])
def test_exact_model_error_is_float32_output_rounding(mix: GaussianMixture, thin: bool) -> None:
    """The exact model's only error is rounding its float64 velocity to float32: |fl(v) - v| <= 2^-24 |v|
    per coordinate (round to nearest), so each band's velocity_mse <= 2^-48 mean |v*|^2 / d. Measured:
    0.17 to 0.20 of the bound. Thin components (iso 1e-5, 1e-4) check that v* is taken at the float32 point
    the model sees: at the float64 draw, input rounding through the velocity's Jacobian gave 381x the bound."""
    # prepare
    if thin:
        mix = GaussianMixture(mix.weights[:2] / mix.weights[:2].sum(), 3 * mix.means[:2], mix.factors[:2],
                              torch.tensor([1e-5, 1e-4], dtype=F64))
    # execute
    res = score_error(exact_velocity_fn(mix, SHAPE), mix, SHAPE)
    # assert
    times = res["times"]
    for (x_t, t), mse in zip(exact_draws(mix, times, res["draws"], res["seed"]), res["per_band"]["velocity_mse"]):
        v = fm_velocity(mix, x_t.to(torch.float32), t)
        assert mse <= 2.0 ** -48 * float((v * v).sum(1).mean()) / mix.d
    assert len(times) == EXACT_BANDS
    assert 0 <= res["score_kl"] < 1e-12 and res["score_kl_per_dim"] == pytest.approx(res["score_kl"] / mix.d)


def test_constant_velocity_error_is_hand_computed(mix: GaussianMixture) -> None:
    # prepare: v_hat = v* + c, so eps error (1 - t) c and score error -((1 - t) / t) c
    c = torch.tensor([0.5, -0.25, 0.125, 1.0, 0.0, -0.5, 0.75, 0.25], dtype=F64)
    c2 = float(c @ c)
    # execute
    res = score_error(perturbed(mix, lambda t: c), mix, SHAPE)
    # assert (float32 output rounding: relative 1e-5)
    t, dlam, _, _ = lambda_grid(EXACT_BANDS)
    t = np.sort(t)
    band = res["per_band"]
    np.testing.assert_allclose(band["velocity_mse"], c2 / 8, rtol=1e-5)
    np.testing.assert_allclose(band["eps_mse"], (1 - t) ** 2 * c2 / 8, rtol=1e-5)
    np.testing.assert_allclose(band["score_mse"], ((1 - t) / t) ** 2 * c2 / 8, rtol=1e-5)
    assert res["velocity_mse"] == pytest.approx(c2 / 8, rel=1e-5)
    expected = 0.5 * sum((1 - tb) ** 2 * c2 * dlam for tb in t)
    assert res["score_kl"] == pytest.approx(expected, rel=1e-5)
    lo, hi = res["score_kl_ci"]
    assert lo <= res["score_kl"] <= hi and hi - lo < 1e-4 * expected  # every point has the same error


def test_lambda_weight_of_a_constant_eps_error(mix: GaussianMixture) -> None:
    # prepare: eps error e at every t <=> velocity error e / (1 - t)
    e = torch.linspace(-1.0, 1.0, 8, dtype=F64)
    model = perturbed(mix, lambda t: e / (1 - t))
    _, _, lo, hi = lambda_grid(1)
    for bands in (3, 16):
        # execute
        res = score_error(model, mix, SHAPE, n=32, bands=bands)
        # assert: 1/2 |e|^2 (lambda_hi - lambda_lo), whatever the band count
        assert res["score_kl"] == pytest.approx(0.5 * float(e @ e) * (hi - lo), rel=1e-5)
        assert res["lambda_range"] == pytest.approx([lo, hi], rel=1e-14)


def test_score_kl_equals_the_time_integral_with_g_squared(mix: GaussianMixture) -> None:
    """1/2 int g(t)^2 |ds|^2 dt with g^2 = 2t / (1 - t) on x_t = (1 - t) x0 + t eps, by quadrature in t,
    for a velocity error dv = c t, i.e. ds = -((1 - t) / t) dv = -(1 - t) c."""
    # prepare
    c = torch.tensor([1.0, -0.5, 0.25, 0.0, 0.5, -1.0, 0.75, 0.125], dtype=F64)
    c2 = float(c @ c)
    reference = integrate.quad(lambda t: 0.5 * (2 * t / (1 - t)) * (1 - t) ** 2 * c2, T_MIN, T_MAX, epsabs=0, epsrel=1e-12)[0]
    # execute
    res = score_error(perturbed(mix, lambda t: c * t), mix, SHAPE, n=16, bands=64)
    # assert: the midpoint rule in lambda on 64 bands is within 1e-3 of the integral (error O(dlambda^2))
    assert res["score_kl"] == pytest.approx(reference, rel=1e-3)


def test_score_error_does_not_depend_on_the_batch(mix: GaussianMixture) -> None:
    # prepare
    model = perturbed(mix, lambda t: torch.full((8,), 0.1, dtype=F64) * t)
    # execute
    a = score_error(model, mix, SHAPE, n=40, bands=4, batch=40)
    b = score_error(model, mix, SHAPE, n=40, bands=4, batch=7)
    # assert
    assert a["score_kl"] == pytest.approx(b["score_kl"], rel=1e-12)


def test_score_error_checks_the_shape(mix: GaussianMixture) -> None:
    with pytest.raises(ValueError, match="d = 8"):
        score_error(exact_velocity_fn(mix, SHAPE), mix, (1, 3, 3))


# -- sample metrics ------------------------------------------------------------------------------


def test_frechet_matches_scipy_sqrtm() -> None:
    # prepare: random moments (covariances A A^T + small ridge)
    rng = np.random.default_rng(1)
    d = 6
    a, b = rng.normal(size=(d, d)), rng.normal(size=(d, 3))
    c1, c2 = a @ a.T + 0.1 * np.eye(d), b @ b.T + 0.05 * np.eye(d)
    m1, m2 = rng.normal(size=d), rng.normal(size=d)
    # execute
    got = frechet_gaussian(m1, c1, m2, c2)
    # assert
    ref = ((m1 - m2) ** 2).sum() + np.trace(c1 + c2 - 2 * linalg.sqrtm(c1 @ c2).real)
    assert got == pytest.approx(ref, rel=1e-9)
    assert frechet_gaussian(m1, c1, m1, c1) == pytest.approx(0.0, abs=1e-10)


def test_frechet_exact_of_exact_draws_and_of_a_mean_shift(mix: GaussianMixture) -> None:
    # prepare
    n = 200_000
    x, _ = mix.sample(n, torch.Generator().manual_seed(3))
    mean, cov = mix.moments()
    # execute
    fresh = sample_metrics(x, mix)["frechet_exact"]
    # assert: estimation noise only. The coupling x = Sigma^1/2 z, y = C^1/2 z bounds the covariance term by
    # |C^1/2 - Sigma^1/2|_F^2 ~ sum_ij D_ij^2 / (sqrt(l_i) + sqrt(l_j))^2 (D = C - Sigma in Sigma's eigenbasis,
    # first order of the square root), and E D_ij^2 = Var(y_i y_j) / n; the mean term is tr Sigma / n.
    # Five replicates measured 0.5x to 1.8x this expectation; bound: 4x.
    lam, q = torch.linalg.eigh(cov)
    y = (x - mean) @ q
    var = (y[:, :, None] * y[:, None, :]).reshape(n, -1).var(0).reshape(mix.d, mix.d)
    root = lam.sqrt()
    expected = (float(cov.trace()) + float((var / (root[:, None] + root[None]) ** 2).sum())) / n
    assert 0 <= fresh < 4 * expected
    # samples whitened to the exact moments score 0, and a shift adds |shift|^2 exactly
    xn = x.numpy()
    whiten = np.linalg.cholesky(cov.numpy()) @ np.linalg.inv(np.linalg.cholesky(np.cov(xn, rowvar=False)))
    matched = mean.numpy() + (xn - xn.mean(0)) @ whiten.T
    shift = np.linspace(-0.5, 0.5, mix.d)
    assert sample_metrics(torch.from_numpy(matched), mix)["frechet_exact"] == pytest.approx(0.0, abs=1e-9)
    moved = sample_metrics(torch.from_numpy(matched + shift).reshape(n, *SHAPE), mix)
    assert moved["frechet_exact"] == pytest.approx(float(shift @ shift), rel=1e-9)
    assert moved["frechet_exact_per_dim"] == pytest.approx(float(shift @ shift) / mix.d, rel=1e-9)


def test_component_tv() -> None:
    # prepare: components 20 sd apart, so the argmax component of a draw is its own
    mix = random_mixture(K=3, d=8, r=2, seed=4, spread=10.0)
    n = 20_000
    x, comp = mix.sample(n, torch.Generator().manual_seed(6))
    # execute
    fresh = sample_metrics(x, mix)
    only = sample_metrics(x[comp == 1], mix)
    # assert: multinomial noise, E|share_k - pi_k| <= sqrt(pi_k (1 - pi_k) / n); 5 of them per component
    assert fresh["component_tv"] <= 0.5 * 5 * float((mix.weights * (1 - mix.weights) / n).sqrt().sum())
    assert fresh["component_shares"] == pytest.approx((torch.bincount(comp, minlength=3).to(F64) / n).tolist(), abs=1e-15)
    assert only["component_tv"] == pytest.approx(1 - float(mix.weights[1]), abs=1e-15)
    assert only["component_shares"] == [0.0, 1.0, 0.0]


def test_nll_gap_of_exact_and_rescaled_draws() -> None:
    """K = 1 Gaussian: log p(mu + c (x - mu)) = const - c^2 Q / 2, Q ~ chi^2_d, so the gap of samples
    rescaled about the mean by c is E_p log p - E log p(x_c) = (d / 2)(c^2 - 1): negative when too narrow."""
    # prepare
    mix = random_mixture(K=1, d=8, r=2, seed=7)
    n, d = 20_000, 8
    x, _ = mix.sample(n, torch.Generator().manual_seed(8))
    mu = mix.means[0]
    # execute
    fresh = reference_sample_metrics(mix, n, seed=8)
    narrow = sample_metrics(mu + 0.5 * (x - mu), mix)
    wide = sample_metrics(mu + 2.0 * (x - mu), mix)
    # assert: MC error of the sample mean (sd c^2 sqrt(2d) / 2) and of the 20000-draw reference (sd sqrt(2d) / 2)
    for c, res in ((1.0, fresh), (0.5, narrow), (2.0, wide)):
        tol = 5 * math.sqrt((c ** 4 / n + 1 / 20_000) * 2 * d) / 2
        assert res["nll_gap"] == pytest.approx(d / 2 * (c * c - 1), abs=tol)
        assert res["nll_gap"] == pytest.approx(res["true_mean_log_density"] - res["mean_log_density"], abs=1e-12)
    assert fresh["n"] == n and fresh["nonfinite"] == 0 and "note" not in fresh


def test_nonfinite_samples_are_counted_and_left_out(mix: GaussianMixture) -> None:
    # prepare
    x, _ = mix.sample(500, torch.Generator().manual_seed(9))
    bad = x.clone()
    bad[3, 0] = math.nan
    bad[10, 5] = math.inf
    bad[11, :] = -math.inf
    keep = torch.ones(500, dtype=torch.bool)
    keep[[3, 10, 11]] = False
    # execute
    res = sample_metrics(bad.to(torch.float32).reshape(500, *SHAPE), mix)
    # assert
    ref = sample_metrics(x[keep].to(torch.float32), mix)
    assert res["nonfinite"] == 3 and res["n"] == 497 and "3 of 500" in res["note"]
    for key in ("component_tv", "frechet_exact", "mean_log_density", "nll_gap"):
        assert res[key] == ref[key]
