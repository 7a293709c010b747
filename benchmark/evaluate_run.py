"""Evaluation of a trained run: fixed-noise samples, grid.png, metrics.json, status.

The samples are saved (samples.npz, uint8), so `dfbench eval RUN_DIR` can score a run
later — e.g. once the Inception weights have been placed — without re-sampling.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dfbench import methods

from . import results
from .config import RunConfig
from .diffusion import fixed_noise


def to_uint8(x: torch.Tensor) -> torch.Tensor:
    """[-1, 1] float -> uint8 [0, 255], rounding to nearest (as torchvision's save_image)."""
    return ((x.clamp(-1, 1) + 1) * 127.5 + 0.5).floor().clamp(0, 255).to(torch.uint8)


def save_grid(images: torch.Tensor, side: int, path: Path) -> None:
    """An side x side grid of uint8 [N, C, H, W] images with a 2-pixel border, as PNG."""
    from PIL import Image

    n, c, h, w = images.shape
    pad = 2
    canvas = np.full((side * (h + pad) + pad, side * (w + pad) + pad, c), 255, dtype=np.uint8)
    for i in range(min(n, side * side)):
        r, q = divmod(i, side)
        y, x = pad + r * (h + pad), pad + q * (w + pad)
        canvas[y:y + h, x:x + w] = images[i].permute(1, 2, 0).numpy()
    img = Image.fromarray(canvas[..., 0] if c == 1 else canvas)
    img.save(path)


def generate(cfg: RunConfig, ctx: Any, method: methods.Method, params: torch.Tensor) -> torch.Tensor:
    """All evaluation samples from the fixed noises (shared by every method of a dataset)."""
    noise = fixed_noise(cfg.eval.samples, ctx.image_shape, base=cfg.eval.noise_seed)
    return to_uint8(method.sample(params, noise, ctx).cpu())


def score(run: Path, cfg: RunConfig, samples: torch.Tensor, sampler: str, progress: bool = False) -> tuple[list[dict[str, Any]], str | None]:
    """Evaluation rows for the samples, or (rows so far, the reason they are incomplete)."""
    from .evaluation import MissingWeightsError, evaluate_images

    if cfg.eval.metrics == "none":  # training-only runs (tests, timing): samples and grid, no score
        return [], None
    try:
        rows = evaluate_images(samples, cfg.data.dataset, metrics=_metrics(cfg), reference_split=cfg.eval.reference_split,
                               data_root=cfg.data.root, device=cfg.device, progress=progress)
    except MissingWeightsError as err:
        return [], str(err)
    for row in rows:
        row.update(sampler=sampler, sampler_steps=cfg.eval.sampler_steps)
    return rows, None


def _metrics(cfg: RunConfig) -> Any:
    return "auto" if cfg.eval.metrics == "auto" else [m.strip() for m in cfg.eval.metrics.split(",") if m.strip()]


def evaluate_state(d: Path, cfg: RunConfig, ctx: Any, method: methods.Method, state: methods.ServerState,
                   ema: torch.Tensor | None, totals: dict[str, Any], extra: dict[str, Any], progress: bool = True) -> None:
    t0 = time.perf_counter()
    params = ema if ema is not None else state.params
    ctx.progress = progress
    samples = generate(cfg, ctx, method, params)
    np.savez_compressed(d / "samples.npz", images=samples.numpy())
    save_grid(samples, cfg.eval.grid, d / "grid.png")
    # a method with its own sampler (expert mixtures) names it in its extra metrics
    sampler = extra.get("mixture_sampler") or ctx.sampler_name(cfg.train.objective)
    rows, pending = score(d, cfg, samples, sampler, progress)
    rounds = results.read_rounds(d)
    metrics = {
        "evaluations": rows,
        "rounds": cfg.train.rounds,
        "uplink_bits": int(totals["uplink_bits"]),
        "downlink_bits": int(totals["downlink_bits"]),
        "dropped_updates": int(totals["dropped_updates"]),
        "gamma_star": totals["gamma_star"],
        "w2_mean": float(np.mean([r["w2"] for r in rounds])) if rounds else None,
        "train_wall_seconds": round(float(totals["wall_seconds"]), 3),
        "eval_wall_seconds": round(time.perf_counter() - t0, 3),
        "wall_seconds": round(float(totals["wall_seconds"]) + time.perf_counter() - t0, 3),
        "num_parameters": int(ctx.layout.total),
        "used_ema": ema is not None,
        "environment": results.environment(cfg.device),
        **extra,
    }
    if pending:
        metrics["evaluation_pending"] = pending
    results.write_json(d / "metrics.json", metrics)
    results.write_status(d, "done", **({"evaluation_pending": pending} if pending else {}))


def evaluate_dir(d: str | Path) -> list[dict[str, Any]]:
    """`dfbench eval RUN_DIR`: score a finished run's saved samples (e.g. after placing weights)."""
    d = Path(d)
    if not (d / "config.json").exists():
        raise FileNotFoundError(f"{d} is not a run folder (no config.json); pass the folder that `dfbench run` printed")
    if not (d / "samples.npz").exists():
        raise FileNotFoundError(f"{d} has no samples.npz: the run has not finished training; rerun `dfbench run` with the same config to resume it")
    cfg = RunConfig.from_dict(results.read_json(d / "config.json"))
    with np.load(d / "samples.npz", allow_pickle=False) as z:
        samples = torch.from_numpy(z["images"])
    from .diffusion import default_sampler

    metrics = results.read_json(d / "metrics.json") if (d / "metrics.json").exists() else {}
    sampler = metrics.get("mixture_sampler") or (default_sampler(cfg.train.objective) if cfg.eval.sampler == "auto" else cfg.eval.sampler)
    rows, pending = score(d, cfg, samples, sampler)
    if pending:
        raise RuntimeError(pending)
    metrics["evaluations"] = rows
    metrics.pop("evaluation_pending", None)
    results.write_json(d / "metrics.json", metrics)
    results.write_status(d, "done")
    return rows
