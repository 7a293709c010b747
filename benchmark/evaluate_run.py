"""Evaluation of a trained run: fixed-noise samples, grid.png, metrics.json, status.

The samples are saved (samples.npz, uint8), so `dfbench eval RUN_DIR` can score a run
later — e.g. once the Inception weights have been placed — without re-sampling.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dfbench import methods

from . import results
from .config import RunConfig
from .diffusion import fixed_noise
from .drift import attach_drift


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
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    results.atomic_write_bytes(path, buf.getvalue())  # a kill never leaves half a PNG


def generate(cfg: RunConfig, ctx: Any, method: methods.Method, params: torch.Tensor) -> torch.Tensor:
    """All evaluation samples from the fixed noises (shared by every method of a dataset)."""
    noise = fixed_noise(cfg.eval.samples, ctx.image_shape, base=cfg.eval.noise_seed)
    return to_uint8(method.sample(params, noise, ctx).cpu())


def score(run: Path, cfg: RunConfig, samples: torch.Tensor, sampler: str, progress: bool = False,
          clients: Callable[[], tuple[Any, ...]] | None = None) -> tuple[list[dict[str, Any]], str | None, list[str]]:
    """(evaluation rows, the reason they are incomplete or None, notes on metrics left out).

    `clients()` gives (client index arrays, expert of each client, size of the clients' split,
    why there are none) for per-client quality. Bootstrap intervals are seeded by the run's seed.
    """
    from .evaluation import MissingWeightsError, evaluate_samples

    if cfg.eval.metrics == "none":  # training-only runs (tests, timing): samples and grid, no score
        return [], None, []
    client_indices, expert_of_client, split_size, why_no_clients = clients() if clients else (None, None, None, None)
    try:
        rows, notes = evaluate_samples(samples, cfg.data.dataset, metrics=_metrics(cfg), reference_split=cfg.eval.reference_split,
                                       data_root=cfg.data.root, device=cfg.device, progress=progress, seed=cfg.seed,
                                       client_indices=client_indices, expert_of_client=expert_of_client,
                                       client_split_size=split_size)
    except MissingWeightsError as err:
        return [], str(err), []
    for row in rows:
        row.update(sampler=sampler, sampler_steps=cfg.eval.sampler_steps)
    return rows, None, notes + ([why_no_clients] if why_no_clients else [])


def _clients(cfg: RunConfig, ctx: Any = None, method: Any = None,
             run: Path | None = None) -> tuple[list[np.ndarray] | None, np.ndarray | None, int | None, str | None]:
    """(client index arrays, expert of each client or None, size of their split, why not) for per-client quality.

    From the run's context when it is at hand; otherwise (`dfbench eval`) the partition is
    rebuilt -- a pure function of (labels, spec, seed) -- and checked against partition.json.
    """
    if ctx is not None:
        part, size = ctx.partition, len(ctx.labels)
    else:
        from dfbench import datasets

        from .seeds import derive_seed

        data = datasets.load(cfg.data.dataset, "train", root=cfg.data.root)
        part = datasets.partition(data.labels.numpy(), cfg.data.partition, cfg.data.clients, derive_seed(cfg.seed, "partition"),
                                  min_size=cfg.data.min_client_size, images=data.images)
        size = len(data.labels)
        saved = results.read_json(run / "partition.json") if run is not None and (run / "partition.json").exists() else {}
        if saved.get("indices_sha256") not in (None, part.digest()):
            return None, None, None, "per-client quality: the rebuilt partition differs from partition.json; rerun the evaluation in the run"
        method = methods.create_method(cfg.method, **dict(cfg.method_params))
    owner = getattr(method, "expert_of_client", None)
    if owner is None and cfg.method == "experts":  # set by init_state; rebuilt the same way here
        from dfbench.methods.experts import assign_experts

        _, owner = assign_experts(method.config.num_experts, cfg.data.partition, part.cluster_of_client, cfg.data.clients)
    return [np.asarray(ix) for ix in part.indices], owner, size, None


def _metrics(cfg: RunConfig) -> Any:
    return "auto" if cfg.eval.metrics == "auto" else [m.strip() for m in cfg.eval.metrics.split(",") if m.strip()]


def evaluate_state(d: Path, cfg: RunConfig, ctx: Any, method: methods.Method, state: methods.ServerState,
                   ema: torch.Tensor | None, totals: dict[str, Any], extra: dict[str, Any], progress: bool = True) -> None:
    t0 = time.perf_counter()
    params = ema if ema is not None else state.params
    ctx.progress = progress
    samples = generate(cfg, ctx, method, params)
    buf = io.BytesIO()
    np.savez_compressed(buf, images=samples.numpy())
    results.atomic_write_bytes(d / "samples.npz", buf.getvalue())  # `dfbench eval` never reads half a file
    save_grid(samples, cfg.eval.grid, d / "grid.png")
    # a method with its own sampler (expert mixtures) names it in its extra metrics
    sampler = extra.get("mixture_sampler") or ctx.sampler_name(cfg.train.objective)
    rows, pending, notes = score(d, cfg, samples, sampler, progress, clients=lambda: _clients(cfg, ctx, method))
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
    if notes:  # metrics that could not be computed: absent from the rows, said here
        metrics["evaluation_notes"] = notes
    attach_drift(d, metrics, device=cfg.device)  # same-noise drift vs the dense reference, when it is done
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
    rows, pending, notes = score(d, cfg, samples, sampler, clients=lambda: _clients(cfg, run=d))
    if pending:
        raise RuntimeError(pending)
    metrics["evaluations"] = rows
    metrics.pop("evaluation_pending", None)
    metrics.pop("evaluation_notes", None)
    if notes:
        metrics["evaluation_notes"] = notes
    attach_drift(d, metrics, device=cfg.device)
    results.write_json(d / "metrics.json", metrics)
    results.write_status(d, "done")
    return rows
