"""What the second feature space and the held-out denoising loss add to a run's time (issue 41's cost).

    OMP_NUM_THREADS=1 .venv/bin/python results/metric-calibration/eval_cost.py [--out results/metric-calibration/eval_cost.md]

Trains the demo's fedavg cell (benchmark/grid/builtin/demo.toml, seed 0: one torch thread, as `make
demo`'s workers) and times, on its final model and samples, each part of its evaluation side by side
in one process: sampling, the scoring the demo did before (fd_fmnist with its quality rows) and what
this issue adds (fd_fmnist_ae, kid_fmnist, kid_fmnist_ae with their PRDC / per-client rows, and the
held-out denoising loss). Reference statistics are computed once before timing (they are cached per
machine). Prints a table, with the added time as a share of the cell's whole time; a benchmark, not
a test: its numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import torch

from dfbench.benchmark.core import runfolder
from dfbench.benchmark.engine import evaluate, heldout, lifecycle
from dfbench.benchmark.engine.context import build_context  # noqa: F401  (the context the run used)
from dfbench.benchmark.grid.spec import load_grid
from dfbench.benchmark.metrics import scoring, table


def _cpu() -> str:
    """The CPU's model name (/proc/cpuinfo), else the platform's word for it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None, help="also write the table (markdown) here")
    p.add_argument("--runs", type=Path, default=Path("/tmp/dfbench-eval-cost"), help="where the demo cell trains")
    p.add_argument("--repeats", type=int, default=3, help="timings are the best of this many")
    a = p.parse_args(argv)
    torch.set_num_threads(1)

    cell = next(c for c in load_grid("demo").cells if c.cfg.method == "fedavg" and c.cfg.train.rounds > 0)
    cfg = cell.cfg
    t0 = time.perf_counter()
    d = lifecycle.run(cfg, a.runs, progress=False)
    cell_seconds = float(runfolder.read_json(d / runfolder.METRICS)["wall_seconds"])
    print(f"demo fedavg cell: {d} ({time.perf_counter() - t0:.0f} s here, {cell_seconds:.1f} s recorded)")

    ctx, method, params = evaluate.final_model(d, cfg)
    samples = evaluate._saved_samples(d, cfg)
    clients = evaluate._clients(cfg, ctx, method)[:3]
    old = ["fd_fmnist"]
    new = [m for m in table.auto_metrics("fmnist", False) if m not in old]

    def score(metrics: list[str]) -> None:
        scoring.evaluate_samples(samples, "fmnist", metrics=metrics, options=scoring.ScoreOptions(device="cpu", seed=cfg.seed),
                                 clients=scoring.ClientSplit(*clients) if clients[0] is not None else None)

    score(old + new)  # the reference statistics of every extractor, computed and cached once
    noise = evaluate.fixed_noise(cfg.eval.samples, ctx.image_shape, base=cfg.eval.noise_seed)
    parts = {
        f"sampling ({cfg.eval.samples} samples, {cfg.eval.sampler_steps} Heun steps)":
            _best(lambda: method.sample(params, noise, ctx), a.repeats),
        "before: fd_fmnist + its PRDC, per-client, class_tv rows": _best(lambda: score(old), a.repeats),
        "before + fd_fmnist_ae, kid_fmnist, kid_fmnist_ae (+ PRDC, per-client)": _best(lambda: score(old + new), a.repeats),
        f"denoise_loss ({heldout.DENOISE_IMAGES} test images x {len(heldout.DENOISE_TIMES)} times)":
            _best(lambda: heldout.method_denoising_rows(cfg, ctx, method, params), a.repeats),
    }
    names = list(parts)
    added_features = parts[names[2]] - parts[names[1]]
    added = added_features + parts[names[3]]
    lines = [
        f"Machine: {_cpu()}, {os.cpu_count()} cores, torch {torch.__version__}, 1 thread "
        f"(`results/metric-calibration/eval_cost.py`, best of {a.repeats}).",
        "",
        "| part | seconds | share of the cell |",
        "|---|---:|---:|",
        f"| demo fedavg cell, train + evaluation as recorded | {cell_seconds:.2f} | 100 % |",
        *[f"| {name} | {sec:.2f} | {100 * sec / cell_seconds:.1f} % |" for name, sec in parts.items()],
        f"| **added by the second space** | {added_features:.2f} | {100 * added_features / cell_seconds:.1f} % |",
        f"| **added in all (second space + denoise_loss)** | {added:.2f} | {100 * added / cell_seconds:.1f} % |",
    ]
    text = "\n".join(lines)
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text("# Evaluation cost of issue 41's metrics\n\n" + text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
