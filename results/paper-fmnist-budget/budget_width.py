"""Budget x width: does a method collapse because of what it is, or because its budget starves it?

    python results/paper-fmnist-budget/budget_width.py results/paper-fmnist-budget

reads the study's ``runs.csv`` (written by `dfbench report`) and writes, from it alone:

- ``budget_width.csv``: one row per network x rounds x setting: the seeds, the ranking metric per seed
  (";"-joined), its geometric mean, how many seeds collapsed, the parameter count and the training
  speed (median client images per second, from the run folders' metrics.json where they are there);
- ``budget_width.md``: that table for a README to include (``<!-- include: budget_width.md -->``);
- ``budget_width.png``: per network, the metric of every seed against the rounds (0: the untrained model
  of that seed), one thin line per seed and method, the geometric mean thick, on a log axis.

A seed *collapsed* when its score lies nearer the untrained model's (same network, same seed) than the
reference method's at the same network, rounds and seed, on the log scale: the leaderboard's rule
(`verdicts.collapsed`), here per budget. The reference is `--reference` (default fedavg).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from dfbench.benchmark.api import is_baseline, reference_method, setting_names, speeds  # noqa: E402
from dfbench.benchmark.api import verdicts as V  # noqa: E402

COLUMNS = ["model", "num_parameters", "rounds", "setting", "seeds", "n", "per_seed", "gmean", "collapsed", "collapse_seeds",
           "images_per_s"]


def summarize(runs: pd.DataFrame, metric: str = "fd_fmnist", reference: str | None = None,
              speed: dict[str, float] | None = None) -> pd.DataFrame:
    """One row per network x rounds x setting (the untrained model as rounds 0), in that order;
    `speed` (run_id -> images/s, `api.speeds`) gives each trained row its median over the seeds."""
    reference = reference or reference_method()  # default: the method that declares itself the reference
    need = {"method", "seed", "baseline", "cfg.model", "cfg.rounds", metric}
    missing = sorted(need - set(runs.columns))
    if missing:
        raise ValueError(f"runs.csv lacks {', '.join(missing)}: write it with `dfbench report --runs RUNS --out STUDY` "
                         "from runs that record the network (train.model) and the rounds")
    runs = runs[runs[metric].notna()].copy()
    if not (runs[metric] > 0).all():
        raise ValueError(f"{metric} must be positive to compare on the log scale (a distance, a loss)")
    runs["untrained"] = runs.apply(is_baseline, axis=1)
    runs["label"] = pd.Series(setting_names(runs.drop(columns=["cfg.model", "cfg.rounds"])), dtype=object)
    log = np.log(runs[metric].astype(float))
    rows = []
    for (model, rounds, label), grp in runs.groupby(["cfg.model", "cfg.rounds", "label"], sort=True):
        grp = grp.sort_values("seed")
        seeds = [int(s) for s in grp["seed"]]
        values = grp[metric].astype(float).tolist()
        collapsed = collapse_seeds = math.nan
        if not grp["untrained"].iloc[0] and label != reference:
            floor = runs[(runs["cfg.model"] == model) & runs["untrained"]].set_index("seed")
            ref = runs[(runs["cfg.model"] == model) & (runs["cfg.rounds"] == rounds) & (runs["label"] == reference)]
            ref = ref.set_index("seed")
            both = [s for s in seeds if s in floor.index and s in ref.index]
            collapse_seeds = len(both)
            collapsed = sum(V.collapsed(float(log[grp.index[seeds.index(s)]]), math.log(float(floor.at[s, metric])),
                                        math.log(float(ref.at[s, metric]))) for s in both)
        params = grp["num_parameters"].dropna() if "num_parameters" in grp else pd.Series(dtype=float)
        rates = [speed[str(r)] for r in grp.get("run_id", []) if speed and str(r) in speed]
        rows.append({"model": model, "num_parameters": int(params.iloc[0]) if len(params) else math.nan,
                     "rounds": int(rounds), "setting": label, "seeds": ";".join(map(str, seeds)), "n": len(seeds),
                     "per_seed": ";".join(f"{v:.1f}" for v in values),
                     "gmean": float(np.exp(np.mean(np.log(values)))), "collapsed": collapsed,
                     "collapse_seeds": collapse_seeds, "images_per_s": float(np.median(rates)) if rates else math.nan})
    return pd.DataFrame(rows, columns=COLUMNS)


def to_markdown(table: pd.DataFrame, metric: str) -> str:
    lines = [f"| network (parameters) | rounds | setting | {metric} per seed | geometric mean | collapsed | images/s |",
             "|---|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        width = f"{r['model']} ({int(r['num_parameters']):,})" if not pd.isna(r["num_parameters"]) else str(r["model"])
        seeds = str(r["seeds"]).split(";")
        per_seed = ", ".join(f"s{s} {v}" for s, v in zip(seeds, str(r["per_seed"]).split(";")))
        fell = "" if pd.isna(r["collapsed"]) else f"{int(r['collapsed'])}/{int(r['collapse_seeds'])}"
        rate = "" if pd.isna(r["images_per_s"]) else f"{r['images_per_s']:.0f}"
        lines.append(f"| {width} | {int(r['rounds'])} | {r['setting']} | {per_seed} | {r['gmean']:.1f} | {fell} | {rate} |")
    return ("\n".join(lines) + "\n\nPer seed the run's score; geometric mean over the seeds; collapsed: seeds nearer "
            "(log scale) the untrained model's score at that width and seed than the reference's at that width, "
            "rounds and seed; images/s: the median over the seeds of client images per second of training wall "
            "time, one torch thread per run (metrics.json); client images count in full-model equivalents, so a keep-0.5 "
            "row reads half the images/s of the same wall time.\n")


def figure(table: pd.DataFrame, metric: str, path: Path) -> Path:
    """Per network, each seed's score against the rounds; every line starts at that seed's untrained model."""
    models = list(dict.fromkeys(table["model"]))
    fig, axes = plt.subplots(1, len(models), figsize=(5.2 * len(models), 4.2), sharey=True, squeeze=False)
    trained = [s for s in dict.fromkeys(table["setting"]) if not str(s).startswith("untrained")]
    colours = dict(zip(trained, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for ax, model in zip(axes[0], models):
        sub = table[table["model"] == model]
        floor = sub[sub["setting"].astype(str).str.startswith("untrained")]
        start = dict(zip(str(floor["seeds"].iloc[0]).split(";"), map(float, str(floor["per_seed"].iloc[0]).split(";")))) \
            if len(floor) else {}
        for setting in trained:
            rows = sub[sub["setting"] == setting].sort_values("rounds")
            if rows.empty:
                continue
            per = [dict(zip(str(r["seeds"]).split(";"), map(float, str(r["per_seed"]).split(";")))) for _, r in rows.iterrows()]
            xs = ([0] if start else []) + rows["rounds"].astype(int).tolist()
            for seed in sorted(set().union(*per), key=int):
                ys = ([start.get(seed, math.nan)] if start else []) + [p.get(seed, math.nan) for p in per]
                ax.plot(xs, ys, color=colours[setting], alpha=0.35, lw=1, marker="o", ms=3)
            g0 = [float(floor["gmean"].iloc[0])] if start else []
            ax.plot(xs, g0 + rows["gmean"].tolist(), color=colours[setting], lw=2.5, marker="o", label=setting)
        params = sub["num_parameters"].dropna()
        ax.set_title(f"{model}" + (f" ({int(params.iloc[0]):,} parameters)" if len(params) else ""))
        ax.set_yscale("log")
        ax.set_xlabel("rounds (0 = untrained)")
        ax.set_xticks(sorted({0, *sub["rounds"].astype(int)}))
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel(f"{metric} (log; thin: one seed, thick: geometric mean)")
    axes[0][-1].legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python results/paper-fmnist-budget/budget_width.py", description=__doc__.split("\n")[0])
    ap.add_argument("study", type=Path, help="the study folder holding runs.csv (results/paper-fmnist-budget)")
    ap.add_argument("--metric", default="fd_fmnist", help="a positive score in runs.csv (default fd_fmnist)")
    ap.add_argument("--reference", default=reference_method(), help="the setting whose score a collapsed seed is farther from")
    args = ap.parse_args(argv)
    path = args.study / "runs.csv"
    if not path.is_file():
        print(f"{path} not found: `dfbench report --runs RUNS --out {args.study}` writes it", file=sys.stderr)
        return 2
    try:
        table = summarize(pd.read_csv(path), args.metric, args.reference, speeds(args.study / "runs"))
    except ValueError as e:
        print(f"budget_width: {e}", file=sys.stderr)
        return 2
    table.to_csv(args.study / "budget_width.csv", index=False)
    (args.study / "budget_width.md").write_text(to_markdown(table, args.metric), encoding="utf-8")
    figure(table, args.metric, args.study / "budget_width.png")
    print(f"wrote {args.study}/budget_width.csv, .md and .png ({len(table)} rows)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
