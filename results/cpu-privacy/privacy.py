"""What each scheme leaks beside what it scores: quality, memorization, membership inference and epsilon.

    python results/cpu-privacy/privacy.py --runs results/cpu-privacy/runs --out results/cpu-privacy

Per block (dataset, partition) and setting -- labelled by its method and the config keys that tell
it apart from the block's usual value (names.setting_names: "fedavg (clip=0.5, noise=1)") -- the
mean over seeds with a 95 % Student-t interval of: the primary quality metric (a distance: its geometric
mean, the interval on its logs, never below 0); the copy rate of the
samples (d1/d2 < 1/3 against the clients' images, in the classifier's features and in pixels) and
the same rule on held-out test images (the rate of a model that does not copy); the nearest
distances to training vs test images; the loss attack's pooled AUC and TPR at 1 % FPR and its
worst client, with how many members and non-members the attack scored and the AUC's band at chance
(`api.chance_band`: 16 against 16 reads only leaks beyond 0.5 +- 0.20); DP's epsilon. The means
are over each setting's own seeds (the seeds column). The copy rate and the quality are also compared
with the reference setting (plain FedAvg) paired by seed, on the seeds both ran (how many, where fewer
than the setting's). A value the same at every seed has no spread: shown as such, never as a
zero-width interval. Writes privacy.md / .csv and privacy.png (quality against copy rate, and quality
against epsilon).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)
import pandas as pd  # noqa: E402

from dfbench.benchmark.api import (RunFolder, chance_band, curve_labels, load_study, metric_table,  # noqa: E402
                                   reference_method, seed_differences, seed_interval, study_main, t_interval,
                                   write_study)

#: the leakage metrics of a row, in the order the table shows them (benchmark/engine/leakage.py)
LEAKS = ("copy_rate_pixel", "copy_rate_test_pixel", "copy_rate_fmnist", "copy_rate_test_fmnist", "nn_train_pixel",
         "nn_test_pixel", "mia_auc", "mia_tpr_1fpr", "mia_auc_client_max")
COPY = "copy_rate_pixel"  # the rule in pixels, as Gu et al. 2023 apply it; the features' rate is shown beside it


def _mean_ci(values: list[float], unit: bool = False) -> tuple[float, float, float]:
    """Mean and 95 % t-interval over seeds, clipped at 0 (every leakage metric is >= 0: a rate, an AUC, a
    distance); `unit`: a rate or an AUC, clipped at 1 too."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return math.nan, math.nan, math.nan
    mean, interval = t_interval(values)
    if interval is None:
        return mean, math.nan, math.nan
    return mean, max(0.0, interval.low), min(1.0, interval.high) if unit else interval.high


def attack_sizes(runs: pd.DataFrame) -> dict[str, tuple[int, int]]:
    """run_id -> (members, non-members) the membership attack scored, as the run's mia_auc row records them
    (runs without the row, or without their folder, are absent)."""
    out: dict[str, tuple[int, int]] = {}
    for run_id, path in zip(runs.get("run_id", []), runs.get("path", [])):
        try:
            rows = RunFolder(Path(str(path))).metrics().get("evaluations", [])
        except (OSError, ValueError, AttributeError):
            continue  # a run copied without its folder: its sizes are not shown
        row = next((r for r in rows if isinstance(r, dict) and r.get("metric") == "mia_auc"), None)
        if row and row.get("num_members") and row.get("num_nonmembers"):
            out[str(run_id)] = (int(row["num_members"]), int(row["num_nonmembers"]))
    return out


def privacy_table(runs: pd.DataFrame, metric: str, reference: str | None = None,
                  sizes: dict[str, tuple[int, int]] | None = None) -> pd.DataFrame:
    """One row per (block, setting label); see the module doc. `sizes`: run_id -> (members, non-members) of
    its attack (`attack_sizes`), shown with the AUC's band at chance."""
    reference = reference or reference_method()  # default: the method that declares itself the reference
    labels = curve_labels(runs)  # the one naming function (names.setting_names)
    runs = runs.assign(label=[labels.get(str(r), str(s)) for r, s in zip(runs["run_id"], runs["setting"])])
    rows = []
    for (dataset, partition), block in runs.groupby(["dataset", "partition"], sort=True):
        ref = block[(block["label"] == reference) & ~block["baseline"].astype(bool)]
        for label, group in block.groupby("label", sort=False):
            row: dict[str, object] = {"dataset": dataset, "partition": partition, "setting": label,
                                      "baseline": bool(group["baseline"].iloc[0]), "seeds": len(group)}
            for col in (metric, *LEAKS):
                values = group[col].astype(float).tolist() if col in group else []
                if col == metric and metric_table.scale(metric) == "log":  # a distance: geometric mean, never below 0
                    row[col], row[f"{col}_low"], row[f"{col}_high"] = seed_interval(values, positive=True)
                else:
                    row[col], row[f"{col}_low"], row[f"{col}_high"] = _mean_ci(values, unit=col.startswith(("copy_rate", "mia_")))
            scored = sorted({(sizes or {}).get(str(r)) for r in group["run_id"]} - {None}) if "run_id" in group else []
            row["mia_members"] = "/".join(str(m) for m in sorted({m for m, _ in scored})) if scored else ""
            row["mia_nonmembers"] = "/".join(str(n) for n in sorted({n for _, n in scored})) if scored else ""
            row["mia_chance"] = max(chance_band(m, n) for m, n in scored) if scored else math.nan
            eps = group["epsilon"].astype(float) if "epsilon" in group else pd.Series(dtype=float)
            dp = "cfg.clip" in group and float(pd.to_numeric(group["cfg.clip"], errors="coerce").fillna(0).max()) > 0
            # no DP: no guarantee (inf); DP without noise: inf too (the accountant says so: metrics.json null)
            row["epsilon"] = float(eps.mean()) if eps.notna().any() else math.inf
            row["dp"] = dp
            for col in (metric, COPY):
                if ref.empty or label == reference or row["baseline"] or col not in group:
                    row[f"{col}_diff"] = row[f"{col}_diff_low"] = row[f"{col}_diff_high"] = math.nan
                    row[f"{col}_diff_seeds"] = 0
                    continue
                paired, _, mean, low, high = seed_differences(group.set_index("seed")[col].astype(float),
                                                              ref.set_index("seed")[col].astype(float))
                row[f"{col}_diff"], row[f"{col}_diff_low"], row[f"{col}_diff_high"] = mean, low, high
                row[f"{col}_diff_seeds"] = len(paired)
            rows.append(row)
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    order = table.assign(_b=table["baseline"], _ref=table["setting"] != reference)
    return order.sort_values(["dataset", "partition", "_b", "_ref", "setting"], kind="stable").drop(columns=["_b", "_ref"]).reset_index(drop=True)


def _interval(text: str, low: float, high: float, fmt: str, seeds: int) -> str:
    """`text` with its interval; a zero-width one (the same value at every seed) as "(no spread)": a
    metric at its bound (an AUC of 1 at every seed) has no spread to estimate, not a certain value."""
    if math.isnan(low):
        return text
    if high - low <= 1e-12 * max(1.0, abs(high)) and seeds > 1:
        return f"{text} (no spread)"
    return f"{text} [{fmt.format(low)}, {fmt.format(high)}]"


def _ci(row: pd.Series, col: str, fmt: str = "{:.3f}") -> str:
    mean, low, high = row.get(col, math.nan), row.get(f"{col}_low", math.nan), row.get(f"{col}_high", math.nan)
    if isinstance(mean, float) and math.isnan(mean):
        return "–"
    return _interval(fmt.format(mean), low, high, fmt, int(row.get("seeds", 0)))


def _diff(row: pd.Series, col: str, fmt: str) -> str:
    mean = row.get(f"{col}_diff", math.nan)
    if math.isnan(mean):
        return ""
    paired = int(row.get(f"{col}_diff_seeds", 0) or 0)
    text = _interval(fmt.format(mean), row[f"{col}_diff_low"], row[f"{col}_diff_high"], fmt, paired)
    return text + (f" ({paired} paired seed{'s' if paired != 1 else ''})" if paired and paired != int(row["seeds"]) else "")


def _attack(row: pd.Series) -> str:
    """"16 / 1000 (±0.14)": members / non-members the attack scored and the AUC's 95 % band at chance."""
    if not row.get("mia_members"):
        return "–"
    return f"{row['mia_members']} / {row['mia_nonmembers']} (±{row['mia_chance']:.2f})"


def to_markdown(table: pd.DataFrame, metric: str, reference: str) -> str:
    lines = [f"# What each scheme leaks: {metric} (quality), memorization, membership inference, epsilon", "",
             f"Means over each setting's own seeds (the seeds column) with 95 % Student-t intervals; (no spread): the "
             f"same value at every seed, no interval to give; Δ = setting − {reference}, paired by seed on the seeds "
             "both ran (their number where fewer than the setting's). Copy: a sample "
             "whose nearest training image (the clients' data) is under 1/3 of the distance to the second nearest "
             "(Yoon et al. 2023, Gu et al. 2023), in pixels or in the Fashion-MNIST classifier's features (fmnist); "
             "test: the same rule on held-out test images, the rate of a model that does not copy. nn: mean distance "
             "of a sample to its nearest training image vs to as many test images (pixels in [0, 1]). MIA: loss attack on the "
             "final model, pooled AUC, TPR at 1 % FPR and the worst client's AUC (0.5 = chance); attack: members / "
             "non-members scored (non-members: held-out images with the members' label mix, in runs scored since "
             "issue 54) and, in brackets, the AUC's 95 % band around 0.5 at chance for those counts: an AUC inside "
             "it is not evidence of a leak. ε at the run's δ "
             "(Opacus RDP); ∞ = no DP guarantee. Intervals are clipped at 0 (every column is >= 0), of rates and AUCs at 1 too.", ""]
    head = ["setting", "seeds", metric, f"Δ {metric}", "copy (pixel)", "Δ copy", "copy test (pixel)", "copy (fmnist)",
            "copy test (fmnist)", "nn train / test (pixel)", "MIA AUC", "attack", "TPR@1%FPR", "worst client AUC", "ε"]
    for (dataset, partition), block in table.groupby(["dataset", "partition"], sort=False):
        lines += [f"## {dataset} / {partition}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for _, row in block.iterrows():
            nn = (f"{row['nn_train_pixel']:.2f} / {row['nn_test_pixel']:.2f}"
                  if not math.isnan(row.get("nn_train_pixel", math.nan)) else "–")
            eps = "∞" if math.isinf(row["epsilon"]) else f"{row['epsilon']:.3g}"
            cells = [str(row["setting"]), str(row["seeds"]), _ci(row, metric, "{:.1f}"), _diff(row, metric, "{:+.1f}"),
                     _ci(row, COPY), _diff(row, COPY, "{:+.3f}"), _ci(row, "copy_rate_test_pixel"), _ci(row, "copy_rate_fmnist"),
                     _ci(row, "copy_rate_test_fmnist"),
                     nn, _ci(row, "mia_auc"), _attack(row), _ci(row, "mia_tpr_1fpr"), _ci(row, "mia_auc_client_max"), eps]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(table: pd.DataFrame, metric: str, reference: str, path: Path) -> Path:
    """Quality against copy rate (every setting) and against epsilon (the DP settings and the reference)."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.6))
    colors = plt.get_cmap("tab10")
    for i, (_, row) in enumerate(table.iterrows()):
        style = dict(color=colors(i % 10), marker="s" if row["baseline"] else ("D" if row["dp"] else "o"), capsize=3, ms=7,
                     label=str(row["setting"]))
        xerr = None if math.isnan(row[f"{COPY}_low"]) else [[row[COPY] - row[f"{COPY}_low"]], [row[f"{COPY}_high"] - row[COPY]]]
        yerr = None if math.isnan(row[f"{metric}_low"]) else [[row[metric] - row[f"{metric}_low"]], [row[f"{metric}_high"] - row[metric]]]
        axes[0].errorbar([row[COPY]], [row[metric]], xerr=xerr, yerr=yerr, **style)
        if row["dp"] or row["setting"] == reference:
            finite = [e for e in table["epsilon"] if math.isfinite(e)]
            x = row["epsilon"] if math.isfinite(row["epsilon"]) else (max(finite) * 3 if finite else 1.0)
            axes[1].errorbar([x], [row[metric]], yerr=yerr, **style)
            if not math.isfinite(row["epsilon"]):
                axes[1].annotate("no DP: ε = ∞", (x, row[metric]), textcoords="offset points", xytext=(-40, -22), fontsize=8)
    axes[0].set(xlabel="copy rate (d1/d2 < 1/3 to the clients' images, pixels)",
                ylabel=f"{metric} (lower is better)", title="quality vs memorization")
    axes[1].set(xscale="log", xlabel="ε (δ per run; log scale)", ylabel=f"{metric} (lower is better)",
                title="quality vs the DP guarantee")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write(runs_dir: str | Path, out: str | Path, reference: str | None = None, metric: str | None = None) -> list[Path]:
    reference = reference or reference_method()  # default: the method that declares itself the reference
    study = load_study(runs_dir, metric, needs=COPY, missing=f"no runs with leakage metrics under {runs_dir} "
                       "(eval.leakage_metrics=true); run the grid first")
    table = privacy_table(study.data.runs, study.metric, reference, attack_sizes(study.data.runs))
    return write_study(out, "privacy", to_markdown(table, study.metric, reference), table,
                       lambda png: plot(table, study.metric, reference, png))


def main(argv: list[str] | None = None) -> int:
    return study_main(argv, "python results/cpu-privacy/privacy.py", __doc__, "privacy.md/.csv/.png",
                      "the setting the paired differences are against (default fedavg)", write, runs_help="root of the run folders (made with eval.leakage_metrics=true)")


if __name__ == "__main__":
    raise SystemExit(main())
