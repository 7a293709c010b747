"""Out of GPU memory, on CPU: evaluation's own advice, a rerun that only evaluates, and the GPU
memory given back once the failed frames are gone.

torch.cuda.OutOfMemoryError is raised by hand (the CPU has none to run out of); where the
freeing is checked, torch.cuda is mocked to look initialized and empty_cache records whether
the failed step's tensor was already collected when it was called.
"""

from __future__ import annotations

import json
import weakref

import numpy as np
import pytest
import torch

import dfbench
from dfbench import datasets
from dfbench.benchmark.cli import main
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.engine import evaluate, lifecycle
from dfbench.benchmark.metrics import scoring
from helpers import tiny_config, write_grid

CUDA_SAID = "CUDA out of memory. Tried to allocate 2.00 GiB"
EXPERTS = ("experts", {"num_experts": 2, "objectives": "ddpm,fm", "mixing": "full", "router_steps": 20, "router_batch": 16},
           {"train.objective": "fm", "data.clients": 3})


@pytest.mark.slow
@pytest.mark.parametrize("method, params, over", [("fedavg", None, {}), EXPERTS], ids=["fedavg", "experts"])
def test_evaluation_out_of_memory_names_the_eval_batches_and_the_rerun_only_evaluates(
        tmp_path, tiny_data, monkeypatch, method, params, over):
    import dfbench.methods.experts as experts

    cfg = tiny_config(method, params, over)
    real_generate, failed = evaluate.generate_float, []  # the sampling of every evaluation

    def generate(*a, **kw):  # sampling runs out of memory, once
        if not failed:
            failed.append(True)
            raise torch.cuda.OutOfMemoryError(CUDA_SAID)
        return real_generate(*a, **kw)

    monkeypatch.setattr(evaluate, "generate_float", generate)
    # the old code gave training's advice (train.batch_size), which evaluation does not use
    with pytest.raises(lifecycle.OutOfMemory, match=r"during evaluation: lower eval\.sample_batch \(now 128") as err:
        lifecycle.run(cfg, tmp_path / "runs", data=tiny_data, progress=False)
    msg = str(err.value)
    assert "eval.feature_batch (now 256" in msg and "--set eval.sample_batch=64" in msg and CUDA_SAID in msg
    assert "without retraining" in msg and "train.batch_size" not in msg and "\n" not in msg
    d = runfolder.run_dir(tmp_path / "runs", cfg)
    status = runfolder.read_status(d)
    assert status["state"] == "failed" and status["error"] == f"OutOfMemory: {msg}"
    assert not (d / runfolder.METRICS).exists()
    # rerun with a smaller sampling batch: the same run id, resumed from the final checkpoint
    trained: list[int] = []
    real_round, real_router = lifecycle.train_round, experts.train_router
    monkeypatch.setattr(lifecycle, "train_round", lambda m, s, ctx, r: trained.append(r) or real_round(m, s, ctx, r))
    monkeypatch.setattr(experts, "train_router", lambda *a, **kw: trained.append(-1) or real_router(*a, **kw))
    smaller = tiny_config(method, params, {**over, "eval.sample_batch": 64})
    assert lifecycle.run(smaller, tmp_path / "runs", data=tiny_data, progress=False) == d
    assert trained == []  # no round, no router: only the evaluation ran
    assert runfolder.read_status(d)["state"] == "done" and (d / runfolder.METRICS).is_file()
    assert [r["round"] for r in runfolder.read_rounds(d)] == [1, 2]
    # ... and it evaluated the model an uninterrupted run evaluates (an expert mixture: its router too)
    ref = lifecycle.run(cfg, tmp_path / "ref", data=tiny_data, progress=False)
    assert trained == [1, 2] + ([-1] if method == "experts" else [])
    assert np.array_equal(np.load(d / runfolder.SAMPLES)["images"], np.load(ref / runfolder.SAMPLES)["images"])


@pytest.mark.slow
def test_dfbench_eval_out_of_memory_names_the_eval_batches_and_keeps_the_run_as_it_was(
        tmp_path, tiny_data, monkeypatch, capsys):
    monkeypatch.setattr(datasets, "load", lambda name, split="train", root=None, **kw: tiny_data)
    d = lifecycle.run(tiny_config(over={"eval.metrics": "fd_fmnist"}), tmp_path, data=tiny_data, progress=False)
    metrics, status = (d / runfolder.METRICS).read_bytes(), (d / runfolder.STATUS).read_bytes()
    real, batches = scoring.evaluate_samples, []

    def evaluate_samples(*a, **kw):  # feature extraction runs out of memory at batch 256
        batches.append(kw["options"].batch_size)
        if kw["options"].batch_size > 128:
            raise torch.cuda.OutOfMemoryError(CUDA_SAID)
        return real(*a, **kw)

    monkeypatch.setattr(scoring, "evaluate_samples", evaluate_samples)
    # the old code let torch's error out of `dfbench eval` (a traceback, no advice)
    assert main(["eval", str(d), "--replace"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("dfbench: error: out of GPU memory on cpu during evaluation") and "\n" not in err
    assert "eval.feature_batch (now 256" in err and f"dfbench eval {d} --device cpu --set eval.sample_batch=64" in err
    assert "--set eval.feature_batch=128" in err and CUDA_SAID in err and "config.json are left as they are" in err
    assert (d / runfolder.METRICS).read_bytes() == metrics and (d / runfolder.STATUS).read_bytes() == status
    # the fix it names works
    assert main(["eval", str(d), "--replace", "--set", "eval.feature_batch=128"]) == 0
    assert batches == [256, 128] and "fd_fmnist: " in capsys.readouterr().out
    assert runfolder.read_status(d)["state"] == "done"
    # other keys change the run, not its scoring: refused
    assert main(["eval", str(d), "--set", "train.lr=0.1"]) == 2
    assert "takes eval.sample_batch and eval.feature_batch only, not train.lr" in capsys.readouterr().err


@pytest.fixture()
def oom_in_training(monkeypatch):
    """A training step that makes a tensor and runs out of memory; empty_cache records whether that
    tensor was already collected when it was called (torch.cuda mocked as available and initialized)."""
    refs: list[weakref.ref] = []
    dead_at_empty_cache: list[bool] = []

    def train_round(method, state, ctx, r):
        activations = torch.empty(1 << 20)  # held by this frame, hence by the traceback
        refs.append(weakref.ref(activations))
        raise torch.cuda.OutOfMemoryError(CUDA_SAID)

    monkeypatch.setattr(lifecycle, "train_round", train_round)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: dead_at_empty_cache.append(refs[-1]() is None))
    return dead_at_empty_cache


def test_a_grid_frees_gpu_memory_after_an_out_of_memory_cell_once_its_tensors_are_gone(tmp_path, tiny_data, oom_in_training):
    from dfbench.benchmark.grid.runner import run_grid
    from dfbench.benchmark.grid.spec import load_grid
    from helpers import TINY

    grid = load_grid(write_grid(tmp_path / "one.toml", TINY, {"seed": [0]}))
    summary = run_grid(grid, tmp_path / "runs", data=tiny_data, progress=False, echo=lambda line: None)
    [o] = summary.outcomes
    assert o.after == "failed" and o.note.startswith("OutOfMemory: out of GPU memory on cpu: lower train.batch_size")
    # the old code emptied the cache inside the except block, the traceback (and the tensor) still alive
    assert oom_in_training and all(oom_in_training), oom_in_training


def test_the_notebook_api_frees_gpu_memory_though_it_raises_the_error_on(tmp_path, tiny_data, oom_in_training):
    with pytest.raises(lifecycle.OutOfMemory, match="lower train.batch_size") as err:
        dfbench.run(tiny_config(), out=tmp_path, data=tiny_data)
    assert oom_in_training == [True]  # freed while the error (kept by the caller) still exists
    assert "in train_round" in "".join(__import__("traceback").format_exception(err.value))  # the traceback still prints
    assert json.loads((runfolder.run_dir(tmp_path, tiny_config()) / runfolder.STATUS).read_text())["state"] == "failed"
