"""Score a finished pruning run's final model under other inference rules (no retraining).

    .venv/bin/python scripts/rescore_inference.py RUN_DIR --rule full --rule scaled \
        --rule submodel --rule submodel:inference_seed=1 --rule scaled:only=out.2 --out OUT_DIR

`scaled:only=PREFIX` is a diagnostic, not a method option: the scaled rule applied only to the
prunable tensors whose name starts with PREFIX (e.g. `out.2`, the UNet's last convolution,
the one layer whose output no normalisation follows), the rest sampled as `full`.

The model is the run's last checkpoint (its EMA when the run used one); the samples come
from the run's fixed noises and sampler, so every rule is compared on the same noises.
Each rule writes OUT_DIR/<rule>/grid.png and samples.npz; a table (rule -> metric values)
is printed and saved as OUT_DIR/rescore.json. The run folder itself is never modified.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from dfbench import methods
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.core.config import RunConfig
from dfbench.benchmark.engine.context import build_context
from dfbench.benchmark.engine.evaluate import generate, save_grid, score


def parse_rule(text: str) -> tuple[str, dict[str, str]]:
    """'submodel:inference_seed=1,inference_keep=0.25' -> ('submodel', {...})."""
    mode, _, rest = text.partition(":")
    extra = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
    return mode, extra


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="a finished run folder of random_prune or topk_prune")
    ap.add_argument("--rule", action="append", required=True, help="full | scaled | submodel[:KEY=VALUE,...] (repeatable)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    cfg = RunConfig.from_dict(runfolder.read_json(args.run / "config.json"))
    if cfg.method not in ("random_prune", "topk_prune"):
        raise SystemExit(f"{args.run} is a {cfg.method!r} run; inference rules belong to random_prune and topk_prune")
    ck = runfolder.load_checkpoint(args.run)
    if ck is None or ck["round"] != cfg.train.rounds:
        raise SystemExit(f"{args.run} has no final checkpoint (round {cfg.train.rounds}); finish the run first")
    params = ck["ema"] if ck.get("ema") is not None else ck["params"]
    ctx = build_context(cfg)
    table: dict[str, dict[str, float]] = {}
    for text in args.rule:
        mode, extra = parse_rule(text)
        only = extra.pop("only", None)
        method = methods.create_method(cfg.method, **{**dict(cfg.method_params), "inference": mode, **extra})
        used = params
        if only is not None:  # diagnostic: scale only the named tensors, sample the result as `full`
            if mode != "scaled":
                raise SystemExit(f"'only=' goes with the scaled rule, not {mode!r}")
            used = params.clone()
            for (name, sl, _), c in zip(ctx.layout.slices(), method.inference_scales(ctx)):
                if name.startswith(only):
                    used[sl] *= c
            method = methods.create_method(cfg.method, **{**dict(cfg.method_params), "inference": "full"})
        samples = generate(cfg, ctx, method, used)
        d = args.out / text.replace(":", "_").replace(",", "_").replace("=", "-")
        d.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(d / "samples.npz", images=samples.numpy())
        save_grid(samples, cfg.eval.grid, d / "grid.png")
        rows, pending = score(d, cfg, samples, ctx.sampler_name(cfg.train.objective))[:2]
        if pending:
            raise SystemExit(pending)
        table[text] = {r["metric"]: float(r["value"]) for r in rows}
        print(f"{text:40s} " + "  ".join(f"{k}={v:.1f}" for k, v in table[text].items()), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rescore.json").write_text(json.dumps({"run": str(args.run), "method": cfg.method, "rules": table}, indent=2))


if __name__ == "__main__":
    main()
