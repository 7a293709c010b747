"""Starting from trained weights (train.init, benchmark/engine/init_weights.py) and converting DDPM weights to flow
matching at initialization (train.init_objective=ddpm, benchmark/engine/diffusion.py `EpsAsVelocity`).

- a tiny diffusers UNet2DModel saved with save_pretrained starts a run: the loaded weights are its own, bit for
  bit, and the run folder says where it started (config.json, metrics.json);
- the weights' digest is in the run id and their place is not: changed bytes, another run; a copy, the same run;
- every refusal comes before any work, in one line naming the file and what differs;
- a finished run's folder starts another run from its final model, and the leaderboard row says "from <run>";
- a DDPM run's network started under flow matching is the experts' converted network, and trains from there.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from dfbench import methods
from dfbench.benchmark.core import presets, runfolder
from dfbench.benchmark.core.config import ConfigError, RunConfig
from dfbench.benchmark.engine import diffusion
from dfbench.benchmark.engine.context import build_context
from dfbench.benchmark.engine.init_weights import weights_sha256
from dfbench.benchmark.engine.lifecycle import run
from dfbench.benchmark.engine.resolve import apply_overrides, config_from_dict
from helpers import final_params, one_line, tiny_config

try:  # the extra (in `dfbench[test]`), imported at collection, so no test is charged its seconds of import
    from diffusers.models.unets.unet_2d import UNet2DModel
except ImportError:  # the diffusers tests skip; the rest need no diffusers
    UNet2DModel = None

ONE_ROUND = {"train.rounds": 1, "train.sigma1_probe_steps": 0}
GT = {"data.dataset": "gmm:dim4?n=1000&test=200", "data.clients": 2, "train.model": "mlp-tiny", "train.local_steps": 5,
      "train.batch_size": 32, "train.lr": 3e-3, "eval.samples": 16, "eval.grid": 4, "eval.sampler_steps": 4,
      "eval.metrics": "none", "train.sigma1_probe_steps": 0}
# the CLI's run, as tests/runs/test_cli_behaviour.py spells it (the synthetic images of the dfbench fixture)
RUN_ARGS = ["--dataset", "fmnist", "--clients", "2", "--local-steps", "1", "--batch-size", "8", "--eval-samples", "16",
            "--sampler-steps", "3", "--rounds", "1", "--set", "eval.metrics=none", "--set", "eval.grid=4",
            "--set", "data.min_client_size=4", "--no-progress"]


def _flat(net: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


def _unet2d(seed: int = 1, **change):
    """diffusers-tiny's UNet2DModel for grey images (as the run builds it), seeded, with `change`d arguments."""
    if UNet2DModel is None:
        pytest.skip("needs the extra: pip install 'dfbench[diffusers]'")
    torch.manual_seed(seed)
    return UNet2DModel(in_channels=1, out_channels=1, **{**dict(presets.DIFFUSERS["diffusers-tiny"]), **change})


def _tiny_state(path: Path, seed: int = 1) -> dict[str, torch.Tensor]:
    """A state_dict of the built-in `tiny` preset's network for grey 28x28 images, saved at `path`."""
    from dfbench.benchmark.engine.model import build_model

    torch.manual_seed(seed)
    state = build_model("tiny", (1, 28, 28)).state_dict()
    torch.save(state, path)
    return state


def _refusal(dfbench, *extra: str) -> str:
    """`dfbench run` refused before any work: exit 2, one line on stderr, no run folder."""
    code, out, err = dfbench(["run", *RUN_ARGS, *extra])
    assert code == 2, (out, err)
    return one_line(err)


# -- a diffusers checkpoint ------------------------------------------------------------------------------------

def test_a_run_starts_from_a_saved_diffusers_unet_bit_for_bit_and_says_so(tmp_path, tiny_data):
    # prepare: a tiny UNet2DModel, saved as a downloaded checkpoint is (save_pretrained)
    unet = _unet2d()
    folder = tmp_path / "unet"
    unet.save_pretrained(folder)
    cfg = tiny_config(over={"train.model": "diffusers-tiny", "train.init": str(folder), **ONE_ROUND})
    # execute
    ctx = build_context(cfg, data=tiny_data)
    d = run(cfg, tmp_path / "runs", data=tiny_data, progress=False)
    # assert: the run's initial parameters are the saved ones, bit for bit (as diffusers itself loads them too)
    assert torch.equal(ctx.init_params, _flat(unet))
    assert torch.equal(ctx.init_params, _flat(type(unet).from_pretrained(folder)))
    digest = weights_sha256(_flat(unet))
    assert cfg.train.init_sha256 == digest and cfg.train.init == str(folder)
    config = json.loads((d / runfolder.CONFIG).read_text())
    assert config["train"]["init"] == str(folder) and config["train"]["init_sha256"] == digest
    metrics = json.loads((d / runfolder.METRICS).read_text())
    assert metrics["init"] == {"path": str(folder), "kind": "diffusers", "sha256": digest, "objective": "ddpm"}
    assert metrics["pairing"]["init_sha256"] == digest  # the seeded-initialization fingerprint is the same digest
    assert not torch.equal(final_params(d), ctx.init_params)  # and it trained from there


def test_a_diffusers_folder_of_another_configuration_is_refused_naming_its_config_and_the_difference(tmp_path, dfbench):
    other = tmp_path / "wider"
    _unet2d(block_out_channels=(8, 32)).save_pretrained(other)
    line = _refusal(dfbench, "--set", "train.model=diffusers-tiny", "--set", f"train.init={other}")
    assert str(other / "config.json") in line and "block_out_channels is (8, 32) there, (8, 16) in the preset" in line, line
    # the image channels are the dataset's: an RGB network does not start a grey run
    rgb = tmp_path / "rgb"
    UNet2DModel(in_channels=3, out_channels=3, **dict(presets.DIFFUSERS["diffusers-tiny"])).save_pretrained(rgb)
    line = _refusal(dfbench, "--set", "train.model=diffusers-tiny", "--set", f"train.init={rgb}")
    assert str(rgb / "config.json") in line and "in_channels is 3 there, 1 in the preset" in line, line
    # and a diffusers folder needs a diffusers preset
    _unet2d().save_pretrained(tmp_path / "tiny")
    line = _refusal(dfbench, "--set", "train.model=tiny", "--set", f"train.init={tmp_path / 'tiny'}")
    assert str(tmp_path / "tiny" / "config.json") in line and "train.model=tiny is not a diffusers preset" in line, line
    assert not (tmp_path / "runs").exists()


# -- a checkpoint file: identity, refusals -------------------------------------------------------------------

def test_the_weights_digest_is_in_the_run_id_and_their_place_is_not(tmp_path, tiny_data):
    # prepare
    state = _tiny_state(tmp_path / "a.pt")
    shutil.copy(tmp_path / "a.pt", tmp_path / "copy.pt")
    seeded = tiny_config()
    # execute
    a = tiny_config(over={"train.init": str(tmp_path / "a.pt")})
    copy = tiny_config(over={"train.init": str(tmp_path / "copy.pt")})
    state["inp.weight"][0, 0, 0, 0] += 1.0  # one weight changed: other bytes
    torch.save(state, tmp_path / "a.pt")
    changed = tiny_config(over={"train.init": str(tmp_path / "a.pt")})
    # assert
    assert a.run_id() == copy.run_id()  # the same weights elsewhere: the same run
    assert len({seeded.run_id(), a.run_id(), changed.run_id()}) == 3
    assert torch.equal(build_context(changed, data=tiny_data).init_params, torch.cat([v.reshape(-1) for v in state.values()]))
    # the config of the old weights no longer builds: its recorded digest names the change
    with pytest.raises(ConfigError, match=f"train.init_sha256.*{changed.train.init_sha256}.*changed"):
        config_from_dict(a.record())
    assert config_from_dict(changed.record()).run_id() == changed.run_id()  # and the present one builds as it was


def test_a_checkpoint_of_another_network_is_refused_naming_the_file_and_the_difference(tmp_path, dfbench):
    path = tmp_path / "ck.pt"
    # another shape: the first parameter that differs, with both shapes
    state = _tiny_state(path)
    state["inp.weight"] = torch.zeros(16, 1, 3, 3)
    torch.save(state, path)
    line = _refusal(dfbench, "--set", "train.model=tiny", "--set", f"train.init={path}")
    assert str(path) in line and "'inp.weight' has shape [16, 1, 3, 3] there, [8, 1, 3, 3] in the network" in line, line
    # a parameter missing, one too many
    state = _tiny_state(path)
    del state["out.2.bias"]
    torch.save(state, path)
    line = _refusal(dfbench, "--set", "train.model=tiny", "--set", f"train.init={path}")
    assert str(path) in line and "missing" in line and "'out.2.bias' (shape [1])" in line, line
    state = {**_tiny_state(path), "head.weight": torch.zeros(2, 2)}
    torch.save(state, path)
    line = _refusal(dfbench, "--set", "train.model=tiny", "--set", f"train.init={path}")
    assert str(path) in line and "does not have" in line and "'head.weight' (shape [2, 2])" in line, line
    # another preset altogether
    _tiny_state(path)
    line = _refusal(dfbench, "--set", "train.model=small28", "--set", f"train.init={path}")
    assert str(path) in line and "train.model=small28" in line, line
    # not a state_dict
    path.write_text("not a checkpoint")
    line = _refusal(dfbench, "--set", "train.model=tiny", "--set", f"train.init={path}")
    assert str(path) in line and "cannot be read as a state_dict" in line, line
    assert not (tmp_path / "runs").exists()


def test_a_missing_path_and_inconsistent_fields_are_refused_before_any_work(tmp_path, dfbench):
    missing = tmp_path / "nowhere" / "unet"
    line = _refusal(dfbench, "--set", f"train.init={missing}")
    assert str(missing) in line and "does not exist" in line, line
    line = _refusal(dfbench, "--set", "train.init_objective=ddpm")
    assert "train.init_objective" in line and "without train.init" in line, line
    path = tmp_path / "ck.pt"
    _tiny_state(path)
    line = _refusal(dfbench, "--set", "train.model=tiny", "--set", f"train.init={path}", "--set", "train.init_objective=ddpm")
    assert "train.init_objective" in line and "train.objective=ddpm" in line, line
    # a folder that is neither a run's nor a diffusers model's
    (tmp_path / "empty").mkdir()
    line = _refusal(dfbench, "--set", f"train.init={tmp_path / 'empty'}")
    assert str(tmp_path / "empty") in line and "config.json" in line, line


# -- a finished run's folder ----------------------------------------------------------------------------------

def test_a_run_starts_from_a_finished_runs_final_model_and_its_row_says_from_which(tmp_path, tiny_data):
    from dfbench.benchmark.report.frames import runs_frame
    from dfbench.benchmark.report.names import run_names
    from dfbench.benchmark.report.run_records import read_run

    # prepare: a finished run that keeps an EMA (its final model: what its evaluation sampled)
    source = run(tiny_config(over={"train.ema": 0.5, **ONE_ROUND}), tmp_path / "runs", data=tiny_data, progress=False)
    final = runfolder.load_checkpoint(source)["ema"]
    cfg = tiny_config(over={"train.init": str(source), **ONE_ROUND})
    # execute
    ctx = build_context(cfg, data=tiny_data)
    d = run(cfg, tmp_path / "runs", data=tiny_data, progress=False)
    # assert: it starts from the final model, and its folder and its leaderboard row say from which run
    assert torch.equal(ctx.init_params, final) and cfg.train.init_sha256 == weights_sha256(final)
    record = json.loads((d / runfolder.METRICS).read_text())["init"]
    assert record["kind"] == "run" and record["run_id"] == source.name and record["path"] == str(source)
    runs, _, _ = runs_frame([read_run(source), read_run(d)])
    names = run_names(runs)
    assert names[d.name] == f"fedavg (init=from {source.name})" and names[source.name] == "fedavg (ema=0.5)", names


def test_an_unfinished_run_and_an_expert_mixture_do_not_start_a_run(tmp_path, tiny_data, dfbench):
    source = run(tiny_config(over=ONE_ROUND), tmp_path / "runs", data=tiny_data, progress=False)
    runfolder.write_status(source, runfolder.FAILED, error="stopped")
    line = _refusal(dfbench, "--set", "train.model=tiny", "--set", f"train.init={source}")
    assert str(source) in line and "not a finished run" in line and "failed" in line, line
    experts = run(tiny_config("experts", {"router_steps": 2, "router_batch": 8}, over=ONE_ROUND), tmp_path / "runs",
                  data=tiny_data, progress=False)
    line = _refusal(dfbench, "--set", "train.model=tiny", "--set", f"train.init={experts}")
    assert str(experts / runfolder.CHECKPOINTS) in line and "holds 2 networks" in line, line


def test_every_expert_starts_from_the_weights(tmp_path, tiny_data):
    state = _tiny_state(tmp_path / "ck.pt")
    cfg = tiny_config("experts", {"num_experts": 2}, over={"train.init": str(tmp_path / "ck.pt")})
    ctx = build_context(cfg, data=tiny_data)
    params = methods.create_method("experts", **dict(cfg.method_params)).init_state(ctx.init_params, ctx).params
    assert params.shape[0] == 2 and all(torch.equal(p, torch.cat([v.reshape(-1) for v in state.values()])) for p in params)


# -- DDPM weights trained under flow matching ---------------------------------------------------------------

def test_a_ddpm_run_started_under_flow_matching_is_the_experts_converted_network_and_trains(tmp_path):
    # prepare: a DDPM run on the ground-truth track
    source = run(apply_overrides(RunConfig(), {**GT, "train.rounds": 1, "train.objective": "ddpm"}), tmp_path / "runs",
                 progress=False)
    ddpm_ctx = build_context(apply_overrides(RunConfig(), {**GT, "train.rounds": 0, "train.init": str(source)}))
    over = {**GT, "train.rounds": 1, "train.objective": "fm", "train.init": str(source)}
    converted = apply_overrides(RunConfig(), {**over, "train.init_objective": "ddpm"})
    # execute
    ctx = build_context(converted)
    x, t = torch.randn(8, 1, 1, 4), torch.rand(8)
    with torch.no_grad():
        v = ctx.model(x, t)
        v_experts = ddpm_ctx.velocity(ddpm_ctx.model, x, t, "ddpm")  # how a DDPM expert of a mixture is sampled
    d = run(converted, tmp_path / "runs", progress=False)
    # assert: the same weights, the experts' conversion, and flow-matching training from there
    assert isinstance(ctx.model, diffusion.EpsAsVelocity) and torch.equal(ctx.init_params, ddpm_ctx.init_params)
    assert torch.equal(v, v_experts)
    assert converted.run_id() != apply_overrides(RunConfig(), over).run_id()  # the same weights, unconverted: another run
    assert math.isfinite(runfolder.read_rounds(d)[0]["loss"]) and not torch.equal(final_params(d), ctx.init_params)
    assert json.loads((d / runfolder.METRICS).read_text())["init"]["objective"] == "ddpm"


@pytest.mark.parametrize("method,params,key", [
    ("experts", {"objectives": "ddpm,fm"}, "method.objectives"),  # a DDPM expert would train the converted network
    ("heterofl", {"rate": 0.5}, "sub-model"),  # a width sub-model is another network than the one converted
])
def test_the_conversion_is_refused_where_it_would_not_wrap_what_trains(tmp_path, method, params, key):
    _tiny_state(tmp_path / "ck.pt")
    over = {"train.objective": "fm", "train.init": str(tmp_path / "ck.pt"), "train.init_objective": "ddpm"}
    with pytest.raises(ConfigError, match=key):
        tiny_config(method, params, over=over)
    tiny_config(method, params, over={**over, "train.init_objective": ""})  # the weights as they are: fine
