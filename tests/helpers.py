"""Small config builders for tests."""

from __future__ import annotations

from typing import Any

from dfbench.benchmark.core.config import RunConfig
from dfbench.benchmark.engine.resolve import apply_overrides

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
    """A script imported as a module (the scripts are not a package): a shared tool's name (scripts/<name>.py),
    or a study's script by its path from the repository root (results/cpu-recipe/cpu_recipe.py).

    Loaded from its file once per process, under a name made from its path (``script_results_cpu_recipe_cpu_recipe``)
    and registered in sys.modules, as dataclasses need. While it loads, its folder is first on sys.path, as when
    Python runs it as a script (results/paper-fmnist/rule_losses.py imports rescore_inference.py beside it)."""
    import importlib.util
    import re
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    path = root / name if name.endswith(".py") else root / "scripts" / f"{name}.py"
    assert path.is_file(), f"no script {path}"
    module_name = "script_" + re.sub(r"\W", "_", path.relative_to(root).with_suffix("").as_posix())
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    saved = list(sys.path)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    finally:
        sys.path[:] = saved
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


def sigkill_then_resume(tmp_path: Any, data: Any, over: dict[str, Any], kill_at: int = 2) -> tuple[Any, Any]:
    """Run `over` uninterrupted, and again killed by SIGKILL after logging round `kill_at` (before
    its checkpoint), then resumed; returns (reference folder, resumed folder)."""
    import signal

    from dfbench.benchmark.core import runfolder
    from dfbench.benchmark.engine.lifecycle import run

    cfg = tiny_config(over=over)
    ref = run(cfg, tmp_path / "ref", data=data, progress=False)
    out = tmp_path / "killed"
    proc = run_then_sigkill(out, over, kill_at)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    d = runfolder.run_dir(out, cfg)
    assert runfolder.load_checkpoint(d)["round"] == kill_at - 1
    assert run(cfg, out, data=data, progress=False) == d
    return ref, d


def rows(d: Any) -> list[dict]:
    """A run folder's rounds.jsonl rows without their wall-clock field (for bitwise comparisons)."""
    import json

    from dfbench.benchmark.core.runfolder import without_wall_clock

    return [without_wall_clock(r) for r in map(json.loads, (d / "rounds.jsonl").read_text().splitlines())]


def write_grid(path: Any, base: dict[str, Any], axes: dict[str, list[Any]] | None = None,
               cells: list[dict[str, Any]] | None = None, name: str = "t") -> Any:
    """A grid TOML file (JSON scalars are valid TOML scalars)."""
    import json

    lines = [f'name = "{name}"', "[base]"] + [f'"{k}" = {json.dumps(v)}' for k, v in base.items()]
    if axes:
        lines += ["[axes]"] + [f'"{k}" = {json.dumps(v)}' for k, v in axes.items()]
    for c in cells or []:
        lines += ["[[cells]]"] + [f'"{k}" = {json.dumps(v)}' for k, v in c.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


# -- hand-built run folders (the reporter's tests: no training) ---------------------------------

BUDGET = {"clients": 4, "rounds": 3, "local_steps": 2, "batch_size": 8, "lr": 1e-3, "participation": 1.0}


def make_run(
    root: Any,
    run_id: str,
    *,
    dataset: str = "fmnist",
    partition: str = "iid",
    method: str = "fedavg",
    params: dict[str, Any] | None = None,
    seed: int = 0,
    state: str = "done",
    error: str | None = None,
    evaluations: list[dict[str, Any]] | None = None,
    uplink_bits: int = 80_000_000,
    rounds: int = 3,
    grid_color: tuple[int, int, int] | None = (200, 30, 30),
    extra_metrics: dict[str, Any] | None = None,
) -> Any:
    """Write one run folder in the documented layout."""
    import json

    from PIL import Image

    d = root / dataset / partition.replace(":", "-") / method / run_id
    d.mkdir(parents=True)
    config = {"run_id": run_id, "dataset": dataset, "partition": partition, "method": method,
              "method_params": params or {}, "seed": seed, **BUDGET, "rounds": rounds}
    (d / "config.json").write_text(json.dumps(config))
    status: dict[str, Any] = {"state": state}
    if error is not None:
        status["error"] = error
    (d / "status.json").write_text(json.dumps(status))
    if state == "done":
        metrics = {"evaluations": evaluations or [], "uplink_bits": uplink_bits, "downlink_bits": uplink_bits,
                   "wall_seconds": 60.0, "rounds": rounds, "gamma_star": None, "w2_mean": None,
                   "dropped_updates": 0, **(extra_metrics or {})}
        (d / "metrics.json").write_text(json.dumps(metrics))
        with open(d / "rounds.jsonl", "w") as f:
            for r in range(1, rounds + 1):
                f.write(json.dumps({"round": r, "clients": [0, 1, 2, 3], "loss": 1.0 / r + seed * 0.01,
                                    "uplink_bits": uplink_bits // max(rounds, 1), "gamma_star": r, "w2": 0.1}) + "\n")
        if grid_color is not None:
            Image.new("RGB", (64, 64), grid_color).save(d / "grid.png")
    return d


def fd(value: float, **extra: Any) -> dict[str, Any]:
    """One fd_fmnist evaluation entry of metrics.json."""
    return {"metric": "fd_fmnist", "value": value, "std_err": None, "extractor": "fmnist_cnn",
            "extractor_sha256": "ab" * 32, "backend": "dfbench", "num_samples": 1000, "sampler": "ddim",
            "sampler_steps": 20, "reference": "test", "resize": "none", **extra}


# -- real `dfbench` processes racing on one results folder (this file run as a script) -------------
# Each process swaps the dataset for the small synthetic one (conftest.make_imageset), records every
# round it trains in a shared trace file, optionally sleeps in each round (so that runs overlap however
# slowly the machine starts them) or SIGKILLs itself after a checkpoint, waits for a common start
# time, then calls `dfbench` (cli.main) or dfbench.run_grid.

# as small as a run gets (about 0.2 s of CPU a round): the processes, not the training, are under test
SMALL = {"data.clients": 2, "train.local_steps": 1, "train.sigma1_probe_steps": 0, "checkpoint_every": 1}
WORKER_LIMIT_S = 120


def worker_main(spec: dict[str, Any]) -> int:
    import json
    import os
    import signal
    import sys
    import time
    from pathlib import Path

    import torch

    torch.set_num_threads(1)
    from conftest import make_imageset

    from dfbench import datasets
    from dfbench.benchmark.cli import main
    from dfbench.benchmark.core import runfolder
    from dfbench.benchmark.engine import lifecycle

    data = make_imageset()
    datasets.load = lambda name, split, root=None, **kw: data  # type: ignore[assignment]
    real_round, real_save = lifecycle.train_round, runfolder.save_checkpoint

    def train_round(method: Any, state: Any, ctx: Any, r: int) -> Any:
        with open(spec["trace"], "a") as f:  # one short O_APPEND write per line: lines never interleave
            f.write(f"{os.getpid()} {ctx.cfg.run_id()} {r}\n")
        time.sleep(spec.get("round_sleep", 0.0))
        return real_round(method, state, ctx, r)

    def save_checkpoint(d: Path, round_: int, payload: dict[str, Any], keep: int = 2) -> Path:
        path = real_save(d, round_, payload, keep)
        if round_ == spec.get("kill_after_checkpoint"):
            os.kill(os.getpid(), signal.SIGKILL)
        return path

    lifecycle.train_round, runfolder.save_checkpoint = train_round, save_checkpoint  # type: ignore[assignment]
    from dfbench.benchmark.grid import workers

    # `dfbench grid --workers N` starts its extra workers as this script too (same data, same trace)
    worker = {k: v for k, v in spec.items() if k != "python"}  # an extra worker runs the command line it is given
    workers.worker_command = lambda argv: [sys.executable, __file__, json.dumps({**worker, "argv": argv, "start_at": 0.0})]
    while time.time() < spec.get("start_at", 0.0):  # every process imported: start together
        time.sleep(0.005)
    if "python" in spec:  # dfbench.run_grid(**spec["python"]) instead of the command line
        import dfbench

        summary = dfbench.run_grid(**spec["python"])
        print(summary.text())
        return 0 if summary.ok else 1
    return main(spec["argv"])


def start_workers(specs: list[dict[str, Any]], logs: Any, delay_s: float = 3.0) -> list[Any]:
    """Start one process (this file run as a script) per spec, logging to logs/p<i>.log; they begin
    their command together, `delay_s` from now."""
    import json
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    here = Path(__file__).resolve().parent
    start_at = time.time() + delay_s
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")])}
    procs = []
    for i, spec in enumerate(specs):
        out = open(logs / f"p{i}.log", "w")
        procs.append(subprocess.Popen([sys.executable, __file__, json.dumps({**spec, "start_at": start_at})],
                                      stdout=out, stderr=subprocess.STDOUT, env=env, cwd=here.parent))
        out.close()
    return procs


def wait_workers(procs: list[Any], logs: Any) -> list[int]:
    """Their exit codes; the test fails with every log if one runs past WORKER_LIMIT_S (none is left running)."""
    import subprocess

    import pytest

    try:
        return [p.wait(timeout=WORKER_LIMIT_S) for p in procs]
    except subprocess.TimeoutExpired:
        pytest.fail("a worker hung:\n" + "\n".join(f"--- {p.name}\n{p.read_text()}" for p in sorted(logs.glob("*.log"))))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


if __name__ == "__main__":
    import json
    import sys

    sys.exit(worker_main(json.loads(sys.argv[1])))


def interrupt_at(monkeypatch: Any, round_: int) -> None:
    """Make train_round raise KeyboardInterrupt when it reaches `round_` (Ctrl-C between rounds)."""
    from dfbench.benchmark.engine import lifecycle

    real = lifecycle.train_round

    def train_round(method, state, ctx, r):
        if r == round_:
            raise KeyboardInterrupt
        return real(method, state, ctx, r)

    monkeypatch.setattr(lifecycle, "train_round", train_round)


def docstring_nodes(tree: "ast.AST") -> set[int]:
    """The ids of the docstring constants of a parsed module (its own, its classes' and functions'): static
    checks over the package's source skip prose there (tests/unit/test_no_method_names.py, test_runfolder_reader.py)."""
    import ast

    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]
