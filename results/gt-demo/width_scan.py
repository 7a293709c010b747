"""How the `mlp` preset's width and the demo's rate were chosen (on seed 99, which no committed run uses):
FedAvg on gmm:dim8, 10 iid clients x 10 local steps x batch 64, clients in lockstep, EMA 0.9, the plateau rule
at 5 % with checks from round 8 and a 256-round cap; prints the plateau checks and the exact metrics.
Run: .venv/bin/python results/gt-demo/width_scan.py PRESET LR SEED. The width of `mlp` is read from
core/presets.py: the scan edited that row between runs (64, 128, 256); width_scan.md holds the printed lines."""
import time, json, sys
from dfbench.benchmark.engine.resolve import apply_overrides
from dfbench.benchmark.core.config import RunConfig
from dfbench.benchmark.engine.lifecycle import run
from dfbench.benchmark.core import presets
import torch; torch.set_num_threads(1)
model, lr, seed = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
over = {"method": "fedavg", "data.dataset": "gmm:dim8", "train.rounds": 256, "train.plateau": 0.05, "train.plateau_start": 8,
        "train.ema": 0.9, "train.objective": "fm", "eval.sampler_steps": 50, "eval.samples": 2000, "data.clients": 10,
        "train.model": model, "train.local_steps": 10, "train.batch_size": 64, "eval.grid": 4, "train.lr": lr,
        "train.clients_mode": "batched", "seed": seed}
cfg = apply_overrides(RunConfig(), over)
w = presets.PRESETS[model].mlp.channels
t = time.time(); d = run(cfg, f"/tmp/width-scan-{w}", progress=False)
m = json.load(open(d / "metrics.json")); p = m["plateau"]
print(model, w, lr, seed, f"train {m['train_wall_seconds']:.0f}s rounds {m['rounds']} reached {p['reached']}",
      [round(c['value'],2) for c in p['checks']], {r['metric']: round(r['value'],3) for r in m['evaluations'] if r['metric'] != 'denoise_loss'}, flush=True)
