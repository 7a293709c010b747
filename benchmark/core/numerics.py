"""The numerics of a run on its device, set in ONE place, and what was set, for the run folder.

PyTorch's defaults trade reproducibility for speed on CUDA: cuDNN picks convolution algorithms
by timing them (`cudnn.benchmark`), several backward kernels (convolution weight gradients,
the attention backward, index_add) accumulate with atomics, cuBLAS splits reductions by its
workspace, and TF32 (10-bit mantissa) is on for cuDNN convolutions. Two identical GPU runs then
differ in the last bits, Adam amplifies the difference, and "resume equals uninterrupted",
"N ranks equal one process" and the bitwise checks of the loop stop holding.

`configure(device, deterministic)` sets, before a run touches its device:

- CUDA, deterministic (train.deterministic = true, the default): `use_deterministic_algorithms`
  (an op with no deterministic CUDA kernel raises, naming itself, instead of drifting),
  cudnn.deterministic, no autotuning, `CUBLAS_WORKSPACE_CONFIG=:4096:8`, TF32 off for matmul and
  cuDNN, float32 matmul precision "highest". Bitwise reproducible on one GPU model with one
  software stack (driver, CUDA, cuDNN, torch); another GPU model runs other kernels.
- CUDA, fast (train.deterministic = false): cuDNN autotuning and TF32 on; not reproducible.
- CPU: PyTorch's defaults (deterministic algorithms off: CPU kernels are deterministic for a
  fixed thread count already, and the flag would fill every torch.empty with NaN at a cost), so
  a CPU cell after a CUDA cell in one process runs exactly as in a fresh one.

`record(device, deterministic)` is what a run folder's numerics.json keeps of it.
`effective_amp(device, amp)`: bf16 autocast on a CPU without native bfloat16 (no avx512_bf16 /
amx_bf16 on x86, no bf16 on Arm) is emulated, 7.7x slower than float32 on the AMD EPYC that made
results/cpu-recipe; there it falls back to float32 with a warning, recorded in numerics.json
(DFBENCH_CPU_BF16=emulate runs the emulation anyway, e.g. to test bf16 numerics on such a CPU).
`exact_float32()` is the context of feature extraction and scoring: TF32 off whatever the run
set, restored after, so features match the float32 references on every GPU.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from dfbench.benchmark.core.config import device_type  # "cuda:3" / torch.device("cuda:3") -> "cuda"

# cuBLAS: a fixed workspace of 8 buffers of 4096 KiB makes its reductions deterministic
# (NVIDIA's documented setting; ":16:8" uses less memory and is slower).
CUBLAS_WORKSPACE = ":4096:8"
_VALID_WORKSPACES = (":4096:8", ":16:8")


def configure(device: str | torch.device, deterministic: bool = True, amp: str = "off") -> dict[str, Any]:
    """Set the process-wide numerics for a run on `device`; returns `record(...)` of what is set
    (with `amp`, train.amp, as it will run: `effective_amp`)."""
    kind = device_type(device)
    if kind == "cuda":
        if deterministic:
            if os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in _VALID_WORKSPACES:
                os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE  # read by cuBLAS when a handle is made
        _deterministic_algorithms(deterministic)
        torch.backends.cudnn.deterministic = deterministic
        torch.backends.cudnn.benchmark = not deterministic
        torch.backends.cuda.matmul.allow_tf32 = not deterministic
        torch.backends.cudnn.allow_tf32 = not deterministic
        torch.set_float32_matmul_precision("highest" if deterministic else "high")
    else:
        _deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False
        torch.backends.cudnn.benchmark = False
        torch.set_float32_matmul_precision("highest")
    rec = record(device, deterministic)
    rec["amp"], note = effective_amp(device, amp)
    if note:
        rec["amp_note"] = note
    return rec


# bfloat16 instructions in /proc/cpuinfo: x86 (AVX-512 BF16, AMX) and Arm (FEAT_BF16)
_CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


@functools.lru_cache(maxsize=1)
def cpu_bf16() -> bool | None:
    """Whether this CPU computes bfloat16 natively (from /proc/cpuinfo); None where it cannot tell."""
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return bool(_CPU_BF16_FLAGS & set(line.split(":", 1)[1].split()))
    return None


def auto_amp(device: str | torch.device) -> str:
    """What train.amp=auto runs on `device`: "bf16" where it computes bfloat16 natively (a CPU with
    avx512_bf16 / amx_bf16 / Arm bf16; a CUDA GPU that supports it, Ampere and later, which is also
    assumed when no GPU is visible to tell, e.g. when a CPU machine plans a GPU grid), else "off".
    Measured harmless before it was made the default: results/cpu-bf16.

    DFBENCH_AUTO_AMP=off (or bf16) makes auto resolve to that on any machine, e.g. to give a grid the
    same run ids on CPUs with and without bfloat16 (the test suite sets it to off)."""
    forced = os.environ.get("DFBENCH_AUTO_AMP", "").strip()
    if forced:
        if forced not in ("off", "bf16"):
            from dfbench.benchmark.core.config import ConfigError

            raise ConfigError(f"DFBENCH_AUTO_AMP={forced!r} is not a train.amp=auto choice: set it to off or bf16, "
                              "or unset it to let the device decide")
        return forced
    if device_type(device) == "cuda":
        if torch.cuda.is_available():
            return "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "off"
        return "bf16"
    return "bf16" if cpu_bf16() else "off"


def effective_amp(device: str | torch.device, amp: str) -> tuple[str, str | None]:
    """(the autocast a run uses, why it differs from `amp` or None): bf16 on a CPU without native
    bfloat16 falls back to float32 ("off") unless DFBENCH_CPU_BF16=emulate."""
    if amp != "bf16" or device_type(device) != "cpu" or cpu_bf16() is not False:
        return amp, None
    if os.environ.get("DFBENCH_CPU_BF16") == "emulate":
        return amp, None
    return "off", (f"train.amp=bf16 runs in float32 on this CPU ({device_name('cpu')}: no avx512_bf16, amx_bf16 "
                   f"or bf16 instructions, so bfloat16 would be emulated, 7.7x slower than float32 where measured); "
                   f"set DFBENCH_CPU_BF16=emulate to run the emulation anyway")


def warn_amp_fallback(device: str | torch.device, amp: str) -> str:
    """`effective_amp`'s autocast, warning (once per process and message) when it falls back."""
    used, note = effective_amp(device, amp)
    if note:
        warnings.warn(note, RuntimeWarning, stacklevel=3)
    return used


def _deterministic_algorithms(on: bool) -> None:
    # only when it changes: setting it imports torch._inductor (about 2.4 s per process)
    if torch.are_deterministic_algorithms_enabled() != on:
        torch.use_deterministic_algorithms(on)


def device_name(device: str | torch.device) -> str:
    """The GPU model (CUDA) or the CPU model: what decides the kernels, hence the last bits."""
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(dev)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# The CPU features that change a CPU run's speed or its last bits (the kernels torch dispatches to):
# vector width and FMA (x86 avx2/fma/avx512f, Arm asimd/sve) and native bfloat16 / fp16 / AMX.
NUMERIC_CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "asimd", "sve", "bf16")


def cpu_record(cpuinfo: str | None = None) -> dict[str, Any]:
    """The CPU as a run folder records it: model, cores, the flags of NUMERIC_CPU_FLAGS it has, and
    torch's CPU capability (the kernel set it dispatches to: DEFAULT, AVX2, AVX512, ...).

    `cpuinfo`: the text of /proc/cpuinfo (read here when None; missing: no model, no flags)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    model, flags = None, set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model is None:
            model = value.strip()
        elif key.strip() in ("flags", "Features") and not flags:
            flags = set(value.split())
    return {"model": model or platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "flags": [f for f in NUMERIC_CPU_FLAGS if f in flags],
            "torch_capability": torch.backends.cpu.get_cpu_capability()}


def record(device: str | torch.device, deterministic: bool) -> dict[str, Any]:
    """The numerics in force, as numerics.json keeps them (one entry per start of a run)."""
    cudnn = torch.backends.cudnn
    return {
        "device": str(device),
        "device_type": device_type(device),
        "device_name": device_name(device),
        "deterministic": bool(deterministic) if device_type(device) == "cuda" else True,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_deterministic": bool(cudnn.deterministic),
        "cudnn_benchmark": bool(cudnn.benchmark),
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "tf32_cudnn": bool(cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": cudnn.version() if cudnn.is_available() else None,
        "torch_threads": torch.get_num_threads(),
    }


def features_key(device: str | torch.device) -> str:
    """What changes feature values besides the network: the device type and, on CUDA, the GPU model
    (float32, TF32 off: `exact_float32`). Part of the reference-statistics cache key."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return f"{dev.type}-fp32"
    name = "".join(ch if ch.isalnum() else "_" for ch in device_name(dev)).strip("_")
    return f"cuda-{name}-fp32"


@contextlib.contextmanager
def exact_float32() -> Iterator[None]:
    """Float32 without TF32 inside (matmul and cuDNN), the previous settings restored after."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[0], saved[1]
        torch.set_float32_matmul_precision(saved[2])


def nondeterministic_hint(err: BaseException) -> str | None:
    """The advice for PyTorch's "no deterministic implementation" error, or None for other errors."""
    text = str(err)
    if "deterministic" not in text or "use_deterministic_algorithms" not in text:
        return None
    first = text.strip().splitlines()[0]
    return (f"{first} -- this op has no deterministic CUDA kernel in this torch build; run with "
            f"--set train.deterministic=false (faster, not bitwise reproducible: another run id) "
            f"or report the op so that the model avoids it")
