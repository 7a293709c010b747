"""`dfbench perf`: how fast the simulation is, measured side by side in one process.

What it measures (all on the same device, same model preset, same batch size):

(a) simulation overhead: wall time of R rounds of the real loop (`training.train_round`:
    N clients x S local steps, aggregation, diagnostics) divided by the wall time of the
    same number of plain training steps of one model (a hand-written loop: the model, one
    Adam, the same objective and gradient clipping, batches drawn on the device). 1.00 means
    the federated bookkeeping costs nothing; the target is <= 1.05. Beside them, the same
    clients' bare `local_train` calls, and the loop's milliseconds per round over those (what the
    round adds to its clients' training); the loops train one client at a time
    (train.client_workers=1), and a last row trains FedAvg's clients side by side.
(b) training images per second of each of those.
(c) FID feature extraction, images per second: dfbench's `Extractor.features` against
    pytorch-fid's own `InceptionV3` forward on the same images, with the same network
    weights (the FID weights if found, else a seeded random init of the same architecture:
    speed only, said in the table).
(d) batched clients (`train.clients_mode = "batched"`) against sequential clients: round
    throughput, speed-up, and how far the two global models end apart (float noise only).
(e) on CUDA (or with `variants=True`): plain-loop throughput with bf16 autocast,
    channels_last and torch.compile.

Each timing is the best of `repeats` alternating measurements, after an untimed warm-up
(allocations, cuDNN autotuning, a pruning method's one-off MAC count). Data are synthetic
uint8 images of the preset's shape: the speed of a step does not depend on pixel values.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import torch
from torch import nn

from dfbench import datasets
from dfbench import methods

from dfbench.benchmark.core.config import RunConfig, time_sampling_for
from dfbench.benchmark.engine.resolve import apply_overrides
from dfbench.benchmark.core.numerics import device_name
from dfbench.benchmark.engine.context import build_context
from dfbench.benchmark.engine.diffusion import make_objective
from dfbench.benchmark.engine.training import train_round
from dfbench.benchmark.engine.model import build_model
from dfbench.benchmark.core.seeds import derive_seed, torch_gen
from dfbench.benchmark.engine.local_step import StepSettings, autocast, local_train, make_optimizer

DEFAULT_METHODS = ("fedavg", "random_prune", "quantized")


@dataclass(frozen=True)
class PerfOptions:
    """Sizes of one `dfbench perf` measurement; None means "the device's default" (see `resolved`)."""

    device: str = "cpu"
    clients: int = 10
    steps: int | None = None  # local steps per round (CPU 2, CUDA 10)
    rounds: int | None = None  # timed rounds (CPU 2, CUDA 3)
    batch_size: int = 32
    preset: str | None = None  # model preset (CPU small28, CUDA small32)
    methods: tuple[str, ...] = DEFAULT_METHODS
    fid_images: int | None = None  # images for (c) (CPU 64, CUDA 1024); 0 skips (c)
    fid_batch: int | None = None  # batch of both extraction paths (CPU 50 = pytorch-fid's default, CUDA 256)
    batched_clients: tuple[int, ...] | None = None  # (d) client counts (CPU (8,), CUDA (8, 32)); () skips (d)
    variants: bool | None = None  # (e) bf16 / channels_last / compile (default: on CUDA only)
    repeats: int = 2
    seed: int = 0
    out: str | Path | None = "results/perf.md"

    def resolved(self) -> "PerfOptions":
        cuda = torch.device(self.device).type == "cuda"
        return PerfOptions(
            device=self.device, clients=self.clients, batch_size=self.batch_size, methods=self.methods,
            repeats=self.repeats, seed=self.seed, out=self.out,
            fid_images=self.fid_images if self.fid_images is not None else (1024 if cuda else 64),
            steps=self.steps if self.steps is not None else (10 if cuda else 2),
            rounds=self.rounds if self.rounds is not None else (3 if cuda else 2),
            preset=self.preset or ("small32" if cuda else "small28"),
            fid_batch=self.fid_batch or (256 if cuda else 50),
            batched_clients=self.batched_clients if self.batched_clients is not None else ((8, 32) if cuda else (8,)),
            variants=self.variants if self.variants is not None else cuda,
        )


@dataclass
class PerfReport:
    """The measured tables (lists of row dicts) and their markdown."""

    machine: dict[str, str]
    options: PerfOptions
    overhead: list[dict[str, Any]] = field(default_factory=list)
    fid: list[dict[str, Any]] = field(default_factory=list)
    fid_notes: list[str] = field(default_factory=list)
    batched: list[dict[str, Any]] = field(default_factory=list)
    variants: list[dict[str, Any]] = field(default_factory=list)
    markdown: str = ""


# -- helpers ---------------------------------------------------------------------------------------

def machine_info(device: torch.device) -> dict[str, str]:
    """CPU model, cores, torch version, device name, date: what the numbers came from."""
    cpu = device_name("cpu")
    name = device_name(device) if device.type == "cuda" else "cpu"
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu, "cores": str(os.cpu_count()), "torch_threads": str(torch.get_num_threads()),
        "torch": torch.__version__, "device": f"{device} ({name})",
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], object], device: torch.device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def write_page(out: Path, stem: str, markdown: str, report: dict[str, Any]) -> tuple[Path, Path]:
    """OUT/STEM.md (a benchmark's page) and OUT/STEM.json (its report, every timing): the two files each
    side-by-side benchmark (flower_bench, submodel_speed) writes."""
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / f"{stem}.md", out / f"{stem}.json"
    md.write_text(markdown)
    js.write_text(json.dumps(report, indent=1) + "\n")
    return md, js


def comma_list(cast: Callable[[str], Any], what: str, example: str) -> Callable[[str], tuple[Any, ...]]:
    """An argparse type: "2,10,40" -> (2, 10, 40) with `cast`, or an error naming `what` and an `example`."""
    def parse(text: str) -> tuple[Any, ...]:
        try:
            return tuple(cast(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, e.g. {example}; got {text!r}") from None

    return parse


def _grey(preset: str) -> bool:
    """The preset's dataset shape is 28x28 grey (Fashion-MNIST's presets), else 32x32 RGB (the *32 presets and
    DDPM's CIFAR-10 network)."""
    return not (preset.endswith("32") or preset.endswith("cifar10"))


def synthetic_images(preset: str, n: int, seed: int) -> datasets.ImageSet:
    """uint8 images of the preset's dataset shape (28x28 grey or 32x32 RGB), 10 balanced labels."""
    grey = _grey(preset)
    shape = (1, 28, 28) if grey else (3, 32, 32)
    g = torch.Generator().manual_seed(derive_seed(seed, "perf-images"))
    images = torch.randint(0, 256, (n, *shape), generator=g, dtype=torch.uint8)
    return datasets.ImageSet(name="fmnist" if grey else "cifar10", split="train", images=images,
                             labels=torch.arange(n) % 10, sha256="synthetic", source="dfbench perf")


def run_config(o: PerfOptions, data: datasets.ImageSet, method: str, clients: int, **train: Any) -> RunConfig:
    """The RunConfig of one timed loop: `o`'s sizes, no evaluation, `train` as train.* overrides (the rest defaults)."""
    items = {
        "data.dataset": data.name, "data.clients": clients, "train.rounds": o.rounds, "train.local_steps": o.steps,
        "train.batch_size": o.batch_size, "train.model": o.preset, "eval.metrics": "none", "seed": o.seed,
        "device": o.device, **{f"train.{k}": v for k, v in train.items()},
    }
    return apply_overrides(RunConfig(method=method), items)


class LoopTimer:
    """R rounds of the real loop for one config, timed after one untimed warm-up round (`warmup=False`:
    none, the first timed round is round 1, as in a run)."""

    def __init__(self, cfg: RunConfig, data: datasets.ImageSet, *, warmup: bool = True) -> None:
        self.ctx = build_context(cfg, data=data)
        self.method = methods.create_method(cfg.method, **dict(cfg.method_params))
        self.state = self.method.init_state(self.ctx.init_params, self.ctx)
        self.next_round = 1
        if warmup:
            self.run(1)

    def run(self, rounds: int) -> None:
        for _ in range(rounds):
            self.state, _row = train_round(self.method, self.state, self.ctx, self.next_round)
            self.next_round += 1

    def time(self, rounds: int) -> float:
        return _timed(lambda: self.run(rounds), self.ctx.device)


class PlainTrainer:
    """The baseline: one model, one Adam, the same objective, batches drawn on the device."""

    def __init__(self, cfg: RunConfig, data: datasets.ImageSet, *, amp: str | None = None, channels_last: bool = False,
                 compile: bool = False) -> None:
        self.device = torch.device(cfg.device)
        self.images = data.images.to(self.device)
        torch.manual_seed(derive_seed(cfg.seed, "init"))
        self.model: nn.Module = build_model(cfg.train.model, self.images.shape[1]).to(self.device)
        if compile:
            self.model.compile()
        self.opt = make_optimizer(list(self.model.parameters()), cfg.train.lr)
        self.obj = make_objective(cfg.train.objective, cfg.train.schedule, cfg.train.timesteps,
                                  time_sampling_for(cfg.train, cfg.train.objective))
        self.gen = torch_gen(cfg.seed, "perf-plain", device=self.device)
        # the run's resolved autocast unless told (train.amp=auto is bf16 on a CPU with it): like against like
        self.amp = cfg.train.amp if amp is None else amp
        self.batch, self.clip, self.channels_last = cfg.train.batch_size, cfg.train.grad_clip, channels_last

    def run(self, steps: int) -> None:
        for _ in range(steps):
            pick = torch.randint(0, self.images.shape[0], (self.batch,), generator=self.gen, device=self.device)
            x0 = datasets.to_model_space(self.images[pick])
            if self.channels_last:
                x0 = x0.contiguous(memory_format=torch.channels_last)
            with autocast(self.device, self.amp):
                loss = self.obj.loss(self.model, x0, self.gen)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            if self.clip > 0:
                nn.utils.clip_grad_norm_(self.model.parameters(), self.clip, foreach=True)
            self.opt.step()

    def time(self, steps: int) -> float:
        return _timed(lambda: self.run(steps), self.device)


# -- (a, b) overhead -------------------------------------------------------------------------------

class BareClients:
    """The round without the round: the same clients' `local_train` calls, one after another, from the same
    start, with their own generators, and nothing else (no plans, uploads, sums, diagnostics, copies)."""

    def __init__(self, loop: LoopTimer) -> None:
        self.loop, self.ctx = loop, loop.ctx
        self.settings = StepSettings.of(self.ctx.cfg.train, self.ctx.cfg.train.lr)
        self.objective = self.ctx.get_objective(self.ctx.cfg.train.objective)

    def run(self, rounds: int) -> None:
        ctx, start = self.ctx, self.loop.state.params
        for r in range(1, rounds + 1):
            for k in range(ctx.num_clients):
                local_train(ctx.model, ctx.flat, start, ctx.images, ctx.client_indices[k], self.objective, methods.LocalStep(),
                            self.settings, steps=int(ctx.local_steps[k]), gen=ctx.gen("client", r, k))

    def time(self, rounds: int) -> float:
        return _timed(lambda: self.run(rounds), self.ctx.device)


def measure_overhead(o: PerfOptions, data: datasets.ImageSet) -> list[dict[str, Any]]:
    """Plain steps, bare local_train calls, and the loop for each method (clients one after another, as the
    other two), then FedAvg with its clients side by side (train.client_workers=0); best of o.repeats,
    alternating. `round_overhead_ms`: the loop's time per round over the bare local_train calls'."""
    assert o.rounds is not None and o.steps is not None
    steps = o.clients * o.steps * o.rounds
    images = steps * o.batch_size
    plain = PlainTrainer(run_config(o, data, "fedavg", o.clients), data)
    plain.run(2)  # warm-up
    registered = set(methods.list_methods("*"))
    loops = {m: LoopTimer(run_config(o, data, m, o.clients, client_workers=1), data) for m in o.methods if m in registered}
    timers: dict[str, Any] = {"plain loop": plain}
    if "fedavg" in loops:
        timers["local_train calls"] = bare = BareClients(loops["fedavg"])
        bare.run(1)  # warm-up
    timers.update(loops)
    if "fedavg" in loops and o.device == "cpu" and torch.get_num_threads() > 1:
        timers["fedavg, clients side by side"] = LoopTimer(run_config(o, data, "fedavg", o.clients, client_workers=0), data)
    best = {name: math.inf for name in timers}
    for _ in range(o.repeats):
        for name, t in timers.items():
            best[name] = min(best[name], t.time(steps if name == "plain loop" else o.rounds))
    bare_s = best.get("local_train calls")
    rows = []
    for name in timers:
        row = {"run": name, "seconds": best[name], "images_per_s": images / best[name], "overhead": best[name] / best["plain loop"],
               "round_overhead_ms": None}
        if bare_s is not None and name not in ("plain loop", "fedavg, clients side by side"):  # (that one: a speed-up)
            row["round_overhead_ms"] = (best[name] - bare_s) / o.rounds * 1000
        rows.append(row)
    for m in o.methods:
        if m not in loops:
            rows.append({"run": m, "seconds": None, "images_per_s": None, "overhead": None, "round_overhead_ms": None,
                         "note": "not registered"})
    return rows


# -- (c) FID feature extraction ------------------------------------------------------------------

def _inception_state(device: str) -> tuple[dict[str, torch.Tensor], str, Any]:
    """(state dict, note, dfbench Extractor or None): the FID weights when found, else a seeded random init."""
    from dfbench.benchmark.metrics.features import MissingWeightsError, WeightsHashError, find_weights, get_extractor, seeded_fid_inception_state_dict

    try:
        ex = get_extractor("inception", device=device)
    except (MissingWeightsError, WeightsHashError) as err:
        why = "weights file not found" if isinstance(err, MissingWeightsError) else "weights file failed its sha256 check"
        return seeded_fid_inception_state_dict(0), f"random init of the FID Inception ({why}): speed only", None
    sd = torch.load(find_weights("inception"), map_location="cpu", weights_only=True)  # verified by get_extractor
    return sd, f"FID Inception weights (sha256 {ex.sha256[:12]}...)", ex


def _dfbench_extractor(sd: dict[str, torch.Tensor], device: str) -> Any:
    """The evaluation helper's Extractor around the FID network with state dict `sd`."""
    from dfbench.benchmark.metrics import features

    net = features.build_fid_inception_v3()
    net.load_state_dict(sd)
    # get_extractor refuses weights it cannot verify; this is its "inception" extractor with
    # the given weights: same network class and the helper's own preprocessing.
    return features.Extractor(name="inception", sha256="unverified", backend="pytorch-fid", resize="torch-bilinear-299",
                              dims=2048, network=features.FIDInceptionFeatures(net).eval().to(device),
                              prepare=features._prepare_inception, device=device)


def _pytorch_fid_model(sd: dict[str, torch.Tensor], device: torch.device) -> nn.Module:
    """pytorch-fid's own InceptionV3 (pool3 block) with state dict `sd`.

    Its constructor downloads the FID weights through `fid_inception_v3()`; we hand it the same
    architecture with `sd` instead (no network access), and time its own forward path.
    """
    import pytorch_fid.inception as pfi

    from dfbench.benchmark.metrics.features import build_fid_inception_v3

    net = build_fid_inception_v3()
    net.load_state_dict(sd)
    with mock.patch.object(pfi, "fid_inception_v3", lambda: net):
        model = pfi.InceptionV3([pfi.InceptionV3.BLOCK_INDEX_BY_DIM[2048]])
    return model.eval().to(device)


def _pytorch_fid_features(model: nn.Module, images: torch.Tensor, batch: int, device: torch.device) -> np.ndarray:
    """pytorch-fid's activation loop (fid_score.get_activations) on in-memory uint8 images."""
    out = []
    for i in range(0, images.shape[0], batch):
        x = images[i:i + batch].to(device).float() / 255.0  # ToTensor's [0, 1]
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)  # PIL convert("RGB") of a grey image
        with torch.no_grad():
            pred = model(x)[0]
        out.append(pred.squeeze(3).squeeze(2).cpu().numpy())
    return np.concatenate(out)


def measure_fid(o: PerfOptions, data: datasets.ImageSet) -> tuple[list[dict[str, Any]], list[str]]:
    """images/s of dfbench's extractor and pytorch-fid's forward, same images and weights."""
    assert o.fid_batch is not None
    device = torch.device(o.device)
    sd, note, ex = _inception_state(o.device)
    ours = ex if ex is not None else _dfbench_extractor(sd, o.device)
    theirs = _pytorch_fid_model(sd, device)
    images = data.images[: o.fid_images].to(device)
    run_ours = partial(ours.features, images, batch_size=o.fid_batch, device=device)
    run_theirs = partial(_pytorch_fid_features, theirs, images, o.fid_batch, device)
    ours.features(images[:2], batch_size=2, device=device)  # warm-up
    _pytorch_fid_features(theirs, images[:2], 2, device)
    best = {"ours": math.inf, "theirs": math.inf}
    for _ in range(o.repeats):
        best["ours"] = min(best["ours"], _timed(run_ours, device))
        best["theirs"] = min(best["theirs"], _timed(run_theirs, device))
    diff = float(np.abs(run_ours() - run_theirs()).max())
    n = images.shape[0]
    rows = [
        {"path": "dfbench Extractor.features", "images": n, "batch": min(n, o.fid_batch), "seconds": best["ours"], "images_per_s": n / best["ours"]},
        {"path": "pytorch-fid InceptionV3 forward", "images": n, "batch": min(n, o.fid_batch), "seconds": best["theirs"], "images_per_s": n / best["theirs"]},
    ]
    notes = [f"weights: {note}", f"speed ratio dfbench / pytorch-fid: {best['theirs'] / best['ours']:.3f}",
             f"max |feature difference| between the two paths: {diff:.3g}"]
    return rows, notes


# -- (d) batched vs sequential clients ---------------------------------------------------------------

def measure_batched(o: PerfOptions, data: datasets.ImageSet) -> list[dict[str, Any]]:
    """fedavg rounds with sequential vs batched clients, per client count."""
    assert o.rounds is not None and o.steps is not None and o.batched_clients is not None
    rows = []
    for n in o.batched_clients:
        timers = {mode: LoopTimer(run_config(o, data, "fedavg", n, clients_mode=mode), data) for mode in ("sequential", "batched")}
        best = {mode: math.inf for mode in timers}
        for _ in range(o.repeats):
            for mode, lt in timers.items():
                best[mode] = min(best[mode], lt.time(o.rounds))
        a, b = timers["sequential"].state.params, timers["batched"].state.params
        images = n * o.steps * o.rounds * o.batch_size
        rows.append({
            "clients": n, "sequential_images_per_s": images / best["sequential"], "batched_images_per_s": images / best["batched"],
            "speedup": best["sequential"] / best["batched"],
            "rel_diff": float((a - b).norm() / a.norm()),  # both ran the same rounds from the same seed
        })
    return rows


# -- (e) training-step variants ---------------------------------------------------------------------

def measure_variants(o: PerfOptions, data: datasets.ImageSet) -> list[dict[str, Any]]:
    """Plain-loop images/s with bf16 autocast, channels_last and (CUDA) torch.compile.

    bf16 is timed as bf16 also on a CPU without native bfloat16 (where a run falls back to
    float32: numerics.effective_amp): the table shows what the emulation would cost."""
    with mock.patch.dict(os.environ, {"DFBENCH_CPU_BF16": "emulate"}):
        return _measure_variants(o, data)


def _measure_variants(o: PerfOptions, data: datasets.ImageSet) -> list[dict[str, Any]]:
    assert o.rounds is not None and o.steps is not None
    cuda = torch.device(o.device).type == "cuda"
    cfg = run_config(o, data, "fedavg", o.clients)
    variants: list[tuple[str, dict[str, Any]]] = [
        ("fp32", {"amp": "off"}), ("bf16 autocast", {"amp": "bf16"}), ("channels_last", {"amp": "off", "channels_last": True}),
        ("bf16 + channels_last", {"amp": "bf16", "channels_last": True}),
    ]
    if cuda:
        variants.append(("torch.compile", {"compile": True}))
    steps = o.clients * o.steps * o.rounds
    trainers = {}
    for name, kw in variants:
        trainers[name] = PlainTrainer(cfg, data, **kw)
        trainers[name].run(3)  # warm-up (compiles)
    best = {name: math.inf for name in trainers}
    for _ in range(o.repeats):
        for name, tr in trainers.items():
            best[name] = min(best[name], tr.time(steps))
    base = best["fp32"]
    return [{"variant": name, "images_per_s": steps * o.batch_size / t, "speedup": base / t} for name, t in best.items()]


# -- the report ----------------------------------------------------------------------------------

def _f(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def render(rep: PerfReport) -> str:
    """The markdown page of a report."""
    o, m = rep.options, rep.machine
    n_params = sum(p.numel() for p in build_model(str(o.preset), 1 if _grey(str(o.preset)) else 3).parameters())
    lines = [
        "# dfbench perf", "",
        f"- date: {m['date']}",
        f"- machine: {m['cpu']}, {m['cores']} cores (torch threads {m['torch_threads']}); torch {m['torch']}; device {m['device']}",
        f"- sizes: preset {o.preset} ({n_params:,} parameters), {o.clients} clients x {o.steps} local steps x {o.rounds} rounds, "
        f"batch {o.batch_size}; best of {o.repeats} after a warm-up; synthetic uint8 images",
        "",
    ]
    if rep.overhead:
        lines += [
            "## (a, b) Simulation overhead and training throughput", "",
            "Overhead = wall time of the real loop (`training.train_round`: clients, aggregation, diagnostics) / "
            "wall time of the same number of plain training steps (one model, one Adam, same objective and clipping). "
            "Target: <= 1.05. Per round = the loop's milliseconds per round over the same clients' bare "
            "`local_train` calls (what the round adds to its clients' training). The loops train their clients one "
            "after another (train.client_workers=1), as the two baselines do; the last row, where present, trains "
            "them side by side in one-thread processes (the default of a run with several threads).", "",
            "| run | seconds | train images/s | overhead | per round (ms) |", "|---|---:|---:|---:|---:|",
        ]
        for r in rep.overhead:
            if r.get("note"):
                lines.append(f"| {r['run']} | {r['note']} | - | - | - |")
            else:
                lines.append(f"| {r['run']} | {_f(r['seconds'], 3)} | {_f(r['images_per_s'])} | {_f(r['overhead'], 3)} | "
                             f"{_f(r.get('round_overhead_ms'), 1)} |")
        lines.append("")
    if rep.fid:
        lines += ["## (c) FID feature extraction", "", "| path | images | batch | seconds | images/s |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {r['path']} | {r['images']} | {r['batch']} | {_f(r['seconds'], 3)} | {_f(r['images_per_s'])} |" for r in rep.fid]
        lines += [""] + [f"- {n}" for n in rep.fid_notes] + [""]
    if rep.batched:
        lines += [
            "## (d) Batched vs sequential clients (fedavg)", "",
            "Same rounds from the same seed in both modes; the last column is ||theta_seq - theta_batched|| / ||theta_seq||.", "",
            "| clients | sequential images/s | batched images/s | speed-up | rel. difference |", "|---:|---:|---:|---:|---:|",
        ]
        lines += [f"| {r['clients']} | {_f(r['sequential_images_per_s'])} | {_f(r['batched_images_per_s'])} | "
                  f"{_f(r['speedup'], 2)} | {r['rel_diff']:.1e} |" for r in rep.batched]
        lines.append("")
    if rep.variants:
        lines += ["## (e) Training-step variants (plain loop)", "", "| variant | images/s | speed-up vs fp32 |", "|---|---:|---:|"]
        lines += [f"| {r['variant']} | {_f(r['images_per_s'])} | {_f(r['speedup'], 2)} |" for r in rep.variants]
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def run_perf(options: PerfOptions, log: Callable[[str], None] | None = None) -> PerfReport:
    """Measure everything `options` asks for, write the markdown to options.out (if set), return the report.

    `log` receives one line as each section starts (the CLI prints them to stderr).
    """
    say = log or (lambda _msg: None)
    o = options.resolved()
    assert o.rounds is not None and o.steps is not None and o.batched_clients is not None
    assert o.fid_images is not None
    if min(o.clients, o.steps, o.rounds, o.batch_size, o.repeats) < 1 or o.fid_images < 0:
        raise ValueError("perf sizes must be >= 1 (clients, steps, rounds, batch size, repeats) and fid images >= 0")
    device = torch.device(o.device)
    n_images = max(64 * max(o.clients, *o.batched_clients, 1), o.fid_images)
    data = synthetic_images(str(o.preset), n_images, o.seed)
    rep = PerfReport(machine=machine_info(device), options=o)
    say(f"perf: (a, b) plain loop vs {', '.join(o.methods)}: {o.clients} clients x {o.steps} steps x {o.rounds} rounds of {o.preset}")
    rep.overhead = measure_overhead(o, data)
    if o.fid_images:
        say(f"perf: (c) FID feature extraction, {o.fid_images} images")
        rep.fid, rep.fid_notes = measure_fid(o, data)
    if o.batched_clients:
        say(f"perf: (d) batched vs sequential clients at {', '.join(map(str, o.batched_clients))} clients")
        rep.batched = measure_batched(o, data)
    if o.variants:
        say("perf: (e) bf16 / channels_last / compile variants")
        rep.variants = measure_variants(o, data)
    rep.markdown = render(rep)
    if o.out:
        path = Path(o.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rep.markdown)
    return rep


def parse_counts(text: str) -> tuple[int, ...]:
    """'8,32' -> (8, 32); '' -> ()."""
    return tuple(int(x) for x in text.split(",") if x.strip())


__all__ = ["PerfOptions", "PerfReport", "run_perf", "render", "machine_info", "parse_counts"]
