"""Figures and a summary table for the pruning study (Qiao et al., ICML 2025) on one dataset.

    python results/paper-fmnist/paper_figures.py --runs results/paper-fmnist/runs --out results/paper-fmnist

reads the finished runs of a pruning grid (random_prune / topk_prune at several keep ratios,
FedAvg, the untrained baseline; `results/paper-fmnist/paper-fmnist.toml`) and writes

- paper_claims.md: the paper's claims C1-C4 checked against those numbers;
- paper_summary.csv / .md: per (family, keep ratio) the mean over its own seeds (the metric's: a geometric
  mean, its interval on the log values, so never below 0) and a 95 % t-interval of
  the primary metric, the same-noise drift (pixels, classifier features), w^2 and Gamma*; beside it the
  metric's geometric mean over the seeds every row ran (`shared_n`), the column to compare rows by;
- paper_metric_vs_keep.png, paper_drift_vs_keep.png: those means with their intervals;
- paper_metric_vs_bound.png: every run's metric against its w^2 and its Gamma*;
- paper_samples.png: the paper's Figure 4-6 layout, one row per keep ratio, one column block per
  family, each block the first 30 fixed-noise samples (3 x 10) of one seed, so the same noise
  sits at the same place in every block;
- paper_rules.csv / .md: per (family, keep ratio, inference rule) the mean and 95 % t-interval of
  the primary metric, every rule scored on the same trained models (eval.inference_variants).

    python results/paper-fmnist/paper_figures.py --runs results/paper-fmnist/rules/runs \
        --out results/paper-fmnist/rules --choose-rules

writes only paper_rules.* and rule_choice.md: each family's inference rule with the lowest mean
metric over its keep ratios (the held-out seed's grid, paper-fmnist-rules.toml, chooses the rules
the study then uses; a rule is never chosen per run from the score it is judged by).

`--model NAME` keeps the runs of one train.model: results/cifar10-gpu's grid trains the pruning study on
diffusers-ddpm-cifar10 and issue 53's sub-models (their own FedAvg and random masks among them) on ddpm32.

FedAvg is the keep-1.0 point of both families (keep 1.0 is bitwise FedAvg; tests/unit/test_pruning.py).

Every comparison between settings (the claims' C1 paired differences, C2's order, C3's change against
FedAvg, C4's sequences, the floor ratios, the summary's shared column) uses only the seeds the compared
settings all ran, and says how many: rows of 16 seeds beside rows of 3 compare on the 3.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, often on headless machines

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from dfbench.benchmark.api import (INFERENCE_MODES, collect, load_samples, primary_metric,  # noqa: E402
                                   reference_method, run_drift, runfolder, seed_differences)
from dfbench.benchmark.api import t_interval as student_t  # noqa: E402  (t_interval below is this module's)

FAMILIES = {"random_prune": "random", "topk_prune": "top-k"}
COLORS = {"random": "tab:orange", "top-k": "tab:blue"}
SAMPLES_PER_CELL, CELL_ROWS = 30, 3


def of_model(runs: pd.DataFrame, model: str | None) -> pd.DataFrame:
    """The runs that trained train.model `model` (None: all); a grid of two networks (results/cifar10-gpu: the
    pruning study on one, issue 53's sub-models on another) draws its figures for one."""
    if model is None or runs.empty:
        return runs
    if "cfg.model" not in runs:
        raise ValueError(f"--model {model}: the runs record no train.model")
    return runs[runs["cfg.model"].astype(str) == model]


def study_runs(runs_dir: str | Path, model: str | None = None) -> tuple[pd.DataFrame, str]:
    """One row per finished run (of train.model `model`, None: every run): family, keep, seed, metric, drift, w2,
    gamma_star, path.

    FedAvg runs appear once per family at keep 1.0; the untrained baseline as family "untrained".
    """
    data = collect(runs_dir)
    runs = of_model(data.runs, model)
    metric = primary_metric(data.metrics)
    if runs.empty or metric is None:
        raise ValueError(f"no scored runs under {runs_dir}; run the grid first (make bench-paper-fmnist)")
    rows = []
    reference = reference_method()  # its runs are each family's keep-1.0 point (FedAvg)
    for _, r in runs.iterrows():
        base = {"seed": int(r["seed"]), "metric": float(r[metric]), "w2": float(r["w2_mean"]),
                "gamma_star": float(r["gamma_star"]), "path": r["path"]}
        rec = run_drift(r["path"])  # as metrics.json (or drift.json, recorded later) has it: the reporter computes none
        base["drift_pixel"] = rec["pixel"] if rec else math.nan
        base["drift_features"] = (rec or {}).get("features", {}).get("fmnist", math.nan) if rec else math.nan
        if r["baseline"]:  # its "reference" is itself (FedAvg at rounds 0): no drift to show
            rows.append({**base, "family": "untrained", "keep": math.nan, "drift_pixel": math.nan, "drift_features": math.nan})
        elif r["method"] == reference:
            rows += [{**base, "family": fam, "keep": 1.0} for fam in FAMILIES.values()]
        elif r["method"] in FAMILIES:
            rows.append({**base, "family": FAMILIES[r["method"]], "keep": float(r["param.keep_ratio"])})
    return pd.DataFrame(rows), metric


RULE_COLUMNS = ["family", "keep", "seed", "rule", "configured", "metric"]


def rule_runs(runs_dir: str | Path, model: str | None = None) -> pd.DataFrame:
    """One row per pruning run (of train.model `model`, None: every run) x inference rule: family, keep, seed,
    rule, configured (the run's result) and the primary metric under that rule; empty when no run scored its rules."""
    data = collect(runs_dir)
    metric = primary_metric(data.metrics)
    inf = data.inference
    if metric is None or inf.empty:
        return pd.DataFrame(columns=RULE_COLUMNS)
    inf = inf[(inf["metric"] == metric) & inf["method"].isin(list(FAMILIES))
              & inf["run_id"].isin(of_model(data.runs, model)["run_id"])]
    keep = data.runs.set_index("run_id")["param.keep_ratio"]
    return pd.DataFrame({
        "family": inf["method"].map(FAMILIES), "keep": inf["run_id"].map(keep).astype(float),
        "seed": inf["seed"].astype(int), "rule": inf["inference"].astype(str),
        "configured": inf["configured"].astype(bool), "metric": inf["value"].astype(float),
    }, columns=RULE_COLUMNS).reset_index(drop=True)


def rule_summary(rules: pd.DataFrame) -> pd.DataFrame:
    """Per (family, keep, rule): n seeds, mean / low / high of the metric (95 % t-interval)."""
    out = []
    for (family, keep, rule), grp in rules.groupby(["family", "keep", "rule"], sort=False):
        mean, low, high = t_interval(grp["metric"].to_numpy(), log=True)
        out.append({"family": family, "keep": keep, "rule": rule, "n": len(grp),
                    "seeds": ";".join(map(str, sorted(grp["seed"]))), "metric_mean": mean, "metric_low": low, "metric_high": high})
    table = pd.DataFrame(out, columns=["family", "keep", "rule", "n", "seeds", "metric_mean", "metric_low", "metric_high"])
    order = {r: i for i, r in enumerate(INFERENCE_MODES)}
    return table.sort_values(["family", "keep", "rule"], ascending=[True, False, True],
                             key=lambda s: s.map(order) if s.name == "rule" else s).reset_index(drop=True)


def choose_rules(summary: pd.DataFrame) -> pd.DataFrame:
    """Per family and rule: the mean of the per-keep means over the keep ratios the family has, and
    whether that rule is the family's choice (the lowest such mean among the rules scored at every
    keep ratio). Ranked best first within each family."""
    out = []
    for family, grp in summary.groupby("family", sort=False):
        keeps = set(grp["keep"])
        for rule, sub in grp.groupby("rule", sort=False):
            complete = set(sub["keep"]) == keeps
            out.append({"family": family, "rule": rule, "keeps": len(sub), "complete": complete,
                        "mean_over_keeps": float(sub["metric_mean"].mean()),
                        "best_at": ";".join(f"{k:g}" for k in sorted(keeps, reverse=True)
                                            if grp[grp["keep"] == k].sort_values("metric_mean")["rule"].iloc[0] == rule)})
    table = pd.DataFrame(out, columns=["family", "rule", "keeps", "complete", "mean_over_keeps", "best_at"])
    table = table.sort_values(["family", "complete", "mean_over_keeps"], ascending=[True, False, True]).reset_index(drop=True)
    table["chosen"] = ~table.duplicated("family") & table["complete"]
    return table


def write_rules(summary: pd.DataFrame, metric: str, out: Path) -> None:
    """paper_rules.csv / .md: the metric under every inference rule, per family and keep ratio."""
    summary.to_csv(out / "paper_rules.csv", index=False, float_format="%.6g")
    rules = [r for r in INFERENCE_MODES if r in set(summary["rule"])]
    lines = [f"| family | keep | n | " + " | ".join(f"{metric}, `{r}`" for r in rules) + " |",
             "|---|---:|---:|" + "---|" * len(rules)]
    for (family, keep), grp in summary.groupby(["family", "keep"], sort=False):
        by = grp.set_index("rule")
        cells = [_fmt(by.loc[r]) if r in by.index else "–" for r in rules]
        lines.append(f"| {family} | {keep:g} | {int(grp['n'].max())} | " + " | ".join(cells) + " |")
    note = ("Geometric mean over seeds with a 95 % Student-t interval (on the log values) in brackets; every rule samples the same trained "
            "model from the same fixed noises (`eval.inference_variants`). full: the global model as it is; "
            "scaled: each pruned tensor times its expected keep fraction; submodel: the global model times the "
            "family's own mask at the clients' keep ratio (top-k: its largest weights; random: one seeded mask).")
    (out / "paper_rules.md").write_text("\n".join(lines) + "\n\n" + note + "\n")


def write_rule_choice(choice: pd.DataFrame, summary: pd.DataFrame, metric: str, out: Path) -> None:
    seeds = sorted({s for v in summary["seeds"] for s in str(v).split(";")})
    lines = [f"Computed by `results/paper-fmnist/paper_figures.py --choose-rules` from the runs of seed(s) {', '.join(seeds)}: "
             f"each family's rule with the lowest {metric} averaged over its keep ratios (lower is better).", "",
             f"| family | rule | mean {metric} over keeps | keeps | best at keep | chosen |", "|---|---|---:|---:|---|---|"]
    for _, r in choice.iterrows():
        lines.append(f"| {r['family']} | `{r['rule']}` | {r['mean_over_keeps']:.1f} | {r['keeps']} | {r['best_at'] or '–'} | "
                     f"{'**yes**' if r['chosen'] else ''} |")
    (out / "rule_choice.md").write_text("\n".join(lines) + "\n")


def t_interval(values: np.ndarray, level: float = 0.95, *, log: bool = False) -> tuple[float, float, float]:
    """(mean, low, high) of the finite values: `api.t_interval` as plain floats, with nan
    for what it cannot give (no value: all nan; one seed: nan bounds), so tables stay numeric.
    `log` (a positive metric: a Frechet distance): on the log values, mapped back, i.e. the geometric
    mean and its interval, which never reaches 0 (verdicts.py compares such metrics as ratios)."""
    finite = [float(v) for v in np.asarray(values, dtype=np.float64) if math.isfinite(v)]
    if not finite:
        return math.nan, math.nan, math.nan
    if log and all(v > 0 for v in finite):
        mean, interval = student_t([math.log(v) for v in finite], level)
        return (math.exp(mean), math.exp(interval.low), math.exp(interval.high)) if interval else (math.exp(mean), math.nan, math.nan)
    mean, interval = student_t(finite, level)
    return (mean, interval.low, interval.high) if interval else (mean, math.nan, math.nan)


def _cell(study: pd.DataFrame, family: str, keep: float) -> pd.DataFrame:
    """The runs of one (family, keep) row; keep NaN: the untrained baseline's."""
    at = study[study["family"] == family]
    return at[at["keep"].isna()] if isinstance(keep, float) and math.isnan(keep) else at[at["keep"] == keep]


def shared_seeds(study: pd.DataFrame, cells: list[tuple[str, float]]) -> list[int]:
    """The seeds every (family, keep) of `cells` ran, sorted: the only seeds on which they are compared."""
    sets = [set(_cell(study, f, k)["seed"].astype(int)) for f, k in cells]
    return sorted(set.intersection(*sets)) if sets else []


def mean_on(study: pd.DataFrame, family: str, keep: float, seeds: list[int], col: str = "metric") -> float:
    """The mean of `col` of one (family, keep) over `seeds` (the metric: its geometric mean); NaN without them."""
    at = _cell(study, family, keep)
    values = at[at["seed"].astype(int).isin(seeds)][col].to_numpy(dtype=float)
    return t_interval(values, log=col == "metric")[0] if len(values) else math.nan


def paired_ratio(study: pd.DataFrame, a: tuple[str, float], b: tuple[str, float]) -> tuple[float, int]:
    """(geometric mean over their shared seeds of metric(a) / metric(b), how many seeds); NaN without one."""
    seeds = shared_seeds(study, [a, b])
    if not seeds:
        return math.nan, 0
    return mean_on(study, *a, seeds) / mean_on(study, *b, seeds), len(seeds)  # a ratio of geometric means: the paired one


def summarize(study: pd.DataFrame) -> pd.DataFrame:
    """Per (family, keep): n seeds and mean/low/high of every numeric column over its own seeds; and the
    metric's geometric mean over the `shared_n` seeds every row ran (`metric_shared`), to compare rows by."""
    out = []
    cells = [(f, k) for (f, k), _ in study.groupby(["family", "keep"], dropna=False, sort=False)]
    common = shared_seeds(study, cells)
    for (family, keep), grp in study.groupby(["family", "keep"], dropna=False, sort=False):
        row = {"family": family, "keep": keep, "n": len(grp), "seeds": ";".join(map(str, sorted(grp["seed"])))}
        for col in ("metric", "drift_pixel", "drift_features", "w2", "gamma_star"):
            row[f"{col}_mean"], row[f"{col}_low"], row[f"{col}_high"] = t_interval(grp[col].to_numpy(), log=col == "metric")
        row["shared_n"], row["metric_shared"] = len(common), mean_on(study, family, keep, common)
        out.append(row)
    table = pd.DataFrame(out)
    order = {"random": 0, "top-k": 1, "untrained": 2}
    return table.sort_values(["family", "keep"], key=lambda s: s.map(order) if s.name == "family" else -s.fillna(-1)).reset_index(drop=True)


def _errorbar(ax: plt.Axes, table: pd.DataFrame, col: str, family: str) -> None:
    sub = table[table["family"] == family].sort_values("keep")
    mean = sub[f"{col}_mean"].to_numpy()
    err = np.vstack([mean - sub[f"{col}_low"].to_numpy(), sub[f"{col}_high"].to_numpy() - mean])
    ax.errorbar(sub["keep"], mean, yerr=np.nan_to_num(err), marker="o", capsize=4, color=COLORS[family], label=family)


def plot_metric_vs_keep(table: pd.DataFrame, metric: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for family in FAMILIES.values():
        _errorbar(ax, table, "metric", family)
    untrained = table[table["family"] == "untrained"]
    if len(untrained):
        ax.axhline(float(untrained["metric_mean"].iloc[0]), color="gray", ls="--", label="untrained")
    ax.set(xlabel="keep ratio", ylabel=f"{metric} (lower is better)", title=f"{metric} vs keep ratio\n(geometric mean, 95% t-interval\nover each point's own seeds)")
    ax.set_ylim(bottom=0)
    ax.invert_xaxis()
    ax.legend()
    return _save(fig, path)


def plot_drift_vs_keep(table: pd.DataFrame, path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, col, label in ((axes[0], "drift_features", "classifier-feature distance"), (axes[1], "drift_pixel", "RMS pixel distance ([0, 1])")):
        for family in FAMILIES.values():
            _errorbar(ax, table, col, family)
        ax.set(xlabel="keep ratio", ylabel=label, title=f"same-noise drift from FedAvg: {label}")
        ax.invert_xaxis()
        ax.legend()
    return _save(fig, path)


def plot_metric_vs_bound(study: pd.DataFrame, metric: str, path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    pruned = study[study["family"].isin(list(FAMILIES.values()))]
    for ax, col, label in ((axes[0], "w2", "w² (mean over rounds)"), (axes[1], "gamma_star", "Γ* (min clients per parameter)")):
        dense = pruned[(pruned["keep"] == 1.0) & (pruned["family"] == "random")]  # each FedAvg run once
        ax.scatter(dense[col], dense["metric"], color="black", label="FedAvg (keep 1)", alpha=0.8)
        for family in FAMILIES.values():
            sub = pruned[(pruned["family"] == family) & (pruned["keep"] < 1.0)]
            ax.scatter(sub[col], sub["metric"], color=COLORS[family], label=family, alpha=0.8)
            for _, r in sub.iterrows():
                ax.annotate(f"{r['keep']:g}", (r[col], r["metric"]), fontsize=7, xytext=(3, 2), textcoords="offset points")
        ax.set(xlabel=label, ylabel=metric, title=f"{metric} vs {label.split(' ')[0]} (each point a run, label = keep)")
        ax.legend()
    return _save(fig, path)


def plot_samples(study: pd.DataFrame, path: Path, seed: int | None = None) -> Path | str:
    """Rows: keep ratios; column blocks: families; cells: 3 x 10 of the first 30 samples. A note instead
    (the figure left as it is) when the runs' samples.npz are not there: a committed study keeps its run
    folders without samples."""
    pruned = study[study["family"].isin(list(FAMILIES.values()))]
    seed = int(pruned["seed"].min()) if seed is None else seed
    missing = [p for p in pruned[pruned["seed"] == seed]["path"] if not (Path(p) / runfolder.SAMPLES).is_file()]
    if missing:
        return (f"not redrawn: {len(missing)} run(s) of seed {seed} have no samples.npz (a committed study keeps "
                f"none; rerun the grid to draw it), {path.name} left as it is")
    keeps = sorted(pruned["keep"].unique(), reverse=True)
    fams = list(FAMILIES.values())
    fig, axes = plt.subplots(len(keeps), len(fams), figsize=(6.2 * len(fams), 2.3 * len(keeps) + 0.4), squeeze=False)
    for i, keep in enumerate(keeps):
        for j, family in enumerate(fams):
            ax = axes[i][j]
            ax.set_xticks([])
            ax.set_yticks([])
            hit = pruned[(pruned["family"] == family) & (pruned["keep"] == keep) & (pruned["seed"] == seed)]
            if hit.empty:
                ax.set_title(f"{family}, keep {keep:g}: no run", fontsize=9)
                continue
            r = hit.iloc[0]
            ax.imshow(_tile(load_samples(Path(r["path"]))), cmap="gray", vmin=0, vmax=255)
            ax.set_title(f"{family}, keep {keep:g}: metric {r['metric']:.0f}, drift {r['drift_features']:.1f}", fontsize=9)
            if j == 0:
                ax.set_ylabel(f"keep {keep:g}")
    fig.suptitle(f"first {SAMPLES_PER_CELL} fixed-noise samples, seed {seed} (same noise at the same place in every block)")
    return _save(fig, path)


def _tile(images: np.ndarray) -> np.ndarray:
    """The first 30 uint8 [N, 1, H, W] images as a CELL_ROWS x 10 grid with 1-pixel white gaps."""
    n, _, h, w = images.shape
    cols = SAMPLES_PER_CELL // CELL_ROWS
    canvas = np.full((CELL_ROWS * (h + 1) - 1, cols * (w + 1) - 1), 255, dtype=np.uint8)
    for k in range(min(n, SAMPLES_PER_CELL)):
        r, c = divmod(k, cols)
        canvas[r * (h + 1):r * (h + 1) + h, c * (w + 1):c * (w + 1) + w] = images[k, 0]
    return canvas


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_summary(table: pd.DataFrame, metric: str, out: Path) -> None:
    table.to_csv(out / "paper_summary.csv", index=False, float_format="%.6g")

    def cell(row: pd.Series, col: str, digits: int) -> str:
        mean, low, high = row[f"{col}_mean"], row[f"{col}_low"], row[f"{col}_high"]
        if not np.isfinite(mean):
            return "–"
        return f"{mean:.{digits}f}" + (f" [{low:.{digits}f}, {high:.{digits}f}]" if np.isfinite(low) else "")

    k = int(table["shared_n"].iloc[0]) if len(table) else 0
    lines = [f"| family | keep | n | {metric} (own seeds) | {metric}, {k} shared seeds | drift (features) | drift (pixels) | w² | Γ* |",
             "|---|---:|---:|---|---:|---|---|---|---|"]
    for _, r in table.iterrows():
        keep = "–" if not np.isfinite(r["keep"]) else f"{r['keep']:g}"
        shared = f"{r['metric_shared']:.1f}" if np.isfinite(r["metric_shared"]) else "–"
        lines.append(f"| {r['family']} | {keep} | {r['n']} | {cell(r, 'metric', 1)} | {shared} | {cell(r, 'drift_features', 2)} | "
                     f"{cell(r, 'drift_pixel', 3)} | {cell(r, 'w2', 3)} | {cell(r, 'gamma_star', 2)} |")
    note = ("Mean over each row's own n seeds with a 95 % Student-t interval in brackets (the metric: geometric mean, "
            "interval on the log values): rows of different n are not compared there. "
            f"{metric}, {k} shared seeds: the geometric mean over the {k} seeds every row ran, the column to compare "
            "rows by. FedAvg is the keep-1.0 row of both "
            "families. Drift: mean distance between sample i of the run and sample i of FedAvg (same seed, "
            "same noise), in the Fashion-MNIST classifier's features and in RMS pixels.")
    (out / "paper_summary.md").write_text("\n".join(lines) + "\n\n" + note + "\n")


def _fmt(row: pd.Series, col: str = "metric", digits: int = 1) -> str:
    mean, low, high = row[f"{col}_mean"], row[f"{col}_low"], row[f"{col}_high"]
    return f"{mean:.{digits}f}" + (f" [{low:.{digits}f}, {high:.{digits}f}]" if np.isfinite(low) else "")


def _own(a: pd.Series, b: pd.Series) -> str:
    """The note that two summary rows are each over their own seeds, where their counts differ."""
    return "" if int(a["n"]) == int(b["n"]) else f" (each over its own seeds: {int(a['n'])} and {int(b['n'])})"


def paired_differences(study: pd.DataFrame, keep: float) -> str:
    """Per seed top-k minus random at `keep` (negative: top-k better), the count of seeds where
    top-k is better, and the mean difference with its 95 % t-interval; "" without a shared seed."""
    at = study[study["keep"] == keep]
    t = at[at["family"] == "top-k"].set_index("seed")["metric"]
    r = at[at["family"] == "random"].set_index("seed")["metric"]
    seeds, diff, mean, low, high = seed_differences(t, r)
    if not seeds:
        return ""
    per = ", ".join(f"seed {s_}: {d:+.1f}" for s_, d in zip(seeds, diff))
    ci = f" [{low:+.1f}, {high:+.1f}]" if np.isfinite(low) else ""
    return f"{per}; top-k better at {int((diff < 0).sum())} of {len(seeds)}; mean {mean:+.1f}{ci}"


def rule_claims(rules: pd.DataFrame) -> list[str]:
    """C1 with both families sampled under the same inference rule, for every rule scored."""
    if rules.empty:
        return []
    summary = {(r["family"], r["keep"], r["rule"]): r for _, r in rule_summary(rules).iterrows()}
    lines = ["\n**C1 under each inference rule** (both families sampled by the same rule, on the same trained models)"]
    for rule in INFERENCE_MODES:
        sub = rules[rules["rule"] == rule]
        keeps = sorted(set(sub[sub["family"] == "random"]["keep"]) & set(sub[sub["family"] == "top-k"]["keep"]), reverse=True)
        if not keeps:
            continue
        lines.append(f"- `{rule}`:")
        for k in keeps:
            r, t = summary[("random", k, rule)], summary[("top-k", k, rule)]
            paired = paired_differences(sub, k)
            lines.append(f"  - keep {k:g}: top-k {_fmt(t)} vs random {_fmt(r)}{_own(t, r)}" + (f"; paired {paired}" if paired else ""))
    return lines


def claims(table: pd.DataFrame, study: pd.DataFrame, metric: str, rules: pd.DataFrame | None = None) -> list[str]:
    """The paper's claims C1-C4 checked against the summary, as markdown lines with numbers (C1
    also under each inference rule, given `rule_runs`' rows)."""
    from scipy import stats

    get = {(r["family"], r["keep"]): r for _, r in table.iterrows()}
    keeps = sorted({k for f, k in get if f != "untrained" and k < 1.0}, reverse=True)
    fams = list(FAMILIES.values())
    lines = [f"Computed by `results/paper-fmnist/paper_figures.py` from the runs; {metric}, lower is better; geometric mean [95 % t-interval on the log values] over seeds. "
             "The verdicts (paired by seed, Holm-corrected) are in claims.md; this page gives the numbers behind them. "
             "Every comparison uses only the seeds the compared settings share, and says how many."]
    lines.append("\n**C1: top-k ≥ random at each keep ratio** (a lower distance is better; verdicts in claims.md)")
    for k in keeps:
        r, t = get.get(("random", k)), get.get(("top-k", k))
        if r is None or t is None:
            continue
        lines.append(f"- keep {k:g}: top-k {_fmt(t)} vs random {_fmt(r)}{_own(t, r)}")
        paired = paired_differences(study, k)
        if paired:
            lines.append(f"  - paired by seed (same partition and initialisation), top-k − random: {paired}")
    lines += rule_claims(rules if rules is not None else pd.DataFrame(columns=RULE_COLUMNS))
    lines.append("\n**C2: quality falls as keep falls** (geometric means over the seeds every keep ratio of the family ran)")
    for fam in fams:
        cells = [(fam, k) for k in [1.0, *keeps] if (fam, k) in get]
        seeds = shared_seeds(study, cells)
        if not seeds:
            lines.append(f"- {fam}: no seed shared by every keep ratio; not compared")
            continue
        seq = [(k, mean_on(study, fam, k, seeds)) for _, k in cells]
        mono = all(b >= a for (_, a), (_, b) in zip(seq, seq[1:]))
        lines.append(f"- {fam}, {_seeds(seeds)}: " + " → ".join(f"{k:g}: {m:.1f}" for k, m in seq)
                     + (" (monotone)" if mono else " (not monotone)"))
    lines.append("\n**C3: moderate pruning costs little** (change against FedAvg: the ratio of geometric means over the seeds both ran)")
    for fam in fams:
        for k in keeps:
            if (fam, 1.0) in get and (fam, k) in get:
                ratio, n = paired_ratio(study, (fam, k), (fam, 1.0))
                if n:
                    lines.append(f"- {fam}, keep {k:g}: {ratio - 1:+.0%} ({n} paired seed{'s' if n != 1 else ''})")
    lines.append("\n**C4: w² grows and Γ* falls as keep falls, and the metric follows them** (means over the seeds every "
                 "keep ratio of the family ran; Spearman ρ over runs, FedAvg included)")
    for fam in fams:
        cells = [(fam, k) for k in [1.0, *keeps] if (fam, k) in get]
        seeds = shared_seeds(study, cells)
        if seeds:
            lines.append(f"- {fam}, {_seeds(seeds)}: w² " + " → ".join(f"{mean_on(study, *c, seeds, 'w2'):.3f}" for c in cells)
                         + "; Γ* " + " → ".join(f"{mean_on(study, *c, seeds, 'gamma_star'):.2f}" for c in cells))
        sub = study[study["family"] == fam]
        for col in ("w2", "gamma_star"):
            ok = sub[[col, "metric"]].dropna()
            if len(ok) > 2 and ok[col].nunique() > 1:
                rho, p = stats.spearmanr(ok[col], ok["metric"])
                lines.append(f"  - {metric} vs {col}: ρ = {rho:+.2f} (p = {p:.2g}, {len(ok)} runs)")
    base = table[table["family"] == "untrained"]
    untrained = base.iloc[0] if len(base) else None  # keep is NaN there: not a dict key that matches
    if untrained is not None and ("random", 0.5) in get:
        floor = ("untrained", math.nan)

        def over(cell: tuple[str, float], name: str) -> str:
            ratio, n = paired_ratio(study, cell, floor)
            return f"{name} / untrained = {ratio:.2f} ({n} paired seed{'s' if n != 1 else ''})"

        parts = ([over(("random", 1.0), "FedAvg")] if ("random", 1.0) in get else []) + [over(("random", 0.5), "random keep 0.5")]
        lines.append(f"\n**Floor**: untrained {_fmt(untrained)}; " + "; ".join(parts) + ".")
    return lines


def _seeds(seeds: list[int]) -> str:
    return f"{len(seeds)} shared seed{'s' if len(seeds) != 1 else ''}"


def build(runs_dir: str | Path, out: str | Path, model: str | None = None) -> dict[str, Path]:
    """Every figure and the summary for the runs under `runs_dir` (of train.model `model`), written into `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    study, metric = study_runs(runs_dir, model)
    table = summarize(study)
    write_summary(table, metric, out)
    rules = rule_runs(runs_dir, model)
    extra = {}
    if not rules.empty:
        write_rules(rule_summary(rules), metric, out)
        extra["rules"] = out / "paper_rules.md"
    (out / "paper_claims.md").write_text("\n".join(claims(table, study, metric, rules)) + "\n")
    return {
        **extra,
        "summary": out / "paper_summary.md",
        "claims": out / "paper_claims.md",
        "metric_vs_keep": plot_metric_vs_keep(table, metric, out / "paper_metric_vs_keep.png"),
        "drift_vs_keep": plot_drift_vs_keep(table, out / "paper_drift_vs_keep.png"),
        "metric_vs_bound": plot_metric_vs_bound(study, metric, out / "paper_metric_vs_bound.png"),
        "samples": plot_samples(study, out / "paper_samples.png"),
    }


def choose(runs_dir: str | Path, out: str | Path, model: str | None = None) -> dict[str, Path]:
    """paper_rules.* and rule_choice.md for the pruning runs under `runs_dir` (of train.model `model`; no FedAvg needed)."""
    out = Path(out)
    rules = rule_runs(runs_dir, model)
    if rules.empty:
        raise ValueError(f"no pruning run under {runs_dir} scored its inference rules; run the grid with "
                         "eval.inference_variants=true first (make bench-paper-fmnist-rules)")
    out.mkdir(parents=True, exist_ok=True)
    metric = primary_metric(collect(runs_dir).metrics)
    summary = rule_summary(rules)
    write_rules(summary, metric, out)
    write_rule_choice(choose_rules(summary), summary, metric, out)
    return {"rules": out / "paper_rules.md", "choice": out / "rule_choice.md"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python results/paper-fmnist/paper_figures.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", required=True, help="root of the study's run folders")
    ap.add_argument("--out", required=True, help="folder for the figures and paper_summary.{md,csv}")
    ap.add_argument("--choose-rules", action="store_true",
                    help="write only paper_rules.{md,csv} and rule_choice.md (each family's best inference rule over its keep ratios)")
    ap.add_argument("--model", default=None, help="only the runs of this train.model (default: every run)")
    args = ap.parse_args(argv)
    for name, path in (choose if args.choose_rules else build)(args.runs, args.out, args.model).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
