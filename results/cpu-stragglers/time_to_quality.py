"""Time to a quality: how long each setting needs to reach what a reference (FedAvg) reaches.

    python results/cpu-stragglers/time_to_quality.py --runs results/cpu-stragglers/runs --out results/cpu-stragglers

Targets come from the reference's own quality curves (curve.jsonl, eval.every), so they are
qualities the reference reaches: for each fraction f of `--at` (default 0.5 and 1), the target is
the worst, over the reference's seeds, of its curve value at its first point with at least f of
its final client work (every reference seed reaches it by then). For every setting and seed:
the simulated seconds and the client work (full-model images) of its first curve point at
least that good (no interpolation between points: a point every eval.every rounds), and the
time ratio to the reference's seed (paired: same seed = same partition, initial model, noises).
Beside them the final score (the run's full evaluation, not the curve) minus the reference's,
paired by seed, with its 95 % Student-t interval and the leaderboard's verdict (benchmark/report/
verdicts.py: the ratio of a positive metric, Holm over the block); the run's simulated time and client work.

Settings are told apart by the config the method does not name (frames.curve_labels: a driver,
a buffer, a deadline, capacity tiers); the reference is `--reference LABEL`, by default the
plain FedAvg of the block (setting `fedavg` without a driver, a deadline or capacity tiers).
Writes time_to_quality.md / .csv.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd

from dfbench.benchmark.api import (CONFIG_DEFAULTS, better, curve_labels, load_study, metric_table, reference_method,
                                   t_interval, write_study)
from dfbench.benchmark.api import verdicts as V

COLUMNS = ["dataset", "partition", "label", "seeds", "final", "final_diff", "final_low", "final_high", "final_verdict",
           "sim_seconds", "client_images", "target_fraction", "target", "reached", "seconds_to_target",
           "images_to_target", "time_ratio", "per_seed_seconds"]


def default_reference(runs: pd.DataFrame, labels: dict[str, str]) -> str:
    """The label of plain synchronous FedAvg: the reference method's setting (`Method.reference`), sync
    driver, no deadline, no tiers."""
    plain_method = reference_method()

    def plain(row: pd.Series) -> bool:
        def neutral(key: str) -> bool:  # absent (a run made before the key) or at the config default
            v = row.get(f"cfg.{key}")
            return v is None or (isinstance(v, float) and math.isnan(v)) or v == CONFIG_DEFAULTS[key]
        return row["setting"] == plain_method and all(neutral(k) for k in ("driver", "deadline", "capacity"))

    trained = runs[~runs["baseline"].astype(bool)] if "baseline" in runs else runs
    found = sorted({labels[str(r["run_id"])] for _, r in trained.iterrows() if plain(r) and str(r["run_id"]) in labels})
    if len(found) != 1:
        known = ", ".join(repr(x) for x in sorted(set(labels.values())))
        raise ValueError(f"{'no' if not found else 'more than one'} plain FedAvg setting with a quality curve "
                         f"({', '.join(found) or 'none'}); name the reference with --reference, one of: {known}")
    return found[0]


def _first_reaching(curve: pd.DataFrame, target: float, higher: bool) -> pd.Series | None:
    ok = curve[curve["value"] >= target] if higher else curve[curve["value"] <= target]
    return ok.iloc[0] if len(ok) else None


def reference_targets(curves: pd.DataFrame, fractions: list[float], higher: bool) -> dict[float, float]:
    """fraction -> the worst over the reference's seeds of its curve value at its first point with at
    least that fraction of its final client work. `curves`: the reference's points (one metric)."""
    out: dict[float, float] = {}
    for f in fractions:
        values = []
        for _, grp in curves.groupby("seed", sort=True):
            grp = grp.sort_values("round")
            work = grp["client_images"].to_numpy(dtype=np.float64)
            at = grp[work >= f * work[-1] - 1e-9]
            values.append(float(at["value"].iloc[0]))
        out[f] = min(values) if higher else max(values)
    return out


def time_to_quality_table(runs: pd.DataFrame, curves: pd.DataFrame, metric: str, curve_metric: str,
                          reference: str | None = None, fractions: tuple[float, ...] = (0.5, 1.0),
                          higher_final: bool = False) -> pd.DataFrame:
    """One row per (block, setting, target fraction); see the module docstring.

    `runs`: one row per run (frames.runs_frame: run_id, dataset, partition, setting, seed, baseline,
    sim_seconds, client_images, `metric`, cfg.* columns); `curves`: frames.curve_frame."""
    higher_curve = better(curve_metric) == "higher"
    labels = curve_labels(runs[runs["run_id"].isin(set(curves["run_id"]))])
    rows = []
    trained = runs[~runs["baseline"].astype(bool)] if "baseline" in runs else runs
    trained = trained[trained["run_id"].isin(set(labels))].assign(label=lambda f: f["run_id"].map(labels))
    pts = curves[curves["metric"] == curve_metric]
    positive = metric_table.scale(metric) == "log"
    tests: dict[tuple[str, str, str], tuple[float, float, float]] = {}  # (block, label) -> (p, p_equivalence, mean)
    for (dataset, partition), block in trained.groupby(["dataset", "partition"], sort=True):
        ref_label = reference or default_reference(block, labels)
        ref_runs = block[block["label"] == ref_label]
        if ref_runs.empty:
            raise ValueError(f"no runs of the reference {ref_label!r} in {dataset} / {partition}; "
                             f"settings: {', '.join(sorted(block['label'].unique()))}")
        ref_pts = pts[pts["run_id"].isin(set(ref_runs["run_id"]))].assign(seed=lambda f: f["seed"].astype(int))
        targets = reference_targets(ref_pts, list(fractions), higher_curve)
        ref_final = ref_runs.set_index(ref_runs["seed"].astype(int))[metric]

        def reach(run_id: str, target: float) -> pd.Series | None:
            return _first_reaching(pts[pts["run_id"] == run_id].sort_values("round"), target, higher_curve)

        ref_seconds = {f: {int(r["seed"]): float(hit["sim_seconds"]) for _, r in ref_runs.iterrows()
                           if (hit := reach(str(r["run_id"]), targets[f])) is not None} for f in fractions}
        order = [ref_label] + sorted(set(block["label"]) - {ref_label})
        for label in order:
            grp = block[block["label"] == label].sort_values("seed")
            seeds = [int(s) for s in grp["seed"]]
            final = grp.set_index(grp["seed"].astype(int))[metric]
            shared = [s for s in seeds if s in ref_final.index and math.isfinite(final[s]) and math.isfinite(ref_final[s])]
            diff = np.array([final[s] - ref_final[s] for s in shared])
            d_mean, d_low, d_high, verdict = math.nan, math.nan, math.nan, ""
            if label != ref_label and len(shared):
                d_mean, ci = t_interval(diff)
                d_low, d_high = (ci.low, ci.high) if ci else (math.nan, math.nan)
                # the verdict is the leaderboard's: on the ratio of a positive metric, Holm over the block (below)
                scale = "log" if positive and all(final[s] > 0 and ref_final[s] > 0 for s in shared) else "difference"
                x, r = V.transform([final[s] for s in shared], scale), V.transform([ref_final[s] for s in shared], scale)
                t = V.paired_t(x - r)
                bounds = V.equivalence_bounds(scale, V.MARGIN, float(np.mean([ref_final[s] for s in shared])))
                tests[(dataset, partition, label)] = (t.p, V.tost_p(x, r, bounds), t.mean)
            for f in fractions:
                secs, imgs, ratios, per_seed = [], [], [], []
                for _, r in grp.iterrows():
                    hit = reach(str(r["run_id"]), targets[f])
                    s = int(r["seed"])
                    if hit is None:
                        per_seed.append("-")
                        continue
                    secs.append(float(hit["sim_seconds"]))
                    imgs.append(float(hit["client_images"]))
                    per_seed.append(f"{float(hit['sim_seconds']):.0f}")
                    if s in ref_seconds[f] and ref_seconds[f][s] > 0:
                        ratios.append(float(hit["sim_seconds"]) / ref_seconds[f][s])
                rows.append({"dataset": dataset, "partition": partition, "label": label,
                             "seeds": ",".join(str(s) for s in seeds),
                             "final": float(np.mean([final[s] for s in seeds])),
                             "final_diff": d_mean, "final_low": d_low, "final_high": d_high, "final_verdict": verdict,
                             "sim_seconds": float(grp["sim_seconds"].mean()), "client_images": float(grp["client_images"].mean()),
                             "target_fraction": f, "target": targets[f], "reached": f"{len(secs)}/{len(seeds)}",
                             "seconds_to_target": float(np.mean(secs)) if secs else math.nan,
                             "images_to_target": float(np.mean(imgs)) if imgs else math.nan,
                             "time_ratio": float(np.mean(ratios)) if ratios else math.nan,
                             "per_seed_seconds": " / ".join(per_seed)})
    verdicts: dict[tuple[str, str, str], str] = {}
    for block in sorted({k[:2] for k in tests}):
        keys = [k for k in tests if k[:2] == block]
        for k, p, q in zip(keys, V.holm([tests[k][0] for k in keys]), V.holm([tests[k][1] for k in keys])):
            verdicts[k] = V.verdict(p, q, tests[k][2], lower_better=not higher_final)
    for row in rows:
        row["final_verdict"] = verdicts.get((row["dataset"], row["partition"], row["label"]), "")
    return pd.DataFrame(rows, columns=COLUMNS)


def _num(v: float, fmt: str) -> str:
    return format(v, fmt) if isinstance(v, (int, float)) and math.isfinite(v) else "–"


def to_markdown(table: pd.DataFrame, metric: str, curve_metric: str, curve_samples: str) -> str:
    fractions = sorted(table["target_fraction"].unique())
    lines = [f"# Time to a quality the reference reaches ({curve_metric} curves)",
             "",
             f"Targets: the reference's {curve_metric} on its quality curve ({curve_samples} fixed noises) at "
             + " and ".join(f"{f:g}" for f in fractions)
             + " of its client work, the worst of its seeds (each of them is there by then). `time`: simulated "
             "seconds to the first curve point at least that good, mean over the seeds that reach it (k/n "
             "reached), per seed in brackets; `× ref`: that time over the reference's, per seed, averaged. "
             f"`final`: the run's full evaluation ({metric}), mean over seeds; `Δ final`: minus the reference's, "
             "paired by seed, with its 95 % Student-t interval, and the leaderboard's verdict (the ratio of the scores, "
             "better / worse / equivalent within 10 % / inconclusive, Holm over the block). `sim s` / `work`: the "
             "run's simulated seconds and client work (thousands of full-model images). "
             "Written by `python results/cpu-stragglers/time_to_quality.py`."]
    for (dataset, partition), block in table.groupby(["dataset", "partition"], sort=False):
        head = [f"target {f:g}: {curve_metric} ≤ {block[block['target_fraction'] == f]['target'].iloc[0]:.1f}"
                if better(curve_metric) != "higher" else
                f"target {f:g}: {curve_metric} ≥ {block[block['target_fraction'] == f]['target'].iloc[0]:.1f}"
                for f in fractions]
        lines += ["", f"## {dataset} / {partition}", "",
                  "| setting | final | Δ final [95% t] | sim s | work | " + " | ".join(f"{h}: time | × ref" for h in head) + " |",
                  "|---|---:|---|---:|---:|" + "---|---:|" * len(fractions)]
        for label, grp in block.groupby("label", sort=False):
            first = grp.iloc[0]
            if math.isfinite(first["final_diff"]):
                ci = f" [{first['final_low']:+.1f}, {first['final_high']:+.1f}]" if math.isfinite(first["final_low"]) else ""
                delta = f"{first['final_diff']:+.1f}{ci} {first['final_verdict']}"
            else:
                delta = "(reference)" if first["final_verdict"] == "" and grp.index[0] == block.index[0] else "–"
            cells = []
            for f in fractions:
                r = grp[grp["target_fraction"] == f].iloc[0]
                k, n = r["reached"].split("/")
                time = _num(r["seconds_to_target"], ".0f") + ("" if k == n else f" ({k}/{n})") + f" [{r['per_seed_seconds']}]"
                cells += [time, _num(r["time_ratio"], ".2f")]
            lines.append(f"| {label} | {first['final']:.1f} | {delta} | {first['sim_seconds']:.0f} | "
                         f"{first['client_images'] / 1000:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write(runs_dir: str | Path, out: str | Path, reference: str | None = None,
          fractions: tuple[float, ...] = (0.5, 1.0)) -> list[Path]:
    study = load_study(runs_dir)
    data, metric = study.data, study.metric
    if data.curves.empty:
        raise ValueError(f"no quality curves under {runs_dir}: the runs need eval.every > 0")
    curve_metric = str(data.curves["metric"].mode().iloc[0])
    samples = sorted({str(int(n)) for n in data.curves["num_samples"].dropna()}) or ["?"]
    table = time_to_quality_table(data.runs, data.curves, metric, curve_metric, reference, fractions, study.higher)
    return write_study(out, "time_to_quality", to_markdown(table, metric, curve_metric, "/".join(samples)), table)


def _fractions(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or not all(0.0 < v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"--at {text!r}: give fractions in (0, 1] of the reference's client work, e.g. 0.5,1")
    return values


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python results/cpu-stragglers/time_to_quality.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", required=True, help="root of the run folders (runs with eval.every > 0)")
    p.add_argument("--out", required=True, help="folder for time_to_quality.md/.csv")
    p.add_argument("--reference", default=None, help="the setting label the targets come from (default: plain synchronous FedAvg)")
    p.add_argument("--at", type=_fractions, default=(0.5, 1.0),
                   help="fractions of the reference's client work whose quality is a target (default 0.5,1)")
    a = p.parse_args(argv)
    try:
        for path in write(a.runs, a.out, a.reference, a.at):
            print(path)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"error: {err}") from None
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
