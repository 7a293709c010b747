"""The bound study's base recipe, chosen before the study on a seed no study uses (97): which FedAvg recipe on the
low-dimensional ground truth reaches the plateau rule (5 % a doubling, checks from round 8) soonest in wall time.
Prints one line per setting: dataset, lr, local steps, EMA, wall seconds, rounds, reached, the checks' score_kl.

Run: OMP_NUM_THREADS=1 .venv/bin/python results/bound/recipe_scan.py "{SETTING}" "{SETTING}" ... (recipe_scan.txt: the lines it printed)
(two settings at a time, one torch thread each; the run folders go to a temporary directory)
"""

from __future__ import annotations

import ast
import json
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

import torch

from dfbench.benchmark.api import make_config, run

COMMON = {"method": "fedavg", "seed": 97, "data.partition": "iid", "data.clients": 10, "train.objective": "fm",
          "train.model": "mlp-tiny", "train.batch_size": 32, "train.plateau": 0.05, "train.plateau_start": 8,
          "train.amp": "off", "eval.samples": 500, "eval.sampler_steps": 20, "eval.grid": 2,
          "eval.inference_variants": False}


def one(over: dict) -> str:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = make_config(**{**COMMON, **over})
        t0 = time.perf_counter()
        d = run(cfg, out=tmp, progress=False)
        wall = time.perf_counter() - t0
        m = json.loads((d / "metrics.json").read_text())
    p = m.get("plateau") or {}
    checks = [round(c["value"], 3) for c in p.get("checks", [])]
    return (f"{over} wall {wall:.0f}s rounds {p.get('rounds')} reached {p.get('reached')} checks {checks}")


def main() -> None:
    grid = [dict(ast.literal_eval(a)) for a in sys.argv[1:]]  # each argument a dict literal of config overrides
    with ProcessPoolExecutor(2) as pool:
        for line in pool.map(one, grid):
            print(line, flush=True)


if __name__ == "__main__":
    main()
