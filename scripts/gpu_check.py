"""One-call GPU check: everything GPU-side that the README claims, measured in one go (<= 10 min).

Steps (each with its own timeout; a failed step is reported and the next one runs):

1. environment   nvidia-smi, torch / CUDA / cuDNN / NCCL versions, GPUs, CPU cores, Fashion-MNIST found,
                 and which dfbench code runs (it must be this checkout's)
2. smoke         every registered method, one tiny round on the device (synthetic images), and
                 batched vs sequential clients after one round (max relative parameter difference)
3. flags         tiny runs (synthetic images), each with one CUDA-only or speed flag on: train.amp=bf16,
                 train.channels_last, train.compile, fused Adam on the flat buffer, compiled sampling of a
                 pruning method, train.deterministic=false; and the determinism figure: one fedavg run
                 twice with train.deterministic=true, final parameters bitwise equal or not
4. fmnist-seq    a short Fashion-MNIST `dfbench run --device cuda` (sequential clients), fd_fmnist
5. fmnist-batch  the same run with train.clients_mode=batched: images/s and speed-up
6. torchrun      the same run under `torchrun --standalone --nproc-per-node N` (N = GPUs; NCCL when
                 N > 1), and how far its final model is from the one-process run
7. perf          `dfbench perf --device cuda`

Writes ONE report, results/gpu-check.md: environment, pass/fail and wall time per step, images/s,
scores, and the `dfbench perf` table. Run folders go to results/runs/gpu-check/ (not committed).

Usage: scripts/gpu_check.sh (runs this checkout's code through a shim on PYTHONPATH and installs
missing dependencies first), or `make gpu-check`. DEVICE=cpu runs the same steps with shrunken
budgets on the CPU, to check the script itself (the CUDA-only flags are then skipped, with the
reason; its runs use one OpenMP thread unless OMP_NUM_THREADS is set); its report goes to
results/runs/gpu-check/gpu-check-cpu.md. BUDGET=600 is the total in seconds; --work DIR moves the run folders.

Helper modes of scripts/gpu_check.sh (neither imports torch): `--missing [--pyproject PATH]` prints
the [project].dependencies the interpreter lacks (one line, space separated, empty when none);
`--where` prints where dfbench and its sub-packages are imported from ("module realpath" lines).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "results" / "runs" / "gpu-check"  # run folders; --work DIR moves them


# ---------------------------------------------------------------------------------------------
# Helper modes of gpu_check.sh: standard library only (run before torch is known to be there)

# distribution name (normalized) -> import name, where they differ beyond '-' -> '_'
IMPORT_NAMES = {"pytorch-fid": "pytorch_fid", "clean-fid": "cleanfid", "pillow": "PIL"}


def _normalize(name: str) -> str:
    """PEP 503: "Pytorch_FID" -> "pytorch-fid"."""
    return re.sub(r"[-_.]+", "-", name).lower()


def missing_dependencies(pyproject: Path) -> list[str]:
    """The [project].dependencies of `pyproject` that this interpreter cannot import (distribution names).

    Presence only (importlib.util.find_spec, nothing is imported); versions are pip's business when
    it installs. A requirement whose environment marker is false here is not needed.
    """
    import importlib.util
    import tomllib

    deps = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {}).get("dependencies", [])
    missing = []
    for req in deps:
        spec, _, marker = req.partition(";")
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
        if not m:
            continue
        if marker.strip():
            try:
                from packaging.markers import Marker

                if not Marker(marker.strip()).evaluate():
                    continue
            except Exception:  # noqa: BLE001 -- no packaging, or a marker it cannot read: count it as needed
                pass
        dist = m.group(1)
        module = IMPORT_NAMES.get(_normalize(dist), _normalize(dist).replace("-", "_"))
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(dist)
    return missing


def where() -> list[tuple[str, str]]:
    """(module, realpath of its __init__.py) for dfbench and its three sub-packages, without running them."""
    import importlib.util

    import dfbench  # its __init__ imports nothing heavy

    rows = [("dfbench", os.path.realpath(dfbench.__file__ or ""))]
    for sub in ("benchmark", "methods", "datasets"):
        spec = importlib.util.find_spec(f"dfbench.{sub}")  # the parent is imported, the package is not run
        rows.append((f"dfbench.{sub}", os.path.realpath(spec.origin) if spec and spec.origin else "not-found"))
    return rows


@dataclass
class Step:
    """One step's outcome: pass / fail / timeout / skipped, its wall time, figures and details."""

    name: str
    what: str
    status: str = "skipped"
    seconds: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)
    detail: str = ""


@dataclass(frozen=True)
class Budget:
    """Run sizes per device: real figures on CUDA, the smallest meaningful run on the CPU."""

    clients: int
    rounds: int
    local_steps: int
    batch_size: int
    eval_samples: int
    run_set: tuple[str, ...]  # extra --set items of the Fashion-MNIST runs
    perf_args: tuple[str, ...]


CUDA_BUDGET = Budget(clients=10, rounds=3, local_steps=50, batch_size=64, eval_samples=1000,
                     run_set=("eval.metrics=fd_fmnist",), perf_args=())
CPU_BUDGET = Budget(clients=4, rounds=2, local_steps=2, batch_size=8, eval_samples=16,
                    run_set=("train.model=tiny", "eval.grid=4", "eval.sampler_steps=3", "eval.metrics=none"),
                    perf_args=("--clients", "2", "--steps", "1", "--rounds", "1", "--preset", "tiny",
                               "--fid-images", "0", "--batched-clients", "2", "--repeats", "1", "--methods", "fedavg"))


class Clock:
    """The whole check's deadline; each step gets min(its own timeout, what is left)."""

    def __init__(self, total: float) -> None:
        self.start = time.monotonic()
        self.total = total

    def left(self) -> float:
        return self.total - (time.monotonic() - self.start)


def run_cmd(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int | None, str, str, float]:
    """(exit code or None on timeout, stdout, stderr, seconds); a timeout kills the whole process group."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})}, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=max(1.0, timeout))
        return proc.returncode, out, err, time.monotonic() - t0
    except subprocess.TimeoutExpired:
        # torchrun starts workers of its own: end the group we started, not just the leader.
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err, time.monotonic() - t0


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _execute(step: Step, cmd: list[str], clock: Clock, timeout: float, env: dict[str, str] | None = None) -> str | None:
    """Run one command of a step; returns its stdout, or None after recording the failure on the step."""
    step.commands.append(" ".join(cmd).replace(f"{ROOT}/", ""))
    limit = min(timeout, clock.left() - 5)
    if limit < 15:
        step.status, step.detail = "skipped", f"out of time ({clock.left():.0f} s of the budget left)"
        return None
    rc, out, err, seconds = run_cmd(cmd, limit, env)
    step.seconds += seconds
    if rc is None:
        step.status, step.detail = "timeout", f"killed after {limit:.0f} s\n{_tail(err)}"
        return None
    if rc != 0:
        step.status, step.detail = "fail", f"exit code {rc}\n{_tail(err or out)}"
        return None
    step.status = "pass"
    return out


# ---------------------------------------------------------------------------------------------
# In-process parts (run as `gpu_check.py --probe env|smoke DEVICE` in a child, so a CUDA crash
# never takes the report down)


def probe_env(device: str) -> dict[str, Any]:
    import torch

    from dfbench import datasets

    info: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__, "cpu_cores": os.cpu_count(),
        "cuda_available": torch.cuda.is_available(), "cuda_torch": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "gpus": [], "fmnist": str(datasets.locate("fmnist") or ""),
        "dfbench_code": dict(where()),
    }
    if torch.cuda.is_available():
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            info["gpus"].append({"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                                 "capability": f"{p.major}.{p.minor}"})
    return info


def _synthetic_data() -> Any:
    """256 random 28x28 images, ten labels: what the tiny in-process runs train on (no download)."""
    import numpy as np
    import torch

    from dfbench.datasets import ImageSet

    g = np.random.default_rng(0)
    labels = np.arange(256) % 10
    images = g.integers(0, 255, size=(256, 1, 28, 28)).astype(np.uint8)
    return ImageSet(name="fmnist", split="train", images=torch.from_numpy(images),
                    labels=torch.from_numpy(labels.astype(np.int64)), sha256="synthetic", source="gpu-check")


def _tiny(device: str) -> dict[str, Any]:
    """The tiny run of the in-process probes (2 clients in the CPU dry mode: half its time)."""
    return {"device": device, "clients": 4 if device.startswith("cuda") else 2, "rounds": 1, "local_steps": 2,
            "batch_size": 8, "train.model": "tiny", "data.min_client_size": 4, "eval.samples": 16, "eval.grid": 4,
            "eval.sampler_steps": 3, "eval.metrics": "none"}


# CPU dry mode only: settings that shrink a method's fixed extra work (the experts' router trains
# 300 steps after the last round, half of the smoke step's time on two cores)
CPU_SMOKE_EXTRA: dict[str, dict[str, Any]] = {"experts": {"method.router_steps": 10}}


def probe_smoke(device: str) -> dict[str, Any]:
    """Every method, one tiny round on `device`; batched vs sequential after one round."""
    import tempfile

    import dfbench
    from dfbench import methods
    from dfbench.benchmark.core.runfolder import load_checkpoint

    data = _synthetic_data()
    tiny = _tiny(device)
    extra = {} if device.startswith("cuda") else CPU_SMOKE_EXTRA
    result: dict[str, Any] = {"methods": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in methods.list_methods():
            t0 = time.perf_counter()
            try:
                dfbench.run(method=name, out=Path(tmp) / "methods", data=data, **tiny, **extra.get(name, {}))
                result["methods"][name] = {"ok": True, "seconds": round(time.perf_counter() - t0, 2)}
            except Exception as err:  # noqa: BLE001 -- a smoke test reports every failure and goes on
                result["methods"][name] = {"ok": False, "error": f"{type(err).__name__}: {err}"[:300]}
        try:
            params = {}
            for mode in ("sequential", "batched"):
                folder = dfbench.run(method="fedavg", out=Path(tmp) / mode, data=data,
                                     **{**tiny, "local_steps": 5, "train.clients_mode": mode})
                params[mode] = load_checkpoint(folder)["params"].double().cpu()
            diff = (params["batched"] - params["sequential"]).abs().max() / params["sequential"].abs().max()
            result["batched_vs_sequential_rel"] = float(diff)
        except Exception as err:  # noqa: BLE001
            result["batched_error"] = f"{type(err).__name__}: {err}"[:300]
    return result


FLAG_MARK = "@flag "  # probe_flags prints one such line per item as it finishes (a timeout keeps the earlier ones)

# (item, method, settings, CUDA only): one tiny run each, one flag on. A CUDA-only flag is refused
# by the config on the CPU; the CPU dry mode records that refusal as "skipped" with its message.
FLAG_RUNS: tuple[tuple[str, str, dict[str, Any], bool], ...] = (
    ("train.amp=bf16", "fedavg", {"train.amp": "bf16"}, False),
    ("train.channels_last=true", "fedavg", {"train.channels_last": True}, False),
    ("train.compile=true", "fedavg", {"train.compile": True}, True),
    ("compiled sampling, random_prune", "random_prune", {"train.compile": True}, True),
    ("train.deterministic=false", "fedavg", {"train.deterministic": False}, True),
)


def _err(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"[:400]


def _flag_run(name: str, method: str, settings: dict[str, Any], cuda_only: bool, device: str, tiny: dict[str, Any],
              data: Any, out: Path) -> dict[str, Any]:
    """One tiny run with `settings` on: pass when it trains and evaluates with finite losses; a CUDA-only
    flag the config refuses off CUDA is skipped, with the refusal as the reason."""
    import math

    import dfbench
    from dfbench.benchmark.core.parsing import ConfigError

    item: dict[str, Any] = {"flag": name, "status": "fail", "seconds": 0.0, "detail": "", "figures": {}}
    t0 = time.perf_counter()
    try:
        cfg = dfbench.make_config(method=method, **{**tiny, **settings})
    except ConfigError as err:
        if cuda_only and not device.startswith("cuda"):
            item["status"], item["detail"] = "skipped", f"CUDA only, refused on {device}: {err}"
        else:
            item["detail"] = _err(err)
        return item
    except Exception as err:  # noqa: BLE001
        item["detail"] = _err(err)
        return item
    try:
        folder = dfbench.run(cfg, out=out, force=True, data=data)
        rounds = (folder / "rounds.jsonl").read_text().splitlines()
        losses = [json.loads(ln).get("loss") for ln in rounds if ln.strip()]
        if not losses or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in losses):
            item["detail"] = f"non-finite training loss: {losses}"
        else:
            item["status"] = "pass"
            item["figures"]["loss"] = f"{losses[-1]:.4f}"
        numerics_file = folder / "numerics.json"
        if device.startswith("cuda") and numerics_file.is_file():  # what the run set (CPU: nothing to see)
            n = json.loads(numerics_file.read_text())["starts"][-1]
            on = {True: "on", False: "off"}
            item["figures"]["numerics"] = (f"deterministic algorithms {on[bool(n.get('deterministic_algorithms'))]}, "
                                           f"cudnn.benchmark {on[bool(n.get('cudnn_benchmark'))]}, "
                                           f"TF32 matmul {on[bool(n.get('tf32_matmul'))]}")
    except Exception as err:  # noqa: BLE001 -- a flag that fails is reported, the next one runs
        item["detail"] = _err(err)
    item["seconds"] = round(time.perf_counter() - t0, 2)
    return item


def _fused_adam(device: str) -> dict[str, Any]:
    """The run's optimizer (local_step.make_optimizer) on the flat buffer of the fmnist model: fused or not,
    and 3 steps of it against plain single-tensor Adam (max abs difference of the parameters)."""
    import torch

    from dfbench.benchmark.engine.local_step import flat_grad_, make_optimizer
    from dfbench.benchmark.engine.model import build_model, flatten_

    item: dict[str, Any] = {"flag": "fused Adam (flat buffer)", "status": "fail", "seconds": 0.0, "detail": "",
                            "figures": {}}
    t0 = time.perf_counter()
    try:
        model = build_model("small28", 1).to(device)
        flat, _ = flatten_(model)
        grad, _ = flat_grad_(model, flat)
        gen = torch.Generator(device=flat.device).manual_seed(0)
        grad.copy_(torch.randn(flat.shape, generator=gen, device=flat.device))
        ref = flat.detach().clone()
        ref.grad = grad.clone()
        opt = make_optimizer([flat], 1e-3)
        plain = torch.optim.Adam([ref], lr=1e-3, foreach=False, fused=False)
        for _ in range(3):
            opt.step()
            plain.step()
        fused = bool(opt.defaults.get("fused"))
        diff = float((flat.detach().double() - ref.double()).abs().max())
        item["figures"] = {"fused": "yes" if fused else f"no (foreach={opt.defaults.get('foreach')})",
                           "parameters": flat.numel(), "vs single-tensor Adam, 3 steps (max abs diff)": f"{diff:.1e}"}
        if diff > 1e-5:
            item["detail"] = f"the optimizer's steps differ from plain Adam by {diff:.2e}"
        elif device.startswith("cuda") and not fused:
            item["detail"] = "make_optimizer fell back to foreach Adam on CUDA (fused=True was refused)"
        else:
            item["status"] = "pass"
    except Exception as err:  # noqa: BLE001
        item["detail"] = _err(err)
    item["seconds"] = round(time.perf_counter() - t0, 2)
    return item


def _determinism(device: str, tiny: dict[str, Any], data: Any, out: Path) -> dict[str, Any]:
    """The same tiny fedavg run twice (two folders), train.deterministic=true: final parameters bitwise equal?"""
    import dfbench
    from dfbench.benchmark.core.runfolder import load_checkpoint

    item: dict[str, Any] = {"flag": "determinism (train.deterministic=true, run twice)", "status": "fail",
                            "seconds": 0.0, "detail": "", "figures": {}}
    t0 = time.perf_counter()
    try:
        settings = {**tiny, "rounds": 2, "local_steps": 3, "train.deterministic": True}
        folders = [dfbench.run(method="fedavg", out=out / leg, force=True, data=data, **settings) for leg in ("a", "b")]
        a, b = (load_checkpoint(f)["params"] for f in folders)
        equal = bool(a.shape == b.shape and bool((a == b).all()))
        diff = float((a.double() - b.double()).abs().max())
        item["figures"] = {"bitwise equal": "yes" if equal else "no", "max abs diff": f"{diff:.1e}"}
        if equal:
            item["status"] = "pass"
        else:
            item["detail"] = f"two identical deterministic runs ended {diff:.2e} apart (max abs parameter difference)"
    except Exception as err:  # noqa: BLE001
        item["detail"] = _err(err)
    item["seconds"] = round(time.perf_counter() - t0, 2)
    return item


def probe_flags(device: str) -> dict[str, Any]:
    """The determinism figure, then one tiny run per flag of FLAG_RUNS, then the fused-Adam check.

    Each item is printed (FLAG_MARK + JSON) as soon as it is done, so a hang or crash in one keeps
    the others. Determinism goes first: the cuBLAS workspace setting must precede any CUDA handle.
    """
    import tempfile

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what numerics.configure sets; before CUDA starts
    data = _synthetic_data()
    tiny = _tiny(device)
    items = []

    def emit(item: dict[str, Any]) -> None:
        items.append(item)
        print(FLAG_MARK + json.dumps(item), flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        emit(_determinism(device, tiny, data, Path(tmp) / "determinism"))
        for i, (name, method, settings, cuda_only) in enumerate(FLAG_RUNS):
            emit(_flag_run(name, method, settings, cuda_only, device, tiny, data, Path(tmp) / f"flag{i}"))
        emit(_fused_adam(device))
    return {"items": len(items)}


# ---------------------------------------------------------------------------------------------
# Steps


def step_environment(py: str, device: str, clock: Clock) -> tuple[Step, dict[str, Any]]:
    step = Step("environment", "nvidia-smi, torch/CUDA/NCCL versions, GPUs, data")
    info: dict[str, Any] = {}
    if shutil.which("nvidia-smi"):
        rc, out, _, _ = run_cmd(["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total,utilization.gpu",
                                 "--format=csv,noheader"], 20)
        info["nvidia_smi"] = out.strip() if rc == 0 else f"nvidia-smi failed (exit {rc})"
    else:
        info["nvidia_smi"] = "nvidia-smi not found"
    out = _execute(step, [py, str(Path(__file__)), "--probe", "env", device], clock, 120)
    if out is not None:
        info.update(json.loads(out.strip().splitlines()[-1]))
        gpus = info["gpus"]
        step.figures["GPUs"] = ", ".join(f"{g['name']} ({g['memory_gib']} GiB)" for g in gpus) or "none"
        if device.startswith("cuda") and not info["cuda_available"]:
            step.status, step.detail = "fail", "torch sees no CUDA device (torch.cuda.is_available() is False)"
        want = {"dfbench": ROOT / "dfbench" / "__init__.py",
                **{f"dfbench.{d}": ROOT / d / "__init__.py" for d in ("benchmark", "methods", "datasets")}}
        wrong = {m: p for m, p in (info.get("dfbench_code") or {}).items() if Path(p) != want.get(m)}
        step.figures["dfbench code"] = str(ROOT) if not wrong else "NOT this checkout"
        if wrong:
            step.status = "fail"
            step.detail += "".join(f"\n{m} is imported from {p}, not from {want.get(m)} (run scripts/gpu_check.sh, "
                                   f"which puts this checkout first)" for m, p in wrong.items())
        if not info["fmnist"]:
            step.detail += "\nFashion-MNIST not found: set DFBENCH_DATA=DIR (the four idx .gz files) or run `dfbench fetch fmnist`."
    return step, info


def step_smoke(py: str, device: str, clock: Clock) -> Step:
    step = Step("smoke", "every registered method, one tiny round; batched vs sequential after one round")
    out = _execute(step, [py, str(Path(__file__)), "--probe", "smoke", device], clock, 180)
    if out is None:
        return step
    res = json.loads(out.strip().splitlines()[-1])
    bad = {k: v["error"] for k, v in res["methods"].items() if not v["ok"]}
    step.figures["methods"] = f"{len(res['methods']) - len(bad)}/{len(res['methods'])} ran"
    if "batched_vs_sequential_rel" in res:
        step.figures["batched vs sequential (max rel. diff, 1 round x 5 steps)"] = f"{res['batched_vs_sequential_rel']:.1e}"
    if bad or "batched_error" in res:
        step.status = "fail"
        step.detail = "\n".join([f"{k}: {v}" for k, v in bad.items()] + [res.get("batched_error", "")]).strip()
    return step


def step_flags(py: str, device: str, clock: Clock) -> Step:
    step = Step("flags", "tiny runs (synthetic images), one CUDA-only or speed flag each; fused Adam; "
                "determinism: one fedavg run twice with train.deterministic=true")
    timeout = 300 if device.startswith("cuda") else 120  # CUDA: two torch.compile runs
    cmd = [py, str(Path(__file__)), "--probe", "flags", device]
    step.commands.append(" ".join(cmd).replace(f"{ROOT}/", ""))
    limit = min(timeout, clock.left() - 5)
    if limit < 15:
        step.status, step.detail = "skipped", f"out of time ({clock.left():.0f} s of the budget left)"
        return step
    rc, out, err, step.seconds = run_cmd(cmd, limit)
    items = []
    for ln in out.splitlines():
        if ln.startswith(FLAG_MARK):
            try:
                items.append(json.loads(ln[len(FLAG_MARK):]))
            except ValueError:  # a line cut short by the kill of a timeout
                pass
    lines = []
    for it in items:
        figures = "; ".join(f"{k}: {v}" for k, v in it["figures"].items())
        step.figures[it["flag"]] = it["status"] + (f" ({figures})" if figures else "")
        lines.append(f"{it['flag']}: {it['status']} in {it['seconds']:.1f} s" + (f"; {figures}" if figures else "")
                     + (f" -- {it['detail']}" if it["detail"] else ""))
    expected = 2 + len(FLAG_RUNS)  # determinism, the runs, fused Adam
    if rc is None:
        step.status = "timeout"
        lines.append(f"killed after {limit:.0f} s, {expected - len(items)} item(s) not reached\n{_tail(err)}")
    elif rc != 0 or len(items) != expected:
        step.status = "fail"
        lines.append(f"exit code {rc}, {len(items)}/{expected} items reported\n{_tail(err or out)}")
    else:
        step.status = "fail" if any(it["status"] == "fail" for it in items) else "pass"
    step.detail = "\n".join(lines)
    return step


def _run_args(device: str, budget: Budget, out: Path) -> list[str]:
    args = ["run", "--device", device, "--dataset", "fmnist", "--method", "fedavg", "--clients", str(budget.clients),
            "--rounds", str(budget.rounds), "--local-steps", str(budget.local_steps),
            "--batch-size", str(budget.batch_size), "--eval-samples", str(budget.eval_samples),
            "--out", str(out), "--force", "--no-progress"]
    for item in budget.run_set:
        args += ["--set", item]
    return args


def _run_figures(stdout: str, step: Step) -> Path | None:
    """Images/s and score from the run folder named on the run's last stdout line."""
    lines = [ln for ln in stdout.strip().splitlines() if ln.strip()]
    folder = Path(lines[-1].strip()) if lines else None
    if folder is None or not (folder / "metrics.json").is_file():
        step.status, step.detail = "fail", f"no run folder in the output: {_tail(stdout, 3)}"
        return None
    metrics = json.loads((folder / "metrics.json").read_text())
    rounds = [json.loads(ln) for ln in (folder / "rounds.jsonl").read_text().splitlines() if ln.strip()]
    batch = json.loads((folder / "config.json").read_text())["train"]["batch_size"]
    images = [sum(r.get("steps") or []) * batch for r in rounds]
    seconds = [float(r.get("wall_seconds") or 0) for r in rounds]
    if sum(seconds) > 0:
        step.figures["train images/s (all rounds)"] = round(sum(images) / sum(seconds))
    if len(rounds) > 1 and sum(seconds[1:]) > 0:  # round 1 pays allocation and autotuning
        step.figures["train images/s (rounds 2+)"] = round(sum(images[1:]) / sum(seconds[1:]))
    for key in ("train_wall_seconds", "eval_wall_seconds", "wall_seconds"):
        if key in metrics:
            step.figures[key.replace("_", " ")] = f"{metrics[key]:.1f} s"
    for ev in metrics.get("evaluations", []):
        step.figures[ev["metric"]] = f"{ev['value']:.2f} ({ev.get('num_samples')} samples)"
    return folder


def step_fmnist(py: str, device: str, budget: Budget, mode: str, clock: Clock) -> tuple[Step, Path | None]:
    step = Step(f"fmnist-{mode}", f"Fashion-MNIST fedavg, {budget.clients} clients x {budget.rounds} rounds x "
                f"{budget.local_steps} steps x batch {budget.batch_size}, clients_mode={mode}")
    args = _run_args(device, budget, WORK / mode) + ["--set", f"train.clients_mode={mode}"]
    out = _execute(step, [py, "-m", "dfbench", *args], clock, 180)
    return step, (_run_figures(out, step) if out is not None else None)


def _final_params_rel_diff(py: str, a: Path, b: Path) -> str:
    code = ("import sys; from dfbench.benchmark.core.runfolder import load_checkpoint as L; "
            "x, y = (L(p)['params'].double().cpu() for p in sys.argv[1:3]); "
            "print(f'{float((x - y).abs().max() / y.abs().max()):.1e}')")
    rc, out, err, _ = run_cmd([py, "-c", code, str(a), str(b)], 60)
    return out.strip() if rc == 0 else f"n/a ({_tail(err, 1)})"


def step_torchrun(py: str, device: str, budget: Budget, gpus: int, seq_folder: Path | None, clock: Clock) -> Step:
    ranks = max(1, gpus) if device.startswith("cuda") else 2
    backend = ("nccl" if ranks > 1 else "none (one rank: NCCL needs 2+ GPUs)") if device.startswith("cuda") else "gloo"
    step = Step("torchrun", f"the fmnist-sequential run on {ranks} rank(s), backend {backend}")
    step.figures["ranks"] = ranks
    step.figures["backend"] = backend
    args = _run_args(device, budget, WORK / "torchrun") + ["--set", "train.clients_mode=sequential"]
    cmd = [py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), "-m", "dfbench", *args]
    out = _execute(step, cmd, clock, 240, env={"OMP_NUM_THREADS": "1"})
    folder = _run_figures(out, step) if out is not None else None
    if folder is not None and seq_folder is not None:
        step.figures["final model vs one process (max rel. diff)"] = _final_params_rel_diff(py, folder, seq_folder)
    return step


def step_perf(py: str, device: str, budget: Budget, clock: Clock) -> tuple[Step, str]:
    step = Step("perf", "dfbench perf: loop overhead, images/s, FID extraction, batched clients, variants")
    target = WORK / "perf.md"
    out = _execute(step, [py, "-m", "dfbench", "perf", "--device", device, "--out", str(target), *budget.perf_args],
                   clock, 300)
    table = target.read_text() if out is not None and target.is_file() else ""
    return step, table


# ---------------------------------------------------------------------------------------------
# Report


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def write_report(path: Path, device: str, info: dict[str, Any], steps: list[Step], perf: str, total: float) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    gpus = ", ".join(f"{g['name']} ({g['memory_gib']} GiB, sm {g['capability']})" for g in info.get("gpus") or [])
    code = info.get("dfbench_code") or {}
    lines = [
        "# dfbench GPU check", "",
        f"{dt.datetime.now().isoformat(timespec='seconds')} · commit {commit or '?'} · host {platform.node()} · "
        f"device `{device}` · {total:.0f} s in all (`scripts/gpu_check.sh`).", "",
        "## Environment", "",
        "| item | value |", "|---|---|",
        f"| GPUs (torch) | {_cell(gpus or 'none')} |",
        f"| nvidia-smi | {_cell(info.get('nvidia_smi', '?'))} |",
        f"| torch / CUDA / cuDNN / NCCL | {info.get('torch')} / {info.get('cuda_torch')} / {info.get('cudnn')} / {info.get('nccl')} |",
        f"| python / CPU cores | {info.get('python')} / {info.get('cpu_cores')} |",
        f"| Fashion-MNIST | {_cell(info.get('fmnist') or 'not found')} |",
        f"| dfbench code | {_cell(Path(code.get('dfbench.benchmark', '?/?/?')).parent.parent)} |", "",
        "## Steps", "",
        "| step | result | wall | figures |", "|---|---|---:|---|",
    ]
    for s in steps:
        figures = "; ".join(f"{k}: {v}" for k, v in s.figures.items())
        lines.append(f"| {s.name} | **{s.status}** | {s.seconds:.0f} s | {_cell(figures)} |")
    lines += ["", "## What each step ran", ""]
    for s in steps:
        lines += [f"- **{s.name}**: {s.what}"] + [f"  - `{c}`" for c in s.commands]
        if s.detail:
            lines += ["", "  ```", *[f"  {ln}" for ln in s.detail.splitlines()], "  ```"]
    if perf:
        lines += ["", "## dfbench perf", "", perf.replace("\n# ", "\n### ").lstrip("# ").strip()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> int:
    global WORK
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=os.environ.get("DEVICE", "cuda"), help="cuda (default) or cpu (dry run)")
    parser.add_argument("--budget", type=float, default=float(os.environ.get("BUDGET", 600)), help="total seconds")
    parser.add_argument("--out", default=None, help="report path (default results/gpu-check.md; CPU: under results/runs/)")
    parser.add_argument("--work", default=None, help="folder of the run folders (default results/runs/gpu-check)")
    parser.add_argument("--missing", action="store_true",
                        help="print the dependencies this interpreter lacks (space separated) and exit")
    parser.add_argument("--pyproject", default=str(ROOT / "pyproject.toml"), help="with --missing: the file to read")
    parser.add_argument("--where", action="store_true", help="print where dfbench is imported from and exit")
    parser.add_argument("--probe", choices=("env", "smoke", "flags"), help=argparse.SUPPRESS)
    parser.add_argument("probe_device", nargs="?", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.missing:
        print(" ".join(missing_dependencies(Path(a.pyproject))))
        return 0
    if a.where:
        print("\n".join(f"{m} {p}" for m, p in where()))
        return 0
    if a.probe:
        fn = {"env": probe_env, "smoke": probe_smoke, "flags": probe_flags}[a.probe]
        print(json.dumps(fn(a.probe_device or a.device)))
        return 0

    if a.work:
        WORK = Path(a.work).resolve()
    device = a.device
    cuda = device.startswith("cuda")
    budget = CUDA_BUDGET if cuda else CPU_BUDGET
    out = Path(a.out) if a.out else (ROOT / "results" / "gpu-check.md" if cuda else WORK / "gpu-check-cpu.md")
    py = sys.executable
    if not cuda:
        # the dry mode's runs are tiny: two OpenMP threads per op cost more than they gain, and on a
        # busy machine their spin-waits make a run ten times slower (measured on 2 cores)
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    clock = Clock(a.budget)
    WORK.mkdir(parents=True, exist_ok=True)
    steps: list[Step] = []

    def log(step: Step) -> None:
        print(f"[gpu-check] {step.name}: {step.status} in {step.seconds:.0f} s "
              + "; ".join(f"{k}: {v}" for k, v in step.figures.items()), file=sys.stderr, flush=True)

    env_step, info = step_environment(py, device, clock)
    steps.append(env_step)
    log(env_step)
    no_device = cuda and not info.get("cuda_available")
    if no_device:
        for name in ("smoke", "flags", "fmnist-sequential", "fmnist-batched", "torchrun", "perf"):
            steps.append(Step(name, "-", "skipped", detail="no CUDA device visible to torch"))
        perf = ""
    else:
        steps.append(step_smoke(py, device, clock))
        log(steps[-1])
        steps.append(step_flags(py, device, clock))
        log(steps[-1])
        seq, seq_folder = step_fmnist(py, device, budget, "sequential", clock)
        steps.append(seq)
        log(seq)
        batched, _ = step_fmnist(py, device, budget, "batched", clock)
        a_s = seq.figures.get("train images/s (rounds 2+)")
        b_s = batched.figures.get("train images/s (rounds 2+)")
        if a_s and b_s:
            batched.figures["speed-up vs sequential"] = f"x{b_s / a_s:.2f}"
        steps.append(batched)
        log(batched)
        steps.append(step_torchrun(py, device, budget, len(info.get("gpus") or []), seq_folder, clock))
        log(steps[-1])
        perf_step, perf = step_perf(py, device, budget, clock)
        steps.append(perf_step)
        log(perf_step)
    total = time.monotonic() - clock.start
    write_report(out, device, info, steps, perf, total)
    print(f"[gpu-check] report: {out}", file=sys.stderr)
    return 0 if all(s.status == "pass" for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
