"""dfbench's round against Flower's simulation engine, the same FedAvg work side by side (`make bench-flower`).

    python -m dfbench.benchmark.flower_bench [--steps 2,10,40] [--repeats 3] [--out results/perf]
    python -m dfbench.benchmark.flower_bench --quick          # 2 clients x 1 step x 1 round: a smoke test

Needs the `flower` extra (``pip install -e '.[flower]'``: flwr[simulation], which brings Ray).

The work (both sides): C clients (default 10), preset small28, batch 32, FedAvg over R rounds (default 3)
at S local steps (2, 10, 40), on Fashion-MNIST's training split when it is found (else synthetic uint8
images of its shape; the page says which). Both sides train with dfbench's own local step
(`engine.local_step.local_train`), the same partition, seeded model and per-client generators, so only
the framework around the step differs:

- ours: dfbench's real loop, `engine.training.train_round` over a `RunContext` (`perf.LoopTimer`, with
  `perf.run_config`'s RunConfig), with the run's defaults (train.amp, parallel clients) and T torch
  threads (default: the machine's cores, as a lone `dfbench run` has); once more with train.amp=off
  (float32).
- Flower: `flwr.simulation.run_simulation` with a ServerApp running `flwr.serverapp.strategy.FedAvg`
  (fraction_train=1.0: every client every round; no federated evaluation) and a ClientApp whose train
  function loads the received weights into the model (`load_state_dict`), runs `local_train` in float32
  with `torch.set_num_threads(num_cpus)` and returns `ArrayRecord(model.state_dict())` with the client's
  sample count as FedAvg's weight: what a plain PyTorch client does. Ray gets T CPUs;
  client_resources num_cpus 1 (T actors of one thread) and 2 (T/2 actors of two), num_gpus 0. (Ray sets
  OMP_NUM_THREADS to an actor's num_cpus where it is unset, `ray._private.utils.set_omp_num_threads_if_unset`;
  the client sets torch's threads itself all the same, so a driver's OMP_NUM_THREADS changes nothing.)

Timed spans (seconds, wall clock), the same work on both sides:

- whole run: from the start to the end of R rounds, each side building what it needs: the data (the
  decoded files, or the synthetic images), the partition and the seeded model. Ours: load, build the
  context, R rounds, in one process (torch already imported). Flower: the `run_simulation` call: Ray's
  start, its actor processes (which import torch and dfbench), in each actor the data and model on its
  first message, the R rounds, Ray's shutdown.
- rounds 2..R: from the end of round 1 to the end of round R (no start-up, no first-round effects);
  Flower's round ends are taken from the strategy's `evaluate_fn` hook, which it calls in the server after
  every round. None when R < 2.
- Flower's start-up, reported apart: from the call until the first client's train function starts
  (Ray, the actor pool, loading the ClientApp; a client's own data and model set-up comes after it and is
  reported as "client set-up").

Each configuration runs `repeats` times, interleaved (ours, ours float32, Flower per num_cpus, then
again); the table gives min and median, and Flower's best median over num_cpus divided by ours.
The page also gives the relative difference of the final global models, Flower's against ours in
float32: the same work gives nearly the same model (thread counts and summation order change the
last bits, Adam amplifies them).

Outputs: the table on stdout; with --out DIR (default results/perf; none for --quick), DIR/flower.md and
DIR/flower.json (every run's timings, the machine, the options).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.metadata
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch

from dfbench import datasets
from dfbench.benchmark.core.numerics import cpu_record, effective_amp
from dfbench.benchmark.core.seeds import derive_seed
from dfbench.benchmark.engine.context import RunContext, build_context
from dfbench.benchmark.engine.local_step import StepSettings, local_train
from dfbench.benchmark.engine.model import build_model, resolve_preset
from dfbench.benchmark.perf import LoopTimer, PerfOptions, comma_list, run_config, synthetic_images, write_page
from dfbench.methods.base import LocalStep

DEFAULT_OUT = Path("results/perf")
METHOD = "fedavg"  # dfbench's side of the comparison: Flower's strategy is its FedAvg
OURS, OURS_FP32 = "ours", "ours float32"
SPANS = {"whole": "whole run (start to end of R rounds)", "rounds": "rounds 2..R (after round 1)"}


def flower_variant(num_cpus: int) -> str:
    """The row name of Flower's runs at client_resources num_cpus."""
    return f"Flower num_cpus={num_cpus}"


@dataclass(frozen=True)
class Work:
    """The FedAvg work both sides do (hashable and picklable: the Flower actors receive it)."""

    clients: int = 10
    steps: int = 2
    rounds: int = 3
    batch_size: int = 32
    preset: str = "small28"
    data: Literal["fmnist", "synthetic"] = "fmnist"  # the decoded training split, or uint8 images of its shape
    synthetic_images: int = 60_000
    seed: int = 0

    def perf_options(self) -> PerfOptions:
        return PerfOptions(clients=self.clients, steps=self.steps, rounds=self.rounds, batch_size=self.batch_size,
                           preset=self.preset, seed=self.seed, out=None)


@dataclass(frozen=True)
class BenchOptions:
    """What one `flower_bench` run measures."""

    steps: tuple[int, ...] = (2, 10, 40)
    repeats: int = 3
    clients: int = 10
    rounds: int = 3
    batch_size: int = 32
    preset: str = "small28"
    data: Literal["auto", "fmnist", "synthetic"] = "auto"  # auto: Fashion-MNIST if found, else synthetic
    num_cpus: tuple[int, ...] = (1, 2)
    threads: int | None = None  # ours' torch threads and Ray's CPUs (None: the machine's cores)
    seed: int = 0
    out: Path | None = DEFAULT_OUT


QUICK = dict(steps=(1,), repeats=1, clients=2, rounds=1, num_cpus=(1,), out=None)


# -- the data ----------------------------------------------------------------------------------------

def resolve_data(choice: str) -> Literal["fmnist", "synthetic"]:
    """'fmnist' or 'synthetic' for `--data auto|fmnist|synthetic` (auto: Fashion-MNIST where it is found)."""
    if choice == "synthetic":
        return "synthetic"
    try:
        datasets.load("fmnist", "train")
        return "fmnist"
    except datasets.DatasetError:
        if choice == "fmnist":
            raise
        return "synthetic"


def load_data(work: Work) -> datasets.ImageSet:
    """The training images of `work` (decoded from disk, or generated from the seed)."""
    if work.data == "fmnist":
        return datasets.load("fmnist", "train")
    return synthetic_images(work.preset, work.synthetic_images, work.seed)


def seeded_model(work: Work, channels: int) -> torch.nn.Module:
    """The seeded initial network, as `build_context` draws it (the same seed key)."""
    torch.manual_seed(derive_seed(work.seed, "init"))
    return build_model(resolve_preset(work.preset, "fmnist"), channels)


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# -- ours ----------------------------------------------------------------------------------------------

def time_ours(work: Work, threads: int, amp: str | None = None) -> dict[str, Any]:
    """One run of dfbench's loop: the whole span and each round's seconds; `amp` None = the run's default."""
    torch.set_num_threads(threads)
    datasets.clear_cache()  # the load is part of the span, as in every Flower actor
    t0 = time.perf_counter()
    data = load_data(work)
    cfg = run_config(work.perf_options(), data, METHOD, work.clients, **({} if amp is None else {"amp": amp}))
    loop = LoopTimer(cfg, data, warmup=False)
    rounds = [loop.time(1) for _ in range(work.rounds)]
    whole = time.perf_counter() - t0
    return {"whole_s": whole, "round_s": rounds, "amp": cfg.train.amp,
            "amp_used": effective_amp(cfg.device, cfg.train.amp)[0], "final": loop.state.params.reshape(-1).clone()}


# -- Flower ----------------------------------------------------------------------------------------------

@dataclass
class _Client:
    ctx: RunContext
    setup_s: float


_CLIENTS: dict[Work, _Client] = {}  # per actor process: data and model built on its first message


def _client_for(work: Work) -> tuple[_Client, float]:
    """This process's data and model for `work` and the seconds spent building them now (0 once built)."""
    if work in _CLIENTS:
        return _CLIENTS[work], 0.0
    t0 = time.perf_counter()
    data = load_data(work)
    cfg = run_config(work.perf_options(), data, METHOD, work.clients, amp="off")
    client = _Client(ctx=build_context(cfg, data=data), setup_s=0.0)
    client.setup_s = time.perf_counter() - t0
    _CLIENTS[work] = client
    return client, client.setup_s


def client_train(work: Work, num_cpus: int, state_dict: dict[str, torch.Tensor], client: int,
                 server_round: int) -> tuple[dict[str, torch.Tensor], int, float]:
    """What the ClientApp's train function does with a message: (the new state dict, the client's sample
    count, its set-up seconds in this call). Plain PyTorch: load the weights, train, return the weights."""
    torch.set_num_threads(num_cpus)
    state, setup_s = _client_for(work)
    ctx = state.ctx.at_round(server_round)
    ctx.model.load_state_dict(state_dict)  # the parameters are views of ctx.flat: this sets it
    settings = StepSettings.of(ctx.cfg.train, ctx.client_lr())  # float32 (train.amp=off)
    local_train(ctx.model, ctx.flat, ctx.flat.detach().clone(), ctx.images, ctx.client_indices[client],
                ctx.get_objective(None), LocalStep(), settings, steps=int(ctx.local_steps[client]),
                gen=ctx.gen("client", server_round, client))
    return ctx.model.state_dict(), int(ctx.client_sizes[client]), setup_s  # ctx.flat holds the trained weights


def make_client_app(work: Work, num_cpus: int) -> Any:
    """Flower's ClientApp (Message API) around `client_train`."""
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        called = time.time()
        weights = msg.content["arrays"].to_torch_state_dict()
        new, n, setup_s = client_train(work, num_cpus, weights, int(context.node_config["partition-id"]),
                                       int(msg.content["config"]["server-round"]))
        metrics = MetricRecord({"num-examples": n, "t-called": called, "setup-s": setup_s})
        return Message(RecordDict({"arrays": ArrayRecord(new), "metrics": metrics}), reply_to=msg)

    return app


@dataclass
class _ServerLog:
    """What the ServerApp (a thread of this process) records: round ends, replies, the final model."""

    round_end: list[float] = field(default_factory=list)  # perf_counter at the start (0) and after each round
    replies: list[int] = field(default_factory=list)
    first_called: list[float] = field(default_factory=list)  # per round: the earliest client start (time.time)
    setup_s: list[float] = field(default_factory=list)
    final: dict[str, torch.Tensor] | None = None


def make_server_app(work: Work, channels: int, log: _ServerLog) -> Any:
    """Flower's ServerApp: FedAvg (fraction_train=1.0, no federated evaluation) for work.rounds rounds."""
    from flwr.app import ArrayRecord, Context, MetricRecord, RecordDict
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

    def train_metrics(replies: list[RecordDict], key: str) -> MetricRecord:
        log.replies.append(len(replies))
        log.first_called.append(min(float(r["metrics"]["t-called"]) for r in replies))
        log.setup_s.append(max(float(r["metrics"]["setup-s"]) for r in replies))
        return aggregate_metricrecords(replies, key)

    def round_done(server_round: int, arrays: ArrayRecord) -> None:
        log.round_end.append(time.perf_counter())  # called before round 1 and after every round

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        model = seeded_model(work, channels)
        strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=work.clients,
                          min_available_nodes=work.clients, train_metrics_aggr_fn=train_metrics)
        result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=work.rounds,
                                evaluate_fn=round_done)
        log.final = result.arrays.to_torch_state_dict()

    return app


def _quiet_flower(verbose: bool = False) -> None:
    """No telemetry or usage reports, and Flower's per-round INFO log only with `verbose` (environment
    variables Flower and Ray read when imported: call this first)."""
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if verbose:
        os.environ["FLWR_LOG_LEVEL"] = "INFO"
    else:
        os.environ.setdefault("FLWR_LOG_LEVEL", "WARNING")


def time_flower(work: Work, num_cpus: int, cpus: int, channels: int) -> dict[str, Any]:
    """One `run_simulation` of `work` with client_resources num_cpus on a Ray of `cpus` CPUs."""
    from flwr.simulation import run_simulation

    log = _ServerLog()
    server, client = make_server_app(work, channels, log), make_client_app(work, num_cpus)
    backend = {"client_resources": {"num_cpus": num_cpus, "num_gpus": 0.0}, "init_args": {"num_cpus": cpus}}
    start_wall, t0 = time.time(), time.perf_counter()
    run_simulation(server_app=server, client_app=client, num_supernodes=work.clients, backend_config=backend)
    whole = time.perf_counter() - t0
    if log.final is None or len(log.round_end) != work.rounds + 1 or log.replies != [work.clients] * work.rounds:
        raise RuntimeError(f"Flower's simulation did not finish {work.rounds} rounds of {work.clients} clients "
                           f"(replies per round: {log.replies}); rerun with --verbose to see its log")
    model = seeded_model(work, channels)
    model.load_state_dict(log.final)
    return {"whole_s": whole, "round_s": [b - a for a, b in zip(log.round_end, log.round_end[1:])],
            "startup_s": log.first_called[0] - start_wall, "client_setup_s": max(log.setup_s),
            "final": flat_params(model)}


# -- the numbers -------------------------------------------------------------------------------------------

def span_seconds(run: dict[str, Any], span: str) -> float | None:
    """A run's seconds over `span`: "whole", or "rounds" (rounds 2..R; None for one round)."""
    if span == "whole":
        return float(run["whole_s"])
    rounds = run["round_s"]
    return float(sum(rounds[1:])) if len(rounds) > 1 else None


def _stats(values: Sequence[float | None]) -> tuple[float, float] | None:
    vals = [v for v in values if v is not None]
    return (min(vals), statistics.median(vals)) if vals else None


def summarize(runs: Sequence[dict[str, Any]], num_cpus: Sequence[int], span: str) -> list[dict[str, Any]]:
    """Per local-step count: (min, median) seconds of each variant over `span`, Flower's best median over
    `num_cpus` (and which), and its ratio to ours (default and float32) on medians."""
    rows = []
    for steps in sorted({r["steps"] for r in runs}):
        mine = [r for r in runs if r["steps"] == steps]
        row: dict[str, Any] = {"steps": steps}
        for variant in (OURS, OURS_FP32, *map(flower_variant, num_cpus)):
            row[variant] = _stats([span_seconds(r, span) for r in mine if r["variant"] == variant])
        flower = [(row[flower_variant(c)][1], c) for c in num_cpus if row[flower_variant(c)] is not None]
        best = min(flower) if flower else None
        row["flower_best"] = best[0] if best else None
        row["flower_best_num_cpus"] = best[1] if best else None
        for variant, key in ((OURS, "ratio"), (OURS_FP32, "ratio_float32")):
            row[key] = best[0] / row[variant][1] if best and row[variant] else None
        rows.append(row)
    return rows


def startup_rows(runs: Sequence[dict[str, Any]], num_cpus: Sequence[int]) -> list[dict[str, Any]]:
    """Per num_cpus: median seconds until the first client trains, and of the slowest client set-up."""
    out = []
    for c in num_cpus:
        mine = [r for r in runs if r["variant"] == flower_variant(c)]
        if mine:
            out.append({"num_cpus": c, "startup_s": statistics.median(r["startup_s"] for r in mine),
                        "client_setup_s": statistics.median(r["client_setup_s"] for r in mine)})
    return out


def machine_line(m: dict[str, Any]) -> str:
    """'MODEL, N cores (flags ...; torch CPU capability X); torch V, flwr V (Ray V), Python V'."""
    flags = " ".join(m["cpu"]["flags"]) or "no vector flags read"
    return (f"{m['cpu']['model']}, {m['cpu']['cores']} cores ({flags}; torch CPU capability "
            f"{m['cpu']['torch_capability']}); torch {m['torch']}, flwr {m['flwr']} (Ray {m['ray']}), Python {m['python']}")


def machine() -> dict[str, Any]:
    """The CPU (`numerics.cpu_record`: model, cores, vector/bf16 flags) and the versions, with the date."""
    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    return {"cpu": cpu_record(), "torch": torch.__version__, "flwr": version("flwr"), "ray": version("ray"),
            "python": platform.python_version(), "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def _cell(stats: tuple[float, float] | None, both: bool = True) -> str:
    if stats is None:
        return "-"
    return f"{stats[0]:.2f} / {stats[1]:.2f}" if both else f"{stats[1]:.2f}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def table(rows: Sequence[dict[str, Any]], num_cpus: Sequence[int]) -> list[str]:
    """The markdown table of `summarize`'s rows."""
    head = ["local steps", "ours (default) min / median s", "ours float32 min / median s",
            *(f"Flower num_cpus={c} min / median s" for c in num_cpus), "Flower best / ours (default)",
            "Flower best / ours (float32)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for r in rows:
        cells = [str(r["steps"]), _cell(r[OURS]), _cell(r[OURS_FP32]), *(_cell(r[flower_variant(c)]) for c in num_cpus),
                 _ratio(r["ratio"]), _ratio(r["ratio_float32"])]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render(report: dict[str, Any]) -> str:
    """The page: machine, work, the two spans' tables, Flower's start-up, the same-work check."""
    o, w, m = report["options"], report["work"], report["machine"]
    cpus = o["num_cpus"]
    data = ("Fashion-MNIST training split (60,000 images, decoded from disk)" if w["data"] == "fmnist"
            else f"synthetic uint8 images of Fashion-MNIST's shape ({w['synthetic_images']:,}; Fashion-MNIST was not found)")
    lines = [
        "# dfbench's round vs Flower's simulation engine (FedAvg)", "",
        f"- machine: {machine_line(m)}",
        f"- date: {m['date']}",
        f"- work: {w['clients']} clients x S local steps x {w['rounds']} round(s), FedAvg, {w['preset']} "
        f"({report['parameters']:,} parameters), batch {w['batch_size']}, every client every round; {data}; "
        "both sides train with dfbench's `local_train`",
        f"- ours: `train_round` over a RunContext, torch threads {report['threads']}; the run's default train.amp, "
        f"resolved to {report['ours_amp']} (runs as {report['ours_amp_used']}); float32: train.amp=off",
        f"- Flower: `run_simulation`, ServerApp with FedAvg(fraction_train=1.0), ClientApp calling `local_train` "
        f"in float32 with torch.set_num_threads(num_cpus); Ray given {report['threads']} CPU(s), client_resources "
        f"num_cpus {', '.join(map(str, cpus))} (num_gpus 0)",
        f"- {o['repeats']} repeat(s), interleaved; min / median seconds; ratio = Flower's best median over num_cpus "
        "/ ours' median (above 1: Flower is slower)", "",
    ]
    for span, title in SPANS.items():
        lines += [f"## {title[0].upper()}{title[1:]}", ""]
        if span == "whole":
            lines += ["Each side builds its data, partition and seeded model inside the span. Ours: in one process "
                      "with torch imported. Flower: the `run_simulation` call, Ray's start and shutdown and its actor "
                      "processes (importing torch and dfbench, then loading the data on their first message) included.", ""]
        else:
            lines += ["From the end of round 1 to the end of the last round (Flower's round ends from the strategy's "
                      "`evaluate_fn` hook): the framework around the local step, without start-up.", ""]
        rows = report["tables"][span]
        if all(r[OURS] is None for r in rows):
            lines += ["(one round only: no span)", ""]
            continue
        lines += table(rows, cpus) + [""]
    if report["startup"]:
        lines += ["## Flower's start-up", "",
                  "Median seconds from the `run_simulation` call until the first client's train function starts "
                  "(Ray, the actor pool, the ClientApp), and of the slowest client's data and model set-up on its "
                  "first message (both inside the whole-run span).", "",
                  "| num_cpus | until the first client trains s | client set-up s |", "|---:|---:|---:|"]
        lines += [f"| {r['num_cpus']} | {r['startup_s']:.2f} | {r['client_setup_s']:.2f} |" for r in report["startup"]]
        lines.append("")
    if report["same_work"]:
        lines += ["## Same work", "",
                  "Relative difference ||Flower - ours|| / ||ours|| of the global model after the last round, ours "
                  "in float32, first repeat (thread counts and summation order change the last bits; Adam amplifies "
                  "them over the steps):", ""]
        lines += [f"- {r['steps']} local steps, num_cpus={r['num_cpus']}: {r['rel_diff']:.1e}" for r in report["same_work"]]
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


# -- the benchmark ------------------------------------------------------------------------------------------

def run_bench(o: BenchOptions, say: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """Measure every configuration of `o`; the report dict (`render` makes its page)."""
    if min(o.clients, o.rounds, o.batch_size, o.repeats, *o.steps, *o.num_cpus) < 1:
        raise ValueError("flower_bench sizes must be >= 1 (clients, rounds, batch size, repeats, steps, num_cpus)")
    threads = o.threads or os.cpu_count() or 1
    too_big = [c for c in o.num_cpus if c > threads]
    if too_big:
        raise ValueError(f"--num-cpus {','.join(map(str, too_big))} exceeds the {threads} CPUs given to Ray: "
                         f"pass --num-cpus of at most {threads} (or --threads)")
    base = Work(clients=o.clients, rounds=o.rounds, batch_size=o.batch_size, preset=o.preset, data=resolve_data(o.data),
                seed=o.seed)
    channels = 1
    time_ours(replace(base, steps=1, rounds=1), threads)  # untimed: first-call costs (lazy imports, allocator)
    runs: list[dict[str, Any]] = []
    finals: dict[tuple[int, str], torch.Tensor] = {}
    for steps in o.steps:
        work = replace(base, steps=steps)
        for rep in range(o.repeats):
            plan: list[tuple[str, Callable[[], dict[str, Any]]]] = [
                (OURS, lambda: time_ours(work, threads)), (OURS_FP32, lambda: time_ours(work, threads, amp="off"))]
            plan += [(flower_variant(c), lambda c=c: time_flower(work, c, threads, channels)) for c in o.num_cpus]
            for variant, timed in plan:
                run = timed()
                finals.setdefault((steps, variant), run.pop("final"))  # the first repeat's
                runs.append({"steps": steps, "repeat": rep, "variant": variant, **run})
                say(f"flower_bench: {steps} local steps, repeat {rep + 1}/{o.repeats}, {variant}: "
                    f"{run['whole_s']:.2f} s whole, rounds {', '.join(f'{s:.2f}' for s in run['round_s'])} s")
    ours_runs = [r for r in runs if r["variant"] == OURS]
    same_work = []
    for steps in o.steps:
        ref = finals[(steps, OURS_FP32)]
        for c in o.num_cpus:
            diff = float((finals[(steps, flower_variant(c))] - ref).norm() / ref.norm())
            same_work.append({"steps": steps, "num_cpus": c, "rel_diff": diff})
    n_params = sum(p.numel() for p in seeded_model(base, channels).parameters())
    return {
        "machine": machine(), "options": {**asdict(o), "out": None if o.out is None else str(o.out)},
        "work": asdict(base), "threads": threads, "parameters": n_params,
        "ours_amp": ours_runs[0]["amp"], "ours_amp_used": ours_runs[0]["amp_used"],
        "runs": runs, "tables": {span: summarize(runs, o.num_cpus, span) for span in SPANS},
        "startup": startup_rows(runs, o.num_cpus), "same_work": same_work,
    }


def write(report: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """DIR/flower.md (the page) and DIR/flower.json (the report)."""
    return write_page(out, "flower", render(report), report)


_ints = comma_list(int, "integers", "2,10,40")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dfbench.benchmark.flower_bench",
                                description="dfbench's round against Flower's simulation engine, the same FedAvg "
                                            "work (needs the flower extra: pip install -e '.[flower]').")
    p.add_argument("--steps", type=_ints, help="local steps per round, comma-separated (default 2,10,40)")
    p.add_argument("--repeats", type=int, help="runs of each configuration (default 3)")
    p.add_argument("--clients", type=int, help="clients, all trained every round (default 10)")
    p.add_argument("--rounds", type=int, help="rounds per run (default 3; the rounds-only span needs 2 or more)")
    p.add_argument("--num-cpus", type=_ints, help="Flower's client_resources num_cpus to try (default 1,2)")
    p.add_argument("--threads", type=int, help="ours' torch threads and Ray's CPUs (default: the machine's cores)")
    p.add_argument("--preset", help="train.model preset (default small28)")
    p.add_argument("--batch-size", type=int, help="batch size (default 32)")
    p.add_argument("--data", choices=("auto", "fmnist", "synthetic"),
                   help="auto (default): Fashion-MNIST's training split if found, else synthetic images of its shape")
    p.add_argument("--seed", type=int, help="seed (default 0)")
    p.add_argument("--out", type=Path, help=f"folder for flower.md and flower.json (default {DEFAULT_OUT}; "
                                            "--quick writes none unless given)")
    p.add_argument("--quick", action="store_true", help="a smoke test: 2 clients x 1 local step x 1 round, "
                                                         "one repeat, num_cpus 1 (flags given still apply)")
    p.add_argument("--verbose", action="store_true", help="Flower's INFO log")
    args = p.parse_args(argv)
    _quiet_flower(args.verbose)
    try:
        import flwr  # noqa: F401  (checked before any work)
    except ImportError:
        print("flower_bench: flwr is not installed; install the extra: pip install -e '.[flower]' "
              "(or make bench-flower)", file=sys.stderr)
        return 2
    o = replace(BenchOptions(), **QUICK) if args.quick else BenchOptions()
    given = {"steps": args.steps, "repeats": args.repeats, "clients": args.clients, "rounds": args.rounds,
             "num_cpus": args.num_cpus, "threads": args.threads, "preset": args.preset, "batch_size": args.batch_size,
             "data": args.data, "seed": args.seed, "out": args.out}
    o = replace(o, **{k: v for k, v in given.items() if v is not None})
    try:
        report = run_bench(o, say=lambda m: print(m, file=sys.stderr, flush=True))
    except ValueError as err:
        print(f"flower_bench: {err}", file=sys.stderr)
        return 2
    page = render(report)
    print(page, end="")
    if o.out is not None:
        md, js = write(report, o.out)
        print(f"wrote {md} and {js}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    # Run through the module's own name, not __main__: Ray pickles the ClientApp's function by reference to
    # this module, which its actor processes import.
    from dfbench.benchmark import flower_bench

    sys.exit(flower_bench.main())
