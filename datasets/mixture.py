"""Gaussian mixtures with low-rank-plus-isotropic components: data whose score is known exactly.

A mixture ``p(x) = sum_k pi_k N(x; mu_k, Sigma_k)`` with ``Sigma_k = U_k U_k^T + s_k^2 I``
(``U_k``: d x r, ``s_k^2``: the isotropic variance ``iso``) stays a mixture of the same form under
every Gaussian noising ``x = a x0 + s eps`` (means ``a mu``, factors ``a U``, iso ``a^2 iso + s^2``),
so densities, scores and the posterior means of a diffusion model's targets are closed-form at every
noise level. Everything is float64; inputs may be float32 or float64 ``[n, d]``.

Densities use Woodbury's identity and the matrix determinant lemma through the r x r capacitance
``C = I_r + U^T U / s^2`` (never a d x d matrix, so d = 784 with r = 16 is cheap):

    Sigma^-1 v       = v / s^2 - U C^-1 U^T v / s^4
    v^T Sigma^-1 v   = |v|^2 / s^2 - |L^-1 U^T v|^2 / s^4          (C = L L^T, Cholesky)
    log det Sigma    = d log s^2 + log det C

Exact posterior quantities (Tweedie's formula; see `fm_x0`) are module functions: `fm_eps`,
`fm_x0`, `fm_velocity` on the flow-matching path ``x_t = (1 - t) x0 + t eps`` and `vp_eps` on the
variance-preserving (DDPM) path ``x = sqrt(abar) x0 + sqrt(1 - abar) eps``.

Layer 0: imports torch, numpy and the standard library only.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch

__all__ = ["GaussianMixture", "fm_eps", "fm_x0", "fm_velocity", "vp_eps"]

_F64 = torch.float64
# rows per block in the density and score passes: bounds the [rows, d] temporaries (25 MB at d = 784)
_ROWS = 4096
_LOG_2PI = math.log(2.0 * math.pi)


def _as_f64(value: Any) -> torch.Tensor:
    """A CPU float64 contiguous copy of a tensor, array or nested list."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(device="cpu", dtype=_F64).contiguous()
    return torch.as_tensor(np.asarray(value, dtype=np.float64), dtype=_F64).contiguous()


@dataclass(frozen=True, eq=False)
class GaussianMixture:
    """``sum_k pi_k N(mu_k, U_k U_k^T + iso_k I)``, float64 on the CPU.

    weights: [K], positive, summing to 1 (within 1e-9); means: [K, d]; factors: [K, d, r] (r may
    be 0: isotropic components); iso: [K], > 0. Inputs are converted to float64 CPU tensors.
    ``eq=False``: identity compares by object; compare mixtures with `digest`.
    """

    weights: torch.Tensor
    means: torch.Tensor
    factors: torch.Tensor
    iso: torch.Tensor

    def __post_init__(self) -> None:
        for name in ("weights", "means", "factors", "iso"):
            object.__setattr__(self, name, _as_f64(getattr(self, name)))
        w, mu, u, iso = self.weights, self.means, self.factors, self.iso
        if w.ndim != 1 or w.numel() == 0:
            raise ValueError(f"weights must be a non-empty [K] vector, got shape {tuple(w.shape)}")
        K = w.shape[0]
        if mu.ndim != 2 or mu.shape[0] != K or mu.shape[1] == 0:
            raise ValueError(f"means must be [K={K}, d] with d >= 1, got shape {tuple(mu.shape)}")
        d = mu.shape[1]
        if u.ndim != 3 or u.shape[:2] != (K, d):
            raise ValueError(f"factors must be [K={K}, d={d}, r], got shape {tuple(u.shape)}")
        if iso.shape != (K,):
            raise ValueError(f"iso must be [K={K}], got shape {tuple(iso.shape)}")
        for name in ("weights", "means", "factors", "iso"):
            if not bool(torch.isfinite(getattr(self, name)).all()):
                raise ValueError(f"{name} has non-finite entries")
        if not bool((w > 0).all()):
            raise ValueError(f"weights must be positive, got min {float(w.min())!r}")
        if abs(float(w.sum()) - 1.0) > 1e-9:
            raise ValueError(f"weights must sum to 1 (within 1e-9), got {float(w.sum())!r}")
        if not bool((iso > 0).all()):
            raise ValueError(f"iso (isotropic variance) must be > 0, got min {float(iso.min())!r}")

    # -- shape ---------------------------------------------------------------------------------

    @property
    def d(self) -> int:
        return int(self.means.shape[1])

    @property
    def K(self) -> int:
        return int(self.weights.shape[0])

    @property
    def rank(self) -> int:
        return int(self.factors.shape[2])

    # -- dense views (tests, small d) ------------------------------------------------------------

    def covariance(self, k: int | None = None) -> torch.Tensor:
        """Sigma_k = U_k U_k^T + iso_k I as a dense [d, d] float64 matrix, or all of them [K, d, d]."""
        eye = torch.eye(self.d, dtype=_F64)
        if k is not None:
            u = self.factors[k]
            return u @ u.T + self.iso[k] * eye
        return self.factors @ self.factors.transpose(1, 2) + self.iso[:, None, None] * eye

    def moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean [d] and covariance [d, d] of the whole mixture.

        cov = sum_k pi_k (Sigma_k + mu_k mu_k^T) - m m^T, written as sum_k pi_k (Sigma_k + c_k c_k^T)
        with c_k = mu_k - m (the same matrix without the cancellation of two large terms).
        """
        mean = self.weights @ self.means
        centred = self.means - mean
        cov = torch.einsum("k,kij->ij", self.weights, self.covariance())
        cov = cov + (centred.T * self.weights) @ centred
        return mean, 0.5 * (cov + cov.T)

    # -- noising ---------------------------------------------------------------------------------

    def noised(self, a: float, s: float) -> GaussianMixture:
        """The law of a x0 + s eps (x0 ~ self, eps ~ N(0, I)): means a mu, factors a U, iso a^2 iso + s^2."""
        a, s = float(a), float(s)
        if not (math.isfinite(a) and math.isfinite(s)):
            raise ValueError(f"noised needs finite a and s, got a={a!r}, s={s!r}")
        return GaussianMixture(self.weights, a * self.means, a * self.factors, a * a * self.iso + s * s)

    def fm(self, t: float) -> GaussianMixture:
        """Marginal of the flow-matching path x_t = (1 - t) x0 + t eps, t in [0, 1]."""
        if not 0.0 <= float(t) <= 1.0:
            raise ValueError(f"flow-matching time t must be in [0, 1], got {t!r}")
        return self.noised(1.0 - float(t), float(t))

    def vp(self, abar: float) -> GaussianMixture:
        """Marginal of the variance-preserving (DDPM) path sqrt(abar) x0 + sqrt(1 - abar) eps."""
        if not 0.0 <= float(abar) <= 1.0:
            raise ValueError(f"abar must be in [0, 1], got {abar!r}")
        return self.noised(math.sqrt(float(abar)), math.sqrt(1.0 - float(abar)))

    # -- sampling --------------------------------------------------------------------------------

    def sample(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """n draws (x float64 [n, d], component int64 [n]), a function of the generator's state only.

        Order of the draws: one uniform per sample (component by inverse CDF), z ~ N(0, I_r) [n, r],
        e ~ N(0, I_d) [n, d]; x = mu_c + U_c z + sqrt(iso_c) e.
        """
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        u = torch.rand(n, dtype=_F64, generator=gen)
        cdf = torch.cumsum(self.weights, 0)
        # min(): a uniform above the rounded cdf[-1] (< 1 by an ulp) still lands in the last component
        comp = torch.searchsorted(cdf, u, right=True).clamp_(max=self.K - 1)
        z = torch.randn(n, self.rank, dtype=_F64, generator=gen)
        e = torch.randn(n, self.d, dtype=_F64, generator=gen)
        x = self.means[comp] + self.iso[comp].sqrt()[:, None] * e
        # per component, so no [n, d, r] gather of the factors (2 GB at n = 20000, d = 784, r = 16)
        for k in range(self.K):
            rows = (comp == k).nonzero().squeeze(1)
            if rows.numel() and self.rank:
                x[rows] += z[rows] @ self.factors[k].T
        return x, comp

    # -- densities and scores --------------------------------------------------------------------

    @cached_property
    def _capacitance(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Cholesky L_k of C_k = I_r + U_k^T U_k / iso_k [K, r, r], and log det Sigma_k [K] (determinant lemma)."""
        gram = self.factors.transpose(1, 2) @ self.factors
        cap = torch.eye(self.rank, dtype=_F64) + gram / self.iso[:, None, None]
        chol = torch.linalg.cholesky(cap)
        logdet = self.d * self.iso.log() + 2.0 * chol.diagonal(dim1=1, dim2=2).log().sum(1)
        return chol, logdet

    def _block(self, x: torch.Tensor, want_score: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log pi_k + log N(x; mu_k, Sigma_k) [n, K] and, if asked, the score [n, d], for one block of rows."""
        chol, logdet = self._capacitance
        n, d = x.shape
        logp = torch.empty(n, self.K, dtype=_F64)
        solved = []  # C_k^-1 U_k^T v / iso_k^2, [n, r] per component (the low-rank half of Sigma_k^-1 v)
        for k in range(self.K):
            v = x - self.means[k]
            proj = v @ self.factors[k]  # U^T v, [n, r]
            s2 = self.iso[k]
            half = torch.linalg.solve_triangular(chol[k], proj.T, upper=False)  # L^-1 U^T v
            # Woodbury: v^T Sigma^-1 v = |v|^2 / s^2 - |L^-1 U^T v|^2 / s^4
            maha = (v * v).sum(1) / s2 - (half * half).sum(0) / (s2 * s2)
            logp[:, k] = self.weights[k].log() - 0.5 * (d * _LOG_2PI + logdet[k] + maha)
            if want_score:
                solved.append(torch.cholesky_solve(proj.T, chol[k]).T / (s2 * s2))
        if not want_score:
            return logp, None
        resp = torch.softmax(logp, dim=1)
        # score = sum_k r_k (-Sigma_k^-1 (x - mu_k)),  -Sigma^-1 v = -v / s^2 + U C^-1 U^T v / s^4;
        # the isotropic half summed over k without a [n, d] temporary per component
        r_over_s2 = resp / self.iso
        score = -(x * r_over_s2.sum(1, keepdim=True) - r_over_s2 @ self.means)
        if self.rank:
            weighted = torch.cat([resp[:, k:k + 1] * solved[k] for k in range(self.K)], dim=1)  # [n, K r]
            score = score + weighted @ self.factors.permute(1, 0, 2).reshape(d, self.K * self.rank).T
        return logp, score

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.as_tensor(x)
        if x.ndim != 2 or x.shape[1] != self.d:
            raise ValueError(f"x must be [n, d={self.d}], got shape {tuple(x.shape)}")
        return x.detach().to(device="cpu", dtype=_F64)

    def component_log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """log pi_k + log N(x; mu_k, Sigma_k), float64 [n, K]."""
        x = self._rows(x)
        return torch.cat([self._block(x[i:i + _ROWS], False)[0] for i in range(0, x.shape[0], _ROWS)]
                         or [torch.empty(0, self.K, dtype=_F64)])

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """log p(x), float64 [n]."""
        return torch.logsumexp(self.component_log_prob(x), dim=1)

    def responsibilities(self, x: torch.Tensor) -> torch.Tensor:
        """Posterior component probabilities r_k(x) = pi_k N_k(x) / p(x), float64 [n, K]."""
        return torch.softmax(self.component_log_prob(x), dim=1)

    def assign(self, x: torch.Tensor) -> torch.Tensor:
        """The most likely component of each row, int64 [n]."""
        return self.component_log_prob(x).argmax(dim=1)

    def score(self, x: torch.Tensor) -> torch.Tensor:
        """grad_x log p(x) = sum_k r_k(x) (-Sigma_k^-1 (x - mu_k)), float64 [n, d] (Woodbury)."""
        x = self._rows(x)
        blocks = [self._block(x[i:i + _ROWS], True)[1] for i in range(0, x.shape[0], _ROWS)]
        return torch.cat(blocks) if blocks else torch.empty(0, self.d, dtype=_F64)

    # -- records ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable lists (Python floats round-trip float64 exactly through json)."""
        return {"K": self.K, "d": self.d, "rank": self.rank, "weights": self.weights.tolist(),
                "means": self.means.tolist(), "factors": self.factors.tolist(), "iso": self.iso.tolist()}

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> GaussianMixture:
        """The mixture `to_dict` wrote."""
        weights = _as_f64(record["weights"])
        means = _as_f64(record["means"])
        # the recorded shape, so a rank-0 record ([[[], ...], ...]) comes back [K, d, 0] whatever numpy infers
        shape = (int(record.get("K", weights.shape[0])), int(record.get("d", means.shape[-1])), int(record.get("rank", 0)))
        factors = _as_f64(record["factors"]).reshape(shape)
        return cls(weights, means, factors, _as_f64(record["iso"]))

    def digest(self) -> str:
        """sha256 hex of (K, d, r) as little-endian int64, then the little-endian float64 bytes of
        weights, means, factors and iso, in that order (the shapes first, so two shapes never share bytes)."""
        h = hashlib.sha256(np.asarray([self.K, self.d, self.rank], dtype="<i8").tobytes())
        for t in (self.weights, self.means, self.factors, self.iso):
            h.update(np.ascontiguousarray(t.numpy(), dtype="<f8").tobytes())
        return h.hexdigest()


# -- exact posterior means (Tweedie) ---------------------------------------------------------------
#
# For x = a x0 + s eps with x0 ~ p, eps ~ N(0, I) independent, the marginal p_a,s = p * N(0, s^2 I)
# (scaled) has score grad log p(x) = E[-(x - a x0) / s^2 | x] = -E[eps | x] / s (Tweedie's formula:
# differentiate p(x) = E_x0 N(x; a x0, s^2 I) under the integral). Hence
#     E[eps | x] = -s grad log p(x),     E[x0 | x] = (x - s E[eps | x]) / a = (x + s^2 grad log p(x)) / a.
# The mixture's noised law is again a mixture (GaussianMixture.noised), so both are closed-form.


def _fm_time(t: float) -> float:
    t = float(t)
    if not 0.0 < t < 1.0:  # E[x0 | x_t] divides by 1 - t; t = 0 is refused too (the path has no noise there)
        raise ValueError(f"flow-matching time t must be in (0, 1) strictly, got {t!r}")
    return t


def fm_eps(mix: GaussianMixture, x: torch.Tensor, t: float) -> torch.Tensor:
    """E[eps | x_t = x] on x_t = (1 - t) x0 + t eps: -t grad log p_t(x) (Tweedie), float64 [n, d].

    Defined on the closed [0, 1]: 0 at t = 0 (x is x0, independent of eps), x at t = 1 (p_1 = N(0, I)).
    """
    if not 0.0 <= float(t) <= 1.0:
        raise ValueError(f"flow-matching time t must be in [0, 1], got {t!r}")
    return -float(t) * mix.fm(float(t)).score(x)


def fm_x0(mix: GaussianMixture, x: torch.Tensor, t: float) -> torch.Tensor:
    """E[x0 | x_t = x] = (x + t^2 grad log p_t(x)) / (1 - t), float64 [n, d]; t in (0, 1).

    Tweedie's formula for x_t = a x0 + s eps with a = 1 - t, s = t: E[x0 | x_t] = (x_t + s^2 s_t(x_t)) / a,
    where s_t = grad log p_t and p_t = mix.fm(t) (derivation above these functions).
    """
    t = _fm_time(t)
    x64 = mix._rows(x)
    return (x64 + t * t * mix.fm(t).score(x64)) / (1.0 - t)


def fm_velocity(mix: GaussianMixture, x: torch.Tensor, t: float) -> torch.Tensor:
    """E[eps - x0 | x_t = x]: the exact flow-matching velocity (the minimiser of E|eps - x0 - v(x_t)|^2).

    With s_t = grad log p_t(x): E[eps | x] = -t s_t, E[x0 | x] = (x + t^2 s_t) / (1 - t), so
    v*(x) = -t s_t - (x + t^2 s_t) / (1 - t) = -(x + t s_t) / (1 - t). One score evaluation.
    """
    t = _fm_time(t)
    x64 = mix._rows(x)
    return -(x64 + t * mix.fm(t).score(x64)) / (1.0 - t)


def vp_eps(mix: GaussianMixture, x: torch.Tensor, abar: float) -> torch.Tensor:
    """E[eps | x] on the DDPM path x = sqrt(abar) x0 + sqrt(1 - abar) eps: -sqrt(1 - abar) grad log p(x).

    Defined on the closed [0, 1]: x at abar = 0 (pure noise), 0 at abar = 1 (x is x0).
    """
    abar = float(abar)
    if not 0.0 <= abar <= 1.0:
        raise ValueError(f"abar must be in [0, 1], got {abar!r}")
    return -math.sqrt(1.0 - abar) * mix.vp(abar).score(x)
