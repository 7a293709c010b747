"""Held-out denoising loss: the trained model's objective in velocity space on test images.

A score that needs no feature network. On a fixed, seeded subset of the dataset's *test* split
(never trained on), at a fixed grid of times with fixed noises -- the same for every method,
objective, seed and run --

    x_t = (1 - t) x0 + t eps,   target v = eps - x0                      (the flow-matching path)
    loss = mean_i mean_j || v_hat(x_t(i, j), t_j) - v(i, j) ||^2 / D      (D = pixels x channels)

where v_hat is the model *as it samples* (`Method.velocity`): a flow-matching network predicts v; a
DDPM network's epsilon is converted at the matched signal-to-noise ratio (diffusion.ddpm_velocity),
so DDPM and flow-matching experts are compared in one space; a pruned model under its inference
rule; an expert mixture with its router's weights. This is the held-out objective used to compare
diffusion models by their likelihood-style fit (Ho et al. 2020, Kingma et al. 2021, evaluated on
the test split), and it moves only with the model, never with a feature network's blind spots.

The interval is a 95% t-interval over images (each image's loss averaged over the times); since
every run sees the same images, times and noises, seed-paired differences between methods are far
tighter than the marginal intervals. Lower is better. The per-time losses are kept in the row
(``per_time``), since the loss at small t (fine detail) and at large t (global structure) answer
different questions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from dfbench import datasets

__all__ = ["DENOISE_IMAGES", "DENOISE_SEED", "DENOISE_TIMES", "METRIC", "denoising_loss", "heldout_set",
           "heldout_rows", "loss_row", "method_denoising_rows"]

METRIC = "denoise_loss"
DENOISE_IMAGES = 256  # test images scored (a seeded subset: its 95% interval is already ~0.4% of the loss)
DENOISE_TIMES: tuple[float, ...] = tuple((j + 0.5) / 8 for j in range(8))  # midpoints of 8 even bins of [0, 1]
DENOISE_SEED = 4_100_417  # fixed for every run: the images and noises never depend on the run's seed
# Cost: DENOISE_IMAGES x len(DENOISE_TIMES) = 2048 forward passes, a third of the demo's sampling
# (400 samples x 15 Heun evaluations); measured by `dfbench perf` (benchmark/perf.py).
_BATCH = 64  # images per forward pass: on a CPU small batches are faster per image (cache): 64 took 0.7x the time of 256

VelocityFn = Callable[[torch.Tensor, float], torch.Tensor]


def heldout_set(images: torch.Tensor, count: int = DENOISE_IMAGES, times: tuple[float, ...] = DENOISE_TIMES,
                seed: int = DENOISE_SEED) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """(x0 float32 [n, C, H, W] in [-1, 1], eps float32 [len(times), n, C, H, W], the test indices used)
    from uint8 test images: a seeded subset (sorted indices) and seeded noises, drawn on the CPU."""
    n = min(count, int(images.shape[0]))
    if n < 2:
        raise ValueError(f"the held-out denoising loss needs at least 2 test images, got {images.shape[0]}")
    idx = np.sort(np.random.default_rng(seed).choice(images.shape[0], n, replace=False))
    x0 = datasets.to_model_space(images[torch.from_numpy(idx)])
    gen = torch.Generator().manual_seed(seed)
    eps = torch.randn((len(times), *x0.shape), generator=gen)
    return x0, eps, idx


@torch.no_grad()
def denoising_loss(velocity: VelocityFn, x0: torch.Tensor, eps: torch.Tensor, times: tuple[float, ...] = DENOISE_TIMES,
                   device: str | torch.device = "cpu", batch: int = _BATCH) -> tuple[np.ndarray, np.ndarray]:
    """(per-image loss [n], per-time loss [len(times)]) in float64: the mean squared velocity error per
    pixel of `velocity(x_t, t)` against eps - x0 on the path x_t = (1 - t) x0 + t eps."""
    if eps.shape[0] != len(times) or eps.shape[1:] != x0.shape:
        raise ValueError(f"eps must have shape [{len(times)}, *x0.shape], got {tuple(eps.shape)} for x0 {tuple(x0.shape)}")
    n = x0.shape[0]
    err = np.zeros((len(times), n), dtype=np.float64)
    for j, t in enumerate(times):
        for start in range(0, n, batch):
            x = x0[start:start + batch].to(device)
            e = eps[j, start:start + batch].to(device)
            x_t = (1.0 - t) * x + t * e
            v_hat = velocity(x_t, float(t))
            sq = (v_hat.double() - (e.double() - x.double())).square().flatten(1).mean(1)
            err[j, start:start + x.shape[0]] = sq.cpu().numpy()
    return err.mean(axis=0), err.mean(axis=1)


def loss_row(per_image: np.ndarray, per_time: np.ndarray, times: tuple[float, ...], reference: str,
             level: float = 0.95) -> dict[str, Any]:
    """The metrics.json row of a held-out denoising loss, with its t-interval over images."""
    from scipy import stats

    n = per_image.size
    mean = float(per_image.mean())
    half = float(stats.t.ppf(0.5 + level / 2, n - 1) * per_image.std(ddof=1) / np.sqrt(n))
    return {"metric": METRIC, "value": mean, "std_err": float(per_image.std(ddof=1) / np.sqrt(n)),
            "ci_low": mean - half, "ci_high": mean + half, "ci_level": level,
            "ci_method": f"{level:.0%} t-interval over the {n} images (each averaged over {len(times)} times)",
            "ci_replicates": None, "extractor": None, "num_samples": n, "reference": reference,
            "space": "velocity on the flow-matching path x_t = (1-t) x0 + t eps, v = eps - x0",
            "times": [round(t, 6) for t in times], "per_time": [float(v) for v in per_time],
            "noise_seed": DENOISE_SEED}


def heldout_rows(velocity: VelocityFn, test_images: torch.Tensor, dataset: str, device: str | torch.device = "cpu",
                 count: int = DENOISE_IMAGES) -> list[dict[str, Any]]:
    """[the denoise_loss row] of a velocity field on the first-`count` seeded subset of `test_images` (uint8)."""
    x0, eps, _ = heldout_set(test_images, count)
    per_image, per_time = denoising_loss(velocity, x0, eps, DENOISE_TIMES, device)
    return [loss_row(per_image, per_time, DENOISE_TIMES, reference=f"{dataset}/test")]


def method_denoising_rows(cfg: Any, ctx: Any, method: Any, params: torch.Tensor) -> list[dict[str, Any]]:
    """The held-out denoising loss of a trained run (the method's `velocity`, as it samples), on the
    run's device; the model is left in training mode, as sampling leaves it."""
    test = datasets.load(cfg.data.dataset, "test", root=cfg.data.root)
    try:
        return heldout_rows(method.velocity(params, ctx), test.images, cfg.data.dataset, ctx.device)
    finally:
        ctx.model.train()
