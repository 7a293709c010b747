"""Training speed on the ground-truth track: FedAvg on gmm:dim8 at 10 and 100 clients, clients one after
another (sequential) or in lockstep (batched, torch.func.vmap), for the mlp presets, one torch thread.
Prints one markdown table (samples/s and the ratio to sequential at the same preset and client count);
`--out FILE` also writes it. Run: .venv/bin/python results/gt-demo/speed.py --out results/gt-demo/speed.md"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile

import torch

from dfbench.benchmark.core import presets
from dfbench.benchmark.core.config import RunConfig
from dfbench.benchmark.engine.lifecycle import run
from dfbench.benchmark.engine.resolve import apply_overrides

ROUNDS, STEPS, BATCH = 4, 10, 64


def samples_per_second(model: str, clients: int, mode: str) -> float:
    over = {"method": "fedavg", "data.dataset": "gmm:dim8", "train.rounds": ROUNDS, "train.objective": "fm",
            "eval.metrics": "none", "eval.samples": 16, "eval.grid": 4, "data.clients": clients, "train.model": model,
            "train.local_steps": STEPS, "train.batch_size": BATCH, "train.clients_mode": mode,
            "train.sigma1_probe_steps": 0, "train.amp": "off"}
    cfg = apply_overrides(RunConfig(), over)
    with tempfile.TemporaryDirectory() as out:
        d = run(cfg, out, progress=False)
        m = json.loads((d / "metrics.json").read_text())
    return ROUNDS * clients * STEPS * BATCH / float(m["train_wall_seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="also write the table to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    samples_per_second("mlp-tiny", 10, "sequential")  # warm-up: the data's draws, imports, first kernels (not timed)
    rows = ["| preset | clients | sequential samples/s | batched samples/s | batched / sequential |", "|---|---|---|---|---|"]
    for model in sorted((n for n in presets.PRESETS if presets.family(n) == "mlp"), key=lambda n: presets.PRESETS[n].cpu_ms_per_sample_grad):
        for clients in (10, 100):
            seq = samples_per_second(model, clients, "sequential")
            bat = samples_per_second(model, clients, "batched")
            rows.append(f"| {model} | {clients} | {seq:,.0f} | {bat:,.0f} | {bat / seq:.2f}x |")
    head = (f"FedAvg on gmm:dim8, {ROUNDS} rounds x {STEPS} local steps x batch {BATCH}, one torch thread, float32; "
            f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
            f"CPU capability {torch.backends.cpu.get_cpu_capability()}")
    text = head + "\n\n" + "\n".join(rows) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
