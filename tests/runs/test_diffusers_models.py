"""The diffusers model presets (benchmark/engine/diffusers_models.py, the optional extra `dfbench[diffusers]`):
diffusers' UNet2DModel behind the built-in UNet's call, with the built-in path's guarantees.

- config's Preset is derived from the one preset table (benchmark/core/presets.py), every preset has a cost;
- DDPM's CIFAR-10 network has the paper's 35.7M parameters (Ho et al. 2020); every count is pinned;
- the time convention: t in [0, 1] reaches UNet2DModel as 1000 t (the built-in UNet's scale);
- a missing or other diffusers, or an image side the down-sampling cannot take, is refused when the
  config is built, before any work, with the fix;
- every registered method runs one round on diffusers-tiny, or is refused up front with the reason
  (heterofl, fedrolex, fjord: their width sub-models need a width-aware network);
- same seed, same result: the seeded initialization (init_sha256), bitwise resume after Ctrl-C
  and after SIGKILL, batched clients equal sequential ones, 2 ranks compute the 1-process run.
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing
import warnings
from pathlib import Path

import pytest
import torch

from dfbench import methods
from dfbench.benchmark.core import presets, runfolder
from dfbench.benchmark.core.config import ConfigError, Preset
from dfbench.benchmark.engine import model as builtin
from dfbench.benchmark.engine.context import build_context
from dfbench.benchmark.engine.lifecycle import run
from dfbench.methods.plugins import load_plugins
from conftest import make_imageset
from helpers import final_params, interrupt_at, rows, sigkill_then_resume, tiny_config

# the extra (in `dfbench[test]`); imported here, at collection, so no test is charged its seconds of import
pytest.importorskip("diffusers.models.unets.unet_2d", reason="needs the extra: pip install 'dfbench[diffusers]'")

load_plugins()  # as the method contract does: a plugin's methods are covered too

TINY = "diffusers-tiny"
ONE_ROUND = {"train.model": TINY, "train.rounds": 1, "eval.samples": 4, "eval.grid": 2, "eval.sampler_steps": 2}
# methods that cannot run on a diffusers network with their default hyperparameters, and a word of the reason
REFUSED = {"heterofl": "width-aware network", "fedrolex": "width-aware network", "fjord": "width-aware network",
           "fedphd": "width-aware network"}
# hyperparameters of the resumed methods, as tests/runs/test_resume.py sets them (a short router, quantized with its memory)
SMALL = {"experts": {"router_steps": 3, "router_batch": 8}, "quantized": {"error_feedback": True}}

# measured parameter counts (the table of docs/models.md, checked below): preset -> {image channels: P}
PARAMS = {
    "tiny": {1: 40_489, 3: 40_779},
    "small28": {1: 267_313, 3: 267_891},
    "small32": {1: 1_062_497, 3: 1_063_651},
    "base28": {1: 6_469_889, 3: 6_472_195},
    "base32": {1: 8_949_761, 3: 8_952_067},
    "ddpm32": {1: 35_741_697, 3: 35_746_307},  # diffusers-ddpm-cifar10's shape in the built-in UNet: the same counts
    "diffusers-tiny": {1: 44_969, 3: 45_259},
    "diffusers-ddpm-cifar10": {1: 35_741_697, 3: 35_746_307},
    # the MLPs' count depends on the sample's size D = C*H*W: here 28x28 grey and 32x32 RGB images flattened
    "mlp-tiny": {1: 59_760, 3: 208_480},  # 8,800 + 65 D
    "mlp": {1: 385_040, 3: 973_056},  # 183,552 + 257 D
}


def _count(name: str, channels: int) -> int:
    side = 28 if channels == 1 else 32  # Fashion-MNIST's images, CIFAR-10's (only the MLPs' count depends on it)
    with torch.device("meta"):  # architecture only: no memory, no init
        return sum(p.numel() for p in builtin.build_model(name, (channels, side, side)).parameters())


# -- the presets ------------------------------------------------------------------------------

def test_the_preset_table_is_what_the_config_and_the_families_read():
    # config's Literal is derived from the one table (benchmark/core/presets.py); this file's counts cover it
    assert typing.get_args(Preset) == ("auto", *presets.ALL)
    assert presets.BUILTIN == tuple(n for n in presets.ALL if presets.PRESETS[n].unet is not None)
    assert set(PARAMS) == set(presets.ALL)
    assert [presets.family(n) for n in presets.ALL] == ["builtin"] * 6 + ["diffusers"] * 2 + ["mlp"] * 2
    assert presets.side_multiple("diffusers-ddpm-cifar10") == 8 and presets.side_multiple(TINY) == 2
    assert presets.side_multiple("small28") == 1
    # every preset has a CPU cost for the grid planner, and the small ones are the cheap ones
    assert all(presets.PRESETS[n].cpu_ms_per_sample_grad > 0 for n in presets.ALL)
    assert presets.PRESETS["tiny"].cpu_ms_per_sample_grad < presets.PRESETS["base32"].cpu_ms_per_sample_grad


def test_ddpm_cifar10_has_the_papers_parameter_count():
    # Ho et al. 2020, Appendix B: "Our CIFAR10 model has 35.7 million parameters"
    n = _count("diffusers-ddpm-cifar10", 3)
    assert n == PARAMS["diffusers-ddpm-cifar10"][3]
    assert round(n / 1e6, 1) == 35.7


def test_ddpm32_is_the_ddpm_cifar10_network_in_the_built_in_unet():
    # the same parameter count and the same FLOPs (what the GPU planner scales its cells by: 1.0), and the width
    # sub-models can cut it (the built-in UNet is width-aware; the diffusers one is not)
    from helpers import load_script

    forward_flops = load_script("results/cifar10-gpu/gpu_plan.py").forward_flops

    assert PARAMS["ddpm32"] == PARAMS["diffusers-ddpm-cifar10"]
    assert forward_flops("ddpm32", "cifar10") == forward_flops("diffusers-ddpm-cifar10", "cifar10") == 12_443_713_536
    assert presets.width_aware("ddpm32") and not presets.width_aware("diffusers-ddpm-cifar10")


@pytest.mark.parametrize("name", presets.ALL)
def test_every_preset_has_its_measured_parameter_count(name):
    assert {c: _count(name, c) for c in (1, 3)} == PARAMS[name]


def test_the_docs_table_quotes_the_measured_counts():
    """docs/models.md's preset table has one row per preset, with this file's counts for 1 and 3 channels."""
    page = Path(__file__).resolve().parents[2] / "docs" / "models.md"
    rows = [line.split("|")[1:-1] for line in page.read_text(encoding="utf-8").splitlines() if line.startswith("| `")]
    table = {}
    for cells in rows:
        counts = [int(m.replace(",", "")) for m in (re.match(r"\s*([\d,]+)", c) for c in cells[2:4]) for m in [m and m.group(1)] if m]
        table[cells[0].strip().strip("`")] = dict(zip((1, 3), counts))
    assert table == PARAMS, f"docs/models.md differs from the measured counts: {table}"


def test_the_wrapper_feeds_unet2dmodel_1000_t_and_returns_the_sample():
    # prepare
    torch.manual_seed(0)
    net = builtin.build_model(TINY, 1).eval()
    x = torch.randn(3, 1, 28, 28)
    t = torch.tensor([0.0, 0.25, 0.999])
    # execute
    with torch.no_grad():
        out = net(x, t)
        direct = net.unet(x, t * 1000.0).sample
        unscaled = net.unet(x, t).sample
    # assert: the same call as UNet2DModel at DDPM's integer-step scale, not at t itself; shape of x
    assert out.shape == x.shape
    assert torch.equal(out, direct)
    assert not torch.allclose(out, unscaled, atol=1e-4)


def test_a_diffusers_preset_builds_for_both_image_shapes():
    torch.manual_seed(0)
    for channels, side in ((1, 28), (3, 32)):
        net = builtin.build_model(TINY, channels)
        with torch.no_grad():
            y = net(torch.randn(2, channels, side, side), torch.rand(2))
        assert y.shape == (2, channels, side, side) and torch.isfinite(y).all()


# -- refused before any work ----------------------------------------------------------------------

def test_missing_diffusers_is_refused_when_the_config_is_built(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "diffusers" else real(name, *a))
    with pytest.raises(ConfigError) as err:
        tiny_config(over={"train.model": TINY})
    assert "'train.model'" in str(err.value) and "pip install 'dfbench[diffusers]'" in str(err.value)
    tiny_config(over={"train.model": "tiny"})  # a built-in preset needs nothing of diffusers


def test_another_diffusers_release_is_refused(monkeypatch):
    from importlib import metadata

    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "0.1.0" if name == "diffusers" else real(name))
    with pytest.raises(ConfigError, match=r"diffusers==0\.42\.1.*found 0\.1\.0"):
        tiny_config(over={"train.model": TINY})


def test_an_image_side_the_down_sampling_cannot_take_is_refused():
    # DDPM's CIFAR-10 network halves 32 three times; Fashion-MNIST's 28 -> 14 -> 7 -> 4 would not come back to 7
    with pytest.raises(ConfigError, match=r"'train.model'.*fmnist.s 28x28.*multiples of 8"):
        tiny_config(over={"train.model": "diffusers-ddpm-cifar10"})
    assert tiny_config(over={"train.model": "diffusers-ddpm-cifar10", "data.dataset": "cifar10"}).train.model == \
        "diffusers-ddpm-cifar10"


def test_heterofl_needs_a_width_aware_network_but_rate_one_is_fedavg():
    with pytest.raises(ConfigError, match=r"heterofl.*train.model=diffusers-tiny.*width-aware network.*method.rate=1.0"):
        tiny_config("heterofl", over={"train.model": TINY})
    with pytest.raises(ConfigError, match="width-aware"):  # a narrow capacity tier is a narrow rate too
        tiny_config("heterofl", {"rate": 1.0}, {"train.model": TINY, "system.capacity": "1.0:0.5,0.5:0.5"})
    assert tiny_config("heterofl", {"rate": 1.0}, {"train.model": TINY}).method == "heterofl"
    assert tiny_config("heterofl", over={"train.model": "tiny"}).method == "heterofl"  # the built-in UNet: sliced


def test_the_run_id_names_the_preset():
    # a new preset is a new value of an existing field, so the built-in presets' ids stay (pinned in
    # tests/results/test_run_ids.py); a diffusers preset is another run
    assert tiny_config(over={"train.model": TINY}).run_id() != tiny_config(over={"train.model": "tiny"}).run_id()


# -- same seed, same result ---------------------------------------------------------------------

def test_the_initialization_is_seeded_and_fingerprinted(tiny_data):
    from dfbench.benchmark.engine.evaluate import pairing_fingerprints

    cfg = tiny_config(over={"train.model": TINY})
    a, b = build_context(cfg, data=tiny_data), build_context(cfg, data=tiny_data)
    other = build_context(tiny_config(over={"train.model": TINY, "seed": 1}), data=tiny_data)
    assert a.layout.total == PARAMS[TINY][1] and a.layout.names[0].startswith("unet.")
    assert torch.equal(a.init_params, b.init_params) and not torch.equal(a.init_params, other.init_params)
    fa, fb = pairing_fingerprints(cfg, a), pairing_fingerprints(cfg, b)
    assert fa["init_sha256"] == fb["init_sha256"] != pairing_fingerprints(other.cfg, other)["init_sha256"]
    # the flat buffer drives the network: its parameters are views of it
    a.flat.zero_()
    assert all(not p.any() for p in a.model.parameters())


@pytest.mark.slow
@pytest.mark.parametrize("name", methods.list_methods())
def test_every_method_runs_one_round_on_diffusers_tiny_or_is_refused_up_front(tmp_path, tiny_data, name):
    try:
        cfg = tiny_config(name, over=ONE_ROUND)
    except ConfigError as err:
        assert name in REFUSED, f"{name} refused: {err}"
        assert REFUSED[name] in str(err) and "use" in str(err).lower()  # the reason and the fix
        return
    assert name not in REFUSED, f"{name} should be refused"
    ctx = build_context(cfg, data=tiny_data)
    init = methods.create_method(name).init_state(ctx.init_params, ctx).params
    d = run(cfg, tmp_path, data=tiny_data, progress=False)
    assert json.loads((d / "status.json").read_text())["state"] == "done"
    p = final_params(d)
    assert p.shape == init.shape and torch.isfinite(p).all() and not torch.equal(p, init)
    (row,) = rows(d)
    assert (row["uplink_bits"] == 0) == (name == "experts")  # the experts never communicate
    import numpy as np

    images = np.load(d / "samples.npz")["images"]
    assert images.shape[0] == 4 and images.shape[-3:] in ((1, 28, 28), (28, 28, 1))


# What a resume restores is the method's state (every method: tests/runs/test_resume.py, on the built-in UNet); what
# the network adds is its parameter layout, which these methods read tensor by tensor (masks, low-rank
# factors, per-client memories, an expert mixture [K, P]); fedavg resumes in a fresh process below.
RESUMED = ["random_prune", "topk_prune", "powersgd", "quantized", "experts"]


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in RESUMED if n in methods.list_methods()])
def test_an_interrupted_run_on_diffusers_tiny_resumes_bitwise(name, tmp_path, tiny_data, monkeypatch):
    cfg = tiny_config(name, SMALL.get(name), {"train.model": TINY, "train.rounds": 3, "checkpoint_every": 1,
                                              "eval.samples": 4, "eval.grid": 2, "eval.sampler_steps": 2})
    ref = run(cfg, tmp_path / "ref", data=tiny_data, progress=False)
    with monkeypatch.context() as m:
        interrupt_at(m, 3)
        with pytest.raises(KeyboardInterrupt):
            run(cfg, tmp_path / "cut", data=tiny_data, progress=False)
    d = runfolder.run_dir(tmp_path / "cut", cfg)
    assert runfolder.load_checkpoint(d)["round"] == 2
    run(cfg, tmp_path / "cut", data=tiny_data, progress=False)
    assert torch.equal(final_params(d), final_params(ref))
    assert rows(d) == rows(ref)


@pytest.mark.slow
def test_a_sigkilled_run_on_diffusers_tiny_resumes_bitwise_in_a_fresh_process(tmp_path, tiny_data):
    # the killed run builds its network in another interpreter (its first diffusers import): same init, same run
    over = {"train.model": TINY, "train.rounds": 3, "checkpoint_every": 1, "train.ema": 0.5, "system.participation": 0.5}
    ref, d = sigkill_then_resume(tmp_path, tiny_data, over)
    assert torch.equal(final_params(d), final_params(ref))
    assert torch.equal(runfolder.load_checkpoint(d)["ema"], runfolder.load_checkpoint(ref)["ema"])
    assert rows(d) == rows(ref)
    assert (d / "grid.png").read_bytes() == (ref / "grid.png").read_bytes()


@pytest.mark.slow
def test_batched_clients_equal_sequential_ones_and_the_fused_attention_comes_back(tiny_data):
    from diffusers.models.attention_processor import Attention, AttnProcessor2_0

    from dfbench.benchmark.engine.training import train_round

    finals, processors = {}, {}
    for mode in ("sequential", "batched"):
        cfg = tiny_config("random_prune", {"keep_ratio": 0.5}, {"train.model": TINY, "train.clients_mode": mode,
                                                                "train.rounds": 1})
        ctx = build_context(cfg, data=tiny_data)
        m = methods.create_method(cfg.method, **dict(cfg.method_params))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            state, _ = train_round(m, m.init_state(ctx.init_params, ctx), ctx, 1)
        # vmap batches the attention (explicit_attention), not a per-client loop over the fused kernel
        assert not [w for w in caught if "performance drop" in str(w.message)], mode
        finals[mode] = state.params
        processors[mode] = {type(b.processor) for b in ctx.model.modules() if isinstance(b, Attention)}
    rel = float((finals["batched"] - finals["sequential"]).double().norm() / finals["sequential"].double().norm())
    assert rel < 1e-5
    assert not torch.equal(finals["batched"], ctx.init_params)
    assert processors == {"sequential": {AttnProcessor2_0}, "batched": {AttnProcessor2_0}}


@pytest.mark.slow
def test_a_three_channel_dataset_and_dp_run_on_diffusers_tiny(tmp_path):
    from dfbench.benchmark.engine import privacy
    from dfbench.benchmark.engine.training import train_round

    data = make_imageset(channels=3, size=32)
    cfg = tiny_config(over={**ONE_ROUND, "data.dataset": "cifar10", "privacy.clip": 1e-3, "privacy.noise": 0.5})
    ctx = build_context(cfg, data=data)
    ctx = dataclasses.replace(ctx, mechanisms=tuple(privacy.mechanisms(cfg, ctx)))  # as the life cycle builds it
    assert ctx.layout.total == PARAMS[TINY][3]
    m = methods.create_method("fedavg")
    state = m.init_state(ctx.init_params, ctx)
    new, row = train_round(m, state, ctx, 1)
    assert row["dp_clipped_fraction"] == 1.0 and row["dp_epsilon"] > 0
    assert torch.isfinite(new.params).all() and not torch.equal(new.params, state.params)


# -- N ranks == 1 process (tests/runs/test_distributed.py's check, on the diffusers preset) -----------------

RANKS_OVER = {"train.model": TINY, "data.clients": 4, "checkpoint_every": 1}  # 2 rounds, each checkpointed


def _rank(root: str) -> int:
    """One rank (this file run as a script, with torchrun's environment): the fedavg run of RANKS_OVER."""
    from dfbench.benchmark.engine import distributed

    torch.set_num_threads(1)
    distributed.init_from_env("cpu")
    rank, _ = distributed.rank_world()
    run(tiny_config("fedavg", over=RANKS_OVER), Path(root) / f"rank{rank}", data=make_imageset(), progress=False)
    distributed.shutdown()
    return 0


def _launch_ranks(root: Path, world: int = 2, limit_s: float = 240.0) -> list[int]:
    """Start `world` ranks as torchrun would on one machine; their exit codes (a hang fails the test)."""
    import os
    import socket
    import subprocess
    import sys

    from dfbench.benchmark.engine import distributed

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    here = Path(__file__).resolve().parents[1]  # tests/, where helpers.py is
    procs = []
    for rank in range(world):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
               distributed.TIMEOUT_ENV: "120", "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")])}
        log = open(root / f"rank{rank}.log", "w")
        procs.append(subprocess.Popen([sys.executable, str(Path(__file__).resolve()), str(root)], env=env,
                                      stdout=log, stderr=subprocess.STDOUT, cwd=here.parent))
        log.close()
    try:
        return [p.wait(timeout=limit_s) for p in procs]
    except subprocess.TimeoutExpired:
        pytest.fail(f"a rank hung past {limit_s:g} s")
    finally:
        for p in procs:  # every process this test started ends with it
            if p.poll() is None:
                p.kill()
                p.wait()


def _ckpt(d: Path, r: int) -> torch.Tensor:
    return torch.load(d / "checkpoints" / f"ckpt-{r:06d}.pt", map_location="cpu", weights_only=True)["params"]


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.slow
def test_two_ranks_compute_the_single_process_run_on_diffusers_tiny(tmp_path, tiny_data):
    # prepare / execute: one 2-rank launch (gloo) and the single-process run
    codes = _launch_ranks(tmp_path)
    logs = "\n".join(p.read_text()[-3000:] for p in sorted(tmp_path.glob("rank*.log")))
    assert codes == [0, 0], f"exit codes {codes}\n{logs}"
    cfg = tiny_config("fedavg", over=RANKS_OVER)
    single = run(cfg, tmp_path / "single", data=tiny_data, progress=False)
    dist = runfolder.run_dir(tmp_path / "rank0", cfg)
    # assert: rank 0 wrote the run, rank 1 nothing. 2 ranks add the clients' sums in another order, so
    # rounds agree within float rounding, not bitwise (tests/runs/test_distributed.py's module doc); the first
    # round's client losses are bitwise the same (same init, same batches)
    assert runfolder.read_status(dist)["state"] == "done" and not (tmp_path / "rank1").exists()
    assert _rel_err(_ckpt(dist, 1), _ckpt(single, 1)) <= 1e-6
    assert _rel_err(_ckpt(dist, 2), _ckpt(single, 2)) <= 1e-6
    a, b = runfolder.read_rounds(dist), runfolder.read_rounds(single)
    assert [r["clients"] for r in a] == [r["clients"] for r in b] == [[0, 1, 2, 3]] * 2
    assert a[0]["client_loss"] == b[0]["client_loss"]


if __name__ == "__main__":  # a rank of the 2-rank test
    import sys

    sys.exit(_rank(sys.argv[1]))
