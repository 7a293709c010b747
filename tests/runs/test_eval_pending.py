"""A run whose FID weights are missing finishes training, says what to place where, and
`dfbench eval RUN_DIR` scores its saved samples later."""

from __future__ import annotations

import json

import pytest

import dfbench.benchmark.metrics.scoring as ev
from dfbench.benchmark.cli import main
from dfbench.benchmark.engine.evaluate import evaluate_dir
from dfbench.benchmark.engine.lifecycle import run
from helpers import final_params, tiny_config


@pytest.fixture()
def no_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty_torch_home"))
    monkeypatch.delenv("DFBENCH_INCEPTION_WEIGHTS", raising=False)


@pytest.mark.slow
def test_missing_inception_weights_leave_a_done_run_with_the_placement_message(tmp_path, tiny_data, no_weights, monkeypatch, capsys):
    # execute: train, then evaluation finds no weights
    d = run(tiny_config(over={"eval.metrics": "fid"}), tmp_path, data=tiny_data, progress=False)
    # assert: the run is done, the trained model and samples are kept, the message is exact
    status = json.loads((d / "status.json").read_text())
    assert status["state"] == "done"
    msg = status["evaluation_pending"]
    for needle in ("pt_inception-2015-12-05-6726825d.pth", "6726825d0af5f729cebd5821db510b11b1cfad8faad88a03f1befd49fb9129b2",
                   "95628359", "DFBENCH_INCEPTION_WEIGHTS"):
        assert needle in msg.replace(",", ""), needle
    assert (d / "samples.npz").exists() and final_params(d).numel() > 0
    # only the held-out denoising loss, which needs the model and no feature network
    assert [r["metric"] for r in json.loads((d / "metrics.json").read_text())["evaluations"]] == ["denoise_loss"]
    # still missing: `dfbench eval` says so and changes nothing
    with pytest.raises(RuntimeError, match="pt_inception"):
        evaluate_dir(d)
    # the weights are "placed": eval scores the saved samples and clears the pending note
    seen = {}

    def fake_evaluate(images, dataset, **kw):
        seen["n"] = images.shape[0]
        return [{"metric": "fid", "value": 12.5, "std_err": None, "extractor": "inception", "extractor_sha256": "x",
                 "backend": "pytorch-fid", "resize": "torch-bilinear-299", "num_samples": images.shape[0], "reference": "fmnist/train"}], []

    monkeypatch.setattr(ev, "evaluate_samples", fake_evaluate)
    assert main(["eval", str(d)]) == 0
    assert "fid: 12.5000" in capsys.readouterr().out
    metrics = json.loads((d / "metrics.json").read_text())
    assert seen["n"] == 16 and metrics["evaluations"][0]["value"] == 12.5
    assert metrics["evaluations"][0]["sampler"] == "ddim" and "evaluation_pending" not in metrics
    assert "evaluation_pending" not in json.loads((d / "status.json").read_text())


def test_eval_refuses_a_folder_that_is_not_a_finished_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a run folder"):
        evaluate_dir(tmp_path)
