"""Seaborn plots of the leaderboard data (written as PNG; never an empty figure).

Every plot function takes the reporter's frames and returns either the written
path or, when its data is absent, a sentence saying why it was skipped.
"""

from __future__ import annotations

import logging
import math
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from pathlib import Path

import matplotlib

# The reporter only writes files, often on headless servers: never open a window.
matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.ticker import MaxNLocator, NullFormatter  # noqa: E402

from dfbench.benchmark.core import runfolder  # noqa: E402
from dfbench.benchmark.report.frames import better, curve_labels, primary_metric  # noqa: E402

logger = logging.getLogger(__name__)

_DPI = 110


def _primary_by_dataset(frame: pd.DataFrame, metrics: Sequence[str], suffix: str = "") -> dict[str, str]:
    """Each dataset's ranking metric (fid for CIFAR/SVHN, fd_fmnist where only that exists)."""
    out: dict[str, str] = {}
    for dataset, grp in frame.groupby("dataset", sort=True):
        present = [m for m in metrics if f"{m}{suffix}" in grp and grp[f"{m}{suffix}"].notna().any()]
        metric = primary_metric(present)
        if metric is not None:
            out[str(dataset)] = metric
    return out


def _with_score(frame: pd.DataFrame, metrics: Sequence[str], suffix: str = "") -> pd.DataFrame:
    """Trained (non-baseline) rows with a ``score`` column: the dataset's primary metric."""
    if frame.empty:
        return frame
    primaries = _primary_by_dataset(frame, metrics, suffix)
    df = frame[~frame["baseline"].astype(bool)].copy()
    df["score_metric"] = df["dataset"].map(primaries)
    df["score"] = [
        row[f"{m}{suffix}"] if isinstance(m, str) else math.nan for m, (_, row) in zip(df["score_metric"], df.iterrows())
    ]
    df["score"] = pd.to_numeric(df["score"], errors="coerce")
    if suffix == "_mean":  # setting rows: the interval of the score (t across seeds, else the run's bootstrap)
        # a positive metric's interval is that of its geometric mean: plot that mean with it, as the page shows
        gmean = pd.to_numeric([row.get(f"{m}_gmean", math.nan) if isinstance(m, str) else math.nan
                               for m, (_, row) in zip(df["score_metric"], df.iterrows())], errors="coerce")
        df["score"] = np.where(np.isfinite(gmean), gmean, df["score"])
        for side in ("low", "high"):
            df[f"score_{side}"] = pd.to_numeric(
                [row.get(f"{m}_ci_{side}", math.nan) if isinstance(m, str) else math.nan
                 for m, (_, row) in zip(df["score_metric"], df.iterrows())], errors="coerce")
    return df[df["score"].notna()]


def _label_panels(grid: sns.FacetGrid, frame: pd.DataFrame, col: str = "dataset") -> None:
    """Panel title "dataset (metric)" and the metric as y label, since panels may differ."""
    metric_of = frame.groupby(col)["score_metric"].first().to_dict()
    for name, ax in grid.axes_dict.items():
        metric = metric_of.get(name, "score")
        ax.set_title(f"{name} ({metric})")
        ax.set_ylabel(f"{metric} ({better(metric)} is better)")


def _save(grid: sns.FacetGrid, path: Path, note: str | None = None) -> Path:
    # FacetGrid's own tight_layout keeps room for the legend it placed outside the axes.
    grid.tight_layout()
    if note:
        # Below the axes; savefig's bbox_inches="tight" grows the canvas to include it.
        grid.figure.text(0.01, -0.02, note, fontsize=8, color="#555", ha="left", va="top")
    path.parent.mkdir(parents=True, exist_ok=True)
    grid.savefig(path, dpi=_DPI, bbox_inches="tight")
    plt.close(grid.figure)
    return path


def _style(frame: pd.DataFrame, col: str = "partition") -> str | None:
    return col if frame[col].nunique() > 1 else None


def plot_metric_vs_keep_ratio(runs: pd.DataFrame, metrics: Sequence[str], path: Path) -> Path | str:
    """Score vs keep ratio of every method with a keep_ratio hyperparameter (the pruning methods), one panel per dataset."""
    if runs.empty or "param.keep_ratio" not in runs:
        return "no run has method_params.keep_ratio"
    df = _with_score(runs[runs["param.keep_ratio"].notna()], metrics)
    if df.empty:
        return "no scored run with a keep_ratio hyperparameter"
    # Per-client keep ratios (capacity tiers) are lists, not one point on this axis.
    df = df.assign(keep_ratio=pd.to_numeric(df["param.keep_ratio"], errors="coerce")).dropna(subset=["keep_ratio"])
    if df.empty:
        return "no pruning run has a scalar keep_ratio"
    if df["keep_ratio"].nunique() < 2:  # one point on the axis is no relation (and a stretched, empty axis)
        return f"only one keep ratio ({df['keep_ratio'].iloc[0]:g}): nothing to plot against"
    grid = sns.relplot(
        data=df, x="keep_ratio", y="score", hue="method", style=_style(df), col="dataset", kind="line",
        marker="o", errorbar="sd", facet_kws={"sharey": False}, height=3.5, aspect=1.2,
    )
    _label_panels(grid, df)
    grid.set_xlabels("keep ratio (fraction of weights each client trains)")
    return _save(grid, path, "mean ± std over seeds")


def _setting_names(scored: pd.DataFrame) -> dict[Any, str]:
    """Row index -> the setting's name on the page (named within its whole dataset/partition block)."""
    from dfbench.benchmark.report.names import setting_names

    return setting_names(scored)


def setting_colors(table: pd.DataFrame, metrics: Sequence[str]) -> dict[str, Any]:
    """Setting name (the page's) -> its colour, over every scored setting of the report, so one
    setting has one colour in every plot drawn from the table, whatever each plot leaves out."""
    ordered = sorted(set(_setting_names(_with_score(table, metrics, suffix="_mean")).values()))
    return dict(zip(ordered, sns.color_palette("tab10" if len(ordered) <= 10 else "husl", len(ordered))))


def palette(labels: Sequence[str], colors: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """label -> colour for a plot's settings: the report's `setting_colors` where it names the label (so a
    setting has one colour in every plot), a colour of its own otherwise (one not already used)."""
    colors = dict(colors or {})
    out = {label: colors[label] for label in labels if label in colors}
    missing = [label for label in sorted(set(labels)) if label not in out]
    if missing:
        used = {tuple(np.round(c, 4)) for c in out.values()}
        spare = [c for c in sns.color_palette("tab10" if len(missing) + len(out) <= 10 else "husl", len(missing) + len(out))
                 if tuple(np.round(c, 4)) not in used]
        out.update(zip(missing, spare))
    return out


def _dodged(panel: pd.DataFrame, labels: Sequence[str], log: bool, span: float, step: float = 0.015) -> pd.Series:
    """x positions with the points that (nearly) share an x value spread sideways, centred on it:
    points closer than `step` (in decades on a log axis, else in fractions of the x range `span`)
    form one group, ordered by label and partition, `step` apart; a lone point keeps its x."""
    pos = np.log10(panel["xv"].to_numpy(float)) if log else panel["xv"].to_numpy(float) / (span or 1.0)
    order = {label: i for i, label in enumerate(labels)}
    rows = sorted(range(len(panel)), key=lambda r: (pos[r], order[panel["label"].iloc[r]], str(panel["partition"].iloc[r])))
    groups: list[list[int]] = []
    for r in rows:
        if groups and pos[r] - pos[groups[-1][-1]] < step:
            groups[-1].append(r)
        else:
            groups.append([r])
    shift = np.zeros(len(panel))
    for group in groups:
        group.sort(key=lambda r: (order[panel["label"].iloc[r]], str(panel["partition"].iloc[r])))
        centre = float(np.mean(pos[group]))
        for j, r in enumerate(group):
            shift[r] = centre + (j - (len(group) - 1) / 2) * step - pos[r]
    xv = panel["xv"].to_numpy(float)
    return pd.Series(xv * 10 ** shift if log else xv + shift * (span or 1.0), index=panel.index)


def _one_config(rows: pd.DataFrame) -> bool:
    """Whether the rows (one label's points) share every config value but the partition: the same setting at
    several x, which a line may join."""
    cols = [c for c in rows.columns if c.startswith("cfg.") and c not in ("cfg.partition", "cfg.alpha", "cfg.grid")]
    return all(rows[c].astype(str).nunique() <= 1 for c in cols)


def _points_with_intervals(table: pd.DataFrame, metrics: Sequence[str], x: str, path: Path, xlabel: str, note: str,
                           log_x: bool | None, connect: bool, ticks_at_values: bool,
                           positive_only: bool = True, colors: dict[str, Any] | None = None) -> Path | str:
    """One panel per dataset; one colour per setting (method and the hyperparameters the leaderboard shows,
    `setting_colors`); the seed mean of the dataset's ranking metric with its 95% interval as a bar.
    Settings that share an x value are spread sideways by a small fixed offset (said in the note) so
    that no bar hides another. `positive_only`: leave out settings with x <= 0 (no uplink, no pruning);
    `colors`: the report's `setting_colors` when `table` is a part of it."""
    colors = setting_colors(table, metrics) if colors is None else colors
    df = _with_score(table, metrics, suffix="_mean")
    names = _setting_names(df)  # before leaving rows out: a setting keeps its page name
    scored = len(df)
    if len(df):
        xv = pd.to_numeric(df[x], errors="coerce")
        df = df[xv > 0] if positive_only else df[xv.notna()]
    if df.empty:
        return f"no scored setting with {x} {'> 0' if positive_only else 'recorded'}"
    if len(df) < scored and x == "uplink_mb_mean":  # e.g. an expert mixture: its clients upload nothing
        note += f"; {scored - len(df)} setting(s) without uplink left out"
    df = df.assign(label=[names[i] for i in df.index], xv=pd.to_numeric(df[x]))
    datasets = sorted(df["dataset"].unique())
    labels = list(dict.fromkeys(df.sort_values("label")["label"]))
    markers = dict(zip(sorted(df["partition"].unique()), "oXs^DvP*"))
    fig, axes = plt.subplots(1, len(datasets), figsize=(5.2 * len(datasets), 3.8), squeeze=False)
    for ax, dataset in zip(axes[0], datasets):
        panel = df[df["dataset"] == dataset]
        xs = panel["xv"].to_numpy(float)
        log = bool(xs.max() / xs.min() > 20) if log_x is None else log_x
        span = float(xs.max() - xs.min()) or float(xs.max())
        panel = panel.assign(xp=_dodged(panel, labels, log, span))
        for label in labels:
            pts = panel[panel["label"] == label].sort_values("xv")
            if pts.empty:
                continue
            xp = pts["xp"]
            low = (pts["score"] - pts["score_low"]).clip(lower=0).fillna(0)
            high = (pts["score_high"] - pts["score"]).clip(lower=0).fillna(0)
            # a line joins one config across x only: a name shared by two configs in two blocks (each block
            # names its settings by what differs there) would otherwise draw a trend no setting has
            same = _one_config(pts)
            ax.errorbar(xp, pts["score"], yerr=[low, high], fmt="-" if connect and same else "none", color=colors[label],
                        elinewidth=1, capsize=2, lw=1.2, alpha=0.9)
            for part, grp in pts.groupby("partition"):
                ax.scatter(grp["xp"], grp["score"], color=colors[label], marker=markers[part], s=40, zorder=3,
                           edgecolor="white", linewidth=0.5)
        if log:
            ax.set_xscale("log")
        if ticks_at_values:  # one labelled tick per value present, no minor labels (they overlapped)
            values = sorted(set(xs))
            ax.set_xticks(values)
            ax.set_xticklabels([f"{v:g}" for v in values])
            ax.xaxis.set_minor_formatter(NullFormatter())
            pad = 10 ** 0.15 if log else 0
            if log:
                ax.set_xlim(min(values) / pad, max(values) * pad)
        metric = str(panel["score_metric"].iloc[0])
        ax.set_title(f"{dataset} ({metric})")
        ax.set_ylabel(f"{metric} ({better(metric)} is better)")
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.25)
    handles = [plt.Line2D([], [], color=colors[l], marker="o", ls="-" if connect else "", label=l) for l in labels]
    if len(markers) > 1:
        handles += [plt.Line2D([], [], color="#555", marker=m, ls="", label=p) for p, m in markers.items()]
    fig.tight_layout()
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 0.95), fontsize=8, frameon=False)
    # wrapped to the figure's width: one long line would widen the canvas past the panels
    fig.text(0.01, -0.02, textwrap.fill(note, width=int(16 * fig.get_figwidth())), fontsize=8, color="#555", ha="left", va="top")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=_DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_metric_vs_alpha(table: pd.DataFrame, metrics: Sequence[str], path: Path) -> Path | str:
    """Score vs Dirichlet alpha per method setting (log x, a labelled tick at each alpha); iid is
    omitted (alpha = inf). Drawn from the aggregated table: seed mean and 95% interval."""
    if table.empty or "alpha" not in table:
        return "no scored runs"
    scored = _with_score(table, metrics, suffix="_mean")
    if scored.empty:
        return "no scored runs"
    n_iid = int((scored["partition"] == "iid").sum())
    df = table[pd.to_numeric(table["alpha"], errors="coerce").notna()]
    if df.empty:
        return "no run with a dirichlet:A partition"
    if pd.to_numeric(df["alpha"]).nunique() < 2:
        return f"only one Dirichlet alpha ({pd.to_numeric(df['alpha']).iloc[0]:g}): nothing to plot against"
    note = ("seed mean of each setting (geometric for a distance); bars: 95% interval; settings at one alpha are spread "
            "sideways so no bar hides another")
    if n_iid:
        note += f"; iid settings ({n_iid}) omitted: alpha = inf"
    return _points_with_intervals(df, metrics, "alpha", path, "Dirichlet alpha (smaller = more heterogeneous)", note,
                                  log_x=True, connect=True, ticks_at_values=True, colors=setting_colors(table, metrics))


def plot_metric_vs_uplink(table: pd.DataFrame, metrics: Sequence[str], path: Path) -> Path | str:
    """Communication-quality front: one point per method setting (seed means) with its 95% interval."""
    if table.empty:
        return "no finished runs"
    return _points_with_intervals(table, metrics, "uplink_mb_mean", path, "total uplink (MB)",
                                  "one point per setting (mean over seeds, geometric for a distance); bars: 95% interval (t across "
                                  "seeds, else the run's bootstrap); settings with the same uplink are spread sideways",
                                  log_x=None, connect=False, ticks_at_values=False)


def table_plots(table: pd.DataFrame, metrics: Sequence[str], plots_dir: Path) -> tuple[dict[str, Path], dict[str, str]]:
    """The plots drawn from the aggregated table alone (a report re-rendered from leaderboard.csv redraws these)."""
    return _run_jobs({
        "metric_vs_alpha": lambda p: plot_metric_vs_alpha(table, metrics, p),
        "metric_vs_uplink": lambda p: plot_metric_vs_uplink(table, metrics, p),
        "metric_vs_gamma_star": lambda p: plot_metric_vs_gamma_star(table, metrics, p),
        "metric_vs_w2": lambda p: plot_metric_vs_w2(table, metrics, p),
    }, plots_dir)


def plot_loss_per_round(rounds: pd.DataFrame, path: Path, labels: dict[str, str] | None = None,
                        colors: Mapping[str, Any] | None = None) -> Path | str:
    """Mean training loss per round (from rounds.jsonl), one line per setting (`labels`: run id ->
    label; seeds of one label pooled), one panel per block; `colors`: the report's `setting_colors`."""
    if rounds.empty:
        return "no rounds.jsonl rows"
    df = rounds.dropna(subset=["round", "loss"])
    if labels:
        df = df.assign(setting=[labels.get(r, s) for r, s in zip(df["run_id"], df["setting"])])
    df = df[np.isfinite(df["loss"])]
    if df.empty:
        return f"no finite loss in {runfolder.ROUNDS}"
    df = df.assign(block=df["dataset"] + " / " + df["partition"])
    n_blocks = df["block"].nunique()
    grid = sns.relplot(
        data=df, x="round", y="loss", hue="setting", col="block", col_wrap=min(3, n_blocks), kind="line",
        palette=palette(list(df["setting"].unique()), colors), errorbar="sd", facet_kws={"sharey": False, "sharex": False}, height=3.2, aspect=1.3,
    )
    grid.set_titles("{col_name}")
    for ax in grid.axes.flat:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    grid.set_ylabels("mean client loss")
    return _save(grid, path, "mean ± std over seeds")


def _plot_vs_bound_term(table: pd.DataFrame, metrics: Sequence[str], column: str, label: str, path: Path) -> Path | str:
    """Score vs a bound term of the pruning study, one point per setting (seed means, as the uplink
    plot: the page's names and colours, 95% interval bars, settings at one x spread sideways)."""
    name = column.removesuffix("_mean")  # the table's seed mean of the run's value
    df = _with_score(table, metrics, suffix="_mean")
    if df.empty or column not in df:
        return "no scored runs"
    values = pd.to_numeric(df[column], errors="coerce").dropna()
    if values.empty:
        return f"no run recorded {name}"
    w2 = column == "w2_mean_mean"
    if w2:  # a method that prunes nothing has w^2 = 0: not a point on the pruning axis
        values = values[values > 0]
        if values.empty:
            return "no run pruned anything (w^2 = 0 for every run)"
    if values.nunique() < 2:
        return f"{name} is {values.iloc[0]:g} for every scored setting{' that prunes' if w2 else ''}: nothing to plot against"
    note = ("one point per setting (mean over seeds, geometric for a distance); bars: 95% interval; settings at one x "
            "are spread sideways")
    if w2:
        note += "; settings that prune nothing (w^2 = 0) left out"
    # Gamma* counts updates: where every setting's mean is a whole number, a labelled tick at each value
    # present and none between (a tick at 0.5 updates reads as nonsense)
    whole = not w2 and bool((values == values.round()).all()) and values.nunique() <= 12
    return _points_with_intervals(table, metrics, column, path, label, note, log_x=False, connect=False,
                                  ticks_at_values=whole, positive_only=w2)


def plot_metric_vs_gamma_star(table: pd.DataFrame, metrics: Sequence[str], path: Path) -> Path | str:
    """Score vs Gamma* (how often the least-trained parameter was updated; pruning bound term)."""
    return _plot_vs_bound_term(table, metrics, "gamma_star_mean", "Γ* (updates of the least-trained parameter)", path)


def plot_metric_vs_w2(table: pd.DataFrame, metrics: Sequence[str], path: Path) -> Path | str:
    """Score vs mean pruning extent w^2 (pruning bound term)."""
    return _plot_vs_bound_term(table, metrics, "w2_mean_mean", "mean pruning extent w² (over rounds)", path)


CURVE_AXES = (("round", "round"), ("uplink_mb", "cumulative uplink (MB)"), ("client_images", "client work (full-model images)"),
              ("sim_seconds", "simulated time (s)"))


def plot_quality_curves(curves: pd.DataFrame, path: Path, colors: Mapping[str, Any] | None = None) -> Path | str:
    """Quality curves (eval.every): the curve metric against round, cumulative uplink, client work
    and simulated time; one row of panels per dataset / partition, one line per setting (mean over
    seeds at each curve round, both axes averaged), band: ± 1 std over seeds."""
    if curves.empty:
        return f"no {runfolder.CURVE} (runs with eval.every > 0 draw one)"
    df = curves.dropna(subset=["round", "value"]).assign(block=lambda f: f["dataset"] + " / " + f["partition"])
    blocks = sorted(df["block"].unique())
    fig, axes = plt.subplots(len(blocks), len(CURVE_AXES), figsize=(4.2 * len(CURVE_AXES), 3.4 * len(blocks)), squeeze=False)
    colors = palette(list(df["label"].unique()), colors)
    for i, block in enumerate(blocks):
        sub = df[df["block"] == block]
        metric = str(sub["metric"].iloc[0])
        for (_, setting), grp in sub.groupby(["group_key", "label"], sort=True):  # one line per setting, seeds pooled
            agg = grp.groupby("round").agg(**{f"{c}_x": (c, "mean") for c, _ in CURVE_AXES if c != "round"},
                                           y=("value", "mean"), sd=("value", "std"), n=("value", "size")).reset_index()
            agg["round_x"] = agg["round"]
            for j, (col, _) in enumerate(CURVE_AXES):
                ax = axes[i][j]
                ax.plot(agg[f"{col}_x"], agg["y"], marker="o", ms=3, color=colors[setting], label=setting if j == 0 else None)
                band = agg["sd"].fillna(0.0)
                ax.fill_between(agg[f"{col}_x"], agg["y"] - band, agg["y"] + band, color=colors[setting], alpha=0.15, lw=0)
        for j, (_, label) in enumerate(CURVE_AXES):
            ax = axes[i][j]
            ax.set_xlabel(label)
            ax.set_ylabel(f"{metric} ({better(metric)} is better)")
            ax.set_title(block, fontsize=9)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.suptitle("quality curves: mean over seeds at each curve round, band ± 1 std over seeds; round 0 is the untrained model",
                 fontsize=9, color="#555")
    fig.tight_layout()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=1 if len(labels) > 4 else len(labels),
               fontsize=7, frameon=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=_DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def make_plots(
    runs: pd.DataFrame, rounds: pd.DataFrame, table: pd.DataFrame, metrics: Sequence[str], plots_dir: Path,
    curves: pd.DataFrame | None = None,
) -> tuple[dict[str, Path], dict[str, str]]:
    """Draw every plot whose data exists; return (written plots, skipped plots with reasons). A setting has
    one colour in every plot of settings (`setting_colors`)."""
    colors = setting_colors(table, metrics) if len(table) else {}
    jobs: dict[str, Callable[[Path], Path | str]] = {
        "metric_vs_keep_ratio": lambda p: plot_metric_vs_keep_ratio(runs, metrics, p),
        "metric_vs_alpha": lambda p: plot_metric_vs_alpha(table, metrics, p),
        "metric_vs_uplink": lambda p: plot_metric_vs_uplink(table, metrics, p),
        "loss_per_round": lambda p: plot_loss_per_round(rounds, p, curve_labels(runs), colors),
        "metric_vs_gamma_star": lambda p: plot_metric_vs_gamma_star(table, metrics, p),
        "metric_vs_w2": lambda p: plot_metric_vs_w2(table, metrics, p),
        "quality_curves": lambda p: plot_quality_curves(curves if curves is not None else pd.DataFrame(), p, colors),
    }
    assert list(jobs) == list(PLOT_NAMES)
    return _run_jobs(jobs, plots_dir)


# the order of the report's plots (build_report's and rerender's)
PLOT_NAMES = ("metric_vs_keep_ratio", "metric_vs_alpha", "metric_vs_uplink", "loss_per_round", "metric_vs_gamma_star",
              "metric_vs_w2", "quality_curves")


def _run_jobs(jobs: dict[str, Callable[[Path], Path | str]], plots_dir: Path) -> tuple[dict[str, Path], dict[str, str]]:
    written: dict[str, Path] = {}
    skipped: dict[str, str] = {}
    for name, job in jobs.items():
        result = job(Path(plots_dir) / f"{name}.png")
        if isinstance(result, Path):
            written[name] = result
        else:
            logger.info("plot %s skipped: %s", name, result)
            skipped[name] = result
            # a plot an earlier report drew here and this one skips would be read as current
            (Path(plots_dir) / f"{name}.png").unlink(missing_ok=True)
    return written, skipped


def plot_partition_heatmap(hist: np.ndarray, title: str, path: Path) -> Path:
    """Per-client label heatmap (clients x classes, sample counts) for `dfbench partition`."""
    clients = hist.shape[0]
    fig, ax = plt.subplots(figsize=(min(2 + 0.35 * hist.shape[1], 10), min(1.5 + 0.22 * clients, 30)))
    sns.heatmap(hist, ax=ax, cmap="viridis", cbar_kws={"label": "samples"},
                yticklabels=max(1, clients // 40) if clients > 40 else True)
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
