"""A GPU study's preflight and plan (`make bench-cifar10-gpu`, `make bench-cifar10-gpu-plan`).

Before a study that takes a GPU for a day starts, this says, all at once, what the machine lacks and
what the study will cost:

1. **Preflight** (`preflight`): every input of the grid, each found or missing with what to fetch
   and from where -- the dataset's splits (found, then decoded and checked against their pinned
   checksums), the Inception weights of fid / kid (sha256 checked), KID's sizes, the optional DINOv2
   file of fd_dinov2, a CUDA device, diffusers at the pinned release, and the model preset itself.
   Required items missing stop a real run before its first cell; the dry run lists them and exits 0.
2. **Throughput** (`measure_throughput`, `stated_throughput`): on a CUDA machine with the model at
   hand, the grid's own network is timed (training steps at the grid's batch size and numerics,
   sampling forwards, Inception and DINOv2 feature passes); elsewhere the plan uses a throughput
   measured earlier (`--throughput FILE`, written by `--save`) or, failing that, a stated estimate
   for an H200 or A100, and says that it is one and how to measure.
3. **Plan** (`plan_study`): per cell, from its config (benchmark/grid/plan.py's `estimate_cost`
   for the sample-gradients and sampling evaluations, the method's sampling rules for the number of
   sampling and scoring passes), the seconds at that throughput; per setting and in total, the
   GPU-hours; the reference statistics once.
4. **Seeds** (`size_seeds`, the package's `api.size_seeds`): how many seeds each claim of the study's claims file needs for a paired
   verdict, from the paired spread of the same contrasts in an earlier study (`--evidence`:
   results/paper-fmnist/runs.csv, whose settings have the same specs), with
   `verdicts.seeds_needed` at the claims file's strictest Holm level, the evidence's sd taken at its
   one-sided 80 % upper confidence bound (`verdicts.SIZING_CONFIDENCE`); and whether the grid gives
   each claim that many shared seeds.

`python results/cifar10-gpu/gpu_plan.py GRID [--dry-run]` prints all four. Nothing here
downloads or trains.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import tomllib
import typing
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dfbench.benchmark.api import SEED_CAP, ConfigError, RunConfig, Sizing, load_grid, seeds_per_setting
from dfbench.benchmark.api import size_seeds as api_size_seeds
from dfbench.benchmark.core.config import Preset
from dfbench.benchmark.grid import plan as grid_plan
from dfbench.benchmark.grid.spec import Cell, Grid, GridError, parse_grid, resolve_grid

__all__ = [
    "Check", "CellPlan", "Sizing", "StudyPlan", "Throughput", "STATED", "load_study_grid", "main", "measure_throughput",
    "plan_study", "preflight", "read_throughput", "render", "seeds_per_setting", "setting_of", "size_seeds",
    "stated_throughput",
]

ROOT = Path(__file__).resolve().parents[2]
# the earlier study whose paired spread sizes the seeds, and which of its metrics stands in for each of ours
EVIDENCE = ROOT / "results" / "paper-fmnist" / "runs.csv"
EVIDENCE_METRICS = {"fid": "fd_fmnist", "kid": "kid_fmnist", "fd_dinov2": "fd_fmnist_ae"}
STAND_IN_MODEL = "base32"  # plans a grid whose model this checkout does not know (its costs come from the throughput)


# -- preflight --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Check:
    """One input of the study: found (`ok`) or not, what was found, and what to do about it."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True  # False: the study runs without it (its metric is left out, with a note)


def _check_data(configs: Sequence[RunConfig], data_root: str | None, verify: bool) -> list[Check]:
    from dfbench import datasets
    from dfbench.datasets import sources

    wanted: dict[tuple[str, str | None], set[str]] = {}
    for cfg in configs:
        # the training split; the reference split when scored; the test split of the held-out loss
        splits = {"train", "test"} | ({cfg.eval.reference_split} if cfg.eval.metrics != "none" else set())
        wanted.setdefault((cfg.data.dataset, data_root or cfg.data.root), set()).update(splits)
    out = []
    for (name, root), splits in wanted.items():
        ordered = [s for s in sources.SPLITS if s in splits]
        label = f"{name} data ({', '.join(ordered)})"
        info = sources.data_info(name)
        how = (f"`dfbench fetch {name}" + (f" --data-root {root}`" if root else "`") +
               f" on a machine with internet ({', '.join(info['urls'])}; checksums pinned); by hand: {info['how_to_get']}")
        problems = [m for m in (sources.missing(name, s, root) for s in ordered) if m]
        if problems:
            out.append(Check(label, False, problems[0].split(". To get it:")[0], how))
            continue
        where = sources.locate(name, "train", root)
        if verify:
            try:
                loaded = [datasets.load(name, s, root=root) for s in ordered]
            except datasets.DatasetError as err:
                out.append(Check(label, False, f"found at {where} but it fails its check: {err}", how))
                continue
            sizes = ", ".join(f"{s} {len(d):,}" for s, d in zip(ordered, loaded))
            out.append(Check(label, True, f"{where}: checksums verified ({sizes} images)"))
        else:
            out.append(Check(label, True, f"{where} (files present; checksums not verified: --no-verify)"))
    return out


def _check_weights(key: str, metrics: list[str], verify: bool, required: bool) -> Check:
    from dfbench.benchmark.metrics.weight_files import MissingWeightsError, WeightsHashError, _verify, find_weights, known_weights

    spec = known_weights(key)
    label = f"{spec.description}, for {', '.join(metrics)}" + ("" if required else " (optional)")
    if spec.fetch_name:
        how = (f"`dfbench fetch {spec.fetch_name}` on a machine with internet ({spec.url}; {spec.size:,} bytes, sha256 "
               f"{spec.sha256}), or export {spec.env_var}=/path/to/{spec.file_name}")
    else:
        how = (f"download {spec.url} yourself (dfbench never downloads it) and export {spec.env_var}=/path/to/"
               f"{spec.file_name}, or put it in dfbench's weights folder or torch hub's checkpoints")
    if not required:
        how += f"; without it the runs score everything else and note why {', '.join(metrics)} is missing"
    try:
        path = find_weights(key)  # type: ignore[arg-type]
    except MissingWeightsError as err:
        looked = ", ".join(str(p) for p, _ in err.searched)
        return Check(label, False, f"{spec.file_name} not found (looked in {looked})", how, required)
    if spec.sha256 is None:
        return Check(label, True, f"{path} (no pinned hash: its keys and shapes are checked when it is loaded)",
                     required=required)
    if not verify:
        return Check(label, True, f"{path} (sha256 not checked: --no-verify)", required=required)
    try:
        _verify(path, spec.sha256, spec.url)
    except WeightsHashError as err:
        return Check(label, False, str(err).splitlines()[0], how, required)
    return Check(label, True, f"{path}: sha256 verified", required=required)


def _check_kid(configs: Sequence[RunConfig]) -> Check | None:
    from dfbench.benchmark.metrics import scoring, table

    scored = [c for c in configs if "kid" in _metrics_of(c)]
    if not scored:
        return None
    subset = scoring.ScoreOptions().kid_subset_size
    small = sorted({c.eval.samples for c in scored if c.eval.samples < subset})
    m = table.METRICS.get("kid")
    if m is None or not m.requestable:
        return Check("KID", False, "this dfbench has no requestable `kid` metric (benchmark/metrics/table.py)",
                     "update dfbench")
    detail = (f"unbiased MMD^2 with the cubic kernel in Inception space, {scoring.ScoreOptions().kid_subsets} subsets "
              f"of {subset} samples against a {scoring.KID_REFERENCE_SAMPLES:,}-image seeded reference subset")
    if small:
        return Check("KID", False, f"{detail}; eval.samples {small} < the subset size {subset}",
                     "raise eval.samples to at least 1000")
    return Check("KID", True, detail)


def _check_cuda(device: str) -> Check:
    import torch

    if not device.startswith("cuda"):
        return Check("CUDA device", False, f"the plan was asked for device {device!r}",
                     "run with --device cuda (DEVICE=cuda for make)")
    if not torch.cuda.is_available():
        build = f"torch {torch.__version__}" + (f" built for CUDA {torch.version.cuda}" if torch.version.cuda else
                                                " built without CUDA")
        return Check("CUDA device", False, f"torch sees no CUDA device ({build})",
                     "run on a machine with an NVIDIA GPU and a CUDA build of torch (`make gpu-check` checks one)")
    dev = torch.device(device)
    props = torch.cuda.get_device_properties(dev)
    return Check("CUDA device", True, f"{device}: {props.name}, {props.total_memory / 2**30:.0f} GiB "
                                      f"(torch {torch.__version__}, CUDA {torch.version.cuda})")


def _model_problem(model: str) -> str | None:
    """Why this checkout cannot build `model` (unknown preset, diffusers missing), or None."""
    if model not in typing.get_args(Preset):
        return (f"train.model {model!r} is not a preset of this dfbench (benchmark/core/config.py Preset: "
                f"{', '.join(typing.get_args(Preset))})")
    try:
        from dfbench.benchmark.core import presets
    except ImportError:  # a dfbench without the preset table: the built-in presets only
        return None
    if presets.family(model) == "diffusers":
        return presets.diffusers_problem()
    return None


def _check_diffusers(model: str) -> Check | None:
    from importlib import metadata
    from importlib.util import find_spec

    try:
        from dfbench.benchmark.core import presets
    except ImportError:
        presets = None  # type: ignore[assignment]
    if presets is None or model not in getattr(presets, "DIFFUSERS", {}):
        if not model.startswith("diffusers"):
            return None
        wanted, extra = "diffusers", "pip install diffusers"
    else:
        wanted, extra = f"diffusers=={presets.DIFFUSERS_VERSION}", presets.DIFFUSERS_EXTRA
    if find_spec("diffusers") is None:
        return Check("Hugging Face diffusers", False, "not installed", f"`{extra}` ({wanted})")
    try:
        found = metadata.version("diffusers")
    except metadata.PackageNotFoundError:
        found = "unknown version"
    problem = presets.diffusers_problem() if presets is not None and model in getattr(presets, "DIFFUSERS", {}) else None
    if problem:
        return Check("Hugging Face diffusers", False, problem, f"`{extra}` ({wanted})")
    return Check("Hugging Face diffusers", True, f"diffusers {found}")


def _check_model(model: str, dataset: str) -> Check:
    problem = _model_problem(model)
    if problem:
        return Check(f"model {model}", False, problem,
                     "update dfbench to a version with this preset" if "not a preset" in problem else
                     "install what the line above names")
    try:
        import torch

        from dfbench.benchmark.engine.model import build_model, resolve_preset
        from dfbench.datasets import data_info

        with torch.device("meta"):  # the architecture only: no memory, no initialisation cost
            net = build_model(resolve_preset(model, dataset), int(data_info(dataset)["channels"]))
        count = sum(p.numel() for p in net.parameters())
    except Exception as err:  # noqa: BLE001 - any build failure is reported, not raised
        return Check(f"model {model}", False, f"could not be built: {type(err).__name__}: {err}",
                     "see the error above (benchmark/engine/model.py)")
    return Check(f"model {model}", True, f"{count:,} parameters")


def _metrics_of(cfg: RunConfig) -> list[str]:
    from dfbench.benchmark.metrics import table

    if cfg.eval.metrics == "none":
        return []
    if cfg.eval.metrics == "auto":
        return table.auto_metrics(cfg.data.dataset, inception_available=True)
    return [m.strip() for m in cfg.eval.metrics.split(",") if m.strip()]


def preflight(configs: Sequence[RunConfig], *, model: str, device: str, data_root: str | None = None,
              verify: bool = True, grid_problems: Sequence[str] = ()) -> list[Check]:
    """Every input the configs need, found or missing, each with its fix: all reported together."""
    from dfbench.benchmark.metrics import table

    checks = [Check("grid", False, p, "fix the grid file") for p in grid_problems]
    checks += _check_data(configs, data_root, verify)
    by_extractor: dict[str, list[str]] = {}
    for cfg in configs:
        for metric in _metrics_of(cfg):
            ex = table.extractor_of(metric)
            if ex in ("inception", "clean", "dinov2") and metric not in by_extractor.setdefault(str(ex), []):
                by_extractor[str(ex)].append(metric)
    for ex, metrics in by_extractor.items():
        checks.append(_check_weights(ex, metrics, verify, required=ex not in table.OPTIONAL_EXTRACTORS))
    if (kid := _check_kid(configs)) is not None:
        checks.append(kid)
    checks.append(_check_cuda(device))
    if (diffusers := _check_diffusers(model)) is not None:
        checks.append(diffusers)
    dataset = configs[0].data.dataset if configs else "cifar10"
    checks.append(_check_model(model, dataset))
    return checks


# -- throughput -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Throughput:
    """Per-image costs on one GPU, measured or stated (see `source`)."""

    device: str
    train_ms: float  # per sample-gradient: forward + backward + the optimizer's share, at the grid's batch size
    forward_ms: float  # per image and network evaluation while sampling
    inception_ms: float  # per image, Inception features (fid, kid)
    dinov2_ms: float  # per image, DINOv2 ViT-L/14 features at 224 px (fd_dinov2)
    score_s: float  # per scoring pass besides the features: KID subsets, bootstrap intervals, PRDC, per-client rows
    measured: bool
    source: str
    model: str = ""
    when: str = ""


# Stated estimates (not measured on this project's machines): FLOPs over a fraction of the FP32 peak
# (the runs' default numerics: float32 with TF32 off, train.deterministic = true). The DDPM CIFAR-10
# UNet: 6.1 GMACs per 32x32 forward (Ho et al.'s 35.7M-parameter network; Fang et al. 2023, Diff-Pruning,
# Table 1), so 12.2 GFLOP forward and ~36.6 GFLOP per sample-gradient (backward ~2x forward). FID
# Inception: 5.7 GFLOP per 299x299 image. DINOv2 ViT-L/14 at 224 px (257 tokens): ~160 GFLOP. At about
# 55 % of FP32 peak for convolutions and 70 % for the ViT's matrix products: H200 (67 TFLOPS FP32) and
# A100 SXM (19.5 TFLOPS FP32). Each is +-2x; `measure_throughput` replaces them on the GPU itself.
STATED: dict[str, Throughput] = {
    "h200": Throughput(device="NVIDIA H200", train_ms=1.0, forward_ms=0.33, inception_ms=0.15, dinov2_ms=3.4,
                       score_s=60.0, measured=False,
                       source="stated estimate for an NVIDIA H200 from FLOPs (+-2x), not measured"),
    "a100": Throughput(device="NVIDIA A100 SXM", train_ms=3.4, forward_ms=1.1, inception_ms=0.5, dinov2_ms=11.7,
                       score_s=90.0, measured=False,
                       source="stated estimate for an NVIDIA A100 SXM from FLOPs (+-2x), not measured"),
}
# what the model preset's throughput was stated for (another model: the stated figures do not apply)
STATED_MODEL = "diffusers-ddpm-cifar10"


def stated_throughput(gpu: str = "h200") -> Throughput:
    """The stated estimate for `gpu` ("h200" or "a100")."""
    key = gpu.lower()
    if key not in STATED:
        raise ValueError(f"no stated throughput for {gpu!r}; choose one of {', '.join(STATED)} or measure on the GPU")
    return STATED[key]


def read_throughput(path: str | Path) -> Throughput:
    """A throughput `--save` wrote (JSON)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return Throughput(**data)


def _timed(fn: Callable[[], object], sync: Callable[[], None], repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_throughput(cfg: RunConfig, device: str, *, steps: int = 10, feature_images: int = 256,
                       repeats: int = 2, dinov2: bool = True) -> Throughput:
    """Time the grid's own network on `device` (meant for CUDA; works on a CPU with a small model):
    `steps` training steps at cfg's batch size, objective and numerics (train.deterministic,
    train.amp), sampling forwards at eval.sample_batch, and Inception / DINOv2 feature passes over
    `feature_images` images (random weights of the real architectures: the speed does not depend on
    the values). Best of `repeats` after a warm-up. The scoring overhead stays the stated one."""
    import datetime

    import torch
    from torch import nn

    from dfbench.benchmark.core.config import time_sampling_for
    from dfbench.benchmark.core.numerics import configure, device_name
    from dfbench.benchmark.engine.diffusion import make_objective
    from dfbench.benchmark.engine.local_step import autocast, make_optimizer
    from dfbench.benchmark.engine.model import build_model, resolve_preset
    from dfbench.benchmark.metrics import dinov2 as dino
    from dfbench.benchmark.metrics import features as fe
    from dfbench.datasets import data_info

    dev = torch.device(device)
    numerics = configure(dev, cfg.train.deterministic, cfg.train.amp)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    info = data_info(cfg.data.dataset)
    shape = tuple(int(v) for v in info["image_shape"])
    gen = torch.Generator(device=dev).manual_seed(0)
    torch.manual_seed(0)
    model: nn.Module = build_model(resolve_preset(cfg.train.model, cfg.data.dataset), shape[0]).to(dev)
    opt = make_optimizer(list(model.parameters()), cfg.train.lr)
    obj = make_objective(cfg.train.objective, cfg.train.schedule, cfg.train.timesteps,
                         time_sampling_for(cfg.train, cfg.train.objective))
    batch = cfg.train.batch_size
    x0 = torch.rand((batch, *shape), generator=gen, device=dev) * 2 - 1

    def train(n: int) -> None:
        for _ in range(n):
            with autocast(dev, numerics["amp"]):
                loss = obj.loss(model, x0, gen)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.train.grad_clip > 0:
                nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip, foreach=True)
            opt.step()

    train(2)  # warm-up: allocations, cuDNN's choices
    train_s = _timed(lambda: train(steps), sync, repeats)
    sample_batch = cfg.eval.sample_batch
    xt = torch.randn((sample_batch, *shape), generator=gen, device=dev)
    tt = torch.full((sample_batch,), 0.5, device=dev)

    def forward(n: int) -> None:
        with torch.no_grad():
            for _ in range(n):
                model(xt, tt)

    model.eval()
    forward(1)
    forward_s = _timed(lambda: forward(steps), sync, repeats)
    images = torch.randint(0, 256, (feature_images, *shape), generator=gen, device=dev, dtype=torch.uint8)
    inception = fe.Extractor(name="inception", sha256="speed-only", backend="pytorch-fid", resize="torch-bilinear-299",
                             dims=2048, network=fe.FIDInceptionFeatures(fe.build_fid_inception_v3()).eval(),
                             prepare=fe._prepare_inception, device=device)
    inception.features(images[:2], batch_size=2, device=dev)
    inception_s = _timed(lambda: inception.features(images, batch_size=cfg.eval.feature_batch, device=dev), sync, repeats)
    dinov2_ms = math.nan
    if dinov2:
        vit = fe.Extractor(name="dinov2", sha256="speed-only", backend="dfbench-dinov2", resize="pil-bicubic-224",
                           dims=dino.FD_SPEC.embed_dim, network=dino.DinoViT(dino.FD_SPEC).eval(),
                           prepare=dino.dinov2_prepare, device=device)
        vit.features(images[:2], batch_size=2, device=dev)
        dinov2_s = _timed(lambda: vit.features(images, batch_size=min(cfg.eval.feature_batch, 128), device=dev),
                          sync, repeats)
        dinov2_ms = 1000 * dinov2_s / feature_images
    name = device_name(dev) if dev.type == "cuda" else "cpu"
    stated = next((t for k, t in STATED.items() if k in name.lower()), STATED["h200"])
    return Throughput(
        device=name, train_ms=1000 * train_s / (steps * batch), forward_ms=1000 * forward_s / (steps * sample_batch),
        inception_ms=1000 * inception_s / feature_images, dinov2_ms=dinov2_ms, score_s=stated.score_s, measured=True,
        source=(f"measured on {name}: {cfg.train.model} at batch {batch} ({'deterministic float32' if cfg.train.deterministic else 'TF32 allowed'}"
                f", amp {numerics['amp']}), {steps} steps, best of {repeats}; scoring overhead stated ({stated.score_s:.0f} s a pass)"),
        model=cfg.train.model, when=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    )


# -- the plan ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CellPlan:
    label: str
    run_id: str
    setting: str  # the claims' name of its setting: the method spec, or "untrained"
    sample_grads: float
    passes: int  # sampling (and scoring) passes: the result and every other sampling rule scored beside it
    nfe: float  # network evaluations for sampling, all passes
    feature_images: dict[str, float]  # extractor -> images through it, all passes
    seconds: float
    model: str = ""  # its train.model
    capacity: str = ""  # its capacity tiers (system.capacity), "" without


@dataclass(frozen=True)
class StudyPlan:
    grid: str
    cells: list[CellPlan]
    throughput: Throughput
    reference_seconds: float  # the reference statistics, once per extractor
    reference_images: dict[str, int]
    notes: list[str] = field(default_factory=list)
    source: str = ""  # the grid file, as a command line in the repository root names it

    @property
    def seconds(self) -> float:
        return sum(c.seconds for c in self.cells) + self.reference_seconds

    @property
    def hours(self) -> float:
        return self.seconds / 3600.0


def setting_of(cell: Cell) -> str:
    """The name a claims file gives the cell's setting: its method spec, or "untrained" (rounds = 0)."""
    return "untrained" if cell.cfg.train.rounds == 0 else cell.method


def _passes(cfg: RunConfig) -> int:
    from dfbench import methods
    from dfbench.benchmark.engine.evaluate import sample_variants

    if cfg.eval.metrics == "none":
        return 1
    method = methods.create_method(cfg.method, **dict(cfg.method_params))
    _, others = sample_variants(cfg, method)
    return 1 + len(others)


def plan_study(grid: Grid, throughput: Throughput, *, dinov2_available: bool = True,
               model_scale: dict[str, float] | None = None) -> StudyPlan:
    """The seconds of every cell of `grid` at `throughput`, and of the reference statistics. `model_scale`:
    per train.model, the factor on the throughput's training and sampling costs for its cells (`model_scales`;
    a model not in it: 1, the throughput's own network)."""
    from dfbench.benchmark.metrics import table
    from dfbench.datasets import data_info

    ms = {"inception": throughput.inception_ms, "dinov2": throughput.dinov2_ms, "clean": throughput.inception_ms}
    scale = model_scale or {}
    cells, reference = [], {}
    notes = []
    for c in grid.cells:
        cost = grid_plan.estimate_cost(c.cfg)
        passes = _passes(c.cfg)
        extractors = {str(table.extractor_of(m)) for m in _metrics_of(c.cfg)} & set(ms)
        if not dinov2_available and "dinov2" in extractors:
            extractors.discard("dinov2")
        feats = {ex: float(passes * c.cfg.eval.samples) for ex in sorted(extractors)}
        k = scale.get(c.cfg.train.model, 1.0)
        seconds = (cost.sample_grads * throughput.train_ms * k / 1000 + passes * cost.eval_forwards * throughput.forward_ms * k / 1000
                   + sum(n * ms[ex] / 1000 for ex, n in feats.items() if math.isfinite(ms[ex]))
                   + (passes * throughput.score_s if feats else 0.0))
        cells.append(CellPlan(c.label, c.run_id, setting_of(c), cost.sample_grads, passes, passes * cost.eval_forwards,
                              feats, seconds, c.cfg.train.model, c.cfg.system.capacity))
        for ex in extractors:
            key = f"{ex}:{c.cfg.data.dataset}/{c.cfg.eval.reference_split}"
            reference[key] = int(data_info(c.cfg.data.dataset)["num_samples"][c.cfg.eval.reference_split])
    ref_seconds = sum(n * ms[key.split(":")[0]] / 1000 for key, n in reference.items() if math.isfinite(ms[key.split(":")[0]]))
    if not math.isfinite(throughput.dinov2_ms) and any("dinov2" in c.feature_images for c in cells):
        notes.append("DINOv2 feature time not measured: not included")
    source = Path(grid.source).resolve()
    shown = str(source.relative_to(ROOT)) if source.is_relative_to(ROOT) else grid.source
    return StudyPlan(grid.name, cells, throughput, ref_seconds, reference, notes, shown)


def forward_flops(model: str, dataset: str) -> int:
    """FLOPs of one forward pass of `model` on one image of `dataset` (torch.utils.flop_counter on the meta device:
    shapes only, nothing computed); raises what building the network raises (e.g. diffusers missing)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from dfbench.benchmark.engine.model import build_model
    from dfbench.datasets import data_info

    shape = tuple(int(v) for v in data_info(dataset)["image_shape"])
    counter = FlopCounterMode(display=False)
    with torch.device("meta"):
        net = build_model(model, shape[0])
    with torch.no_grad(), counter:
        net(torch.zeros(1, *shape, device="meta"), torch.full((1,), 0.5, device="meta"))
    return int(counter.get_total_flops())


def model_scales(grid: Grid, throughput_model: str, stand_in: str | None = None) -> tuple[dict[str, float], list[str]]:
    """For each train.model of `grid` other than the one the throughput was measured or stated for: the factor on
    its per-image training and sampling costs, the ratio of their forward FLOPs (counted here), with a line saying
    so; where one of the two cannot be built here (diffusers missing) the factor is 1, and the line says that.
    `stand_in` (cells planned in the throughput model's place) gets 1 and no line."""
    dataset = grid.cells[0].cfg.data.dataset
    out: dict[str, float] = {}
    notes = []
    for model in dict.fromkeys(c.cfg.train.model for c in grid.cells):
        if model in (throughput_model, stand_in):
            continue
        try:
            out[model] = forward_flops(model, dataset) / forward_flops(throughput_model, dataset)
        except Exception as err:  # noqa: BLE001 - a network this checkout cannot build: planned unscaled, said so
            notes.append(f"cells of {model}: planned at the per-image costs of {throughput_model}, unscaled (their "
                         f"FLOP ratio needs both networks built here: {type(err).__name__})")
            continue
        notes.append(f"cells of {model}: training and sampling at {out[model]:.3g}x the per-image costs of "
                     f"{throughput_model} (the ratio of their forward FLOPs)")
    return out, notes


# -- seeds ------------------------------------------------------------------------------------------

def size_seeds(claims_file: str | Path, evidence: str | Path, cells: Sequence[Cell], *,
               evidence_metrics: dict[str, str] | None = None, **options: Any) -> list[Sizing]:
    """`api.size_seeds` with this study's stand-in metrics (`EVIDENCE_METRICS`: Fashion-MNIST's for CIFAR-10's)."""
    return api_size_seeds(claims_file, evidence, cells,
                          evidence_metrics=EVIDENCE_METRICS if evidence_metrics is None else evidence_metrics, **options)


# -- loading the grid, whatever this checkout knows ---------------------------------------------------

def _raw_model(path: Path) -> str:
    spec = tomllib.loads(path.read_text(encoding="utf-8"))
    return str(spec.get("base", {}).get("train.model", "auto"))


def load_study_grid(name: str, device: str = "cuda") -> tuple[Grid, str, list[str], str | None]:
    """(grid, its train.model, problems that are not the model's, the stand-in model when this checkout cannot
    validate the grid's own). A model this dfbench does not know (or cannot build here: diffusers missing) is
    a preflight item, not a crash: the cells are then validated with `STAND_IN_MODEL`, which changes no
    count the plan uses (the costs per image come from the throughput)."""
    path = resolve_grid(name)
    model = _raw_model(path)
    extra: dict[str, Any] = {"device": device}
    try:
        return load_grid(path, extra=extra), model, [], None
    except GridError as err:
        if _model_problem(model) is None:
            raise
        first = str(err)
    spec = tomllib.loads(path.read_text(encoding="utf-8"))
    spec["base"] = {**spec.get("base", {}), "train.model": STAND_IN_MODEL}  # cells naming their own model keep it
    try:
        grid = parse_grid(spec, source=str(path), extra=extra)
    except GridError as err:
        raise GridError(f"{first}\n(and with train.model={STAND_IN_MODEL} in its place: {err})") from None
    return grid, model, [], STAND_IN_MODEL


# -- output -----------------------------------------------------------------------------------------

def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else grid_plan.fmt_seconds(seconds)


def render_checks(grid_name: str, checks: Sequence[Check]) -> str:
    lines = [f"{grid_name}: preflight (what this machine has)"]
    for c in checks:
        tag = "ok" if c.ok else ("MISSING" if c.required else "optional")
        lines.append(f"  [{tag:>8}] {c.name}: {c.detail}")
        if not c.ok and c.fix:
            lines.append(f"             get it: {c.fix}")
    blocking = [c for c in checks if not c.ok and c.required]
    optional = [c for c in checks if not c.ok and not c.required]
    if blocking:
        lines.append(f"  => {len(blocking)} required item(s) missing here: {', '.join(c.name for c in blocking)}"
                     + (f" (and {len(optional)} optional)" if optional else ""))
    else:
        lines.append("  => everything the study needs is here" + (f" ({len(optional)} optional item(s) missing)" if optional else ""))
    return "\n".join(lines)


def render_plan(plan: StudyPlan, model: str, stand_in: str | None) -> str:
    t = plan.throughput

    def model_of(c: CellPlan) -> str:  # a stand-in's cells are the grid's own model's
        return model if not c.model or c.model == stand_in else c.model

    by: dict[tuple[str, str, str], list[CellPlan]] = {}
    for c in plan.cells:
        by.setdefault((c.setting, model_of(c), c.capacity), []).append(c)
    head = ["setting", "model", "cells", "sample-grads/cell", "passes", "sampling NFE/cell", "feature images/cell", "per cell",
            "total"]
    rows = []
    for (setting, net, capacity), cells in by.items():
        c0 = cells[0]
        feats = " + ".join(f"{n:,.0f} {ex}" for ex, n in c0.feature_images.items()) or "-"
        rows.append([setting + (f" (capacity {capacity})" if capacity else ""), net, str(len(cells)), f"{c0.sample_grads:,.0f}",
                     str(c0.passes), f"{c0.nfe:,.0f}", feats, grid_plan.fmt_seconds(float(np.mean([c.seconds for c in cells]))),
                     _hours(sum(c.seconds for c in cells))])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    fmt = lambda r: "  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip()  # noqa: E731
    trained = sum(1 for c in plan.cells if c.setting != "untrained")
    per_model: dict[str, int] = {}
    for c in plan.cells:
        per_model[model_of(c)] = per_model.get(model_of(c), 0) + 1
    of = (f" of {model}" if len(per_model) == 1 else
          ": " + ", ".join(f"{n} of {m}" for m, n in sorted(per_model.items(), key=lambda kv: kv[0] != model)))
    lines = [f"plan: {len(plan.cells)} cells ({trained} trained, {len(plan.cells) - trained} untrained){of}"
             + (f" (planned with {stand_in} in its place: this checkout cannot build {model})" if stand_in else ""),
             fmt(head)] + [fmt(r) for r in rows]
    refs = ", ".join(f"{key} ({n:,} images)" for key, n in plan.reference_images.items())
    lines.append(f"  reference statistics once: {refs}: {grid_plan.fmt_seconds(plan.reference_seconds)}")
    lines.append(f"  throughput: {t.source}" + (f", {t.when}" if t.when else ""))
    lines.append(f"    {t.train_ms:.3g} ms per sample-gradient, {t.forward_ms:.3g} ms per sampling evaluation, "
                 f"{t.inception_ms:.3g} ms per Inception image, {t.dinov2_ms:.3g} ms per DINOv2 image, "
                 f"{t.score_s:.0f} s of scoring overhead per pass")
    word = "measured" if t.measured else "ESTIMATED (not measured here)"
    lines.append(f"  => {plan.hours:.1f} GPU-hours on one {t.device}, {word}")
    if not t.measured:
        lines.append(f"     measure it: on the GPU machine `python results/cifar10-gpu/gpu_plan.py {plan.source or plan.grid} --dry-run` "
                     f"(`make bench-{plan.grid}-plan`) times this grid's own network there; `--save FILE` keeps the "
                     "figures for a later `--throughput FILE`; `make gpu-check` checks the machine as a whole")
        if model != STATED_MODEL:
            lines.append(f"     (the stated figures are for {STATED_MODEL}; this grid trains {model})")
    lines += [f"  note: {n}" for n in plan.notes]
    lines.append("  not included: the held-out denoising loss, drift, method extras; evaluation runs once per pass; every "
                 "sample-gradient is counted at its network's full cost (a client training a narrower sub-model takes "
                 "less: for it, an upper bound)")
    return "\n".join(lines)


def render_sizing(sizing: Sequence[Sizing], evidence: Path, claims_file: Path) -> str:
    n = len(sizing)
    levels = {s.confidence for s in sizing if s.status != "no evidence"}
    bound = next(iter(levels)) if len(levels) == 1 else None
    lines = [f"seeds: each claim of {claims_file.name} sized from the paired spread of the same contrast in "
             f"{evidence.relative_to(ROOT) if evidence.is_relative_to(ROOT) else evidence} "
             + (f"at its one-sided {bound:.0%} upper confidence bound (chi-square) " if bound is not None else "")
             + f"(power 0.8 at alpha 0.05/{n}, Holm's strictest level; benchmark/report/verdicts.seeds_needed)"]
    head = ["claim", "metric (evidence)", "evidence seeds", "A/B or A-B", "sd",
            *(["sd sized from"] if bound is not None else []), "seeds needed", "grid gives", "status"]
    rows = []
    for s in sizing:
        est = "-" if not math.isfinite(s.estimate) else (f"x{s.estimate:.3g}" if s.metric != "kid" else f"{s.estimate:+.3g}")
        sized = ["-" if not math.isfinite(s.sd_sized) else f"{s.sd_sized:.3g}"] if bound is not None else []
        rows.append([s.claim, f"{s.metric} ({s.evidence_metric})", str(s.evidence_seeds), est,
                     "-" if not math.isfinite(s.sd) else f"{s.sd:.3g}", *sized, "-" if s.needed is None else str(s.needed),
                     str(s.grid_seeds), s.status])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in [head, *rows]]
    short = [s.claim for s in sizing if s.status == "short"]
    if short:
        lines.append(f"  => the grid gives fewer seeds than needed to: {', '.join(short)}")
    far = [f"{s.claim} ({s.needed or '>1000'})" for s in sizing if s.status == "out of reach"]
    if far:
        lines.append(f"  => out of reach at {SEED_CAP} seeds (reported, likely undecided): {', '.join(far)}")
    return "\n".join(lines)


def render(grid: Grid, checks: Sequence[Check], plan: StudyPlan, model: str, stand_in: str | None,
           sizing: Sequence[Sizing] | None = None, evidence: Path | None = None, claims_file: Path | None = None) -> str:
    parts = [render_checks(grid.name, checks), render_plan(plan, model, stand_in)]
    if sizing is not None and evidence is not None and claims_file is not None:
        parts.append(render_sizing(sizing, evidence, claims_file))
    return "\n\n".join(parts)


# -- command line -----------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python results/cifar10-gpu/gpu_plan.py", description=__doc__.split("\n\n")[0])
    p.add_argument("grid", help="a study's grid file (e.g. results/cifar10-gpu/cifar10-gpu.toml) or a shipped grid's name")
    p.add_argument("--device", default="cuda", help="the device the study runs on (default cuda)")
    p.add_argument("--dry-run", action="store_true", help="print the preflight and plan and exit 0 whatever is missing")
    p.add_argument("--data-root", default=None, help="look for the dataset here (as the grid's data.root)")
    p.add_argument("--gpu", default="h200", choices=sorted(STATED), help="whose stated throughput to plan with when "
                   "nothing is measured (default h200)")
    p.add_argument("--throughput", default=None, help="a throughput JSON written by --save (used when not measuring here)")
    p.add_argument("--save", default=None, help="write the throughput measured here to this JSON file (for --throughput)")
    p.add_argument("--no-measure", action="store_true", help="do not time the network even on a GPU")
    p.add_argument("--no-verify", action="store_true", help="skip the checksums (data and weights found are trusted)")
    p.add_argument("--evidence", default=str(EVIDENCE), help="runs.csv whose paired spread sizes the seeds")
    a = p.parse_args(argv)
    try:
        grid, model, problems, stand_in = load_study_grid(a.grid, a.device)
    except (GridError, ConfigError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    configs = [c.cfg for c in grid.cells]
    checks = preflight(configs, model=model, device=a.device, data_root=a.data_root, verify=not a.no_verify,
                       grid_problems=problems)
    throughput = None
    ready = {c.name: c.ok for c in checks}
    if not a.no_measure and a.device.startswith("cuda") and ready.get("CUDA device") and stand_in is None:
        trained = next((c.cfg for c in grid.cells if c.cfg.train.rounds > 0 and c.cfg.train.model == model), configs[0])
        try:
            throughput = measure_throughput(trained, a.device)
        except Exception as err:  # noqa: BLE001 - what fails in the timed steps would fail every cell: a preflight item
            from dfbench.benchmark.core.numerics import nondeterministic_hint

            first = (str(err).strip().splitlines() or [""])[0]
            checks.append(Check(f"a training step of {model} on {a.device}", False, f"{type(err).__name__}: {first}",
                                nondeterministic_hint(err) or "the grid's cells would fail the same way: fix this first"))
    if throughput is None and a.throughput and Path(a.throughput).is_file():
        throughput = read_throughput(a.throughput)
    if throughput is None:
        throughput = stated_throughput(a.gpu)
    if a.save and throughput.measured:  # a stated estimate is not kept: it is in this file already
        Path(a.save).parent.mkdir(parents=True, exist_ok=True)
        Path(a.save).write_text(json.dumps(asdict(throughput), indent=2) + "\n", encoding="utf-8")
    dinov2_ok = all(c.ok for c in checks if c.name.startswith("DINOv2"))
    # the network the throughput is for: the one timed, else the grid's own (a stated estimate stands for it)
    scales, scale_notes = model_scales(grid, throughput.model if throughput.measured and throughput.model else model, stand_in)
    plan = plan_study(grid, throughput, dinov2_available=dinov2_ok, model_scale=scales)
    plan.notes.extend(scale_notes)
    if not dinov2_ok:
        extra = plan_study(grid, throughput, dinov2_available=True, model_scale=scales).seconds - plan.seconds
        if extra > 0:
            plan.notes.append(f"fd_dinov2 is not planned (its weights are not here: those runs leave it out); with the "
                              f"DINOv2 file the study takes {_hours(extra)} more")
    claims_file = Path(grid.source).with_name(Path(grid.source).stem + ".claims.toml")
    sizing = None
    evidence = Path(a.evidence)
    if claims_file.is_file() and evidence.is_file():
        sizing = size_seeds(claims_file, evidence, grid.cells)
    print(render(grid, checks, plan, model, stand_in, sizing, evidence, claims_file))
    blocking = [c for c in checks if not c.ok and c.required]
    if a.dry_run:
        print(f"\ndry run: nothing was run{'; the study could start here' if not blocking else ''}")
        return 0
    if blocking:
        print(f"\nnot starting: {len(blocking)} required item(s) missing (above); nothing was run", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
