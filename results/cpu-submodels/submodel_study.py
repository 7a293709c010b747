"""cpu-submodels' own tables, from its run folders (`make bench-cpu-submodels` runs it after the report):

    python results/cpu-submodels/submodel_study.py [--runs results/cpu-submodels/runs] [--out results/cpu-submodels]

1. tier_speed.csv: each scheme's measured training speed per capacity tier, images/s = local steps x batch /
   the client's measured training seconds (rounds.jsonl client_train_seconds: one client at a time on one
   torch thread, the grid's 2 workers side by side), the median over every (round, client) of the tier and
   every seed; beside it the speed-up over a FedAvg client (FedAvg's clients all train the full model: its
   median over both tiers) and the plan's FLOP fraction. Tiers come from the run's own settings
   (system.capacity / system.speed through dfbench's seeded tier assignment), never from the timings.
2. time_to_fedavg.csv: the time each run needs to reach FedAvg's final quality, by the rule the claims
   file fixed before the runs (cpu-submodels.claims.toml): target = the worst over FedAvg's seeds of its
   last quality-curve point (fd_fmnist on 200 fixed noises); a run's time = its measured clock up to its
   first curve point at most the target, where each round lasts its slowest client's measured training
   seconds divided by the client's simulated speed; never reached = infinitely late. Beside it the same
   on the simulated clock (the run's sim_seconds, which credits a mask with its kept FLOPs). Then the
   rule's verdict for every structured scheme against every mask scheme: "faster" when the structured one
   is strictly sooner on every seed (one-sided sign test, p = 1/2^n), else "not shown".
3. curves.csv: each scheme's quality curve (geometric mean over seeds per round of client training).
4. communication_runs.csv: every bit each scheme sent (uplink and downlink; with edges, clients <-> edges and
   edges <-> cloud), per run and as a fraction of flat FedAvg's on the same seed; communication.csv: per scheme.

Writes those CSVs and tier_speed.md, time_to_fedavg.md, curves.md, communication.md (the tables with their captions,
generated, never edited by hand; the README includes them).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from dfbench.benchmark.api import iter_runs, runfolder
from dfbench.benchmark.core.parsing import parse_capacity
from dfbench.benchmark.engine.clock import assign_speeds

ROOT = Path(__file__).resolve().parent
STRUCTURED = ("heterofl", "fedrolex", "fjord")
MASKS = ("random_prune", "topk_prune", "balanced_prune")


def load_runs(runs: Path) -> list[dict]:
    """Every finished run: its config, rounds, curve and metrics, and its scheme's label."""
    out = []
    for run in iter_runs(runs) if Path(runs).is_dir() else []:
        if not run.has(runfolder.METRICS):
            continue
        d, cfg = run.path, run.config()
        method, edges = cfg["method"], int(cfg["system"].get("edges", 0))
        label = f"{method} ({edges} edges)" if edges else method
        out.append({"dir": d, "cfg": cfg, "label": label, "method": method, "edges": edges, "seed": int(cfg["seed"]),
                    "rounds": runfolder.read_rounds(d), "curve": runfolder.read_rounds(d, runfolder.CURVE),
                    "metrics": run.metrics()})
    if not out:
        raise SystemExit(f"no finished runs under {runs}: run `make bench-cpu-submodels` first")
    return out


def tiers_of(cfg: dict) -> tuple[np.ndarray, np.ndarray]:
    """(capacity, speed) per client, as the run assigned them (dfbench's seeded tiers)."""
    n, seed, system = int(cfg["data"]["clients"]), int(cfg["seed"]), cfg["system"]
    speed = assign_speeds(n, system.get("speed", ""), seed)
    tiers = parse_capacity(system.get("capacity", ""))
    if tiers:
        from dfbench.benchmark.core.seeds import tier_values

        capacity = tier_values(n, tiers, seed)
    else:
        capacity = np.ones(n)
    return capacity, speed


def tier_speed(runs: list[dict]) -> pd.DataFrame:
    rows = []
    for run in runs:
        if run["edges"]:
            continue  # a cloud round's row holds several edge rounds: no per-client timing to split
        capacity, speed = tiers_of(run["cfg"])
        batch = int(run["cfg"]["train"]["batch_size"])
        for r in run["rounds"]:
            for k, steps, sec, flop in zip(r["clients"], r["steps"], r.get("client_train_seconds") or [], r["flop_fraction"]):
                if sec:
                    rows.append({"scheme": run["label"], "tier": f"capacity {capacity[k]:g}, speed {speed[k]:g}",
                                 "capacity": float(capacity[k]), "round": int(r["round"]),
                                 "images_per_s": steps * batch / sec, "flop_fraction": flop, "seed": run["seed"]})
    df = pd.DataFrame(rows)
    ref = float(df[df["scheme"] == "fedavg"]["images_per_s"].median())
    table = (df.groupby(["scheme", "tier"], sort=False)
             .agg(client_rounds=("images_per_s", "size"), images_per_s=("images_per_s", "median"),
                  flop_fraction=("flop_fraction", "mean")).reset_index())
    table["speedup_over_fedavg_client"] = table["images_per_s"] / ref
    # within the run: the tier's images/s over the same round's capacity-1 clients' (the same machine load)
    full = df[df["capacity"] == 1.0].groupby(["scheme", "seed", "round"])["images_per_s"].median().rename("full_ips")
    df = df.join(full, on=["scheme", "seed", "round"])
    within = (df["images_per_s"] / df["full_ips"]).groupby([df["scheme"], df["tier"]]).median()
    table["speedup_over_own_full_clients"] = [within.get((a, b), float("nan")) for a, b in zip(table["scheme"], table["tier"])]
    return table


def measured_clock(run: dict) -> dict[int, float]:
    """round -> measured-clock seconds at its end: each round lasts max_k train_seconds_k / speed_k."""
    _, speed = tiers_of(run["cfg"])
    t, out = 0.0, {0: 0.0}
    for r in run["rounds"]:
        secs = [s / speed[k] for k, s in zip(r["clients"], r.get("client_train_seconds") or []) if s is not None]
        t += max(secs) if secs else 0.0
        out[int(r["round"])] = t
    return out


def bench_speedups(path: Path) -> dict[tuple[str, float], float]:
    """(method, capacity) -> median images/s over full FedAvg's, from `make bench-submodel-speed`'s JSON
    (its rows interleaved over the rounds, so a load on the machine falls on every row alike)."""
    data = json.loads(path.read_text())
    med = {(r["method"], float(r["capacity"])): float(np.median([r["images"] / t for t in r["seconds"]])) for r in data["rows"]}
    ref = med[("fedavg", 1.0)]
    return {k: v / ref for k, v in med.items()}


def bench_clock(run: dict, speedup: dict[tuple[str, float], float]) -> dict[int, float] | None:
    """round -> seconds on the bench clock: a client's local training at the benchmark's images/s of its
    method and capacity (full FedAvg = 1 unit per image), over its simulated speed; None if not benched."""
    capacity, speed = tiers_of(run["cfg"])
    batch = int(run["cfg"]["train"]["batch_size"])
    t, out = 0.0, {0: 0.0}
    for r in run["rounds"]:
        secs = []
        for k, steps in zip(r["clients"], r["steps"]):
            ratio = speedup.get((run["method"], float(capacity[k])), speedup.get((run["method"], 1.0)) if run["method"] == "fedavg" else None)
            if ratio is None:
                return None
            secs.append(steps * batch / ratio / speed[k])
        t += max(secs) if secs else 0.0
        out[int(r["round"])] = t
    return out


def time_to_target(runs: list[dict], speedup: dict[tuple[str, float], float] | None = None) -> tuple[pd.DataFrame, float]:
    ref = [r for r in runs if r["label"] == "fedavg"]
    target = max(r["curve"][-1]["value"] for r in ref)  # fd: lower is better; the worst of FedAvg's seeds
    rows = []
    for run in runs:
        if run["edges"]:
            continue
        clock = measured_clock(run)
        bench = bench_clock(run, speedup) if speedup else None
        hit = next((p for p in run["curve"] if p["value"] <= target), None)
        rows.append({"scheme": run["label"], "seed": run["seed"], "final_curve_fd": run["curve"][-1]["value"],
                     "round": hit["round"] if hit else None,
                     "measured_seconds": clock[int(hit["round"])] if hit else math.inf,
                     "bench_units": (bench[int(hit["round"])] if hit else math.inf) if bench else float("nan"),
                     "sim_seconds": hit["sim_seconds"] if hit else math.inf,
                     "measured_seconds_total": clock[max(clock)]})
    return pd.DataFrame(rows), target


def sign_rule(times: pd.DataFrame, column: str = "measured_seconds") -> pd.DataFrame:
    """The claims file's rule for every structured scheme against every mask scheme (paired by seed)."""
    rows = []
    by = {s: g.set_index("seed")[column] for s, g in times.groupby("scheme")}
    for s in STRUCTURED:
        for m in MASKS:
            if s not in by or m not in by:
                continue
            seeds = sorted(set(by[s].index) & set(by[m].index))
            sooner = sum(1 for k in seeds if by[s][k] < by[m][k])  # inf < inf is False: a tie counts against
            p = 0.5 ** len(seeds) if sooner == len(seeds) else None
            rows.append({"structured": s, "mask": m, "seeds": len(seeds), "structured_sooner": sooner,
                         "p_one_sided": p, "verdict": "faster" if p is not None and p < 0.05 else "not shown"})
    return pd.DataFrame(rows)


def communication(runs: list[dict]) -> pd.DataFrame:
    rows = []
    for run in runs:
        m = run["metrics"]
        client = int(m.get("uplink_bits", 0)) + int(m.get("downlink_bits", 0))
        edge = sum(int(r.get("edge_uplink_bits", 0)) + int(r.get("edge_downlink_bits", 0)) for r in run["rounds"])
        rows.append({"scheme": run["label"], "seed": run["seed"], "client_link_bits": client, "edge_link_bits": edge,
                     "total_bits": client + edge})
    df = pd.DataFrame(rows)
    ref = df[df["scheme"] == "fedavg"].set_index("seed")["total_bits"]
    df["fraction_of_fedavg"] = [t / ref[s] if s in ref.index else float("nan") for t, s in zip(df["total_bits"], df["seed"])]
    return df


def curves(runs: list[dict]) -> pd.DataFrame:
    """Each scheme's quality curve: fd_fmnist on the 200 curve noises, geometric mean over seeds per round of
    client training (a hierarchical run's cloud round r is client round r x edge_rounds)."""
    rows = []
    for run in runs:
        per = int(run["cfg"]["system"].get("edge_rounds", 1)) if run["edges"] else 1
        rows += [{"scheme": run["label"], "round": int(p["round"]) * per, "value": p["value"]} for p in run["curve"]]
    df = pd.DataFrame(rows)
    table = df.groupby(["scheme", "round"])["value"].apply(lambda v: float(np.exp(np.log(v).mean()))).unstack("round")
    table.columns = [f"round {c}" for c in table.columns]
    return table.reset_index()


def _md(df: pd.DataFrame, fmt: dict[str, str]) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in df.iterrows():
        cells = []
        for c in cols:
            v = r[c]
            if isinstance(v, float) and math.isinf(v):
                cells.append("never")
            elif v is None or (isinstance(v, float) and math.isnan(v)):
                cells.append("-")
            elif c in fmt:
                cells.append(format(v, fmt[c]))
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, default=ROOT / "runs")
    ap.add_argument("--out", type=Path, default=ROOT)
    ap.add_argument("--bench", type=Path, default=ROOT.parent / "perf" / "submodel_speed.json",
                    help="make bench-submodel-speed's JSON: per (method, capacity) images/s for the bench clock")
    args = ap.parse_args(argv)
    runs = load_runs(args.runs)
    speed = tier_speed(runs)
    times, target = time_to_target(runs, bench_speedups(args.bench))
    rule = sign_rule(times)
    rule_bench = sign_rule(times, "bench_units")
    comm = communication(runs)
    curve = curves(runs)
    summary = (comm.groupby("scheme", sort=False)
               .agg(runs=("seed", "size"), total_bits=("total_bits", "median"), edge_link_bits=("edge_link_bits", "median"),
                    fraction_of_fedavg=("fraction_of_fedavg", "mean")).reset_index())
    times_mean = (times.replace(math.inf, np.nan).groupby("scheme", sort=False)
                  .agg(reached=("round", lambda s: f"{int(s.notna().sum())}/{len(s)}"),
                       measured_seconds=("measured_seconds", "median"), bench_units=("bench_units", "median"),
                       sim_seconds=("sim_seconds", "median"),
                       measured_seconds_total=("measured_seconds_total", "median")).reset_index())
    args.out.mkdir(parents=True, exist_ok=True)
    speed.to_csv(args.out / "tier_speed.csv", index=False)
    times.to_csv(args.out / "time_to_fedavg.csv", index=False)
    rule.to_csv(args.out / "time_rule.csv", index=False)
    rule_bench.to_csv(args.out / "time_rule_bench.csv", index=False)
    comm.to_csv(args.out / "communication_runs.csv", index=False)
    summary.to_csv(args.out / "communication.csv", index=False)
    curve.to_csv(args.out / "curves.csv", index=False)
    pages = {
        "tier_speed.md": [
            "images/s = local steps x batch / the client's measured training seconds (one thread, the grid's two "
            "workers side by side), median over every round, client of the tier and seed; speed-up over a FedAvg "
            "client (full model, median over its clients) and over the same run's capacity-1 clients in the same round (the same "
            "machine load: the grid's cells ran at different times, some beside other work); FLOP fraction of the "
            "client's plan (mean).",
            "",
            _md(speed, {"images_per_s": ".1f", "flop_fraction": ".3f", "speedup_over_fedavg_client": ".2f",
                        "speedup_over_own_full_clients": ".2f"}),
        ],
        "time_to_fedavg.md": [
            f"Target: fd_fmnist <= {target:.1f} on the quality curve (200 fixed noises), the worst of FedAvg's seeds "
            "at its last point. Measured clock: each round lasts its slowest client's measured training seconds "
            "over its simulated speed (the slow half at 0.5); simulated clock: the run's sim_seconds (a mask "
            "credited with its kept FLOPs). Medians over the seeds that reach the target; total = the whole run "
            "on the measured clock.",
            "",
            _md(times_mean, {"measured_seconds": ".1f", "bench_units": ".0f", "sim_seconds": ".1f",
                             "measured_seconds_total": ".1f"}),
            "",
            "The rule fixed before the runs (cpu-submodels.claims.toml): a structured scheme is faster than a mask "
            "scheme when it reaches the target strictly sooner on the measured clock on every seed (one-sided sign "
            "test; never reaching = infinitely late, both never = a tie, against it).",
            "",
            _md(rule, {"p_one_sided": ".3f"}),
            "",
            "Sensitivity (exploratory, not the registered rule): the same rule on the bench clock, where a client "
            "trains at the images/s `make bench-submodel-speed` measured for its method and capacity "
            "(results/perf/submodel_speed.json: rows interleaved, so a load on the machine falls on every row alike; "
            "bench_units = images at full FedAvg's speed), since the grid's cells ran at different times under "
            "different loads.",
            "",
            _md(rule_bench, {"p_one_sided": ".3f"}),
        ],
        "curves.md": [
            "fd_fmnist on the quality curve's 200 fixed noises, geometric mean over the seeds, by round of client "
            "training (the hierarchical cells' cloud round r is client round 2r); round 0 is the initial model.",
            "",
            _md(curve, {c: ".0f" for c in curve.columns if c.startswith("round")}),
        ],
        "communication.md": [
            "Every bit sent, up and down, clients <-> edges (or the server) and edges <-> cloud: the median per run, "
            "and the mean over seeds of the fraction of flat FedAvg's on the same seed.",
            "",
            _md(summary, {"fraction_of_fedavg": ".3f", "total_bits": ".4g", "edge_link_bits": ".4g"}),
        ],
    }
    for name, lines in pages.items():
        (args.out / name).write_text("\n".join(lines) + "\n")
        print(f"## {name}\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
