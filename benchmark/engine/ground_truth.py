"""The ground-truth track's evaluation: a trained model's exact error against its known mixture.

On ``gmm:`` data (datasets/gmm.py) the score of every noised marginal is known in closed form
(datasets/mixture.py), so a run is scored with no feature network (benchmark/metrics/exact.py):

- ``score_kl``: 1/2 int E|eps_hat - eps*|^2 d lambda over log-SNR in [lambda(0.99), lambda(0.01)],
  the score-estimation term of the continuous-time KL bound (the seed paper's generation-error bound
  is written through it), with a 95 % interval over fixed draws of (t, x_t) from the exact p_t;
  ``velocity_mse``: the mean squared velocity error per coordinate over the same draws, per band in
  the row (``per_band``). The model is the method's ``velocity`` (as it samples: a DDPM network
  through SNR matching, a pruned model under its inference rule, an expert mixture with its router);
- on the run's own samples (float, never quantized or clipped): ``component_tv`` (each sample's most
  likely component against the true weights: mode collapse), ``frechet_exact`` (the samples' moments
  against the mixture's exact ones) and ``nll_gap`` (E_p[log p] minus the samples' mean log-density);
  each row also carries the same metric of as many fresh exact draws (``fresh_draws``: what a perfect
  sampler scores with that many samples).
"""

from __future__ import annotations

from typing import Any

import torch

from dfbench import datasets
from dfbench.benchmark.metrics import exact

__all__ = ["FRESH_SEED", "exact_rows", "is_ground_truth", "score_error"]

FRESH_SEED = exact.EXACT_SEED + 2  # the fresh draws beside every run's samples: one stream, the same for every run


def is_ground_truth(dataset: str) -> bool:
    """Whether runs on `dataset` are scored against a known mixture."""
    return datasets.is_mixture(dataset)


def _row(metric: str, value: float, reference: str, **extra: Any) -> dict[str, Any]:
    return {"metric": metric, "value": float(value), "ci_low": None, "ci_high": None, "ci_level": None,
            "ci_method": None, "extractor": None, "reference": reference, **extra}


def score_error(dataset: str, ctx: Any, method: Any, params: torch.Tensor) -> dict[str, Any]:
    """`exact.score_error` of the model `params` as the method samples it (its velocity field), against the
    dataset's mixture; the network is left in training mode."""
    try:
        return exact.score_error(method.velocity(params, ctx), datasets.mixture(dataset), ctx.image_shape, device=ctx.device)
    finally:
        ctx.model.train()


def exact_rows(dataset: str, ctx: Any, method: Any, params: torch.Tensor, samples: torch.Tensor) -> list[dict[str, Any]]:
    """The exact rows of a trained run: the method's velocity field and its float samples against the mixture."""
    mix = datasets.mixture(dataset)
    reference = f"{datasets.gmm_canonical(dataset)} (mixture sha256 {mix.digest()[:16]})"
    err = score_error(dataset, ctx, method, params)
    lo, hi = err["score_kl_ci"]
    band = {"times": err["times"], "per_band": err["per_band"], "lambda_range": err["lambda_range"],
            "num_samples": err["draws"], "draw_seed": err["seed"]}
    rows = [
        _row("score_kl", err["score_kl"], reference, ci_low=lo, ci_high=hi, ci_level=0.95,
             ci_method=f"95% t-interval over the {err['draws']} draws of every band", per_dim=err["score_kl_per_dim"],
             space="1/2 int E|eps_hat - eps*|^2 d lambda (the KL bound's score term)", **band),
        _row("velocity_mse", err["velocity_mse"], reference, space="mean |v_hat - v*|^2 / d over the bands", **band),
    ]
    got = exact.sample_metrics(samples, mix)
    fresh = exact.reference_sample_metrics(mix, max(int(samples.shape[0]), 2), FRESH_SEED)
    for metric in ("component_tv", "frechet_exact", "nll_gap"):
        rows.append(_row(metric, got[metric], reference, num_samples=got["n"], nonfinite=got["nonfinite"],
                         fresh_draws=fresh[metric],
                         **({"component_shares": got["component_shares"], "weights": mix.weights.tolist()}
                            if metric == "component_tv" else {}),
                         **({"mean_log_density": got["mean_log_density"], "true_mean_log_density": got["true_mean_log_density"]}
                            if metric == "nll_gap" else {})))
    return rows
