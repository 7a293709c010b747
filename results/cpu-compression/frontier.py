"""The bits/quality frontier: each setting's score against the uplink it sent.

    python results/cpu-compression/frontier.py --runs results/cpu-compression/runs --out results/cpu-compression

Per block (dataset, partition, budget) and setting: the mean uplink MB per run (exact: the
ledger's bits), the compression ratio against the reference (FedAvg's mean uplink over the
setting's), the score's mean over seeds with its 95 % Student-t interval (for a distance: the geometric
mean, its interval on the log values, never below 0), and the setting minus
the reference paired by seed (same seed = same partition, initial model, noises) with its own
interval (`api.seed_differences`). A setting is Pareto-optimal when no other trained setting
of its block sends at most its uplink with a score at least as good, one of the two strictly
(means; the reference is a candidate). The claim of FedDM (Vora et al. 2024: up to 4x less
communication for at most 1.75x the metric) is checked per method family: its settings with a
ratio >= 4 and the score ratio to the reference's mean (lower-is-better metrics; for a higher-is-better
one the reference's over the setting's), and whether any is <= 1.75 in the means (`holds`); whether the
claim is decided, seed-paired and one-sided, is the study's claims file's job (claims.md).
Writes frontier.md / .csv and frontier.png (log uplink axis, intervals, Pareto points circled,
the untrained floor as a line).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from dfbench.benchmark.api import (load_study, metric_table, reference_method, seed_differences,  # noqa: E402
                                   seed_interval, setting_names, study_main, write_study)

CLAIM_RATIO, CLAIM_METRIC = 4.0, 1.75  # FedDM: up to 4x less communication for at most 1.75x the metric
COLUMNS = ["dataset", "partition", "method", "setting", "name", "seeds", "uplink_mb", "compression", "mean", "low", "high",
           "diff", "diff_low", "diff_high", "wins", "metric_ratio", "pareto"]


def pareto_mask(uplink: np.ndarray, score: np.ndarray, higher_better: bool = False) -> np.ndarray:
    """True where no other point has uplink <= and score at least as good, one of them strictly."""
    s = -np.asarray(score, float) if higher_better else np.asarray(score, float)
    u = np.asarray(uplink, float)
    keep = np.ones(len(u), dtype=bool)
    for i in range(len(u)):
        dominated = (u <= u[i]) & (s <= s[i]) & ((u < u[i]) | (s < s[i]))
        keep[i] = not dominated.any()
    return keep


def frontier_table(runs: pd.DataFrame, metric: str, reference: str | None = None, higher_better: bool = False) -> pd.DataFrame:
    """One row per (block, trained setting) of a block that holds the reference; see the module doc."""
    reference = reference or reference_method()  # default: the method that declares itself the reference
    rows = []
    trained = runs[~runs["baseline"].astype(bool)].dropna(subset=[metric])
    names = setting_names(trained)  # the one naming function: method, hyperparameters off its defaults, config
    for (dataset, partition, _budget), block in trained.groupby(["dataset", "partition", "budget_key"], sort=True):
        ref = block[block["setting"] == reference]
        if ref.empty:
            continue
        ref_scores = ref.set_index("seed")[metric]
        ref_mean = seed_interval(ref_scores.to_list(), metric_table.scale(metric) == "log")[0]  # as `mean` below
        ref_uplink = float(ref["uplink_mb"].mean())
        part = []
        for setting, group in block.groupby("setting", sort=False):
            mean, low, high = seed_interval(group[metric].to_list(), metric_table.scale(metric) == "log")
            seeds, diff, dmean, dlow, dhigh = seed_differences(group.set_index("seed")[metric], ref_scores)
            uplink = float(group["uplink_mb"].mean())
            wins = int((diff > 0).sum() if higher_better else (diff < 0).sum())
            part.append({"dataset": dataset, "partition": partition, "method": str(group["method"].iloc[0]),
                         "setting": setting, "name": names[group.index[0]], "seeds": len(group), "uplink_mb": uplink,
                         "compression": ref_uplink / uplink if uplink > 0 else math.inf,
                         "mean": mean, "low": low, "high": high,
                         "diff": math.nan if setting == reference else dmean,
                         "diff_low": math.nan if setting == reference else dlow,
                         "diff_high": math.nan if setting == reference else dhigh,
                         "wins": "" if setting == reference else f"{wins}/{len(seeds)}",
                         "metric_ratio": (ref_mean / mean) if higher_better else (mean / ref_mean)})
        frame = pd.DataFrame(part)
        frame["pareto"] = pareto_mask(frame["uplink_mb"].to_numpy(), frame["mean"].to_numpy(), higher_better)
        rows.append(frame.sort_values(["uplink_mb", "mean"], ascending=[False, not higher_better], kind="stable"))
    if not rows:
        return pd.DataFrame(columns=COLUMNS)
    return pd.concat(rows, ignore_index=True)[COLUMNS]


def claim_table(table: pd.DataFrame, reference: str | None = None) -> pd.DataFrame:
    """Per block and method family (not the reference): the settings at >= 4x less uplink, the best
    score ratio among them and whether it is <= 1.75 (FedDM's claim)."""
    reference = reference or reference_method()  # default: the method that declares itself the reference
    rows = []
    for (dataset, partition, method), fam in table[table["setting"] != reference].groupby(
            ["dataset", "partition", "method"], sort=True):
        eligible = fam[fam["compression"] >= CLAIM_RATIO]
        best = eligible.loc[eligible["metric_ratio"].idxmin()] if len(eligible) else None
        rows.append({"dataset": dataset, "partition": partition, "method": method,
                     "settings_at_4x": len(eligible),
                     "best_setting": best["setting"] if best is not None else "",
                     "best_name": best["name"] if best is not None else "",
                     "best_compression": float(best["compression"]) if best is not None else math.nan,
                     "best_metric_ratio": float(best["metric_ratio"]) if best is not None else math.nan,
                     "holds": bool(best is not None and best["metric_ratio"] <= CLAIM_METRIC)})
    return pd.DataFrame(rows, columns=["dataset", "partition", "method", "settings_at_4x", "best_setting", "best_name",
                                       "best_compression", "best_metric_ratio", "holds"])


def _fmt_ci(low: float, high: float, signed: bool = False) -> str:
    if not (math.isfinite(low) and math.isfinite(high)):
        return ""
    return f" [{low:+.1f}, {high:+.1f}]" if signed else f" [{low:.1f}, {high:.1f}]"


def to_markdown(table: pd.DataFrame, claims: pd.DataFrame, metric: str, reference: str,
                floors: dict[tuple[str, str], float], higher_better: bool) -> str:
    better = "higher" if higher_better else "lower"
    lines = [f"# {metric} against uplink: the frontier", "",
             f"Per setting: mean uplink per run (exact bits of every message), the compression against "
             f"{reference}'s uplink, {metric} ({better} is better) with its 95 % Student-t interval over seeds, "
             f"the setting minus {reference} paired by seed with its interval and the seeds it wins, the "
             f"score ratio to {reference}'s mean, and ★ for the Pareto-optimal settings (no other sends "
             f"at most as much with a score at least as good). Written by "
             f"`python results/cpu-compression/frontier.py`."]
    for (dataset, partition), block in table.groupby(["dataset", "partition"], sort=False):
        floor = floors.get((dataset, partition))
        lines += ["", f"## {dataset} / {partition}", ""]
        if floor is not None:
            lines += [f"Untrained floor: {floor:.1f}.", ""]
        lines += [f"| setting | seeds | uplink MB | less uplink | {metric} [95% t] | − {reference}, paired [95% t] | wins | × {reference} | Pareto |",
                  "|---|---:|---:|---:|---|---|---:|---:|:---:|"]
        for _, r in block.iterrows():
            diff = "" if not math.isfinite(r["diff"]) else f"{r['diff']:+.1f}{_fmt_ci(r['diff_low'], r['diff_high'], True)}"
            lines.append(f"| {r['name']} | {r['seeds']} | {r['uplink_mb']:.2f} | {r['compression']:.1f}x | "
                         f"{r['mean']:.1f}{_fmt_ci(r['low'], r['high'])} | {diff} | {r['wins']} | "
                         f"{r['metric_ratio']:.2f} | {'★' if r['pareto'] else ''} |")
        fam = claims[(claims["dataset"] == dataset) & (claims["partition"] == partition)]
        if len(fam):
            lines += ["", f"FedDM's claim (at least {CLAIM_RATIO:g}x less uplink for at most {CLAIM_METRIC:g}x "
                      f"the metric of {reference}), per family: the best setting at >= {CLAIM_RATIO:g}x.", "",
                      "| family | settings at >= 4x | best of them | less uplink | × metric | ≤ 1.75× in the means (decided in claims.md) |",
                      "|---|---:|---|---:|---:|:---:|"]
            for _, c in fam.iterrows():
                if c["settings_at_4x"] == 0:
                    lines.append(f"| {c['method']} | 0 | – | – | – | no setting at {CLAIM_RATIO:g}x |")
                    continue
                lines.append(f"| {c['method']} | {c['settings_at_4x']} | {c['best_name']} | "
                             f"{c['best_compression']:.1f}x | {c['best_metric_ratio']:.2f} | {'yes' if c['holds'] else 'no'} |")
    return "\n".join(lines) + "\n"


def plot(table: pd.DataFrame, metric: str, reference: str, floors: dict[tuple[str, str], float],
         higher_better: bool, path: Path) -> Path:
    blocks = list(table.groupby(["dataset", "partition"], sort=False))
    fig, axes = plt.subplots(1, len(blocks), figsize=(8.5 * len(blocks), 5.6), squeeze=False)
    methods = sorted(table["method"].unique())
    colors = dict(zip(methods, plt.get_cmap("tab10").colors))
    for ax, ((dataset, partition), block) in zip(axes[0], blocks):
        for _, r in block.iterrows():
            yerr = None
            if math.isfinite(r["low"]):
                yerr = [[r["mean"] - r["low"]], [r["high"] - r["mean"]]]
            # an open marker for a setting without error feedback (its params say error_feedback=false)
            open_marker = "error_feedback=false" in r["setting"].lower()
            ax.errorbar([r["uplink_mb"]], [r["mean"]], yerr=yerr, fmt="o", color=colors[r["method"]],
                        mfc="white" if open_marker else colors[r["method"]], ms=6, capsize=3, elinewidth=1)
            if r["pareto"]:
                ax.plot([r["uplink_mb"]], [r["mean"]], "o", ms=15, mfc="none", mec="black", mew=1.2)
            ax.annotate(r["name"], (r["uplink_mb"], r["mean"]),
                        fontsize=6.5, xytext=(5, 4), textcoords="offset points")
        front = block[block["pareto"]].sort_values("uplink_mb")
        ax.step(front["uplink_mb"], front["mean"], where="post", color="black", lw=0.8, ls="--", alpha=0.6)
        floor = floors.get((dataset, partition))
        if floor is not None:
            ax.axhline(floor, color="#999", ls=":", lw=1)
            ax.annotate(f"untrained {floor:.0f}", (1, floor), xycoords=("axes fraction", "data"), ha="right",
                        va="bottom", fontsize=7, color="#666")
        ax.set_xscale("log")
        ax.set_xlabel("uplink per run (MB, log)")
        ax.set_ylabel(f"{metric} ({'higher' if higher_better else 'lower'} is better)")
        mean = "geometric mean" if metric_table.scale(metric) == "log" else "mean"
        ax.set_title(f"{dataset} / {partition}: {mean} over seeds, 95 % t-interval; circled: Pareto-optimal", fontsize=9)
        handles = [plt.Line2D([], [], marker="o", ls="", color=colors[m], label=m) for m in methods]
        handles.append(plt.Line2D([], [], marker="o", ls="", color="#444", mfc="white", label="no error feedback"))
        ax.legend(handles=handles, fontsize=7, loc="best")
        ax.grid(True, which="both", alpha=0.25)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def untrained_floors(runs: pd.DataFrame, metric: str) -> dict[tuple[str, str], float]:
    """Per (dataset, partition) the untrained baseline's score over seeds, averaged as every setting's `mean` is
    (the geometric mean for a distance: the leaderboard's untrained figure)."""
    base = runs[runs["baseline"].astype(bool)].dropna(subset=[metric])
    log = metric_table.scale(metric) == "log"
    return {k: float(seed_interval(g[metric].to_list(), log)[0]) for k, g in base.groupby(["dataset", "partition"])}


def write(runs_dir: str | Path, out: str | Path, reference: str | None = None, metric: str | None = None) -> list[Path]:
    reference = reference or reference_method()  # default: the method that declares itself the reference
    study = load_study(runs_dir, metric, reference=reference)
    metric, higher, runs = study.metric, study.higher, study.data.runs
    table = frontier_table(runs, metric, reference, higher)
    claims = claim_table(table, reference)
    floors = untrained_floors(runs, metric)
    return write_study(out, "frontier", to_markdown(table, claims, metric, reference, floors, higher), table,
                       lambda png: plot(table, metric, reference, floors, higher, png))


def main(argv: list[str] | None = None) -> int:
    return study_main(argv, "python results/cpu-compression/frontier.py", __doc__, "frontier.md/.csv/.png",
                      "the setting the compression and differences are against (default fedavg)", write)


if __name__ == "__main__":
    raise SystemExit(main())
