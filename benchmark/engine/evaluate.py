"""Evaluation of a trained run: fixed-noise samples, grid.png, metrics.json, status.

The samples are saved (samples.npz, uint8), so `dfbench eval RUN_DIR` can score a run
later — e.g. once the Inception weights have been placed — without re-sampling.

A method with other ways to sample the same model (`Method.sample_variants`, e.g. pruning's
inference rules) gets each of them sampled from the same fixed noises with the same sampler,
saved as samples-<label>.npz and scored by the same `score`, its rows tagged
`inference = <label>`, `configured = false`; the result's rows say `inference = <its label>`,
`configured = true` and come first. Only the result feeds grid.png, drift and the wall times
(the variants' time is `inference_variants_wall_seconds`). Off: eval.inference_variants=false.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dfbench import methods

from dfbench.benchmark.core import runfolder
from dfbench.benchmark.core.config import ConfigError, RunConfig
from dfbench.benchmark.engine import ground_truth, heldout, hierarchical, leakage, privacy
from dfbench.benchmark.engine.diffusion import default_sampler, fixed_noise
from dfbench.benchmark.engine.resolve import apply_overrides, config_from_dict
from dfbench.benchmark.metrics.drift import attach_drift


def to_uint8(x: torch.Tensor) -> torch.Tensor:
    """[-1, 1] float -> uint8 [0, 255], rounding to nearest (as torchvision's save_image): `datasets.to_pixels`."""
    from dfbench.datasets import to_pixels

    return to_pixels(x)


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
    runfolder.atomic_write_bytes(path, buf.getvalue())  # a kill never leaves half a PNG


def tensor_sha256(t: torch.Tensor) -> str:
    """sha256 of a tensor's values (float32, C order, little-endian): equal exactly when the values are."""
    return hashlib.sha256(t.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4").tobytes()).hexdigest()


def pairing_fingerprints(cfg: RunConfig, ctx: Any) -> dict[str, str]:
    """What two runs at the same seed must share to be compared seed-paired (benchmark/report/verdicts.py):
    the seeded initial parameters and the fixed evaluation noises (the partition's own digest is
    partition.json's indices_sha256)."""
    noise = fixed_noise(cfg.eval.samples, ctx.image_shape, base=cfg.eval.noise_seed)
    return {"init_sha256": tensor_sha256(ctx.init_params), "eval_noise_sha256": tensor_sha256(noise)}


def generate_float(cfg: RunConfig, ctx: Any, method: methods.Method, params: torch.Tensor,
                   sample: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
    """All evaluation samples from the fixed noises (shared by every method of a dataset), drawn by
    `sample(params, noise, ctx)` (default: `method.sample`; else one of its `sample_variants`), as the
    sampler returns them (float, in the model's space)."""
    noise = fixed_noise(cfg.eval.samples, ctx.image_shape, base=cfg.eval.noise_seed)
    return (method.sample if sample is None else sample)(params, noise, ctx).cpu()


def generate(cfg: RunConfig, ctx: Any, method: methods.Method, params: torch.Tensor,
             sample: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
    """`generate_float`'s samples as uint8 images."""
    return to_uint8(generate_float(cfg, ctx, method, params, sample))


_LABEL = re.compile(r"[a-z0-9_]+")
LEAKAGE = "leakage"  # the flag of metrics.json rows made by leakage.py (eval.leakage_metrics)


def sample_variants(cfg: RunConfig, method: methods.Method) -> tuple[str | None, dict[str, Callable[..., torch.Tensor]]]:
    """(the label of the result's sampling rule or None, label -> sample function of each other rule to
    score): the method's `sample_variants`; no other rule with eval.inference_variants=false or when
    nothing is scored (eval.metrics=none)."""
    variants = method.sample_variants(cfg)
    if variants is None:
        return None, {}
    for label in (variants.label, *variants.others):
        if not _LABEL.fullmatch(label):
            raise ValueError(f"method {cfg.method!r}: sampling rule label {label!r} is not lowercase letters, digits and '_'")
    if not cfg.eval.inference_variants or cfg.eval.metrics == "none":
        return variants.label, {}
    return variants.label, dict(variants.others)


def curve_metric(cfg: RunConfig) -> str:
    """The metric of the quality curve (eval.every): the first ranking metric the run scores."""
    from dfbench.benchmark.metrics import table

    chosen = _metrics(cfg)
    names = table.auto_metrics(cfg.data.dataset, inception_available=False) if chosen == "auto" else list(chosen)
    ranked = [m for m in table.PRIMARY if m in names]
    if not ranked:
        raise ConfigError(f"eval.every={cfg.eval.every} draws a quality curve of a ranking metric, and eval.metrics="
                          f"{cfg.eval.metrics!r} has none; add one of {list(table.PRIMARY)} or set eval.every=0")
    return ranked[0]


def curve_point(cfg: RunConfig, ctx: Any, method: methods.Method, params: torch.Tensor, round_: int,
                totals: dict[str, Any]) -> dict[str, Any]:
    """One quality-curve row: `curve_metric` of the model after round `round_` on the first
    eval.curve_samples fixed noises (the final evaluation's first noises, its sampler), with the
    run's cumulative uplink bits, client work and simulated seconds at that point.

    It touches no random stream of training (fixed noises; a deterministic sampler; the bootstrap
    interval has its own seeded generator) and leaves ctx.model in training mode, so a run with a
    curve trains bitwise as one without."""
    from dfbench.benchmark.metrics.scoring import MissingWeightsError, ScoreOptions, evaluate_samples

    t0 = time.perf_counter()
    metric = curve_metric(cfg)
    noise = fixed_noise(cfg.eval.curve_samples, ctx.image_shape, base=cfg.eval.noise_seed)
    samples = to_uint8(method.sample(params, noise, ctx).cpu())
    try:
        options = ScoreOptions(reference_split=cfg.eval.reference_split, data_root=cfg.data.root, device=cfg.device,
                               seed=cfg.seed, batch_size=cfg.eval.feature_batch)
        rows, _ = evaluate_samples(samples, cfg.data.dataset, metrics=[metric], options=options, quality=False)
    except MissingWeightsError as err:
        raise ConfigError(f"eval.every needs {metric}'s network for its curve: {err}; or set eval.every=0") from None
    row = next(r for r in rows if r["metric"] == metric)
    return {"round": round_, "metric": metric, "value": float(row["value"]),
            "ci_low": row.get("ci_low"), "ci_high": row.get("ci_high"), "num_samples": cfg.eval.curve_samples,
            "uplink_bits": int(totals["uplink_bits"]), "client_images": round(float(totals.get("client_images", 0.0)), 3),
            "sim_seconds": round(float(totals.get("sim_seconds", 0.0)), 6), "wall_seconds": round(time.perf_counter() - t0, 3)}


def variant_samples_name(label: str) -> str:
    """The file of a sampling variant's samples: samples-<label>.npz beside samples.npz."""
    stem, dot, ext = runfolder.SAMPLES.rpartition(".")
    return f"{stem}-{label}{dot}{ext}"


def tag_rows(rows: list[dict[str, Any]], label: str | None, configured: bool) -> list[dict[str, Any]]:
    """Say which sampling rule the rows score (nothing for a method that samples one way)."""
    if label is not None:
        for row in rows:
            row.update(inference=label, configured=configured)
    return rows


def score(run: Path, cfg: RunConfig, samples: torch.Tensor, sampler: str, progress: bool = False,
          clients: Callable[[], tuple[Any, ...]] | None = None,
          metrics: list[str] | None = None) -> tuple[list[dict[str, Any]], str | None, list[str]]:
    """(evaluation rows, the reason they are incomplete or None, notes on metrics left out).

    `clients()` gives (client index arrays, expert of each client, size of the clients' split,
    why there are none) for per-client quality. Bootstrap intervals are seeded by the run's seed.
    `metrics`: score these instead of the run's eval.metrics (`dfbench eval`: the ones a run lacks).
    """
    from dfbench.benchmark.metrics.scoring import ClientSplit, MissingWeightsError, ScoreOptions, evaluate_samples

    if cfg.eval.metrics == "none":  # training-only runs (tests, timing): samples and grid, no score
        return [], None, []
    if cfg.eval.metrics == "auto" and ground_truth.is_ground_truth(cfg.data.dataset):
        return [], None, []  # scored exactly (ground_truth.exact_rows), with no feature network
    client_indices, expert_of_client, split_size, why_no_clients = clients() if clients else (None, None, None, None)
    options = ScoreOptions(reference_split=cfg.eval.reference_split, data_root=cfg.data.root, device=cfg.device,
                           progress=progress, seed=cfg.seed, batch_size=cfg.eval.feature_batch)
    split = None if client_indices is None else ClientSplit(client_indices, expert_of_client, split_size)
    try:
        rows, notes = evaluate_samples(samples, cfg.data.dataset, metrics=_metrics(cfg) if metrics is None else metrics,
                                       options=options, clients=split)
    except MissingWeightsError as err:
        return [], str(err), []
    for row in rows:
        row.update(sampler=sampler, sampler_steps=cfg.eval.sampler_steps)
    return rows, None, notes + ([why_no_clients] if why_no_clients else [])


def _clients(cfg: RunConfig, ctx: Any = None, method: Any = None,
             run: Path | None = None) -> tuple[list[np.ndarray] | None, np.ndarray | None, int | None, str | None]:
    """(client index arrays, group of each client or None, size of their split, why not) for per-client quality.

    The group of a client (an expert, for expert mixtures) is the method's `client_groups` hook.

    From the run's context when it is at hand; otherwise (`dfbench eval`) the partition is
    rebuilt -- a pure function of (labels, spec, seed) -- and checked against partition.json.
    """
    if ctx is not None:
        part, size = ctx.partition, len(ctx.labels)
    else:
        from dfbench import datasets

        from dfbench.benchmark.engine.context import run_partition

        data = datasets.load(cfg.data.dataset, "train", root=cfg.data.root)
        part = run_partition(cfg, data.labels.numpy(), data.images)
        size = len(data.labels)
        saved = runfolder.read_json(run / runfolder.PARTITION) if run is not None and (run / runfolder.PARTITION).exists() else {}
        if saved.get("indices_sha256") not in (None, part.digest()):
            return None, None, None, "per-client quality: the rebuilt partition differs from partition.json; rerun the evaluation in the run"
        method = methods.create_method(cfg.method, **dict(cfg.method_params))
    groups = method.client_groups(cfg, part.cluster_of_client)
    return [np.asarray(ix) for ix in part.indices], groups, size, None


def sampler_of(cfg: RunConfig, method: methods.Method) -> str:
    """The sampler the run's samples were drawn with: the method's own (e.g. an expert mixture's
    velocity-space ODE), else eval.sampler, where "auto" is the objective's default."""
    if (own := method.sampler_label(cfg)) is not None:
        return own
    return default_sampler(cfg.train.objective) if cfg.eval.sampler == "auto" else cfg.eval.sampler


def write_samples(d: Path, samples: torch.Tensor, name: str = runfolder.SAMPLES) -> None:
    """samples.npz (uint8; or a variant's `name`; samples_float.npz: float32), written atomically: `dfbench eval`
    never reads half a file."""
    buf = io.BytesIO()
    np.savez_compressed(buf, images=samples.numpy())
    runfolder.atomic_write_bytes(d / name, buf.getvalue())


def _metrics(cfg: RunConfig) -> Any:
    return "auto" if cfg.eval.metrics == "auto" else [m.strip() for m in cfg.eval.metrics.split(",") if m.strip()]


def evaluate_state(d: Path, cfg: RunConfig, ctx: Any, method: methods.Method, state: methods.ServerState,
                   ema: torch.Tensor | None, totals: dict[str, Any], extra: dict[str, Any], progress: bool = True) -> None:
    from dfbench.benchmark.metrics.scoring import reference_build_seconds

    t0, built0 = time.perf_counter(), reference_build_seconds()
    params = ema if ema is not None else state.params
    ctx = dataclasses.replace(ctx, progress=progress)  # sampling's bars; the run's context is not written
    raw = generate_float(cfg, ctx, method, params)
    samples = to_uint8(raw)
    write_samples(d, samples)
    save_grid(samples, cfg.eval.grid, d / runfolder.GRID)
    sampler = sampler_of(cfg, method)
    rows, pending, notes = score(d, cfg, samples, sampler, progress, clients=lambda: _clients(cfg, ctx, method))
    if cfg.eval.metrics != "none":  # the model's own objective on held-out test images: no feature network
        rows += heldout.method_denoising_rows(cfg, ctx, method, params)
    if ground_truth.is_ground_truth(cfg.data.dataset):
        write_samples(d, raw.to(torch.float32), runfolder.SAMPLES_FLOAT)  # as drawn (samples.npz holds them as pixels)
        if cfg.eval.metrics != "none":  # exact, against the mixture
            rows += ground_truth.exact_rows(cfg.data.dataset, ctx, method, params, raw)
    if cfg.eval.leakage_metrics:  # memorization of the samples and a membership attack on the model (leakage.py)
        leak, why = leakage.leakage_rows(cfg, ctx, params, samples)
        rows += [{**row, LEAKAGE: True} for row in leak]
        notes += why
    # the one-time build of reference statistics (then cached for every later run) is not this run's evaluation
    reference_seconds = reference_build_seconds() - built0
    eval_seconds = time.perf_counter() - t0 - reference_seconds
    label, others = sample_variants(cfg, method)
    tag_rows(rows, label, True)
    for other, sample in others.items():  # the same noises and sampler, scored alike; never the result
        images = generate(cfg, ctx, method, params, sample)
        write_samples(d, images, variant_samples_name(other))
        if not pending:  # else scored by `dfbench eval` with the result (same metrics, same weights)
            # its notes are the result's (the same metrics, left out for the same reasons)
            rows += tag_rows(score(d, cfg, images, sampler, progress, clients=lambda: _clients(cfg, ctx, method))[0], other, False)
    variant_seconds = time.perf_counter() - t0 - eval_seconds - reference_seconds
    rounds = runfolder.read_rounds(d)
    metrics = {
        "evaluations": rows,
        "rounds": cfg.train.rounds,
        "uplink_bits": int(totals["uplink_bits"]),
        "downlink_bits": int(totals["downlink_bits"]),
        # edge servers (system.edges > 0): the edge <-> cloud links, beside the clients' (engine/hierarchical.py)
        **{k: int(totals[k]) for k in hierarchical.EDGE_BITS if k in totals},
        "dropped_updates": int(totals["dropped_updates"]),
        "gamma_star": totals["gamma_star"],
        "w2_mean": float(np.mean([r["w2"] for r in rounds])) if rounds else None,
        "train_wall_seconds": round(float(totals["wall_seconds"]), 3),
        "eval_wall_seconds": round(eval_seconds, 3),
        "wall_seconds": round(float(totals["wall_seconds"]) + eval_seconds, 3),
        "sim_seconds": round(float(totals.get("sim_seconds", 0.0)), 6),  # the simulated clock (engine/clock.py)
        "client_images": round(float(totals.get("client_images", 0.0)), 3),  # client work, in full-model images
        "num_parameters": int(ctx.layout.total),
        "used_ema": ema is not None,
        "pairing": pairing_fingerprints(cfg, ctx),
        "environment": runfolder.environment(cfg.device),
        **extra,
    }
    if (guarantee := privacy.summary(cfg, cfg.train.rounds)) is not None:  # DP's (epsilon, delta) after the last round
        metrics["privacy"] = guarantee
    if reference_seconds > 0:  # this run built (and cached) reference statistics: timed apart from its evaluation
        metrics["reference_stats_seconds"] = round(reference_seconds, 3)
    if others:  # sampling and scoring the other rules: not in the run's wall time, which is the result's
        metrics["inference_variants_wall_seconds"] = round(variant_seconds, 3)
    if pending:
        metrics["evaluation_pending"] = pending
    if notes:  # metrics that could not be computed: absent from the rows, said here
        metrics["evaluation_notes"] = notes
    attach_drift(d, metrics, device=cfg.device)  # same-noise drift vs the dense reference, when it is done
    runfolder.write_json(d / runfolder.METRICS, metrics)
    runfolder.write_status(d, runfolder.DONE, **({"evaluation_pending": pending} if pending else {}))


def default_device() -> str:
    """Where `dfbench eval` scores by default: "cuda" when a GPU is visible, else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def available_devices() -> list[str]:
    """The devices this process can compute on: cpu, then cuda:0 .. cuda:N-1."""
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return ["cpu", *(f"cuda:{i}" for i in range(n))]


def check_device(device: str, fix: str = "pass one of them") -> str:
    """`device` if this machine has it ("cuda" = the current GPU); else ConfigError naming the ones it has.

    Before any work: on a CPU-only machine CUDA fails deep inside ("Torch not compiled with CUDA",
    "Found no NVIDIA driver") and cuda:3 on a 2-GPU machine with "invalid device ordinal"."""
    dev = str(device)
    have = available_devices()
    kind, _, index = dev.partition(":")
    ok = dev == "cpu" or (kind == "cuda" and len(have) > 1 and (index == "" or f"cuda:{index}" in have))
    if not ok:
        raise ConfigError(f"device {dev!r} is not available on this machine (available: {', '.join(have)}); {fix}")
    return dev


def eval_device(device: str | None = None) -> str:
    """The device evaluation runs on: `device` (checked to exist here), else `default_device()`."""
    return check_device(default_device() if device is None else device,
                        fix="pass --device with one of them (a run trained on a GPU can be scored anywhere)")


def on_device(cfg: RunConfig, device: str) -> RunConfig:
    """A copy of `cfg` that computes on `device` (config.json is never rewritten: it says where the run
    trained). On cpu also train.deterministic=true and train.compile=false, which cpu requires (the
    first is a no-op there, the second speed only)."""
    if cfg.device == device:
        return cfg
    if device == "cpu":
        return dataclasses.replace(cfg, device=device, train=dataclasses.replace(cfg.train, deterministic=True, compile=False))
    return dataclasses.replace(cfg, device=device)


def eval_oom_message(cfg: RunConfig, err: BaseException, rerun: str, *, of_run: bool = True) -> str:
    """Advice after torch.cuda.OutOfMemoryError in sampling, feature extraction or scoring (one line):
    evaluation has its own batches (eval.sample_batch, eval.feature_batch), training's do not matter.
    `rerun`: the command that goes on with the halved batches, its overrides at the end; `of_run`:
    it is the run's own (`dfbench run`, grid), which resumes at evaluation, not `dfbench eval`."""
    e = cfg.eval
    halved = f"--set eval.sample_batch={max(1, e.sample_batch // 2)} --set eval.feature_batch={max(1, e.feature_batch // 2)}"
    said = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    why = ("neither key changes the run id (memory and speed only), so the rerun resumes at evaluation from the "
           "final checkpoint without retraining" if of_run else
           "they are memory and speed only: the run and its config.json are left as they are")
    return (f"out of GPU memory on {cfg.device} during evaluation: lower eval.sample_batch (now {e.sample_batch}, "
            f"images per sampling batch) or eval.feature_batch (now {e.feature_batch}, images per feature-extraction "
            f"batch), e.g. {rerun} {halved}; {why}. CUDA said: {said}")


def evaluate_dir(d: str | Path, device: str | None = None, *, sample_batch: int | None = None,
                 feature_batch: int | None = None) -> list[dict[str, Any]]:
    """`dfbench eval RUN_DIR`: score a finished run's saved samples (e.g. after placing weights).

    On `device` (default: `default_device()`), not config.json's training device: a GPU-trained run
    is scored on a CPU-only machine too; a device this machine lacks is refused before any work.
    `sample_batch` / `feature_batch` replace eval.sample_batch / eval.feature_batch for this
    scoring (memory only). Out of GPU memory raises memory.OutOfMemory naming them; the run's
    status stays what it was (its metrics.json too).
    """
    from dfbench.benchmark.engine.memory import OutOfMemory, free_gpu_memory

    d = Path(d)
    if not (d / runfolder.CONFIG).exists():
        raise FileNotFoundError(f"{d} is not a run folder (no {runfolder.CONFIG}); pass the folder that `dfbench run` printed")
    device = eval_device(device)
    cfg = on_device(config_from_dict(runfolder.read_json(d / runfolder.CONFIG)), device)
    batches = {k: v for k, v in (("sample_batch", sample_batch), ("feature_batch", feature_batch)) if v is not None}
    if batches:
        cfg = apply_overrides(cfg, {f"eval.{k}": v for k, v in batches.items()})  # validated
    try:
        return _evaluate_dir(d, cfg)
    except torch.cuda.OutOfMemoryError as err:
        msg = eval_oom_message(cfg, err, rerun=f"dfbench eval {d} --device {device}", of_run=False)
    free_gpu_memory()  # out of the except block: the failed frames (and their tensors) are gone
    raise OutOfMemory(msg)


def _evaluate_dir(d: Path, cfg: RunConfig) -> list[dict[str, Any]]:
    samples = _saved_samples(d, cfg)
    metrics = runfolder.read_json(d / runfolder.METRICS) if (d / runfolder.METRICS).exists() else {}
    method = methods.create_method(cfg.method, **dict(cfg.method_params))
    sampler = sampler_of(cfg, method)
    clients = functools.cache(lambda: _clients(cfg, run=d))  # the partition is rebuilt once, not per rule
    rows, pending, notes = score(d, cfg, samples, sampler, clients=clients)
    if pending:
        raise RuntimeError(pending)
    label, others = sample_variants(cfg, method)
    tag_rows(rows, label, True)
    # the held-out denoising loss and the leakage rows need the trained model (and the clients' data), not only
    # the samples: kept as the run wrote them, where the run wrote them (after the result's rows)
    rows += [row for row in metrics.get("evaluations", []) if row.get(LEAKAGE) or row.get("metric") == heldout.METRIC]
    for other in others:
        # the samples the run's evaluation saved for this rule; a rule without them (a run evaluated
        # before variants were saved, or with eval.inference_variants=false) is left out, not sampled
        path = d / variant_samples_name(other)
        if path.exists():
            images = _read_samples(path, d, regenerable=False)
            rows += tag_rows(score(d, cfg, images, sampler, clients=clients)[0], other, False)
    metrics["evaluations"] = rows
    metrics.pop("evaluation_pending", None)
    metrics.pop("evaluation_notes", None)
    if notes:
        metrics["evaluation_notes"] = notes
    attach_drift(d, metrics, device=cfg.device)
    runfolder.write_json(d / runfolder.METRICS, metrics)
    runfolder.write_status(d, runfolder.DONE)
    return rows


def _saved_samples(d: Path, cfg: RunConfig) -> torch.Tensor:
    """The images of samples.npz; a finished run whose samples.npz was deleted gets it regenerated from
    its final checkpoint (the same images). A damaged file is named, never unpickled."""
    path = d / runfolder.SAMPLES
    status = runfolder.read_status(d) or {}
    if not path.exists():
        if status.get("state") != runfolder.DONE:
            raise FileNotFoundError(f"{d} has no {runfolder.SAMPLES}: the run has not finished; rerun `dfbench run` "
                                    f"with the same config to resume it (it evaluates the run when training ends)")
        return regenerate_samples(d, cfg)
    return _read_samples(path, d)


def _read_samples(path: Path, d: Path, regenerable: bool = True) -> torch.Tensor:
    """The uint8 [N, C, H, W] images of a samples file; a damaged one is named, never unpickled."""
    import zipfile
    import zlib

    problem = None
    try:
        with open(path, "rb") as f:
            head = f.read(4)
        if head[:2] != b"PK":  # an .npz is a zip archive; anything else is damage (numpy would try pickle)
            problem = "not a .npz (zip) archive"
        else:
            with np.load(path, allow_pickle=False) as z:
                if "images" not in z.files:
                    problem = f"no 'images' array (it holds {', '.join(z.files) or 'nothing'})"
                else:
                    images = z["images"]
                    if images.dtype != np.uint8 or images.ndim != 4:
                        problem = f"'images' is {images.dtype} of shape {list(images.shape)}, not uint8 [N, C, H, W]"
    except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile, zlib.error) as err:
        said = str(err).splitlines()[0] if str(err).strip() else ""
        problem = f"unreadable ({type(err).__name__}{': ' + said if said and 'pickle' not in said else ''})"
    if problem is not None and not regenerable:
        raise ValueError(f"{path} is corrupt: {problem}. It holds the samples of one of the run's other sampling "
                         f"rules: delete it and run `dfbench eval {d}` again (that rule is then left out)")
    if problem is not None:
        raise ValueError(f"{path} is corrupt: {problem}. It holds the run's evaluation samples, which can be made "
                         f"again from the run's final checkpoint: delete it and run `dfbench eval {d}` again "
                         f"(it regenerates {runfolder.SAMPLES}, then scores it)")
    return torch.from_numpy(images)


def _row_key(row: dict[str, Any]) -> tuple[str, Any]:
    return str(row.get("metric")), row.get("inference")


def rescore_dir(d: str | Path, device: str | None = None, *, feature_batch: int | None = None) -> list[dict[str, Any]]:
    """Add what this code scores and a finished run lacks -- new metric rows from its saved samples (every
    sampling rule whose samples were saved) and the held-out denoising loss from its final weights -- to
    rescored.json (`runfolder.RESCORED`), which the reporter reads beside metrics.json. Every other byte of
    the run folder stays as it was (a samples.npz deleted by hand is regenerated from the final checkpoint,
    as `evaluate_dir` does). Returns the rows added (none when the run is up to date). A run whose
    evaluation is pending (weights that were missing at its end) is completed instead: `evaluate_dir`.
    """
    from dfbench.benchmark.engine.memory import OutOfMemory, free_gpu_memory

    d = Path(d)
    if not (d / runfolder.CONFIG).exists():
        raise FileNotFoundError(f"{d} is not a run folder (no {runfolder.CONFIG}); pass the folder that `dfbench run` printed")
    status = runfolder.read_status(d) or {}
    if status.get("state") != runfolder.DONE or not (d / runfolder.METRICS).exists():
        raise FileNotFoundError(f"{d} is not a finished run (state {status.get('state', 'unknown')!r}); rerun `dfbench run` "
                                f"with the same config to finish it (it evaluates the run when training ends)")
    metrics = runfolder.read_json(d / runfolder.METRICS)
    if metrics.get("evaluation_pending"):
        return evaluate_dir(d, device, feature_batch=feature_batch)
    device = eval_device(device)
    cfg = on_device(config_from_dict(runfolder.read_json(d / runfolder.CONFIG)), device)
    if feature_batch is not None:
        cfg = apply_overrides(cfg, {"eval.feature_batch": feature_batch})
    try:
        return _rescore_dir(d, cfg, metrics)
    except torch.cuda.OutOfMemoryError as err:
        msg = eval_oom_message(cfg, err, rerun=f"dfbench eval {d} --device {device}", of_run=False)
    free_gpu_memory()
    raise OutOfMemory(msg)


def _rescore_dir(d: Path, cfg: RunConfig, metrics: dict[str, Any]) -> list[dict[str, Any]]:
    samples = _saved_samples(d, cfg)  # checked (a damaged file is named), or regenerated when deleted
    if cfg.eval.metrics == "none":
        return []
    added = runfolder.read_json(d / runfolder.RESCORED) if (d / runfolder.RESCORED).exists() else {}
    have = {_row_key(r) for r in [*metrics.get("evaluations", []), *added.get("evaluations", [])]}
    method = methods.create_method(cfg.method, **dict(cfg.method_params))
    sampler = sampler_of(cfg, method)
    label, others = sample_variants(cfg, method)
    clients = functools.cache(lambda: _clients(cfg, run=d))
    # only the requested metrics a rule lacks are scored (with the rows that come with them: PRDC, per-client
    # quality, mode coverage); a run that has them all is not scored again. A row kind added later to a metric
    # the run already has needs `--replace`.
    from dfbench.benchmark.metrics.scoring import _resolve_metrics

    requested = _resolve_metrics(_metrics(cfg), cfg.data.dataset, None)

    def lacking(rule: Any) -> list[str]:
        return [m for m in requested if (m, rule) not in have]

    rows = tag_rows(score(d, cfg, samples, sampler, clients=clients, metrics=lacking(label))[0], label, True) \
        if lacking(label) else []
    for other in others:
        path = d / variant_samples_name(other)
        if path.exists() and lacking(other):
            rows += tag_rows(score(d, cfg, _read_samples(path, d, regenerable=False), sampler, clients=clients,
                                   metrics=lacking(other))[0], other, False)
    if (heldout.METRIC, label) not in have:  # the model's own loss needs the trained weights, not the samples
        ctx, method, params = final_model(d, cfg)
        rows += tag_rows(heldout.method_denoising_rows(cfg, ctx, method, params), label, True)
    new = [row for row in rows if _row_key(row) not in have]
    # a run from before metrics.json kept its pairing records: the seeded initial parameters and the fixed
    # noises are rebuilt from its config (no training), so the verdicts can check that runs at one seed share them
    pairing = None if "pairing" in metrics or "pairing" in added else pairing_fingerprints(cfg, _context(cfg))
    if new or pairing:
        from dfbench.benchmark.core.runfolder import environment

        record = {**{k: v for k, v in added.items() if k not in ("evaluations", "note", "environment")},
                  "evaluations": [*added.get("evaluations", []), *new],
                  "note": "rows added after the run by `dfbench eval` (metrics.json is the run's own evaluation)",
                  "environment": environment(cfg.device)}
        if pairing:
            record["pairing"] = pairing
        runfolder.write_json(d / runfolder.RESCORED, record)
    return new


def _context(cfg: RunConfig) -> Any:
    """A run's context rebuilt from its config: its data, partition and seeded initial network."""
    from dfbench.benchmark.engine.context import build_context

    return build_context(cfg)


def rescore_tree(root: str | Path, device: str | None = None, *, feature_batch: int | None = None,
                 report: Callable[[Path, list[dict[str, Any]] | None, str | None], None] | None = None) -> dict[str, int]:
    """`rescore_dir` on every run folder under `root` (or `root` itself): {"rescored", "up_to_date", "skipped"}.
    A run that is not finished is skipped and named through `report(path, None, why)`."""
    root = Path(root)
    found = [run.path for run in runfolder.iter_runs(root)]  # `root` itself when it is a run folder
    if not found:
        raise FileNotFoundError(f"no run folder (a folder with {runfolder.CONFIG}) under {root}")
    device = eval_device(device)
    counts = {"rescored": 0, "up_to_date": 0, "skipped": 0}
    for run in found:
        try:
            rows = rescore_dir(run, device, feature_batch=feature_batch)
        except FileNotFoundError as err:
            counts["skipped"] += 1
            if report:
                report(run, None, str(err))
            continue
        counts["rescored" if rows else "up_to_date"] += 1
        if report:
            report(run, rows, None)
    return counts


def final_model(d: Path, cfg: RunConfig, *, data: Any = None) -> tuple[Any, methods.Method, torch.Tensor]:
    """(context, method after `finalize`, the parameters it samples: EMA when the run kept one) of a finished
    run, from its final checkpoint; FileNotFoundError naming the fix when that checkpoint is not there."""
    from dfbench.benchmark.core import numerics
    from dfbench.benchmark.engine.context import build_context

    numerics.configure(cfg.device, cfg.train.deterministic)  # the kernels the run sampled with (CUDA: TF32 off)
    ctx = build_context(cfg, data=data)
    method = methods.create_method(cfg.method, **dict(cfg.method_params))
    if cfg.train.compile:
        ctx.model.compile()
    method.init_state(ctx.init_params, ctx)  # sets up the method (e.g. which expert owns which client)
    ck = runfolder.load_checkpoint(d, str(ctx.device))
    if ck is None or ck["round"] != cfg.train.rounds:
        found = "none readable" if ck is None else f"the newest is round {ck['round']}"
        raise FileNotFoundError(f"{d / runfolder.CHECKPOINTS} holds no final checkpoint (round {cfg.train.rounds}; "
                                f"{found}) to rebuild the trained model from; rerun `dfbench run` with the same "
                                f"config and --force to train and evaluate the run again")
    state = methods.ServerState(params=ck["params"], extra=ck["extra"])
    method.finalize(state, ctx)
    ema = ck.get("ema")
    return ctx, method, ema if ema is not None else state.params


def regenerate_samples(d: Path, cfg: RunConfig, *, data: Any = None, progress: bool = False) -> torch.Tensor:
    """A finished run's evaluation samples again, from its final checkpoint, and samples.npz rewritten.

    The resume path of `_run` with no round left: the method's state from the final checkpoint
    (saved after finalize, so an expert mixture's router is restored, not retrained), then the
    same fixed noises and sampler. `dfbench eval` uses it when samples.npz is missing, with `cfg`
    on its eval device (`on_device`): on another device type than training's the images agree up to
    that device's roundings. Raises FileNotFoundError when the final checkpoint is not there (the
    run never finished).
    """
    try:
        ctx, method, params = final_model(d, cfg, data=data)
    except FileNotFoundError as err:
        raise FileNotFoundError(str(err).replace("to rebuild the trained model from", f"to regenerate {runfolder.SAMPLES} from")) from None
    samples = generate(cfg, dataclasses.replace(ctx, progress=progress), method, params)
    write_samples(d, samples)
    return samples
