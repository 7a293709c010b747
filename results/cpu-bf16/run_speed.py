"""One `dfbench run` of the paper-fmnist FedAvg setting, as a user runs it alone on the machine, under
the speed settings of before and after issue 52, side by side in one script:

    python results/cpu-bf16/run_speed.py [--seed 300] [--repeats 2] [--out DIR]

- before: what main ran until issue 52: clients one after another in one process with the machine's
  threads, float32 (`train.client_workers=1`, `train.amp=off`);
- parallel: clients side by side in one-thread processes, float32 (`client_workers=0`, `amp=off`);
- after: the defaults now, clients side by side and `train.amp=auto` (bf16 where the CPU has it).

Each run is a fresh `dfbench run` process (imports, data, training, evaluation: the wall time a user
waits), in a fresh folder, the variants alternating within each repeat. The table (speed_run.md, and
speed_run.json with every timing) gives the median wall seconds, the training part of it
(metrics.json's train_wall_seconds), the speed-up over `before`, and the run's fd_fmnist (one seed:
equal quality is what results/cpu-bf16's paired study decides, not this table). The seed (300) is
one that no study reports.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SETTING = ["--method", "fedavg", "--clients", "4", "--rounds", "14", "--local-steps", "30", "--batch-size", "16",
           "--lr", "0.001", "--partition", "dirichlet:0.5", "--eval-samples", "400", "--sampler-steps", "8",
           "--set", "train.model=small28", "--set", "train.objective=fm", "--set", "train.time_sampling=logit_normal"]
VARIANTS = {
    "before": {"train.client_workers": "1", "train.amp": "off"},
    "parallel": {"train.client_workers": "0", "train.amp": "off"},
    "after": {"train.client_workers": "0", "train.amp": "auto"},
}


def one_run(name: str, seed: int, out: Path) -> dict[str, object]:
    """A fresh `dfbench run` of variant `name`; its wall seconds and what its metrics.json says."""
    sets = [a for k, v in VARIANTS[name].items() for a in ("--set", f"{k}={v}")]
    cmd = [sys.executable, "-m", "dfbench", "run", *SETTING, *sets, "--seed", str(seed), "--out", str(out), "--no-progress"]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}  # the machine's threads
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name}: dfbench run failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    folder = Path(proc.stdout.strip().splitlines()[-1])
    metrics = json.loads((folder / "metrics.json").read_text())
    numerics = json.loads((folder / "numerics.json").read_text())["starts"][-1]
    fd = next(r["value"] for r in metrics["evaluations"] if r["metric"] == "fd_fmnist")
    return {"variant": name, "wall_s": wall, "train_s": metrics["train_wall_seconds"], "eval_s": metrics["eval_wall_seconds"],
            "fd_fmnist": fd, "amp": numerics["amp"], "client_workers": numerics.get("client_workers"),
            "run_id": folder.name}


def table(rows: list[dict[str, object]], machine: str) -> str:
    by = {n: [r for r in rows if r["variant"] == n] for n in VARIANTS}
    base = statistics.median(r["wall_s"] for r in by["before"])
    base_train = statistics.median(r["train_s"] for r in by["before"])
    lines = [f"machine: {machine}", "",
             "| variant | settings | amp | workers | wall s (median) | train s (median) | speed-up (wall) | speed-up (train) | fd_fmnist |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for n, rs in by.items():
        wall, train = statistics.median(r["wall_s"] for r in rs), statistics.median(r["train_s"] for r in rs)
        sets = ", ".join(f"{k}={v}" for k, v in VARIANTS[n].items())
        fds = "/".join(f"{r['fd_fmnist']:.1f}" for r in rs[:1])
        lines.append(f"| {n} | {sets} | {rs[0]['amp']} | {rs[0]['client_workers']} | {wall:.1f} | {train:.1f} | "
                     f"{base / wall:.2f}x | {base_train / train:.2f}x | {fds} |")
    lines += ["", f"{len(by['before'])} repeat(s) per variant, alternating; each a fresh `dfbench run` process "
              "(wall = what the user waits, train = metrics.json's train_wall_seconds)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE, help="where speed_run.md and speed_run.json go (default: beside this script)")
    args = ap.parse_args(argv)
    from dfbench.benchmark.core.numerics import cpu_record

    cpu = cpu_record()
    machine = f"{cpu['model']}, {cpu['cores']} cores, flags: {', '.join(cpu['flags'])}; torch capability {cpu['torch_capability']}"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for name in VARIANTS:
                r = one_run(name, args.seed, Path(tmp) / f"{name}-{rep}")
                print(f"repeat {rep + 1}: {name}: {r['wall_s']:.1f} s wall, {r['train_s']:.1f} s training, "
                      f"fd_fmnist {r['fd_fmnist']:.2f}", flush=True)
                rows.append(r)
    text = table(rows, machine)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "speed_run.md").write_text(text)
    (args.out / "speed_run.json").write_text(json.dumps({"machine": cpu, "seed": args.seed, "runs": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
