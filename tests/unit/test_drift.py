"""Same-noise drift (benchmark/metrics/drift.py): distances on hand-built arrays, reference lookup, the
evaluation hook, the later record for runs evaluated before their reference, and a reporter that only
reads it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dfbench.benchmark.metrics import drift
from dfbench.benchmark.engine import lifecycle
from dfbench.benchmark.metrics.drift import compute_drift, feature_drift, find_reference, pixel_drift
from helpers import tiny_config


def test_pixel_drift_equals_hand_computation():
    # prepare: 2 images of 1x2x2; sample 0 differs everywhere by 255, sample 1 in one pixel of 4
    a = np.zeros((2, 1, 2, 2), dtype=np.uint8)
    b = np.zeros((2, 1, 2, 2), dtype=np.uint8)
    b[0] = 255
    b[1, 0, 0, 0] = 255
    # execute / assert: per-image RMS in [0, 1] units: 1 and sqrt(1/4) = 0.5, mean 0.75
    assert pixel_drift(a, b) == pytest.approx(0.75, abs=1e-15)
    assert pixel_drift(b, a) == pytest.approx(0.75, abs=1e-15)
    assert pixel_drift(a, a) == 0.0


def test_feature_drift_pairs_sample_i_with_sample_i_over_the_common_count():
    fa = np.array([[0.0, 0.0], [3.0, 4.0], [1.0, 1.0]])
    fb = np.array([[0.0, 0.0], [0.0, 0.0]])  # the reference has 2 samples: the third is ignored
    assert feature_drift(fa, fb) == pytest.approx((0.0 + 5.0) / 2, abs=1e-15)
    # a permutation is not a drift of zero: pairs are by index, not by nearest neighbour
    assert feature_drift(fa[[1, 0]], fa[[0, 1]]) == pytest.approx(5.0)


def test_shape_mismatch_and_empty_are_clear_errors():
    with pytest.raises(ValueError, match="one shape"):
        pixel_drift(np.zeros((2, 1, 2, 2), np.uint8), np.zeros((2, 1, 3, 3), np.uint8))
    with pytest.raises(ValueError, match="at least one sample"):
        feature_drift(np.zeros((0, 3)), np.zeros((4, 3)))


def _fake_run(root: Path, method: str, params: dict, seed: int = 0, over: dict | None = None, images: np.ndarray | None = None,
              state: str = "done", metrics: dict | None = None) -> Path:
    cfg = tiny_config(method, params, {"seed": seed, **(over or {})})
    d = root / "fmnist" / "iid" / method / cfg.run_id()
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"run_id": cfg.run_id(), **cfg.to_dict()}))
    (d / "status.json").write_text(json.dumps({"state": state}))
    if images is not None:
        np.savez_compressed(d / "samples.npz", images=images)
    if metrics is not None:
        (d / "metrics.json").write_text(json.dumps(metrics))
    return d


_SCORED = {"evaluations": [{"metric": "fd_fmnist", "value": 1.0, "extractor": "fmnist"}]}


def _images(value: int, n: int = 4) -> np.ndarray:
    return np.full((n, 1, 28, 28), value, dtype=np.uint8)


def test_reference_is_the_same_family_keep_one_run_else_fedavg_same_seed_and_budget(tmp_path):
    # prepare
    fed0 = _fake_run(tmp_path, "fedavg", {}, 0, images=_images(0))
    _fake_run(tmp_path, "fedavg", {}, 1, images=_images(0))
    _fake_run(tmp_path, "fedavg", {}, 0, {"train.rounds": 5}, images=_images(0))  # other budget
    dense0 = _fake_run(tmp_path, "random_prune", {"keep_ratio": 1.0}, 0, images=_images(0))
    rnd0 = _fake_run(tmp_path, "random_prune", {"keep_ratio": 0.5}, 0, images=_images(51))
    top0 = _fake_run(tmp_path, "topk_prune", {"keep_ratio": 0.5}, 0, images=_images(51))
    other_noise = _fake_run(tmp_path, "topk_prune", {"keep_ratio": 0.25}, 0, {"eval.noise_seed": 9}, images=_images(51))
    more_samples = _fake_run(tmp_path, "topk_prune", {"keep_ratio": 0.25}, 0, {"eval.samples": 32}, images=_images(51, 8))
    # execute / assert
    assert find_reference(rnd0) == dense0  # same family at keep 1.0 wins
    assert find_reference(top0) == fed0  # no topk keep 1.0: FedAvg of the same seed and budget
    assert find_reference(fed0) == fed0  # FedAvg is its own reference
    assert find_reference(other_noise) is None  # other noises: no sample-by-sample reference
    assert find_reference(more_samples) == fed0  # the sample count may differ: the first min(N) pair up
    rec = compute_drift(more_samples, fed0)
    assert rec["num_samples"] == 4 and rec["pixel"] == pytest.approx(51 / 255)
    assert rec["reference"] == str(fed0.relative_to(tmp_path))


def test_unfinished_reference_is_not_used(tmp_path):
    _fake_run(tmp_path, "fedavg", {}, 0, images=_images(0), state="running")
    rnd = _fake_run(tmp_path, "random_prune", {"keep_ratio": 0.5}, 0, images=_images(1), metrics={"evaluations": []})
    assert find_reference(rnd) is None
    assert drift.record_missing_drift([rnd]) == []  # nothing to compare with yet: nothing written
    assert json.loads((rnd / "metrics.json").read_text()) == {"evaluations": []} and not (rnd / "drift.json").exists()


def test_budget_ignores_exactly_what_is_compared_and_the_result_neutral_keys(tmp_path):
    from dfbench.benchmark.core.config import execution_keys

    cfg = {"run_id": "s0-x", "version": 1, **tiny_config("random_prune", {"keep_ratio": 0.5}).to_dict()}
    base = drift._budget(cfg)
    # every result-neutral key of core.config, and what is compared, may differ from the reference's
    free = [*execution_keys(), "method", "method_params", "system.capacity", "eval.samples", "eval.grid", "eval.metrics",
            "run_id", "version"]
    for key in free:
        section, _, leaf = key.rpartition(".")
        other = json.loads(json.dumps(cfg))
        (other[section] if section else other)[leaf] = "changed"
        assert drift._budget(other) == base, key
    # anything else is part of the budget: the seed, a training or evaluation-noise setting
    for section, leaf in ((None, "seed"), ("train", "lr"), ("eval", "noise_seed"), ("system", "participation")):
        other = json.loads(json.dumps(cfg))
        (other[section] if section else other)[leaf] = 12345
        assert drift._budget(other) != base, (section, leaf)


def test_feature_drift_in_the_classifier_space_matches_a_direct_computation(tmp_path):
    from dfbench.benchmark.metrics.features import get_extractor

    gen = np.random.default_rng(0)
    a, b = gen.integers(0, 256, (6, 1, 28, 28), dtype=np.uint8), gen.integers(0, 256, (6, 1, 28, 28), dtype=np.uint8)
    fed = _fake_run(tmp_path, "fedavg", {}, 0, images=b)
    rnd = _fake_run(tmp_path, "random_prune", {"keep_ratio": 0.5}, 0, images=a)
    rec = compute_drift(rnd, fed, ["fmnist"])
    ext = get_extractor("fmnist")
    fa, fb = ext.features(torch.from_numpy(a)), ext.features(torch.from_numpy(b))
    expected = float(np.mean([np.sqrt(((fa[i] - fb[i]) ** 2).sum()) for i in range(6)]))
    assert rec["features"]["fmnist"] == pytest.approx(expected, rel=1e-12)
    assert rec["features"]["fmnist"] > 0
    # a run evaluated before its reference was done gets the same record written later, once, in drift.json
    for d in (fed, rnd):
        (d / "metrics.json").write_text(json.dumps(_SCORED))
    before = {d: (d / "metrics.json").read_bytes() for d in (fed, rnd)}
    assert drift.missing_drift([fed, rnd]) == [fed, rnd]
    assert drift.record_missing_drift([fed, rnd]) == [fed, rnd]  # FedAvg is its own reference (drift 0)
    written = json.loads((rnd / "drift.json").read_text())
    assert written["features"]["fmnist"] == pytest.approx(expected, rel=1e-12)
    assert written == json.loads(json.dumps(rec)) and drift.run_drift(rnd) == written
    assert {d: (d / "metrics.json").read_bytes() for d in (fed, rnd)} == before  # metrics.json stays the evaluation's
    assert json.loads((fed / "drift.json").read_text())["pixel"] == 0.0
    assert drift.missing_drift([fed, rnd]) == [] and drift.record_missing_drift([fed, rnd]) == []  # a record is left as it is


def test_missing_drift_is_not_written_while_another_process_holds_the_run(tmp_path):
    from dfbench.benchmark.core.lock import RunLock

    fed = _fake_run(tmp_path, "fedavg", {}, 0, images=_images(0), metrics=_SCORED)
    rnd = _fake_run(tmp_path, "random_prune", {"keep_ratio": 0.5}, 0, images=_images(51), metrics=_SCORED)
    with RunLock(rnd):  # e.g. `dfbench eval` rewriting it right now
        assert drift.record_missing_drift([rnd]) == []
    assert not (rnd / "drift.json").exists() and not (rnd / ".lock").exists()
    assert drift.record_missing_drift([rnd]) == [rnd]  # a later call catches it
    assert json.loads((rnd / "drift.json").read_text())["reference"] == str(fed.relative_to(tmp_path))
    assert json.loads((rnd / "metrics.json").read_text()) == _SCORED


@pytest.mark.slow
def test_evaluation_writes_drift_into_metrics_json(tmp_path, tiny_data):
    # prepare / execute: the reference first (as a grid orders FedAvg first), then a pruned run
    fed = lifecycle.run(tiny_config("fedavg"), tmp_path, data=tiny_data, progress=False)
    rnd = lifecycle.run(tiny_config("random_prune", {"keep_ratio": 0.5}), tmp_path, data=tiny_data, progress=False)
    # assert
    m_fed = json.loads((fed / "metrics.json").read_text())
    m_rnd = json.loads((rnd / "metrics.json").read_text())
    assert m_fed["drift"]["pixel"] == 0.0 and m_fed["drift"]["reference"] == str(fed.relative_to(tmp_path))
    a, b = drift.load_samples(rnd), drift.load_samples(fed)
    assert m_rnd["drift"]["reference"] == str(fed.relative_to(tmp_path))
    assert m_rnd["drift"]["pixel"] == pytest.approx(pixel_drift(a, b), rel=1e-12) and m_rnd["drift"]["pixel"] > 0
    assert m_rnd["drift"]["features"] == {}  # eval.metrics = none in tests: no extractor was used


def test_the_reporter_only_reads_drift_and_the_later_record_fills_the_column(tmp_path, monkeypatch):
    from dfbench.benchmark.metrics import features
    from dfbench.benchmark.report.build import build_report
    from dfbench.benchmark.report.frames import collect

    # prepare: two scored runs without a drift record in metrics.json (e.g. the reference finished later)
    runs = []
    for method, params, value in (("fedavg", {}, 0), ("random_prune", {"keep_ratio": 0.5}, 51)):
        d = _fake_run(tmp_path, method, params, 0, images=_images(value))
        (d / "rounds.jsonl").write_text(json.dumps({"round": 1, "clients": [0], "loss": 0.1, "w2": 0.0, "gamma": 1}) + "\n")
        (d / "metrics.json").write_text(json.dumps({"evaluations": [{"metric": "fd_fmnist", "value": 100.0 + value, "extractor": "fmnist"}], "rounds": 2}))
        runs.append(d)
    before = {d: (d / "metrics.json").read_bytes() for d in runs}

    def no_network(*args, **kwargs):
        raise AssertionError("the reporter built a feature extractor")

    # execute / assert: the reporter computes nothing (no classifier is loaded), writes nothing, shows no drift
    with monkeypatch.context() as m:
        m.setattr(features, "get_extractor", no_network)
        table = collect(tmp_path).table.set_index("method")
        build_report(tmp_path, tmp_path / "report0")
    assert table["drift_mean"].isna().all() and table["drift_pixel_mean"].isna().all()
    assert "drift (features)" not in (tmp_path / "report0" / "leaderboard.md").read_text()
    assert {d: (d / "metrics.json").read_bytes() for d in runs} == before
    # execute: the later record (what the grid runner calls once its cells are done: drift.json), then the report
    assert drift.record_missing_drift(runs) == runs
    assert {d: (d / "metrics.json").read_bytes() for d in runs} == before
    table = collect(tmp_path).table.set_index("method")
    build_report(tmp_path, tmp_path / "report")
    # assert: pixel drift 51/255 for the pruned run, 0 for FedAvg itself; drift columns in the markdown's diagnostics table
    assert table.loc["random_prune", "drift_pixel_mean"] == pytest.approx(51 / 255)
    assert table.loc["fedavg", "drift_pixel_mean"] == 0.0
    assert table.loc["random_prune", "drift_mean"] > 0 and table.loc["fedavg", "drift_mean"] == 0.0  # classifier features
    diagnostics = (tmp_path / "report" / "leaderboard.md").read_text().split("### Drift and diagnostics", 1)[1]
    assert "| rank | setting | drift (features) | drift (pixels) |" in diagnostics
    assert "drift_pixel_mean" in (tmp_path / "report" / "leaderboard.csv").read_text().splitlines()[0]


def _file_hashes(root: Path) -> dict[str, str]:
    import hashlib

    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def test_dfbench_report_leaves_every_byte_of_every_run_folder_as_it_was(tmp_path, capsys):
    from dfbench.benchmark.cli import main

    # prepare: FedAvg with its drift from evaluation; a pruned run evaluated before its reference was done (no
    # drift anywhere); one whose drift was recorded later (drift.json); a failed run
    runs_root = tmp_path / "runs"
    row = json.dumps({"round": 1, "clients": [0], "loss": 0.1, "w2": 0.0, "gamma": 1}) + "\n"
    fed = _fake_run(runs_root, "fedavg", {}, 0, images=_images(0),
                    metrics={**_SCORED, "drift": {"reference": "x", "num_samples": 4, "pixel": 0.0, "features": {}}})
    late = _fake_run(runs_root, "random_prune", {"keep_ratio": 0.5}, 0, images=_images(51), metrics=_SCORED)
    recorded = _fake_run(runs_root, "topk_prune", {"keep_ratio": 0.5}, 0, images=_images(102), metrics=_SCORED)
    (recorded / "drift.json").write_text(json.dumps({"reference": "x", "num_samples": 4, "pixel": 0.4, "features": {}}))
    failed = _fake_run(runs_root, "fedprox", {}, 0, state="failed")
    for d in (fed, late, recorded, failed):
        (d / "rounds.jsonl").write_text(row)
    before = _file_hashes(runs_root)
    # execute
    code = main(["report", "--runs", str(runs_root), "--out", str(tmp_path / "report")])
    # assert: every file of every run folder byte for byte as it was, and no file added or removed
    assert code == 0
    assert _file_hashes(runs_root) == before
    err = capsys.readouterr().err
    assert "1 run(s) show no drift" in err and f"dfbench eval {runs_root}" in err  # the late run, and how to record it
    csv = (tmp_path / "report" / "leaderboard.csv").read_text()
    assert "drift_pixel_mean" in csv.splitlines()[0]
    # the record of drift.json is read beside metrics.json, as rescored.json is
    from dfbench.benchmark.report.run_records import read_run

    assert read_run(recorded).metrics["drift"]["pixel"] == 0.4 and "drift" not in read_run(late).metrics
