"""train.amp=auto: bf16 where the device computes it natively, float32 elsewhere; the choice is what
the config, the run id and the run folder record (a score is traceable to its numerics)."""

from __future__ import annotations

import json

import pytest
import torch

from dfbench.benchmark.core import numerics, runfolder
from dfbench.benchmark.core.config import ConfigError
from dfbench.benchmark.engine.lifecycle import run
from helpers import tiny_config

pytestmark = pytest.mark.native_amp  # the real numerics.auto_amp, on a mocked CPU


@pytest.mark.parametrize("native, expected", [(False, "off"), (True, "bf16"), (None, "off")])
def test_auto_resolves_from_the_cpus_bf16_support(native, expected, monkeypatch):
    monkeypatch.setattr(numerics, "cpu_bf16", lambda: native)  # None: /proc/cpuinfo unreadable
    auto = tiny_config(over={"train.amp": "auto"})
    assert auto.train.amp == expected
    assert auto.run_id() == tiny_config(over={"train.amp": expected}).run_id()  # the id hashes the choice
    assert auto.run_id() != tiny_config(over={"train.amp": "bf16" if expected == "off" else "off"}).run_id()


def test_auto_on_cuda_asks_the_gpu_or_assumes_a_current_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)  # a V100
    assert numerics.auto_amp("cuda:0") == "off"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert numerics.auto_amp("cuda") == "bf16"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # planning a GPU grid on a CPU machine
    assert numerics.auto_amp("cuda") == "bf16"


def test_a_run_with_auto_records_float32_on_a_cpu_without_bf16(tmp_path, tiny_data, monkeypatch):
    monkeypatch.setattr(numerics, "cpu_bf16", lambda: False)
    cfg = tiny_config(over={"train.amp": "auto", "train.rounds": 1})
    d = run(cfg, tmp_path, progress=False, data=tiny_data)
    assert json.loads((d / runfolder.CONFIG).read_text())["train"]["amp"] == "off"
    starts = json.loads((d / runfolder.NUMERICS).read_text())["starts"]
    assert starts[-1]["amp"] == "off" and "amp_note" not in starts[-1]  # no fallback: float32 was chosen
    assert d.name == cfg.run_id()


def test_a_run_with_auto_records_bf16_on_a_cpu_with_it(tmp_path, tiny_data, monkeypatch):
    monkeypatch.setattr(numerics, "cpu_bf16", lambda: True)
    cfg = tiny_config(over={"train.amp": "auto", "train.rounds": 1})
    d = run(cfg, tmp_path, progress=False, data=tiny_data)
    assert json.loads((d / runfolder.CONFIG).read_text())["train"]["amp"] == "bf16"
    assert json.loads((d / runfolder.NUMERICS).read_text())["starts"][-1]["amp"] == "bf16"


def test_dfbench_auto_amp_forces_the_choice_on_any_machine(monkeypatch):
    monkeypatch.setattr(numerics, "cpu_bf16", lambda: False)
    monkeypatch.setenv("DFBENCH_AUTO_AMP", "bf16")
    assert tiny_config(over={"train.amp": "auto"}).train.amp == "bf16"
    monkeypatch.setattr(numerics, "cpu_bf16", lambda: True)
    monkeypatch.setenv("DFBENCH_AUTO_AMP", "off")
    assert tiny_config(over={"train.amp": "auto"}).train.amp == "off"
    assert tiny_config(over={"train.amp": "bf16"}).train.amp == "bf16"  # an explicit choice is not auto's


def test_a_bad_dfbench_auto_amp_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("DFBENCH_AUTO_AMP", "fp16")
    with pytest.raises(ConfigError, match="DFBENCH_AUTO_AMP='fp16'.*off or bf16"):
        tiny_config(over={"train.amp": "auto"})
