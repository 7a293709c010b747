"""The CUDA path, guarded on a CPU: run ids by device type, the numerics helper, TF32 off for
features, the reference cache key, no host-to-device copy in a loss step, attention under vmap.

No GPU runs here (CI has none): each test drives the CUDA-specific code through what a CPU
can observe (flags, dispatched ops, the meta device, warnings, run folders).
"""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from dfbench.benchmark.core import numerics, runfolder
from dfbench.benchmark.core.config import ConfigError
from dfbench.benchmark.engine.resolve import apply_overrides
from dfbench.benchmark.engine.diffusion import DDPM, FlowMatching
from helpers import tiny_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def restore_numerics():
    """The numerics are process-wide: every test that sets them leaves PyTorch's CPU defaults behind."""
    saved = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
             torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision())
    yield
    torch.use_deterministic_algorithms(saved[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[1], saved[2]
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[3], saved[4]
    torch.set_float32_matmul_precision(saved[5])


# -- run ids: the device type is in them, the index is not ---------------------------------------

def test_device_type_is_part_of_the_run_id_and_the_index_is_not():
    cpu = tiny_config()
    cuda = apply_overrides(cpu, {"device": "cuda"})
    cuda3 = apply_overrides(cpu, {"device": "cuda:3"})
    fast = apply_overrides(cpu, {"device": "cuda", "train.deterministic": False})
    assert cuda.run_id() != cpu.run_id()  # CUDA generators are Philox, CPU ones mt19937: another run
    assert cuda3.run_id() == cuda.run_id()  # the GPU index changes nothing
    assert fast.run_id() not in (cuda.run_id(), cpu.run_id())  # the fast path is not reproducible: its own id
    # speed knobs that change no number stay out of it on every device
    assert apply_overrides(cuda, {"eval.sample_batch": 32, "eval.feature_batch": 64}).run_id() == cuda.run_id()


def test_deterministic_false_is_refused_on_cpu():
    with pytest.raises(ConfigError, match=r"train\.deterministic.*device cpu"):
        tiny_config(over={"train.deterministic": False})


def test_a_generator_lives_on_the_runs_device_and_cpu_runs_draw_as_before(tiny_data):
    """The streams stay device-native (no host-to-device copy per step); what keeps a CPU and a GPU
    run apart is the run id above. On the CPU every draw is what it always was."""
    from dfbench.benchmark.engine.context import build_context
    from dfbench.benchmark.core.seeds import derive_seed

    ctx = build_context(tiny_config(), data=tiny_data)
    g = ctx.gen("client", 1, 0)
    assert g.device.type == "cpu"
    ref = torch.Generator().manual_seed(derive_seed(0, "client", 1, 0))
    assert torch.equal(torch.randn(5, generator=g), torch.randn(5, generator=ref))


@pytest.mark.parametrize("study,csv", [
    ("demo", "results/demo/reference/leaderboard.csv"),
    ("results/paper-fmnist/paper-fmnist.toml", "results/paper-fmnist/leaderboard.csv"),
    ("results/cpu-aggregation/cpu-aggregation.toml", "results/cpu-aggregation/leaderboard.csv"),
    ("results/cpu-aggregation/tune/cpu-aggregation-tune.toml", "results/cpu-aggregation/tune/leaderboard.csv"),
    ("results/paper-fmnist/rules/paper-fmnist-rules.toml", "results/paper-fmnist/rules/leaderboard.csv"),
    ("results/cpu-recipe/demo-tune.toml", "results/cpu-recipe/demo-tune/leaderboard.csv"),
])
def test_the_committed_cpu_studies_keep_their_run_ids(study, csv):
    """Every run id in a committed leaderboard is one its grid gives today (CPU ids unchanged)."""
    from dfbench.benchmark.grid.spec import load_grid

    ids = {c.cfg.run_id() for c in load_grid(str(ROOT / study) if study.endswith(".toml") else study).cells}
    committed = set(re.findall(r"\bs\d+-[0-9a-f]{10}\b", (ROOT / csv).read_text()))
    assert committed and committed <= ids, sorted(committed - ids)


@pytest.mark.slow
def test_a_resume_on_another_device_type_is_refused_before_any_work(tiny_data, tmp_path):
    """A folder trained on the CPU, presented as the CUDA run's folder (copied by hand): refused with
    a message, and nothing in it is touched."""
    from dfbench.benchmark.engine import lifecycle

    cpu = tiny_config()
    d = lifecycle.run(cpu, tmp_path, progress=False, data=tiny_data)
    starts = json.loads((d / runfolder.NUMERICS).read_text())["starts"]
    assert [s["device_type"] for s in starts] == ["cpu"]
    cuda = apply_overrides(cpu, {"device": "cuda"})
    other = runfolder.run_dir(tmp_path, cuda)
    shutil.copytree(d, other)
    (other / runfolder.STATUS).write_text(json.dumps({"state": "interrupted"}))
    before = {p.name: p.read_bytes() for p in other.iterdir() if p.is_file()}
    with pytest.raises(ConfigError, match=r"trained on cpu.*resuming it on cuda"):
        lifecycle.run(cuda, tmp_path, progress=False, data=tiny_data)
    after = {p.name: p.read_bytes() for p in other.iterdir() if p.is_file()}
    assert after == before


@pytest.mark.slow
def test_numerics_json_records_every_start(tiny_data, tmp_path):
    from dfbench.benchmark.engine import lifecycle

    cfg = tiny_config()
    d = lifecycle.run(cfg, tmp_path, progress=False, data=tiny_data)
    (d / runfolder.STATUS).write_text(json.dumps({"state": "interrupted"}))  # as if stopped: the rerun resumes
    lifecycle.run(cfg, tmp_path, progress=False, data=tiny_data)
    starts = json.loads((d / runfolder.NUMERICS).read_text())["starts"]
    assert len(starts) == 2
    assert all(s["device_type"] == "cpu" and s["deterministic_algorithms"] is False and s["torch"] == torch.__version__
               for s in starts)


# -- the numerics helper ----------------------------------------------------------------------------

def test_configure_cuda_deterministic_sets_every_flag(restore_numerics, monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    torch.backends.cudnn.benchmark = True  # what a fast cell before it may have left
    torch.backends.cudnn.allow_tf32 = True
    rec = numerics.configure("cuda:0", deterministic=True)
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert torch.get_float32_matmul_precision() == "highest"
    import os

    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert rec["deterministic"] and rec["deterministic_algorithms"] and not rec["tf32_cudnn"]
    assert rec["device_type"] == "cuda" and rec["cublas_workspace_config"] == ":4096:8"


def test_configure_cuda_fast_and_then_cpu(restore_numerics, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # a valid user choice is kept
    numerics.configure("cuda", deterministic=False)
    assert not torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.benchmark and torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
    numerics.configure("cuda", deterministic=True)
    import os

    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    # a CPU cell after a CUDA cell in the same grid process: PyTorch's CPU defaults again
    rec = numerics.configure("cpu")
    assert not torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.benchmark
    assert rec["device_type"] == "cpu" and rec["deterministic"]


def test_a_nondeterministic_op_error_becomes_advice():
    err = RuntimeError("index_add_cuda_ does not have a deterministic implementation, but you set "
                       "'torch.use_deterministic_algorithms(True)'. You can turn off ...")
    hint = numerics.nondeterministic_hint(err)
    assert hint is not None and "index_add_cuda_" in hint and "train.deterministic=false" in hint
    assert numerics.nondeterministic_hint(RuntimeError("shape mismatch")) is None


# -- features: TF32 off while the network runs, numerics in the cache key ------------------------------

class _Recorder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[bool, bool, str]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                          torch.get_float32_matmul_precision()))
        return x.flatten(1)[:, :4].double()


def _extractor(device: str = "cpu"):
    from dfbench.benchmark.metrics.features import Extractor

    return Extractor(name="probe", sha256="0" * 64, backend="test", resize="none", dims=4, network=_Recorder(),
                     prepare=lambda b: b.float(), device=device)


def test_tf32_is_off_while_an_extractor_runs_and_restored_after(restore_numerics):
    torch.backends.cuda.matmul.allow_tf32 = True  # what the fast training path sets
    torch.backends.cudnn.allow_tf32 = True
    ex = _extractor()
    ex.features(torch.zeros(5, 1, 4, 4, dtype=torch.uint8), batch_size=2)
    assert ex.network.seen == [(False, False, "highest")] * 3
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32  # restored


def test_scoring_runs_in_exact_float32(restore_numerics, monkeypatch):
    """evaluate_samples as a whole (features, Frechet distances, KID) runs with TF32 off."""
    from dfbench.benchmark.metrics import scoring

    seen = []

    def probe(*a, **k):
        seen.append(torch.backends.cudnn.allow_tf32 or torch.backends.cuda.matmul.allow_tf32)
        raise RuntimeError("stop here")

    monkeypatch.setattr(scoring, "_resolve_metrics", probe)
    torch.backends.cudnn.allow_tf32 = True
    with pytest.raises(RuntimeError, match="stop here"):
        scoring.evaluate_samples(torch.zeros(4, 1, 28, 28, dtype=torch.uint8), "fmnist")
    assert seen == [False] and torch.backends.cudnn.allow_tf32


def test_the_reference_cache_key_holds_the_device_and_gpu_model(monkeypatch, tmp_path):
    from dfbench.benchmark.metrics import scoring

    cpu = scoring._reference_path(tmp_path, "fmnist", "train", "ab" * 32, _extractor("cpu"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    h100 = scoring._reference_path(tmp_path, "fmnist", "train", "ab" * 32, _extractor("cuda:0"))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100-SXM4-40GB")
    a100 = scoring._reference_path(tmp_path, "fmnist", "train", "ab" * 32, _extractor("cuda:1"))
    assert len({cpu, h100, a100}) == 3
    assert "cpu-fp32" in cpu.name and "NVIDIA_H100_80GB_HBM3" in h100.name


def test_a_cached_reference_from_other_numerics_is_recomputed(tmp_path, monkeypatch):
    """A file at the key's path whose stored numerics differ (or are absent: files made before the
    key had them) is not trusted: the statistics are computed again."""
    from dfbench.benchmark.metrics import scoring
    from dfbench.datasets import ImageSet

    g = np.random.default_rng(0)
    data = ImageSet(name="fmnist", split="train", images=torch.from_numpy(g.integers(0, 255, (40, 1, 4, 4)).astype(np.uint8)),
                    labels=torch.from_numpy(np.arange(40) % 10), sha256="cd" * 32, source="tests")
    monkeypatch.setattr(scoring, "_check_dataset", lambda name: None)
    monkeypatch.setattr(scoring, "_load_dataset", lambda *a: data)
    ex = _extractor()
    first = scoring._reference("fmnist", "train", ex, data_root=None, cache_dir_=tmp_path)
    calls = len(ex.network.seen)
    path = scoring._reference_path(tmp_path, "fmnist", "train", data.sha256, ex)
    with np.load(path) as z:
        assert str(z["numerics"]) == "cpu-fp32"
        stale = {k: z[k] for k in z.files if k != "numerics"}
    np.savez(path, **stale)  # as written before the numerics were recorded
    again = scoring._reference("fmnist", "train", ex, data_root=None, cache_dir_=tmp_path)
    assert len(ex.network.seen) > calls  # recomputed
    np.testing.assert_array_equal(again["mu"], first["mu"])
    scoring._reference("fmnist", "train", ex, data_root=None, cache_dir_=tmp_path)
    assert len(ex.network.seen) == 2 * calls  # and now read from the file


# -- no host-to-device copy inside a loss step ------------------------------------------------------

class _CrossDeviceCopies(TorchDispatchMode):
    """Records every op that takes a CPU tensor and returns one on another device (a host-to-device copy)."""

    def __init__(self) -> None:
        super().__init__()
        self.copies: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat_in = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        flat_out = [o for o in torch.utils._pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
        if any(a.device.type == "cpu" and a.dim() > 0 for a in flat_in) and any(o.device.type != "cpu" for o in flat_out):
            self.copies.append(str(func))
        return out


class _MetaNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 3, padding=1, device="meta")

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.conv(x) * t.view(-1, *[1] * (x.dim() - 1))


@pytest.mark.parametrize("objective", [DDPM("cosine", 1000), FlowMatching()], ids=["ddpm", "fm"])
def test_a_loss_step_copies_nothing_from_the_host(objective):
    """On the meta device (a stand-in for a GPU: its tensors are not on the CPU), a loss step and
    its backward, and the batched clients' noising, dispatch no CPU -> device copy once warm
    (the DDPM schedule used to be copied at every step: `abar.to(x0.device)`)."""
    from dfbench.benchmark.engine.batched import noised_inputs

    net = _MetaNet()
    x0 = torch.empty(4, 1, 8, 8, device="meta")
    gen = torch.Generator().manual_seed(0)
    objective.loss(net, x0, gen).backward()  # warm: a schedule may be copied once, here
    noised_inputs(objective, torch.empty(3, 4, 1, 8, 8, device="meta"), [gen] * 3)
    with _CrossDeviceCopies() as mode:
        for _ in range(3):
            objective.loss(net, x0, gen).backward()
            noised_inputs(objective, torch.empty(3, 4, 1, 8, 8, device="meta"), [gen] * 3)
    assert mode.copies == []


def test_the_ddpm_velocity_copies_nothing_from_the_host_once_warm():
    obj = DDPM("cosine", 1000)
    net = lambda x, t: x * 0.5  # noqa: E731
    x = torch.empty(4, 1, 8, 8, device="meta")
    t = torch.full((4,), 0.3, device="meta")
    obj.velocity(net, x, t)
    with _CrossDeviceCopies() as mode:
        obj.velocity(net, x, t)
    assert mode.copies == []


def test_the_cached_schedule_gives_the_same_velocity_as_the_reference():
    from dfbench.benchmark.engine.diffusion import ddpm_velocity

    obj = DDPM("cosine", 1000)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 1, 5, 5, generator=g)
    t = torch.rand(6, generator=g)
    net = lambda y, tau: torch.tanh(y) * tau.view(-1, 1, 1, 1)  # noqa: E731
    assert torch.equal(obj.velocity(net, x, t), ddpm_velocity(net, x, t, obj.abar64))


# -- batched clients: attention batches under vmap -------------------------------------------------------

def test_batched_clients_attend_through_ops_that_vmap_batches(tiny_data, monkeypatch):
    """small28 has attention. Under vmap, scaled_dot_product_attention dispatches to fused kernels
    whose batching rules depend on the backend (this torch's CPU flash kernel has none:
    vmap(grad(sdpa)) of a plain batch warns "There is a performance drop" and loops over the
    batch), so batched clients attend through `product_attention` (matmul, softmax) instead: the
    fused op is never called in a batched round, and the round raises no warning at all."""
    from dfbench import methods
    from dfbench.benchmark.engine import model as model_module
    from dfbench.benchmark.engine.context import build_context
    from dfbench.benchmark.engine.training import train_round

    fused = []
    real = model_module.F.scaled_dot_product_attention
    monkeypatch.setattr(model_module.F, "scaled_dot_product_attention", lambda *a, **k: fused.append(1) or real(*a, **k))
    cfg = tiny_config(over={"train.model": "small28", "train.clients_mode": "batched", "train.rounds": 1,
                            "train.local_steps": 1, "train.batch_size": 2, "data.clients": 2})
    ctx = build_context(cfg, data=tiny_data)
    assert any(isinstance(m, model_module.Attention) for m in ctx.model.modules())
    method = methods.create_method("fedavg")
    state = method.init_state(ctx.init_params, ctx)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, row = train_round(method, state, ctx, 1)
    assert row["clients"] and np.isfinite(row["loss"])
    assert fused == []
    assert not any(m.explicit for m in ctx.model.modules() if isinstance(m, model_module.Attention))  # switched back
    blocks = sum(isinstance(m, model_module.Attention) for m in ctx.model.modules())
    ctx.model(torch.zeros(1, 1, 28, 28), torch.zeros(1))  # one network (sampling, sequential clients): the fused kernel
    assert len(fused) == blocks
def test_product_attention_equals_the_fused_kernel():
    from dfbench.benchmark.engine.model import product_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 49, 32, generator=g, dtype=torch.float64) for _ in range(3))
    fused = torch.nn.functional.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]
    torch.testing.assert_close(product_attention(q, k, v), fused, rtol=1e-12, atol=1e-12)


# -- bf16 on a CPU without native bfloat16 -------------------------------------------------------------

@pytest.mark.parametrize("flags,native", [("fpu avx2 fma", False), ("fpu avx2 avx512f avx512_bf16", True),
                                           ("fpu avx2 amx_tile amx_bf16", True)])
def test_bf16_falls_back_to_float32_with_a_message_where_the_cpu_lacks_it(flags, native, monkeypatch):
    from dfbench.benchmark.engine.local_step import autocast

    monkeypatch.delenv("DFBENCH_CPU_BF16", raising=False)
    monkeypatch.setattr(numerics, "cpu_bf16", lambda: native)
    used, note = numerics.effective_amp("cpu", "bf16")
    assert used == ("bf16" if native else "off") and (note is None) == native
    assert numerics.effective_amp("cuda:0", "bf16") == ("bf16", None)  # CUDA: never
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with autocast(torch.device("cpu"), "bf16"):
            dtype = torch.matmul(torch.ones(2, 2), torch.ones(2, 2)).dtype
    assert dtype == (torch.bfloat16 if native else torch.float32)
    assert [str(w.message) for w in seen if "DFBENCH_CPU_BF16=emulate" in str(w.message)] == ([] if native else [note])
    monkeypatch.setenv("DFBENCH_CPU_BF16", "emulate")
    assert numerics.effective_amp("cpu", "bf16") == ("bf16", None)


def test_cpu_bf16_reads_the_flags(monkeypatch, tmp_path):
    import builtins

    real_open = builtins.open
    for text, want in (("processor : 0\nflags : fpu avx2\n", False), ("flags : avx512_bf16 avx2\n", True),
                       ("Features : fp asimd bf16\n", True), ("nothing here\n", None)):
        path = tmp_path / "cpuinfo"
        path.write_text(text)
        monkeypatch.setattr(builtins, "open", lambda f, *a, **k: real_open(path if f == "/proc/cpuinfo" else f, *a, **k))
        numerics.cpu_bf16.cache_clear()
        assert numerics.cpu_bf16() is want
    monkeypatch.setattr(builtins, "open", real_open)
    numerics.cpu_bf16.cache_clear()


def test_numerics_json_records_the_amp_a_run_used(tiny_data, tmp_path, monkeypatch):
    from dfbench.benchmark.engine import lifecycle

    monkeypatch.delenv("DFBENCH_CPU_BF16", raising=False)
    monkeypatch.setattr(numerics, "cpu_bf16", lambda: False)
    with pytest.warns(RuntimeWarning, match="train.amp=bf16 runs in float32"):
        d = lifecycle.run(tiny_config(over={"train.amp": "bf16"}), tmp_path, progress=False, data=tiny_data)
    start = json.loads((d / runfolder.NUMERICS).read_text())["starts"][0]
    assert start["amp"] == "off" and "DFBENCH_CPU_BF16=emulate" in start["amp_note"]
