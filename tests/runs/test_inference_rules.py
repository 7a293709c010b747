"""Every pruning run is scored under each of its inference rules, on the same trained model.

The configured rule is the result (the leaderboard's); the other rules (full / scaled /
submodel, `Method.sample_variants`) are sampled from the same fixed noises with the same
sampler, saved as samples-<rule>.npz, scored alike and kept as metric rows tagged
`inference` / `configured: false` in metrics.json, which the reporter never ranks and lists
in inference_rules.csv. Runs here: tiny configs scored with fd_fmnist (the committed
classifier) against the synthetic `tiny_data` set.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from dfbench import datasets, methods
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.core.config import ConfigError, config_hash
from dfbench.benchmark.engine import evaluate, lifecycle
from dfbench.benchmark.engine.resolve import config_from_dict
from dfbench.methods.pruning import INFERENCE_MODES
from helpers import load_script, tiny_config

pytestmark = pytest.mark.slow  # whole pruning runs scored under every rule

ROOT = Path(__file__).resolve().parents[2]
PRUNERS = {"random_prune": "scaled", "topk_prune": "submodel"}  # method -> its default (configured) rule
SCORED = {"eval.metrics": "fd_fmnist"}
TAGS = ("inference", "configured")


def _rows(d: Path) -> list[dict[str, Any]]:
    return json.loads((d / runfolder.METRICS).read_text())["evaluations"]


def _untagged(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in TAGS} for r in rows]


def _by_rule(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["inference"], []).append(r)
    return out


def _images(path: Path) -> np.ndarray:
    with np.load(path) as z:
        return z["images"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tiny_data) -> dict[str, Path]:
    """Finished scored runs: both pruners at keep 0.5 (rules on), random_prune with the switch off,
    random_prune at keep 1.0, fedavg. Every dataset load is the synthetic set."""
    root = tmp_path_factory.mktemp("inference_runs")
    with pytest.MonkeyPatch.context() as mp:  # module scope: the function-scoped autouse fixtures are not set up yet
        mp.setenv("DFBENCH_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        mp.setattr(datasets, "load", lambda name, split="train", root=None, **kw: tiny_data)
        torch.set_num_threads(1)

        def run(key: str, method: str, params: dict[str, Any], over: dict[str, Any] | None = None) -> Path:
            return lifecycle.run(tiny_config(method, params, {**SCORED, **(over or {})}), root / key, data=tiny_data, progress=False)

        out = {"fedavg": run("on", "fedavg", {})}  # first: the dense reference of the others' drift
        shutil.copytree(out["fedavg"], root / "off" / out["fedavg"].relative_to(root / "on"))
        out.update({name: run("on", name, {"keep_ratio": 0.5}) for name in PRUNERS})
        # the same run id as the rules-on run (a speed switch), so in another root
        out["random_prune-off"] = run("off", "random_prune", {"keep_ratio": 0.5}, {"eval.inference_variants": False})
        out["keep1"] = run("on", "random_prune", {"keep_ratio": 1.0})
    return out


@pytest.fixture
def synthetic_loads(monkeypatch, tiny_data) -> None:
    monkeypatch.setattr(datasets, "load", lambda name, split="train", root=None, **kw: tiny_data)


# -- the hook ---------------------------------------------------------------------------------

@pytest.mark.parametrize("method,params,capacity,configured,others", [
    ("random_prune", {"keep_ratio": 0.5}, "", "scaled", ["full", "submodel"]),
    ("topk_prune", {"keep_ratio": 0.5}, "", "submodel", ["full", "scaled"]),
    ("random_prune", {"keep_ratio": 0.5, "inference": "submodel"}, "", "submodel", ["full", "scaled"]),
    # nobody trains a sub-model: every rule samples the model unchanged (keep 1.0 is FedAvg)
    ("random_prune", {"keep_ratio": 1.0}, "", "scaled", []),
    ("topk_prune", {"keep_ratio": 1.0, "inference": "submodel"}, "", "submodel", []),
    # ... except a sub-model of an explicit inference_keep, which differs from the unchanged model once
    ("random_prune", {"keep_ratio": 1.0, "inference": "submodel", "inference_keep": 0.25}, "", "submodel", ["full"]),
    # capacity tiers are the keep ratios: one tier at 0.5 makes every rule a model of its own
    ("random_prune", {"keep_ratio": 1.0}, "1.0:0.5,0.5:0.5", "scaled", ["full", "submodel"]),
    # a submodel at keep 1.0 is the full model
    ("random_prune", {"keep_ratio": 0.5, "inference_keep": 1.0}, "", "scaled", ["full"]),
])
def test_pruning_offers_each_rule_that_samples_another_model(method, params, capacity, configured, others):
    cfg = tiny_config(method, params, {"system.capacity": capacity})
    variants = methods.create_method(method, **dict(cfg.method_params)).sample_variants(cfg)
    assert variants.label == configured
    assert list(variants.others) == others


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "quantized", "scaffold", "fedadam", "heterofl", "experts"])
def test_other_methods_sample_one_way(name):
    assert methods.create_method(name).sample_variants(tiny_config()) is None


def test_the_switch_and_unscored_runs_sample_the_result_only():
    method = methods.create_method("random_prune", keep_ratio=0.5)
    on = tiny_config("random_prune", {"keep_ratio": 0.5}, SCORED)
    assert list(evaluate.sample_variants(on, method)[1]) == ["full", "submodel"]
    for over in ({**SCORED, "eval.inference_variants": False}, {"eval.metrics": "none"}):
        assert evaluate.sample_variants(tiny_config("random_prune", {"keep_ratio": 0.5}, over), method) == ("scaled", {})
    # a speed switch: not part of the run id, refused when it is not a boolean
    assert config_hash(on) == config_hash(tiny_config("random_prune", {"keep_ratio": 0.5}, {**SCORED, "eval.inference_variants": False}))
    with pytest.raises(ConfigError, match="eval.inference_variants"):
        tiny_config(over={"eval.inference_variants": "sometimes"})


# -- the evaluation ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(PRUNERS))
def test_a_pruning_run_has_rows_for_every_rule_the_configured_first(runs, name):
    d, configured = runs[name], PRUNERS[name]
    rows = _rows(d)
    rules = _by_rule(rows)
    assert list(rules) == [configured] + [r for r in INFERENCE_MODES if r != configured]
    assert all(r["configured"] is (r["inference"] == configured) for r in rows)
    # the held-out denoising loss scores the model the run samples (the configured rule), not its samples
    assert [rule for rule, these in rules.items() if any(r["metric"] == "denoise_loss" for r in these)] == [configured]
    rules = {rule: [r for r in these if r["metric"] != "denoise_loss"] for rule, these in rules.items()}
    metrics = [r["metric"] for r in rules[configured]]
    assert metrics[0] == "fd_fmnist"
    for rule, these in rules.items():  # each rule scored alike: the same metrics, samples, sampler
        assert [r["metric"] for r in these] == metrics
        assert {(r["num_samples"], r["sampler"], r["sampler_steps"]) for r in these} == {(16, "ddim", 3)}
    fds = {rule: these[0]["value"] for rule, these in rules.items()}
    assert len(set(fds.values())) == 3, fds  # three different models
    # each other rule's samples are saved; samples.npz and grid.png are the result's
    files = sorted(p.name for p in d.glob("samples*.npz"))
    assert files == sorted(["samples.npz"] + [f"samples-{r}.npz" for r in INFERENCE_MODES if r != configured])
    for rule in INFERENCE_MODES:
        if rule != configured:
            assert not np.array_equal(_images(d / f"samples-{rule}.npz"), _images(d / "samples.npz"))
    m = json.loads((d / runfolder.METRICS).read_text())
    assert m["inference_variants_wall_seconds"] > 0
    assert m["wall_seconds"] == pytest.approx(m["train_wall_seconds"] + m["eval_wall_seconds"], abs=2e-3)


def test_the_result_is_bitwise_the_single_rule_evaluation_and_the_switch_turns_the_rest_off(runs):
    on, off = runs["random_prune"], runs["random_prune-off"]
    assert on.name == off.name  # the same run id: the switch changes no result
    on_rows, off_rows = _rows(on), _rows(off)
    assert {r["inference"] for r in off_rows} == {"scaled"} and all(r["configured"] is True for r in off_rows)
    assert on_rows[:len(off_rows)] == off_rows  # every key, every float
    assert len(on_rows) == 3 * (len(off_rows) - 1) + 1  # the denoising loss once: the configured rule's model
    for name in (runfolder.SAMPLES, runfolder.GRID):
        assert (on / name).read_bytes() == (off / name).read_bytes()
    assert sorted(p.name for p in off.glob("samples*.npz")) == ["samples.npz"]
    m_on, m_off = (json.loads((d / runfolder.METRICS).read_text()) for d in (on, off))
    assert "inference_variants_wall_seconds" not in m_off
    assert m_on["drift"] == m_off["drift"] and m_on["drift"]["features"]["fmnist"] > 0  # the result's samples only


def test_runs_that_sample_one_way_have_no_rule_rows(runs):
    fed, keep1 = runs["fedavg"], runs["keep1"]
    assert all(not set(TAGS) & set(r) for r in _rows(fed))
    # keep 1.0: the rows name the configured rule, and no other rule is sampled (they all are FedAvg's model)
    assert {(r["inference"], r["configured"]) for r in _rows(keep1)} == {("scaled", True)}
    assert _untagged(_rows(keep1)) == _rows(fed)
    for d in (fed, keep1):
        assert sorted(p.name for p in d.glob("samples*.npz")) == ["samples.npz"]
        assert "inference_variants_wall_seconds" not in json.loads((d / runfolder.METRICS).read_text())


def _rescore(run: Path, out: Path, rules: list[str], monkeypatch, *more: str) -> dict[str, dict[str, float]]:
    script = load_script("results/paper-fmnist/rescore_inference.py")
    monkeypatch.setattr(sys, "argv", ["rescore_inference.py", str(run), *[a for r in rules for a in ("--rule", r)], "--out", str(out), *more])
    script.main()
    return json.loads((out / "rescore.json").read_text())["rules"]


@pytest.mark.parametrize("name", list(PRUNERS))
def test_every_rule_equals_what_rescore_inference_computes_after_the_fact(runs, name, tmp_path, synthetic_loads,
                                                                          monkeypatch, capsys):
    d = runs[name]
    table = _rescore(d, tmp_path / "rescore", list(INFERENCE_MODES), monkeypatch)
    rules = _by_rule(_rows(d))
    for rule in INFERENCE_MODES:
        mine = {r["metric"]: r["value"] for r in rules[rule]}
        assert table[rule] == {k: mine[k] for k in table[rule]}, rule  # bitwise (the script scores no per-client rows)
        saved = d / (runfolder.SAMPLES if rule == PRUNERS[name] else f"samples-{rule}.npz")
        assert np.array_equal(_images(tmp_path / "rescore" / rule / "samples.npz"), _images(saved))


def test_ensemble_diagnostic_averages_fresh_training_masks_and_is_the_full_model_at_keep_1(runs, tmp_path, synthetic_loads,
                                                                                          monkeypatch, capsys):
    from dfbench.benchmark.engine.context import build_context
    from dfbench.methods.pruning import random_mask

    script = load_script("results/paper-fmnist/rescore_inference.py")
    d = runs["random_prune"]
    cfg = config_from_dict(runfolder.read_json(d / "config.json"))
    ctx = build_context(cfg)
    params = runfolder.load_checkpoint(d)["params"]
    method = methods.create_method("random_prune", **dict(cfg.method_params))
    net = script.MaskEnsemble(ctx, params, 0.5, method.prunable(ctx.layout), draws=2)
    x, t = torch.randn(3, *ctx.image_shape), torch.full((3,), 0.4)
    ctx.model.eval()
    with torch.no_grad():
        got = net(x, t)
        gen = ctx.gen("ensemble_mask")  # the documented stream, drawn by hand
        ys = []
        for _ in range(2):
            ctx.flat.copy_(params * random_mask(ctx.layout, 0.5, method.prunable(ctx.layout), gen))
            ys.append(ctx.model(x, t))
    assert torch.equal(got, (ys[0] + ys[1]) / 2)
    assert not torch.allclose(ys[0], ys[1])  # two different sub-models
    # the whole diagnostic: deterministic, and at keep 1.0 (every mask all ones) exactly the full model
    a = _rescore(d, tmp_path / "a", ["ensemble:draws=2"], monkeypatch)
    b = _rescore(d, tmp_path / "b", ["ensemble:draws=2", "full"], monkeypatch)
    assert a["ensemble:draws=2"] == b["ensemble:draws=2"] and b["ensemble:draws=2"] != b["full"]
    k1 = _rescore(runs["keep1"], tmp_path / "k1", ["ensemble:draws=2", "full"], monkeypatch, "--loss", "16")
    assert np.array_equal(_images(tmp_path / "k1" / "ensemble_draws-2" / "samples.npz"), _images(tmp_path / "k1" / "full" / "samples.npz"))
    assert k1["ensemble:draws=2"] == k1["full"] and k1["full"]["loss"] > 0  # the loss too: same images, times, noises
    # --loss against the objective's own loss on the documented draws, by hand
    ctx1 = build_context(config_from_dict(runfolder.read_json(runs["keep1"] / "config.json")))
    gen = ctx1.gen("rescore_loss")
    pick = torch.randperm(ctx1.images.shape[0], generator=gen)[:16]
    ctx1.flat.copy_(runfolder.load_checkpoint(runs["keep1"])["params"])
    ctx1.model.eval()
    with torch.no_grad():
        want = float(ctx1.get_objective(None).loss(ctx1.model, ctx1.images[pick].float() / 127.5 - 1.0, gen))
    assert k1["full"]["loss"] == pytest.approx(want, rel=1e-6)
    # a run of another method takes `full` alone (a reference model for --loss)
    fed = _rescore(runs["fedavg"], tmp_path / "fed", ["full"], monkeypatch, "--loss", "16")
    assert fed["full"]["loss"] > 0
    with pytest.raises(SystemExit, match="inference rules belong to"):
        _rescore(runs["fedavg"], tmp_path / "fed2", ["scaled"], monkeypatch)
    with pytest.raises(SystemExit, match="belongs to random_prune"):
        _rescore(runs["topk_prune"], tmp_path / "t", ["ensemble:draws=2"], monkeypatch)


def test_rule_losses_scores_every_rule_of_the_keep_ratio_and_fedavg(runs, tmp_path, synthetic_loads, monkeypatch):
    script = load_script("results/paper-fmnist/rule_losses.py")
    root = runs["fedavg"].parents[3]  # the "on" root: fedavg, both pruners at 0.5, random_prune at keep 1.0
    monkeypatch.setattr(sys, "argv", ["rule_losses.py", "--runs", str(root), "--out", str(tmp_path / "o"), "--keep", "0.5",
                                      "--loss", "16"])
    script.main()
    frame = pd.read_csv(tmp_path / "o" / "rule_losses.csv")
    got = {(f, r) for f, r in zip(frame["family"], frame["rule"])}
    assert got == {("fedavg", "full"), *(("random", r) for r in ("full", "scaled", "submodel", "ensemble:draws=4")),
                   *(("top-k", r) for r in ("submodel", "full", "scaled"))}  # keep 1.0 is left out
    # each row is what the rescore of that run computes on its own
    table = _rescore(runs["random_prune"], tmp_path / "again", ["scaled"], monkeypatch, "--loss", "16")
    row = frame[(frame["family"] == "random") & (frame["rule"] == "scaled")].iloc[0]
    assert row["loss"] == pytest.approx(table["scaled"]["loss"]) and row["fd_fmnist"] == pytest.approx(table["scaled"]["fd_fmnist"])
    assert (tmp_path / "o" / "random_rules.png").is_file() and "| random | 0.5 | `scaled` |" in (tmp_path / "o" / "rule_losses.md").read_text()


def test_dfbench_eval_rescores_every_saved_rule_and_leaves_out_a_missing_one(runs, tmp_path, synthetic_loads):
    d = tmp_path / "run"
    shutil.copytree(runs["random_prune"], d)
    before = _rows(d)
    assert evaluate.evaluate_dir(d, device="cpu") == before
    assert _rows(d) == before
    (d / "samples-full.npz").unlink()
    rows = evaluate.evaluate_dir(d, device="cpu")
    assert [r for r in before if r["inference"] != "full"] == rows == _rows(d)
    (d / "samples-submodel.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="samples-submodel.npz is corrupt.*other sampling rules"):
        evaluate.evaluate_dir(d, device="cpu")


# -- the report ------------------------------------------------------------------------------

BUDGET = {"clients": 4, "rounds": 3, "local_steps": 2, "batch_size": 8, "lr": 1e-3, "participation": 1.0}


def _fd(value: float, **extra: Any) -> dict[str, Any]:
    return {"metric": "fd_fmnist", "value": value, "std_err": None, "extractor": "fmnist", "extractor_sha256": "ab" * 32,
            "backend": "dfbench", "num_samples": 1000, "sampler": "heun", "sampler_steps": 8,
            "reference": "fmnist/train", "resize": "none-28", "ci_low": value - 1.0, "ci_high": value + 1.0,
            "ci_method": "95% basic bootstrap", **extra}


def _kid(value: float, **extra: Any) -> dict[str, Any]:
    return {"metric": "kid", "value": value, "std_err": 0.001, **extra}


def _make_runs(root: Path, tagged: bool) -> None:
    """fedavg x2 seeds, random_prune (scaled) x2 seeds, topk_prune (full) x1: as old runs wrote them
    (`tagged` False: the result's rows only), or as runs write them now, the result's rows tagged
    and followed by the other rules' rows, whose scores are far better than any result."""
    def write(method: str, seed: int, params: dict[str, Any], result: list[dict[str, Any]],
              others: dict[str, list[dict[str, Any]]] | None = None) -> None:
        d = root / "fmnist" / "iid" / method / f"s{seed}-{method[:2]}"
        d.mkdir(parents=True)
        config = {"run_id": d.name, "dataset": "fmnist", "partition": "iid", "method": method, "method_params": params,
                  "seed": seed, **BUDGET}
        evaluations = result
        if tagged and others is not None:
            evaluations = [{**r, "inference": params["inference"], "configured": True} for r in result]
            evaluations += [{**r, "inference": rule, "configured": False} for rule, rows in others.items() for r in rows]
            config["inference_variants"] = bool(seed)  # new configs say it (one seed each way): it never splits a setting
        (d / "config.json").write_text(json.dumps(config))
        (d / "status.json").write_text(json.dumps({"state": "done"}))
        (d / "metrics.json").write_text(json.dumps({"evaluations": evaluations, "uplink_bits": 8_000_000, "downlink_bits": 8_000_000,
                                                    "wall_seconds": 60.0, "rounds": 3, "gamma_star": None, "w2_mean": None,
                                                    "dropped_updates": 0}))
        (d / "rounds.jsonl").write_text("".join(json.dumps({"round": r, "clients": [0, 1, 2, 3], "loss": 1.0 / r,
                                                            "uplink_bits": 8_000_000 // 3, "w2": 0.1}) + "\n" for r in (1, 2, 3)))

    for seed in (0, 1):
        write("fedavg", seed, {}, [_fd(100.0 + seed), _kid(0.02)])
        write("random_prune", seed, {"keep_ratio": 0.5, "inference": "scaled"}, [_fd(120.0 + 2 * seed), _kid(0.03)],
              {"full": [_fd(10.0 + seed), _kid(0.001)], "submodel": [_fd(50.0 + 4 * seed)]})
    write("topk_prune", 0, {"keep_ratio": 0.5, "inference": "full"}, [_fd(130.0)], {"scaled": [_fd(5.0)], "submodel": [_fd(6.0)]})


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, Path]]]:
    import matplotlib

    matplotlib.use("Agg")
    from dfbench.benchmark.report.build import build_report

    out = {}
    for kind in ("old", "tagged"):
        root = tmp_path_factory.mktemp(f"runs_{kind}")
        _make_runs(root, tagged=kind == "tagged")
        out[kind] = (root, build_report(root, tmp_path_factory.mktemp(f"report_{kind}")))
    return out


def test_the_leaderboard_is_the_configured_rules_byte_for_byte(reports):
    old, tagged = reports["old"][1], reports["tagged"][1]
    import re

    for key in ("leaderboard_md", "leaderboard_csv"):
        assert old[key].read_bytes() == tagged[key].read_bytes(), key
    # the page links each run folder: the two run roots differ, the rest is the same byte for byte
    unlinked = [re.sub(rb'href="[^"#]*"', b'href=""', r[1]["leaderboard_html"].read_bytes()) for r in (reports["old"], reports["tagged"])]
    assert unlinked[0] == unlinked[1]
    # old runs (no rule rows): no new file; the ranking is the configured rules' (120/122 > 100/101, 130)
    assert "inference_rules_csv" not in old and not (old["leaderboard_csv"].parent / "inference_rules.csv").exists()
    board = pd.read_csv(tagged["leaderboard_csv"])
    assert list(board["method"]) == ["fedavg", "random_prune", "topk_prune"]
    # the order of the configured rules' scores (the geometric means 100.5, 121.0, 130)
    assert board.set_index("method")["rank"].to_dict() == {"fedavg": 1, "random_prune": 2, "topk_prune": 3}
    assert board.set_index("method")["fd_fmnist_mean"].to_dict() == {"fedavg": 100.5, "random_prune": 121.0, "topk_prune": 130.0}
    assert board.set_index("method")["n"].to_dict() == {"fedavg": 2, "random_prune": 2, "topk_prune": 1}


def test_frames_keep_the_result_and_list_every_rule_apart(reports):
    from dfbench.benchmark.report.frames import collect

    data = collect(reports["tagged"][0])
    assert sorted(data.evaluations["value"]) == [0.02, 0.02, 0.03, 0.03, 100.0, 101.0, 120.0, 122.0, 130.0]
    assert "fd_fmnist (dfbench)" not in data.metrics and data.metrics == ["fd_fmnist", "kid"]
    assert data.inference.equals(collect(reports["tagged"][0]).inference)  # deterministic
    assert collect(reports["old"][0]).inference.empty


def test_inference_rules_csv_has_one_row_per_run_rule_and_metric_with_the_seed_mean(reports):
    written = reports["tagged"][1]
    frame = pd.read_csv(written["inference_rules_csv"])
    assert list(frame.columns) == ["dataset", "partition", "method", "params", "setting", "seed", "run_id", "inference",
                                   "configured", "metric", "value", "std_err", "ci_low", "ci_high", "seed_mean", "seed_std", "seed_n"]
    assert set(frame["method"]) == {"random_prune", "topk_prune"}  # fedavg samples one way
    rp = frame[frame["method"] == "random_prune"]
    assert list(zip(rp["seed"], rp["inference"], rp["configured"], rp["metric"])) == [
        (0, "scaled", True, "fd_fmnist"), (0, "scaled", True, "kid"), (0, "full", False, "fd_fmnist"), (0, "full", False, "kid"),
        (0, "submodel", False, "fd_fmnist"),
        (1, "scaled", True, "fd_fmnist"), (1, "scaled", True, "kid"), (1, "full", False, "fd_fmnist"), (1, "full", False, "kid"),
        (1, "submodel", False, "fd_fmnist")]
    fd = rp[rp["metric"] == "fd_fmnist"].groupby("inference").first()
    assert fd["seed_mean"].to_dict() == {"full": 10.5, "scaled": 121.0, "submodel": 52.0}
    assert fd["seed_n"].to_dict() == {"full": 2, "scaled": 2, "submodel": 2}
    assert fd.loc["submodel", "seed_std"] == pytest.approx(np.std([50.0, 54.0], ddof=1))
    tk = frame[frame["method"] == "topk_prune"]
    assert list(zip(tk["inference"], tk["configured"], tk["value"], tk["seed_n"])) == [
        ("full", True, 130.0, 1), ("scaled", False, 5.0, 1), ("submodel", False, 6.0, 1)]
    assert tk["seed_std"].isna().all()
