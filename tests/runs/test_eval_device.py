"""`dfbench eval RUN_DIR --device D`: a run is scored where the scoring runs, not where it was trained.

A GPU-trained run (config.json says "cuda") is scored on a CPU-only machine; a device this
machine lacks is refused before any work, naming the devices it has.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dfbench import datasets
from dfbench.benchmark.cli import build_parser, main
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.core.config import ConfigError
from dfbench.benchmark.engine import evaluate
from dfbench.benchmark.engine.lifecycle import run
from helpers import tiny_config


@pytest.fixture()
def gpu_trained_run(tmp_path, tiny_data, monkeypatch):
    """A finished tiny CPU run scored with the committed Fashion-MNIST classifier, whose config.json
    then says it was trained on "cuda"; every dataset load is the small synthetic set."""
    monkeypatch.setattr(datasets, "load", lambda name, split="train", root=None, **kw: tiny_data)
    d = run(tiny_config(over={"eval.metrics": "fd_fmnist"}), tmp_path, data=tiny_data, progress=False)
    assert runfolder.read_status(d)["state"] == "done"
    cfg = runfolder.read_json(d / runfolder.CONFIG)
    runfolder.write_json(d / runfolder.CONFIG, {**cfg, "device": "cuda"})
    return d


@pytest.mark.slow
@pytest.mark.parametrize("regenerate", [False, True], ids=["saved-samples", "regenerated-samples"])
def test_a_gpu_trained_run_is_scored_on_this_cpu_machine(gpu_trained_run, capsys, regenerate):
    d = gpu_trained_run
    before = json.loads((d / runfolder.METRICS).read_text())["evaluations"]
    saved = np.load(d / runfolder.SAMPLES)["images"]
    if regenerate:  # samples.npz is made again from the final checkpoint: a context on the eval device
        (d / runfolder.SAMPLES).unlink()
    assert not torch.cuda.is_available()  # the default --device is then cpu
    # the old code built the context and the extractor on config.json's "cuda": no CUDA here, it raised
    assert main(["eval", str(d), "--replace"]) == 0, capsys.readouterr().err
    assert "fd_fmnist: " in capsys.readouterr().out
    after = json.loads((d / runfolder.METRICS).read_text())["evaluations"]
    assert [r["metric"] for r in after] == [r["metric"] for r in before] and "fd_fmnist" in [r["metric"] for r in after]
    assert after[0]["value"] == pytest.approx(before[0]["value"], rel=1e-6)  # the same samples, the same score
    assert np.array_equal(np.load(d / runfolder.SAMPLES)["images"], saved)
    assert runfolder.read_json(d / runfolder.CONFIG)["device"] == "cuda"  # config.json is never rewritten
    assert runfolder.read_status(d)["state"] == "done"


@pytest.mark.parametrize("device, count, available", [
    ("cuda:3", 2, "cpu, cuda:0, cuda:1"),  # "invalid device ordinal" before
    ("cuda", 0, "cpu"),  # "Torch not compiled with CUDA" / "no NVIDIA driver" before
    ("tpu", 0, "cpu"),
])
def test_a_device_this_machine_lacks_is_refused_before_any_work_naming_the_ones_it_has(
        tmp_path, monkeypatch, capsys, device, count, available):
    cfg = tiny_config(over={"device": "cuda"})
    d = tmp_path / "run"
    d.mkdir()
    runfolder.write_json(d / runfolder.CONFIG, {"run_id": cfg.run_id(), **cfg.to_dict()})
    runfolder.write_json(d / runfolder.METRICS, {"evaluations": []})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)

    def no_work(*a, **kw):
        raise AssertionError("work started on an unavailable device")

    monkeypatch.setattr(evaluate, "score", no_work)
    monkeypatch.setattr(evaluate, "regenerate_samples", no_work)
    metrics = (d / runfolder.METRICS).read_bytes()
    with pytest.raises(ConfigError, match=f"device {device!r} is not available on this machine") as err:
        evaluate.evaluate_dir(d, device=device)
    assert f"available: {available}" in str(err.value) and "\n" not in str(err.value)
    assert main(["eval", str(d), "--device", device]) == 2
    assert f"available: {available}" in capsys.readouterr().err
    assert (d / runfolder.METRICS).read_bytes() == metrics


def test_eval_help_says_the_default_device():
    sub = build_parser()._subparsers._group_actions[0].choices["eval"]
    text = " ".join(sub.format_help().split())
    assert "--device" in text and '"cuda" when a GPU is visible, else "cpu"' in text
    assert sub.parse_args(["x"]).device is None  # resolved when run: cuda if torch.cuda.is_available() else cpu


def test_the_default_eval_device_is_cuda_when_a_gpu_is_visible(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert evaluate.eval_device(None) == "cuda" and evaluate.eval_device("cuda:1") == "cuda:1"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert evaluate.eval_device(None) == "cpu"
