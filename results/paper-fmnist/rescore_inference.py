"""Score a finished pruning run's final model under other inference rules (no retraining).

    .venv/bin/python results/paper-fmnist/rescore_inference.py RUN_DIR --rule full --rule scaled \
        --rule submodel --rule submodel:inference_seed=1 --rule scaled:only=out.2 --out OUT_DIR

`scaled:only=PREFIX` is a diagnostic, not a method option: the scaled rule applied only to the
prunable tensors whose name starts with PREFIX (e.g. `out.2`, the UNet's last convolution,
the one layer whose output no normalisation follows), the rest sampled as `full`.

`ensemble:draws=M` (random_prune only) is a second diagnostic: every network evaluation of the
sampler averages the outputs of M sub-models drawn afresh from the training distribution (a
uniform random mask at the clients' keep ratio, as `random_mask` draws for a client; generator:
run seed, "ensemble_mask"). It asks whether the trained weights are a good model *of the
distribution they were trained under*, which no single deterministic rule samples: the mean
prediction of the sub-models, not the prediction of one model. It costs M times the sampling.

`--loss N` adds each rule's training loss (the run's objective, e.g. flow matching's velocity
MSE) on N training images: the same images, times and noises for every rule (generator: run
seed, "rescore_loss"), in the table as `loss`. It measures the model a rule samples on the task
it was trained for, without the sampler and the feature extractor in between.

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

import torch

from dfbench import methods
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.core.config import RunConfig
from dfbench.benchmark.engine.resolve import config_from_dict
from dfbench.benchmark.engine.context import build_context
from dfbench.benchmark.engine.evaluate import generate, save_grid, score
from dfbench.methods.pruning import random_mask


class MaskEnsemble(torch.nn.Module):
    """ctx.model whose every forward is the mean over `draws` fresh random sub-models of `base`."""

    def __init__(self, ctx, base: torch.Tensor, keep: float, prunable: list[bool], draws: int) -> None:
        super().__init__()
        self.ctx, self.base, self.keep, self.prunable, self.draws = ctx, base.to(ctx.device), keep, prunable, draws
        self.model = ctx.model  # its parameters are views of ctx.flat
        self.gen = ctx.gen("ensemble_mask")

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        out = None
        for _ in range(self.draws):
            self.ctx.flat.copy_(self.base * random_mask(self.ctx.layout, self.keep, self.prunable, self.gen, self.base.dtype))
            y = self.model(x, t)
            out = y if out is None else out + y
        return out / self.draws


def rule_loss(ctx, net: torch.nn.Module, params: torch.Tensor | None, n: int) -> float:
    """The objective's loss of `net` (with ctx.flat = params unless None: net sets its own) on n
    training images, times and noises drawn from one fixed generator (the same for every rule)."""
    gen = ctx.gen("rescore_loss")
    pick = torch.randperm(ctx.images.shape[0], generator=gen, device=ctx.device)[:n]
    x0 = ctx.images[pick].float().div(127.5).sub(1.0)
    obj = ctx.get_objective(ctx.objective)
    if params is not None:
        ctx.flat.copy_(params)
    ctx.model.eval()
    try:
        with torch.no_grad():
            total = 0.0
            for i in range(0, n, 256):  # one generator over the batches: the same draws for every rule
                total += float(obj.loss(net, x0[i:i + 256], gen)) * x0[i:i + 256].shape[0]
    finally:
        ctx.model.train()
    return total / n


def ensemble_samples(cfg: RunConfig, ctx, method, params: torch.Tensor, draws: int) -> torch.Tensor:
    """The run's fixed noises sampled by MaskEnsemble (the run's sampler and steps), as uint8."""
    if draws < 1:
        raise SystemExit(f"ensemble:draws={draws}: give a number of sub-models >= 1")
    net = MaskEnsemble(ctx, params, method.sampling_keep(ctx), method.prunable(ctx.layout), draws)

    def sample(p: torch.Tensor, noise: torch.Tensor, c) -> torch.Tensor:
        c.model.eval()
        try:
            return c.sample_single(p, noise, c.objective, network=net)
        finally:
            c.model.train()

    return generate(cfg, ctx, method, params, sample=sample)


def parse_rule(text: str) -> tuple[str, dict[str, str]]:
    """'submodel:inference_seed=1,inference_keep=0.25' -> ('submodel', {...})."""
    mode, _, rest = text.partition(":")
    extra = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
    return mode, extra


def write_and_score(cfg: RunConfig, ctx, out: Path, text: str, samples: torch.Tensor) -> dict[str, float]:
    """OUT/<rule>/samples.npz + grid.png, scored like the run's own evaluation: metric -> value."""
    d = out / text.replace(":", "_").replace(",", "_").replace("=", "-")
    d.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(d / "samples.npz", images=samples.numpy())
    save_grid(samples, cfg.eval.grid, d / "grid.png")
    rows, pending = score(d, cfg, samples, ctx.sampler_name(cfg.train.objective))[:2]
    if pending:
        raise SystemExit(pending)
    return {r["metric"]: float(r["value"]) for r in rows}


def print_row(text: str, values: dict[str, float]) -> None:
    print(f"{text:40s} " + "  ".join(f"{k}={v:.4g}" for k, v in values.items()), flush=True)


def rescore(run: Path, rules: list[str], out: Path, loss: int = 0) -> dict[str, dict[str, float]]:
    """Rule text -> {metric: value} (and "loss" with loss > 0) for the run's final model; writes
    OUT/<rule>/samples.npz + grid.png and OUT/rescore.json."""
    cfg = config_from_dict(runfolder.read_json(run / "config.json"))
    pruner = cfg.method in ("random_prune", "topk_prune")
    if not pruner and set(rules) != {"full"}:
        raise SystemExit(f"{run} is a {cfg.method!r} run; inference rules belong to random_prune and topk_prune "
                         "(another run takes --rule full alone: its model as it is, e.g. a FedAvg reference for --loss)")
    ck = runfolder.load_checkpoint(run)
    if ck is None or ck["round"] != cfg.train.rounds:
        raise SystemExit(f"{run} has no final checkpoint (round {cfg.train.rounds}); finish the run first")
    params = ck["ema"] if ck.get("ema") is not None else ck["params"]
    ctx = build_context(cfg)
    table: dict[str, dict[str, float]] = {}
    for text in rules:
        mode, extra = parse_rule(text)
        only = extra.pop("only", None)
        if mode == "ensemble":
            if cfg.method != "random_prune":
                raise SystemExit("the ensemble diagnostic draws random masks: it belongs to random_prune runs")
            method = methods.create_method(cfg.method, **dict(cfg.method_params))
            draws = int(extra.pop("draws", "1"))
            if extra:
                raise SystemExit(f"unknown ensemble options {sorted(extra)}; allowed: draws")
            table[text] = write_and_score(cfg, ctx, out, text, ensemble_samples(cfg, ctx, method, params, draws))
            if loss:
                net = MaskEnsemble(ctx, params, method.sampling_keep(ctx), method.prunable(ctx.layout), draws)
                table[text]["loss"] = rule_loss(ctx, net, None, loss)
            print_row(text, table[text])
            continue
        rule = {"inference": mode, **extra} if pruner else {}
        method = methods.create_method(cfg.method, **{**dict(cfg.method_params), **rule})
        used = params
        if only is not None:  # diagnostic: scale only the named tensors, sample the result as `full`
            if mode != "scaled":
                raise SystemExit(f"'only=' goes with the scaled rule, not {mode!r}")
            used = params.clone()
            for (name, sl, _), c in zip(ctx.layout.slices(), method.inference_scales(ctx)):
                if name.startswith(only):
                    used[sl] *= c
            method = methods.create_method(cfg.method, **{**dict(cfg.method_params), "inference": "full"})
        table[text] = write_and_score(cfg, ctx, out, text, generate(cfg, ctx, method, used))
        if loss:
            sampled = method.inference_params(used, ctx) if pruner else used
            table[text]["loss"] = rule_loss(ctx, ctx.model, sampled, loss)
        print_row(text, table[text])
    out.mkdir(parents=True, exist_ok=True)
    (out / "rescore.json").write_text(json.dumps({"run": str(run), "method": cfg.method, "rules": table}, indent=2))
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="a finished run folder of random_prune or topk_prune")
    ap.add_argument("--rule", action="append", required=True, help="full | scaled | submodel[:KEY=VALUE,...] (repeatable)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--loss", type=int, default=0, metavar="N", help="also each rule's training loss on N training images (0 = off)")
    args = ap.parse_args()
    rescore(args.run, args.rule, args.out, args.loss)


if __name__ == "__main__":
    main()
