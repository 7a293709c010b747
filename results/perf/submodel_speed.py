"""What a client's sub-model saves in training speed: one client's local training at capacity c, timed
against a full FedAvg client (`make bench-submodel-speed`, issue 53).

    python results/perf/submodel_speed.py [--preset small28] [--steps 20] [--repeats 5] [--out results/perf]
    python results/perf/submodel_speed.py --quick        # tiny preset, 2 steps, 1 repeat: a smoke test

The work: the model preset (default small28) on synthetic uint8 images of its shape (a step's speed does not
depend on pixel values), the paper-fmnist recipe's step (flow matching with logit-normal times, batch 16,
lr 1e-3, float32: train.amp=off), T torch threads (default 1: a client of a parallel run trains in a
one-thread worker). For each method and capacity the client is built as a run builds it: a RunContext
(`engine.context.build_context`) whose capacity tiers (`system.capacity`, one client per capacity) give one
client each capacity, the method (`methods.create_method`), and the method's own plan for that client in
round r (`method.client_view(state, k, ctx.at_round(r))`); what is timed is that plan's local training,
`engine.local_step.local_train`, S steps (its `LocalResult.seconds`, the wall time a run records as
`client_train_seconds`). The plan is rebuilt each round, untimed: a mask, a rolling window or FjORD's
per-step widths are drawn as in a run (FjORD draws a width per step uniformly from its widths up to the
client's capacity, so its row averages over those widths, and its FLOP fraction is the mean of the draws').

Rows: the reference method (FedAvg, `methods.registry.reference_method`) at capacity 1.0, then each method at each
capacity (default 1.0, 0.75, 0.5, 0.25): HeteroFL, FedRolex and FjORD train a narrower network (fewer
FLOPs, faster); random, balanced and top-k masks train the full network with zeros in it (a mask saves
bytes, not time: expected about 1.0x). Round 1 of every row is an untimed warm-up; then `repeats` rounds,
interleaved over the rows (each row once per pass), so drift of the machine's load spreads over all rows.
Per row: images/s of the median and the best round (S x batch images / seconds), the speed-up (its median
images/s over the reference's), and the plan's `flop_fraction` (mean over the timed rounds; for masks the
kept multiply-accumulates, as if sparse compute were free of overhead).

Outputs: the page on stdout; with --out DIR (default results/perf; none for --quick unless given),
DIR/submodel_speed.md and DIR/submodel_speed.json (every round's seconds, the machine, the options).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import platform
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from dfbench import methods
from dfbench.benchmark.api import ConfigError, reference_method
from dfbench.benchmark.core.numerics import cpu_record
from dfbench.benchmark.engine.context import build_context
from dfbench.benchmark.engine.local_step import StepSettings, local_train
from dfbench.benchmark.engine.model import build_model
from dfbench.benchmark.engine.resolve import apply_overrides
from dfbench.benchmark.perf import PerfOptions, comma_list, run_config, synthetic_images, write_page

DEFAULT_OUT = Path("results/perf")
#: structured sub-models first, then the masks they are compared with (the reference, FedAvg, is added first)
DEFAULT_METHODS = ("heterofl", "fedrolex", "fjord", "random_prune", "balanced_prune", "topk_prune")
DEFAULT_CAPACITIES = (1.0, 0.75, 0.5, 0.25)
#: the paper-fmnist recipe's step (results/paper-fmnist/paper-fmnist.toml), float32 as its runs
RECIPE = {"objective": "fm", "time_sampling": "logit_normal", "lr": 0.001, "amp": "off"}
QUICK = {"preset": "tiny", "steps": 2, "repeats": 1}
IMAGES_PER_CLIENT = 64  # synthetic images per client: batches are drawn with replacement, the count does not matter


@dataclass(frozen=True)
class SpeedOptions:
    """Sizes of one measurement."""

    preset: str = "small28"
    batch_size: int = 16
    steps: int = 20  # local steps per timed call
    repeats: int = 5  # timed rounds per row, after the warm-up round
    threads: int = 1  # torch threads while timing
    methods: tuple[str, ...] = DEFAULT_METHODS
    capacities: tuple[float, ...] = DEFAULT_CAPACITIES
    seed: int = 0
    out: Path | None = DEFAULT_OUT

    def check(self) -> None:
        """One clear line for a size out of range or an unknown method."""
        if min(self.batch_size, self.steps, self.repeats, self.threads) < 1:
            raise ValueError("batch size, steps, repeats and threads must each be at least 1")
        if not self.capacities or not all(0.0 < c <= 1.0 for c in self.capacities) or len(set(self.capacities)) != len(self.capacities):
            raise ValueError(f"capacities must be distinct numbers in (0, 1], e.g. 1.0,0.5; got {self.capacities}")
        unknown = [m for m in self.methods if m not in methods.list_methods("*")]
        if unknown:
            raise ValueError(f"unknown method(s) {', '.join(unknown)}; `dfbench methods` lists them")


@dataclass
class Row:
    """One method at one capacity: every timed round's seconds and plan FLOP fraction."""

    method: str
    capacity: float
    images: int  # per timed call: steps x batch size
    seconds: list[float] = field(default_factory=list)
    flop_fractions: list[float] = field(default_factory=list)
    params: str = ""  # the hyperparameters the row ran with (the JSON keeps them)


# -- the numbers, from given timings ------------------------------------------------------------------

def summarize(rows: Sequence[Row], reference: str) -> list[dict[str, Any]]:
    """Per row: images/s of the median and of the best round, the speed-up of its median over the reference
    row's (the reference method at capacity 1.0), and its mean FLOP fraction."""
    ref = next((r for r in rows if r.method == reference and r.capacity == 1.0), None)
    if ref is None or not ref.seconds:
        raise ValueError(f"no timed row of the reference {reference!r} at capacity 1.0 to compare with")
    ref_ips = ref.images / statistics.median(ref.seconds)
    out = []
    for r in rows:
        median = r.images / statistics.median(r.seconds)
        out.append({"method": r.method, "capacity": r.capacity, "images_per_s": median, "best_images_per_s": r.images / min(r.seconds),
                    "speedup": median / ref_ips, "flop_fraction": statistics.fmean(r.flop_fractions),
                    "rounds": len(r.seconds)})
    return out


def machine(threads: int) -> dict[str, Any]:
    """The CPU (`numerics.cpu_record`: model, cores, vector / bf16 flags, torch's CPU capability), the versions,
    the torch threads timed with, and the date."""
    return {"cpu": cpu_record(), "torch": torch.__version__, "python": platform.python_version(), "threads": threads,
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def machine_line(m: dict[str, Any]) -> str:
    flags = " ".join(m["cpu"]["flags"]) or "no vector flags read"
    return (f"{m['cpu']['model']}, {m['cpu']['cores']} cores ({flags}; torch CPU capability {m['cpu']['torch_capability']}); "
            f"torch {m['torch']} with {m['threads']} thread(s), Python {m['python']}")


def table(summary: Sequence[dict[str, Any]], reference: str) -> list[str]:
    lines = [f"| method | capacity | images/s (median) | images/s (best) | speed-up over full {reference} | FLOP fraction |",
             "|---|---:|---:|---:|---:|---:|"]
    for s in summary:
        lines.append(f"| {s['method']} | {s['capacity']:g} | {s['images_per_s']:.1f} | {s['best_images_per_s']:.1f} | "
                     f"{s['speedup']:.2f}x | {s['flop_fraction']:.3f} |")
    return lines


def render(report: dict[str, Any]) -> str:
    """The page: machine, work, the table, what each kind of row means."""
    o, m, ref = report["options"], report["machine"], report["reference"]
    lines = [
        "# What a sub-model saves in training speed", "",
        f"- machine: {machine_line(m)}",
        f"- date: {m['date']}",
        f"- work: one client's `local_train` of {o['steps']} steps at batch {o['batch_size']} on {o['preset']} "
        f"({report['parameters']:,} parameters), flow matching with logit-normal times, lr 1e-3, float32; the plan is "
        "the method's own `client_view` for a client of that capacity (`system.capacity` tiers); synthetic images",
        f"- {o['repeats']} timed round(s) per row after a warm-up round, interleaved over the rows; speed-up = the row's "
        f"median images/s / {ref}'s at capacity 1.0",
        "",
        *table(report["summary"], ref),
        "",
        "HeteroFL, FedRolex and FjORD train a narrower network (a capacity-c client's layers have c of the channels); "
        "FjORD draws a width per step from its widths up to the capacity, so its row is the mean over those widths "
        "and so is its FLOP fraction. Random, balanced and top-k masks train the full network with zeros in it: "
        "their FLOP fraction counts only the kept multiply-accumulates, their speed is the full model's. Every method "
        "runs with its default hyperparameters; a client's width rate or keep ratio is its capacity.",
    ]
    return "\n".join(lines) + "\n"


# -- the measurement ---------------------------------------------------------------------------------

class Client:
    """One row's client: its run context (capacity tiers, one client per capacity), the method and its state."""

    def __init__(self, o: SpeedOptions, data: Any, method: str, capacity: float, tiers: str | None) -> None:
        perf = PerfOptions(device="cpu", clients=len(o.capacities), steps=o.steps, rounds=1 + o.repeats,
                           batch_size=o.batch_size, preset=o.preset, seed=o.seed, out=None)
        cfg = run_config(perf, data, method, len(o.capacities), **RECIPE)
        if tiers is not None:
            cfg = apply_overrides(cfg, {"system.capacity": tiers})
        self.cfg, self.ctx = cfg, build_context(cfg, data=data)
        self.method = methods.create_method(cfg.method, **dict(cfg.method_params))
        self.state = self.method.init_state(self.ctx.init_params, self.ctx)
        caps = self.ctx.capacity
        self.client = 0 if caps is None else next(k for k, c in enumerate(caps) if math.isclose(float(c), capacity))
        self.row = Row(method, capacity, o.steps * o.batch_size,
                       params=", ".join(f"{k}={v}" for k, v in sorted(dict(cfg.method_params).items())))

    def train(self, r: int) -> tuple[float, float]:
        """Round r's plan for the client (untimed), then its local training: (seconds, flop fraction)."""
        ctx, k = self.ctx.at_round(r, float(self.ctx.client_sizes.sum())), self.client
        plan = self.method.client_view(self.state, k, ctx)
        settings = StepSettings.of(self.cfg.train, ctx.client_lr())
        res = local_train(ctx.model, ctx.flat, plan.start, ctx.images, ctx.client_indices[k], ctx.get_objective(plan.step.objective),
                          plan.step, settings, steps=int(ctx.local_steps[k]), gen=ctx.gen("client", r, k))
        assert res.seconds is not None
        return res.seconds, float(plan.flop_fraction)


def run_bench(o: SpeedOptions, say: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """Time every row of `o` and return the report (rows, summary, machine, options)."""
    o.check()
    reference = reference_method()
    data = synthetic_images(o.preset, IMAGES_PER_CLIENT * len(o.capacities), o.seed)
    tiers = ",".join(f"{c:g}:{1 / len(o.capacities):.9f}" for c in o.capacities)
    old_threads = torch.get_num_threads()
    torch.set_num_threads(o.threads)
    try:
        say(f"submodel_speed: building {1 + len(o.methods) * len(o.capacities)} clients of {o.preset}")
        clients = [Client(o, data, reference, 1.0, None)]
        clients += [Client(o, data, m, c, tiers) for m in o.methods if m != reference for c in o.capacities]
        say("submodel_speed: warm-up round")
        for c in clients:
            c.train(1)
        for rep in range(o.repeats):
            say(f"submodel_speed: timed round {rep + 1}/{o.repeats}")
            for c in clients:
                seconds, flops = c.train(2 + rep)
                c.row.seconds.append(seconds)
                c.row.flop_fractions.append(flops)
    finally:
        torch.set_num_threads(old_threads)
    rows = [c.row for c in clients]
    with torch.device("meta"):
        n_params = sum(p.numel() for p in build_model(o.preset, data.images.shape[1]).parameters())
    return {"machine": machine(o.threads), "options": {**asdict(o), "out": None if o.out is None else str(o.out)},
            "reference": reference, "parameters": n_params, "rows": [asdict(r) for r in rows],
            "summary": summarize(rows, reference)}


def write(report: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """DIR/submodel_speed.md (the page) and DIR/submodel_speed.json (the report)."""
    return write_page(out, "submodel_speed", render(report), report)


_floats = comma_list(float, "numbers", "1.0,0.5")


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python results/perf/submodel_speed.py",
                                description="One client's local-training images/s at capacity c (structured sub-models and "
                                            "masks) against a full FedAvg client.")
    p.add_argument("--preset", help="train.model preset (default small28)")
    p.add_argument("--batch-size", type=int, help="batch size (default 16, the paper-fmnist recipe's)")
    p.add_argument("--steps", type=int, help="local steps per timed call (default 20)")
    p.add_argument("--repeats", type=int, help="timed rounds per row after the warm-up (default 5)")
    p.add_argument("--threads", type=int, help="torch threads (default 1: a parallel run's client worker)")
    p.add_argument("--methods", type=_names, help=f"methods besides the reference, comma-separated (default {','.join(DEFAULT_METHODS)})")
    p.add_argument("--capacities", type=_floats, help="client capacities, comma-separated (default 1.0,0.75,0.5,0.25)")
    p.add_argument("--seed", type=int, help="seed (default 0)")
    p.add_argument("--out", type=Path, help=f"folder for submodel_speed.md and .json (default {DEFAULT_OUT}; --quick writes "
                                            "none unless given)")
    p.add_argument("--quick", action="store_true", help="a smoke test: tiny preset, 2 steps, 1 repeat (flags given still apply)")
    args = p.parse_args(argv)
    o = replace(SpeedOptions(), **QUICK, out=None) if args.quick else SpeedOptions()
    given = {"preset": args.preset, "batch_size": args.batch_size, "steps": args.steps, "repeats": args.repeats,
             "threads": args.threads, "methods": args.methods, "capacities": args.capacities, "seed": args.seed, "out": args.out}
    o = replace(o, **{k: v for k, v in given.items() if v is not None})
    try:
        report = run_bench(o, say=lambda m: print(m, file=sys.stderr, flush=True))
    except (ValueError, ConfigError) as err:
        print(f"submodel_speed: {err}", file=sys.stderr)
        return 2
    print(render(report), end="")
    if o.out is not None:
        md, js = write(report, o.out)
        print(f"wrote {md} and {js}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
