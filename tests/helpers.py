"""Small config builders for tests."""

from __future__ import annotations

from typing import Any

from dfbench.benchmark.core.config import RunConfig, apply_overrides

TINY = {
    "data.clients": 4, "data.min_client_size": 4, "train.rounds": 2, "train.local_steps": 2, "train.batch_size": 8,
    "train.model": "tiny", "eval.samples": 16, "eval.grid": 4, "eval.sampler_steps": 3, "eval.metrics": "none",
}


def tiny_config(method: str = "fedavg", params: dict[str, Any] | None = None, over: dict[str, Any] | None = None) -> RunConfig:
    """A config small enough to train in about a second on one CPU core."""
    items = {"method": method, **{f"method.{k}": v for k, v in (params or {}).items()}, **TINY, **(over or {})}
    return apply_overrides(RunConfig(), items)  # validated once, as a whole


def final_params(run_dir: Any) -> Any:
    from dfbench.benchmark.core.runfolder import load_checkpoint

    ck = load_checkpoint(run_dir)
    assert ck is not None, f"no checkpoint in {run_dir}"
    return ck["params"]


def local_train_kw(model, flat, start, images, indices, objective, *, steps, batch_size, lr, gen, mask=None, prox_mu=0.0,
                   step_correction=None, network=None, grad_clip=0.0, probe_steps=0, amp="off", channels_last=False):
    """`local_step.local_train` with its LocalStep and StepSettings spelled as keywords (tests only)."""
    from dfbench.benchmark.engine.local_step import StepSettings, local_train
    from dfbench.methods import LocalStep

    step = LocalStep(mask=mask, proximal_mu=prox_mu, step_correction=step_correction, network=network)
    settings = StepSettings(batch_size=batch_size, lr=lr, grad_clip=grad_clip, probe_steps=probe_steps, amp=amp,
                            channels_last=channels_last)
    return local_train(model, flat, start, images, indices, objective, step, settings, steps=steps, gen=gen)


def lockstep_kw(model, layout, jobs, images, objective, *, steps, batch_size, lr, grad_clip=0.0, probe_steps=0, amp="off"):
    """`batched.train_lockstep` with its StepSettings spelled as keywords (tests only)."""
    from dfbench.benchmark.engine.batched import train_lockstep
    from dfbench.benchmark.engine.local_step import StepSettings

    settings = StepSettings(batch_size=batch_size, lr=lr, grad_clip=grad_clip, probe_steps=probe_steps, amp=amp)
    return train_lockstep(model, layout, jobs, images, objective, settings, steps=steps)


def load_script(name: str) -> Any:
    """scripts/<name>.py imported as a module (the scripts are not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Runs in a fresh interpreter: trains tiny_config(over) on the synthetic image set (every
# datasets.load too) and SIGKILLs itself right after appending the row of round KILL_AT to WATCH
# (rounds.jsonl or curve.jsonl), i.e. before that round's checkpoint (the worst moment).
KILL_SCRIPT = """
import json, os, signal, sys
sys.path.insert(0, {tests!r})
import torch
torch.set_num_threads(1)
from conftest import make_imageset
from helpers import tiny_config
from dfbench import datasets
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.engine.lifecycle import run

out, kill_at, over, watch = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
data = make_imageset()
datasets.load = lambda name, split="train", root=None, **kw: data
append = runfolder.append_round

def append_then_die(d, row, name=runfolder.ROUNDS):
    append(d, row, name)
    if name == watch and row["round"] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)

runfolder.append_round = append_then_die
run(tiny_config(over=over), out, data=data, progress=False)
"""


def run_then_sigkill(out: Any, over: dict[str, Any], kill_at: int, watch: str = "rounds.jsonl") -> Any:
    """Train tiny_config(over=over) into `out` in a subprocess that SIGKILLs itself after writing
    round `kill_at`'s row of `watch`; returns the CompletedProcess (returncode -SIGKILL when it did)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    return subprocess.run([sys.executable, "-c", KILL_SCRIPT.format(tests=str(tests)), str(out), str(kill_at), json.dumps(over), watch],
                          cwd=tests.parent, capture_output=True, text=True, timeout=300)
