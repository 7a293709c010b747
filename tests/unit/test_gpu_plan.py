"""The GPU study's preflight and plan (results/cifar10-gpu/gpu_plan.py, `make bench-cifar10-gpu[-plan]`), on CPU:
every missing input reported at once with its fix, the plan's seconds computed from the grid's cells, the
seeds each claim needs from an earlier study's paired spread, and a dry run that exits 0 with a plan."""

from __future__ import annotations

import importlib.util
import math
import re
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from dfbench.benchmark.core import presets
from dfbench.benchmark.grid import matching
from dfbench.benchmark.report import verdicts as V
from dfbench.datasets import data_info
from helpers import load_script, tiny_config, write_grid

G = load_script("results/cifar10-gpu/gpu_plan.py")

ROOT = Path(__file__).resolve().parents[2]
GRID = str(ROOT / "results" / "cifar10-gpu" / "cifar10-gpu.toml")  # the study's grid, in its results folder
INCEPTION_URL = "https://github.com/mseitzer/pytorch-fid/releases/download/fid_weights/pt_inception-2015-12-05-6726825d.pth"
DINOV2_URL = "https://dl.fbaipublicfiles.com/dinov2/dinov2_vitl14/dinov2_vitl14_pretrain.pth"


@pytest.fixture
def bare_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No dataset, no weights, no CUDA, no diffusers: returns the (empty) data root to look in."""
    for var in ("DFBENCH_INCEPTION_WEIGHTS", "DFBENCH_DINOV2_WEIGHTS", "DFBENCH_DATA"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "diffusers" else real_find_spec(name, *a))
    monkeypatch.setattr(presets, "diffusers_problem",
                        lambda: f"Hugging Face diffusers is not installed: {presets.DIFFUSERS_EXTRA}")
    root = tmp_path / "no_data"
    root.mkdir()
    return root


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))


# -- preflight ---------------------------------------------------------------------------------------


def test_everything_missing_is_reported_together_with_what_to_fetch(bare_machine):
    grid, model, problems, stand_in = G.load_study_grid(GRID, "cuda")
    # diffusers "missing": this checkout cannot validate the grid's model, so it is planned with a stand-in
    assert model == "diffusers-ddpm-cifar10" and stand_in == G.STAND_IN_MODEL and problems == []
    checks = {c.name.split(",")[0].split(" (")[0]: c for c in
              G.preflight([c.cfg for c in grid.cells], model=model, device="cuda", data_root=str(bare_machine))}
    missing = {name for name, c in checks.items() if not c.ok and c.required}
    assert missing == {"cifar10 data", "FID Inception weights", "CUDA device", "Hugging Face diffusers",
                       "model diffusers-ddpm-cifar10"}
    assert checks["KID"].ok
    dino = checks["DINOv2 ViT-L/14 weights"]
    assert not dino.ok and not dino.required  # optional: the runs score the rest without it
    text = G.render_checks("cifar10-gpu", list(checks.values()))
    for needle in ("`dfbench fetch cifar10 --data-root", "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
                   "`dfbench fetch inception`", INCEPTION_URL, "6726825d0af5f729cebd5821db510b11b1cfad8faad88a03f1befd49fb9129b2",
                   "torch sees no CUDA device", "pip install 'dfbench[diffusers]'", "diffusers==0.42.1", DINOV2_URL,
                   "dfbench never downloads it", "5 required item(s) missing here", "(and 1 optional)"):
        assert needle in text, needle
    assert text.count("[ MISSING]") == 5 and text.count("[optional]") == 1


def test_the_dry_run_exits_0_with_the_plan_and_the_real_run_stops_before_any_cell(bare_machine, capsys):
    assert G.main([GRID, "--dry-run", "--data-root", str(bare_machine)]) == 0
    out = capsys.readouterr().out
    for needle in ("preflight (what this machine has)",
                   "plan: 84 cells (74 trained, 10 untrained): 60 of diffusers-ddpm-cifar10, 24 of ddpm32 (planned with",
                   f"planned with {G.STAND_IN_MODEL} in its place", "GPU-hours on one NVIDIA H200, ESTIMATED (not measured here)",
                   "times this grid's own network there", "make gpu-check", "seeds: each claim of cifar10-gpu.claims.toml",
                   "dry run: nothing was run"):
        assert needle in out, needle
    assert G.main([GRID, "--data-root", str(bare_machine)]) == 1
    captured = capsys.readouterr()
    assert "not starting: 5 required item(s) missing (above); nothing was run" in captured.err


def test_an_unknown_model_is_a_preflight_item_not_a_crash(tmp_path, no_cuda, capsys):
    path = write_grid(tmp_path / "future.toml", {"data.dataset": "cifar10", "train.model": "diffusers-ddpm-cifar10-v9",
                                                 "train.rounds": 1, "eval.metrics": "fid"}, {"seed": [0, 1]})
    grid, model, _, stand_in = G.load_study_grid(str(path), "cuda")
    assert (model, stand_in, len(grid.cells)) == ("diffusers-ddpm-cifar10-v9", G.STAND_IN_MODEL, 2)
    check = next(c for c in G.preflight([c.cfg for c in grid.cells], model=model, device="cuda", verify=False)
                 if c.name.startswith("model"))
    assert not check.ok and "is not a preset of this dfbench" in check.detail and "update dfbench" in check.fix
    assert G.main([str(path), "--dry-run", "--no-verify"]) == 0
    assert "planned with base32 in its place: this checkout cannot build diffusers-ddpm-cifar10-v9" in capsys.readouterr().out


def test_a_grid_error_that_is_not_the_model_s_is_an_error(tmp_path, capsys):
    path = write_grid(tmp_path / "bad.toml", {"data.dataset": "cifar10", "train.rounds": -1}, {"seed": [0]})
    assert G.main([str(path), "--dry-run"]) == 2
    assert "train.rounds" in capsys.readouterr().err


# -- the plan's numbers --------------------------------------------------------------------------------


def test_plan_seconds_are_computed_from_the_grid_s_cells(tmp_path):
    base = {"data.dataset": "cifar10", "data.clients": 3, "data.min_client_size": 4, "train.model": "tiny",
            "train.rounds": 4, "train.local_steps": 5, "train.batch_size": 8, "eval.samples": 100,
            "eval.sampler": "ddim", "eval.sampler_steps": 10, "eval.metrics": "fid,kid"}
    path = write_grid(tmp_path / "small.toml", base,
                      {"method": ["fedavg", "random_prune?keep_ratio=0.5&inference=scaled"], "seed": [0, 1]},
                      cells=[{"method": "fedavg", "train.rounds": 0, "seed": 0}])
    grid, *_ = G.load_study_grid(str(path), "cuda")
    t = G.Throughput(device="test GPU", train_ms=2.0, forward_ms=0.5, inception_ms=0.25, dinov2_ms=math.nan, score_s=7.0,
                     measured=True, source="test")
    plan = G.plan_study(grid, t)
    # by hand: 4 rounds x 3 clients x 5 steps x batch 8; DDIM: one evaluation per step; pruning is sampled and
    # scored under its configured rule and its two others (full, submodel); one Inception pass per sampling pass
    grads, nfe = 4 * 3 * 5 * 8, 100 * 10
    fedavg = grads * 2.0 / 1000 + nfe * 0.5 / 1000 + 100 * 0.25 / 1000 + 7.0
    pruned = grads * 2.0 / 1000 + 3 * (nfe * 0.5 / 1000 + 100 * 0.25 / 1000 + 7.0)
    untrained = nfe * 0.5 / 1000 + 100 * 0.25 / 1000 + 7.0
    reference = 50_000 * 0.25 / 1000  # CIFAR-10's training split through Inception, once
    by_setting = {c.setting: c for c in plan.cells}
    assert set(by_setting) == {"fedavg", "random_prune?inference=scaled&keep_ratio=0.5", "untrained"}
    assert [c.passes for c in plan.cells] == [1, 1, 3, 3, 1]
    assert by_setting["fedavg"].seconds == pytest.approx(fedavg)
    assert by_setting["random_prune?inference=scaled&keep_ratio=0.5"].seconds == pytest.approx(pruned)
    assert by_setting["untrained"].seconds == pytest.approx(untrained) and by_setting["untrained"].sample_grads == 0
    assert plan.reference_seconds == pytest.approx(reference)
    assert plan.seconds == pytest.approx(2 * fedavg + 2 * pruned + untrained + reference)
    # the rendered plan says the same total
    text = G.render_plan(plan, "tiny", None)
    assert f"=> {plan.hours:.1f} GPU-hours on one test GPU, measured" in text
    # fd_dinov2 adds one DINOv2 pass per sampling pass, and the reference once
    dino = G.plan_study(G.load_study_grid(str(write_grid(tmp_path / "d.toml", {**base, "eval.metrics": "fid,kid,fd_dinov2"},
                                                          {"seed": [0]})), "cuda")[0],
                        G.Throughput(**{**t.__dict__, "dinov2_ms": 4.0}))
    assert dino.cells[0].feature_images == {"dinov2": 100.0, "inception": 100.0}
    assert dino.seconds == pytest.approx(fedavg + 100 * 4.0 / 1000 + reference + 50_000 * 4.0 / 1000)


def test_the_stated_throughput_is_labelled_an_estimate_and_a_saved_one_is_read_back(tmp_path, no_cuda, capsys):
    assert not G.stated_throughput("h200").measured and "not measured" in G.stated_throughput("a100").source
    with pytest.raises(ValueError, match="no stated throughput"):
        G.stated_throughput("v100")
    saved = tmp_path / "throughput.json"
    assert G.main([GRID, "--dry-run", "--no-verify", "--gpu", "a100", "--save", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "GPU-hours on one NVIDIA A100 SXM, ESTIMATED" in out and not saved.exists()  # only a measurement is kept
    mine = G.Throughput(**{**G.stated_throughput("h200").__dict__, "train_ms": 0.5, "measured": True,
                           "source": "measured on a test GPU", "device": "Test GPU"})
    saved.write_text(__import__("json").dumps(mine.__dict__))
    assert G.main([GRID, "--dry-run", "--no-verify", "--throughput", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "throughput: measured on a test GPU" in out and "GPU-hours on one Test GPU, measured" in out


def test_measure_throughput_times_the_grid_s_own_network(monkeypatch):
    from dfbench.benchmark.metrics import dinov2

    monkeypatch.setattr(dinov2, "FD_SPEC", dinov2.ViTSpec(embed_dim=16, depth=1, heads=2, grid=4))  # ViT-L/14 is slow on a CPU
    cfg = tiny_config(over={"data.dataset": "cifar10"})
    t = G.measure_throughput(cfg, "cpu", steps=1, feature_images=2, repeats=1)
    assert t.measured and t.model == "tiny" and t.device == "cpu" and "measured on cpu" in t.source
    assert all(v > 0 and math.isfinite(v) for v in (t.train_ms, t.forward_ms, t.inception_ms, t.dinov2_ms))


# -- seeds ---------------------------------------------------------------------------------------------


def _evidence(tmp_path: Path, log_ratios: list[float]) -> Path:
    rows = []
    for seed, d in enumerate(log_ratios):
        b = 100.0 + 10 * seed
        for method, value in (("topk_prune", b * math.exp(d)), ("random_prune", b)):
            rows.append({"method": method, "baseline": False, "param.keep_ratio": 0.5, "group_key": method, "seed": seed,
                         "fd_fmnist": value})
    path = tmp_path / "runs.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def _claims(tmp_path: Path) -> Path:
    path = tmp_path / "c.claims.toml"
    path.write_text('metric = "fid"\n[[claim]]\nid = "C1"\nstatement = "s"\na = "topk_prune?keep_ratio=0.5"\n'
                    'b = "random_prune?keep_ratio=0.5"\nexpect = "better"\n')
    return path


@pytest.mark.parametrize("log_ratios", [[-0.9, -0.3, -1.4, -0.6, -0.2, -1.1], [-0.5, -0.45, -0.6, -0.4]])
def test_seeds_are_sized_from_the_evidence_s_paired_spread(tmp_path, log_ratios):
    claims = _claims(tmp_path)
    grid, *_ = G.load_study_grid(str(write_grid(tmp_path / "g.toml", {"data.dataset": "cifar10", "train.model": "tiny"},
                                                {"method": ["topk_prune?keep_ratio=0.5", "random_prune?keep_ratio=0.5"],
                                                 "seed": [0, 1, 2, 3, 4]})), "cuda")
    (s,) = G.size_seeds(claims, _evidence(tmp_path, log_ratios), grid.cells)
    d = np.asarray(log_ratios)
    assert (s.claim, s.metric, s.evidence_metric, s.evidence_seeds) == ("C1", "fid", "fd_fmnist", len(d))
    assert s.estimate == pytest.approx(math.exp(d.mean())) and s.sd == pytest.approx(d.std(ddof=1))
    # the sd sized from: its one-sided 80 % upper confidence bound, sd x sqrt((n - 1) / chi2_0.2(n - 1))
    from scipy import stats

    upper = d.std(ddof=1) * math.sqrt((len(d) - 1) / stats.chi2.ppf(0.2, len(d) - 1))
    assert s.confidence == 0.8 and s.sd_sized == pytest.approx(upper) and upper > s.sd

    # power 0.8 of the paired t-test at alpha 0.05 / 1 claim: the first n where the noncentral t clears the bar
    def power(n: int) -> float:
        df, ncp = n - 1, abs(d.mean()) / upper * math.sqrt(n)
        crit = stats.t.ppf(0.975, df)
        return stats.nct.sf(crit, df, ncp) + stats.nct.cdf(-crit, df, ncp)

    assert s.needed is not None and power(s.needed) >= 0.8 and (s.needed == 2 or power(s.needed - 1) < 0.8)
    assert s.needed == V.seeds_needed(d.mean(), d.std(ddof=1), len(d), (math.log(0.9), math.log(1.1)), 0.05)
    assert s.power(s.needed, 0.05) == pytest.approx(power(s.needed))
    point = V.seeds_needed(d.mean(), d.std(ddof=1), len(d), (math.log(0.9), math.log(1.1)), 0.05, confidence=None)
    assert point is not None and point <= s.needed  # the sample sd asks for no more seeds than its upper bound
    assert s.grid_seeds == 5 and s.status == ("sized" if s.needed <= 5 else "short")
    assert G.seeds_per_setting([s], claims) == {"topk_prune?keep_ratio=0.5": max(3, s.needed),
                                                 "random_prune?keep_ratio=0.5": max(3, s.needed)}


def test_a_claim_s_where_picks_the_grid_s_cells_but_not_the_evidence_s_network(tmp_path):
    # two networks in one grid, seeds 0-4 on tiny and 0-1 on small32: the claim names tiny's cells; the
    # evidence (another study, its own network) is read without the model key (EVIDENCE_FREE_KEYS)
    claims = tmp_path / "w.claims.toml"
    claims.write_text('metric = "fid"\n[[claim]]\nid = "C1"\nstatement = "s"\na = "topk_prune?keep_ratio=0.5"\n'
                      'b = "random_prune?keep_ratio=0.5"\nexpect = "better"\nwhere = { "train.model" = "tiny" }\n')
    methods = ["topk_prune?keep_ratio=0.5", "random_prune?keep_ratio=0.5"]
    other = [{"method": m, "train.model": "small32", "seed": s} for m in methods for s in (5, 6)]
    grid, *_ = G.load_study_grid(str(write_grid(tmp_path / "g.toml", {"data.dataset": "cifar10", "train.model": "tiny"},
                                                {"method": methods, "seed": [0, 1, 2, 3, 4]}, cells=other)), "cuda")
    assert len(matching.cells_of(grid.cells, methods[0])) == 7
    assert len(matching.cells_of(grid.cells, methods[0], {"train.model": "tiny"})) == 5
    assert [c.cfg.seed for c in matching.cells_of(grid.cells, methods[1], {"model": "small32"})] == [5, 6]  # a bare field name
    (s,) = G.size_seeds(claims, _evidence(tmp_path, [-0.9, -0.3, -1.4, -0.6]), grid.cells)
    assert s.evidence_seeds == 4 and s.grid_seeds == 5 and s.status != "no evidence"


def test_cells_of_another_network_are_planned_at_its_flop_ratio(tmp_path):
    base = {"data.dataset": "cifar10", "data.clients": 2, "data.min_client_size": 4, "train.model": "tiny",
            "train.rounds": 1, "train.local_steps": 2, "train.batch_size": 4, "eval.samples": 10, "eval.grid": 2,
            "eval.sampler": "ddim", "eval.sampler_steps": 2, "eval.metrics": "none"}
    grid, *_ = G.load_study_grid(str(write_grid(tmp_path / "m.toml", base, {"seed": [0]},
                                                cells=[{"train.model": "small32", "seed": 0}])), "cuda")
    scales, notes = G.model_scales(grid, "tiny")
    ratio = G.forward_flops("small32", "cifar10") / G.forward_flops("tiny", "cifar10")
    assert scales == {"small32": pytest.approx(ratio)} and ratio > 10
    assert notes == [f"cells of small32: training and sampling at {ratio:.3g}x the per-image costs of tiny (the ratio of "
                     "their forward FLOPs)"]
    t = G.Throughput(device="test GPU", train_ms=2.0, forward_ms=0.5, inception_ms=0.25, dinov2_ms=math.nan, score_s=0.0,
                     measured=True, source="test")
    tiny, small = G.plan_study(grid, t, model_scale=scales).cells
    # by hand: 1 round x 2 clients x 2 steps x batch 4 = 16 sample-gradients, 10 samples x 2 DDIM steps
    assert tiny.seconds == pytest.approx(16 * 2.0 / 1000 + 20 * 0.5 / 1000)
    assert small.seconds == pytest.approx(ratio * tiny.seconds) and (tiny.model, small.model) == ("tiny", "small32")
    assert G.model_scales(grid, "tiny", stand_in="small32") == ({}, [])  # a stand-in is the throughput's network
    text = G.render_plan(G.plan_study(grid, t, model_scale=scales), "tiny", None)
    assert "plan: 2 cells (2 trained, 0 untrained): 1 of tiny, 1 of small32" in text


def test_the_shipped_grid_gives_every_claim_in_reach_the_seeds_it_needs(no_cuda):
    if not G.EVIDENCE.is_file():
        pytest.skip("results/paper-fmnist/runs.csv is not in this checkout")
    grid, *_ = G.load_study_grid(GRID, "cuda")
    claims = ROOT / "results" / "cifar10-gpu" / "cifar10-gpu.claims.toml"
    # the grid was sized at the evidence's sample sd, before sizing took its upper confidence bound (issue 62)
    sizing = G.size_seeds(claims, G.EVIDENCE, grid.cells, confidence=None)
    assert [s.claim for s in sizing if s.status == "short"] == []
    assert {s.claim for s in sizing if s.status == "sized"} >= {"C1-0.5", "C1-0.25", "cost-topk-0.5", "trained"}
    # every setting has exactly the seeds the rule gives it (none wasted, every cell a claim's), seed 7 (held out) never
    rule = G.seeds_per_setting(sizing, claims)
    pruning = {"train.model": "diffusers-ddpm-cifar10"}  # every claim's `where`: the pruning study's network
    for spec, n in rule.items():
        cells = matching.cells_of(grid.cells, spec, pruning)
        assert len(cells) == len({c.cfg.seed for c in cells}) == n, spec
    assert sum(rule.values()) == len([c for c in grid.cells if c.cfg.train.model == pruning["train.model"]]) == 60
    assert all(c.cfg.seed != 7 for c in grid.cells)
    # the sub-model block (issue 53): eight settings on ddpm32 at seeds 0-2, none of them a claim's
    block = [c for c in grid.cells if c.cfg.train.model == "ddpm32"]
    assert len(block) == len(grid.cells) - 60 == 24 and {c.cfg.seed for c in block} == {0, 1, 2}
    assert {(c.cfg.method, c.cfg.system.capacity, c.cfg.system.edges) for c in block} == {
        ("fedavg", "", 0), ("heterofl", "1.0:0.5,0.4:0.5", 0), ("fedrolex", "1.0:0.5,0.4:0.5", 0),
        ("fjord", "1.0:0.5,0.4:0.5", 0), ("random_prune", "", 0), ("balanced_prune", "", 0), ("fedphd", "", 2), ("fedavg", "", 2)}
    assert all(len([c for c in block if (c.method, c.cfg.system.edges) == key]) == 3
               for key in {(c.method, c.cfg.system.edges) for c in block})
    assert all(dict(c.cfg.method_params)["keep_ratio"] == 0.5 for c in block if c.cfg.method.endswith("_prune"))
    # the study's budget: DDPM's CIFAR-10 network, 10k samples scored by FID and KID
    cfg = next(c.cfg for c in grid.cells if c.cfg.train.rounds > 0)
    assert (cfg.data.dataset, cfg.eval.samples) == ("cifar10", 10_000)
    assert {"fid", "kid"} <= set(cfg.eval.metrics.split(","))
    assert int(data_info("cifar10")["num_samples"]["train"]) == 50_000


# -- make --------------------------------------------------------------------------------------------


def test_the_make_targets_run_the_plan_first_and_under_make_n():
    text = (ROOT / "Makefile").read_text()
    phony = next(line for line in text.splitlines() if line.startswith(".PHONY:"))
    assert " bench-cifar10-gpu " in phony + " " and " bench-cifar10-gpu-plan " in phony + " "
    recipe = re.search(r"^bench-cifar10-gpu:.*?\n((?:\t.*\n)+)", text, re.M).group(1).splitlines()
    assert recipe[0].startswith("\t+$(BIN)/python results/cifar10-gpu/gpu_plan.py results/cifar10-gpu/cifar10-gpu.toml")
    assert "$(if $(CIFAR10_GPU_DRY),--dry-run," in recipe[0]
    assert any("dfbench grid results/cifar10-gpu/cifar10-gpu.toml" in line for line in recipe[1:])
    assert any("--claims results/cifar10-gpu/cifar10-gpu.claims.toml" in line for line in recipe)
    plan = re.search(r"^bench-cifar10-gpu-plan:.*?\n((?:\t.*\n)+)", text, re.M).group(1)
    assert "gpu_plan.py results/cifar10-gpu/cifar10-gpu.toml" in plan and "--dry-run" in plan


@pytest.mark.slow
def test_make_n_prints_the_plan_and_runs_nothing_else(tmp_path):
    env = {**__import__("os").environ, "TORCH_HOME": str(tmp_path / "torch_home"), "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run(["make", "-n", "bench-cifar10-gpu"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "plan: 84 cells" in out.stdout and "dry run: nothing was run" in out.stdout
    assert "dfbench grid results/cifar10-gpu/cifar10-gpu.toml --out results/cifar10-gpu/runs" in out.stdout  # printed, not run
    assert not (ROOT / "results" / "cifar10-gpu" / "runs").exists()


def test_a_model_that_fails_its_timed_training_step_is_a_missing_item(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    if G.load_study_grid(GRID, "cuda")[3] is not None:
        pytest.skip("this checkout cannot build the study's model (diffusers missing): nothing to time")
    monkeypatch.setattr(G, "_check_cuda", lambda device: G.Check("CUDA device", True, "cuda: a test GPU"))

    def fails(cfg, device, **kw):
        raise RuntimeError("upsample_nearest2d_backward_out_cuda does not have a deterministic implementation, but you "
                           "set 'torch.use_deterministic_algorithms(True)'")

    monkeypatch.setattr(G, "measure_throughput", fails)
    assert G.main([GRID, "--no-verify", "--data-root", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "[ MISSING] a training step of diffusers-ddpm-cifar10 on cuda: RuntimeError: upsample_nearest2d" in out
    assert "train.deterministic=false" in out and "ESTIMATED" in out
