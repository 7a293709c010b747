"""Issue 60's speed target, measured: a 100-client FedAvg run on the ground-truth track to its plateau in under 2
minutes on 2 cores. Trains FedAvg with 100 clients (Dirichlet 0.3) under the plateau rule (5 %, checks from round 8,
EMA 0.9) on gmm:dim8 (the mlp preset, clients in lockstep: train.clients_mode=auto) and on gmm:fmnist8 (the 8x8
image mixture, the tiny UNet, one client after another), each up to a cap, and prints one table row per run: the
wall time, the rounds it trained, whether it reached its plateau, the last doubling's gain and its score_kl.

Run: OMP_NUM_THREADS=2 .venv/bin/python results/gt-demo/speed_target.py --out results/gt-demo/speed_target.md
(the run folders go to a temporary directory and are not kept; the table is the result)
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import torch

from dfbench.benchmark.api import make_config, run

SETTINGS = [  # (label, overrides)
    ("gmm:dim8, mlp, 100 clients", {"data.dataset": "gmm:dim8", "train.model": "mlp", "train.rounds": 64}),
    ("gmm:dim8, mlp-tiny, 100 clients", {"data.dataset": "gmm:dim8", "train.model": "mlp-tiny", "train.rounds": 512}),
    ("gmm:fmnist8, tiny UNet, 100 clients", {"data.dataset": "gmm:fmnist8", "train.model": "tiny", "train.rounds": 8}),
]
COMMON = {"method": "fedavg", "seed": 98, "data.partition": "dirichlet:0.3", "data.clients": 100, "train.objective": "fm",
          "train.lr": 0.01, "train.local_steps": 10, "train.batch_size": 32, "train.ema": 0.9, "train.plateau": 0.05,
          "train.plateau_start": 8, "train.amp": "off", "eval.samples": 2000, "eval.sampler_steps": 50,
          "eval.grid": 4, "eval.inference_variants": False}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write the table here too (markdown)")
    args = parser.parse_args()
    lines = [f"FedAvg, 100 clients (Dirichlet 0.3), 10 local steps x batch 32, lr 1e-2, EMA 0.9, plateau rule 5 % from "
             f"round 8, seed 98 (no study's), float32, {torch.get_num_threads()} torch threads; {platform.machine()}, "
             f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}", "",
             "| setting | clients mode | wall time | rounds | plateau reached | last doubling | score_kl |",
             "|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for label, over in SETTINGS:
            cfg = make_config(**{**COMMON, **over})
            t0 = time.perf_counter()
            d = run(cfg, out=tmp, progress=False)
            wall = time.perf_counter() - t0
            metrics = json.loads((d / "metrics.json").read_text())
            mode = json.loads((d / "config.json").read_text())["train"]["clients_mode"]
            plateau = metrics.get("plateau") or {}
            score = {r["metric"]: r["value"] for r in metrics["evaluations"]}
            gain = None if plateau.get("reached") else plateau.get("last_improvement")
            lines.append(f"| {label} | {mode} | {wall:.0f} s | {plateau.get('rounds', metrics['rounds'])} | "
                         f"{'yes' if plateau.get('reached') else 'no'} | "
                         f"{'' if gain is None else f'{gain:+.0%}'} | {score['score_kl']:.3g} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
