"""proxy-validity: how often each image proxy orders two models as the exact error does.

Reads the study's run folders through the one reader (dfbench.benchmark.api.load_runs), applies the
pre-registered rules of claims.toml (after checking, from git, that every run started after its last commit),
and writes, all generated from the runs (nothing retyped):
  models.csv          one row per model: its setting, the truths and every proxy
  agreement.csv       per proxy, truth and pair set: pairs, agreement with its 95 % bootstrap interval, Kendall tau
  proxy_claims.md     the pre-registration line and each claim's value, interval and verdict
  agreement.md        the tables the README quotes (agreement, anchors)
  proxy_vs_exact.png  every proxy against score_kl, one panel each

Run: .venv/bin/python results/proxy-validity/analyze.py  (make bench-proxy-validity runs it after the grid)
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import stats  # noqa: E402

from dfbench.benchmark.api import check_preregistration, load_runs  # noqa: E402
from dfbench.benchmark.api import metric_table as table  # noqa: E402

HERE = Path(__file__).resolve().parent
ANCHORS = {"exact_score": "floor (exact score)", "untrained": "ceiling (untrained)"}


def models_frame(runs: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """One row per run: method label, rounds, seed, and the value of each metric (the result rows only)."""
    rows = runs[runs["metric"].isin(metrics)]
    if "variant" in rows:  # the result's samples only (no inference variants are drawn in this grid)
        rows = rows[rows["variant"].fillna(True).astype(bool)]
    wide = rows.pivot_table(index="run_id", columns="metric", values="value", aggfunc="first")
    info = runs.drop_duplicates("run_id").set_index("run_id")
    out = pd.DataFrame({
        "method": info["setting"] if "setting" in info else info["method"],
        "rounds": info["cfg.rounds"].astype(int),
        "seed": info["seed"].astype(int),
        "path": info["path"],
    }).join(wide)
    out["role"] = np.where(out["rounds"].eq(0),
                           np.where(info["method"].eq("exact_score"), "exact_score", "untrained"), "model")
    return out.reset_index().sort_values(["role", "method", "rounds", "seed"]).reset_index(drop=True)


def signed(values: np.ndarray, metric: str) -> np.ndarray:
    """Lower is better, for every metric (a higher-is-better one is negated)."""
    return -values if table.better(metric) == "higher" else values


def agreement_matrix(proxy: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """A[i, j] = 1 where the proxy orders models i and j as the truth does, 0 where the other way, 0.5 where
    the proxy ties them (the truth never ties two trained models here; a truth tie counts 0.5 as well)."""
    dp = np.sign(proxy[:, None] - proxy[None, :])
    dt = np.sign(truth[:, None] - truth[None, :])
    return np.where((dp == 0) | (dt == 0), 0.5, (dp == dt).astype(float))


def close_mask(truth: np.ndarray, close: float) -> np.ndarray:
    lo = np.minimum(truth[:, None], truth[None, :])
    return np.abs(truth[:, None] - truth[None, :]) / lo < close


def bootstrap_indices(n: int, replicates: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(replicates, n))


def mean_over_pairs(a: np.ndarray, mask: np.ndarray, idx: np.ndarray | None = None) -> float:
    """The mean of a over pairs i < j (of the resample `idx`: pairs of draws of distinct models) within mask."""
    if idx is None:
        idx = np.arange(a.shape[0])
    sub, keep = a[np.ix_(idx, idx)], mask[np.ix_(idx, idx)]
    upper = np.triu(np.ones_like(keep, dtype=bool), 1) & (idx[:, None] != idx[None, :])
    sel = keep & upper
    return float(sub[sel].mean()) if sel.any() else float("nan")


def agreement_rows(models: pd.DataFrame, truth_name: str, proxies: list[str], spec: dict) -> tuple[pd.DataFrame, dict]:
    truth = models[truth_name].to_numpy(float)
    masks = {"all": np.ones((len(truth), len(truth)), dtype=bool), "close": close_mask(truth, spec["close"])}
    draws = bootstrap_indices(len(truth), spec["bootstrap"], spec["seed"])
    mats, rows, reps = {}, [], {}
    for proxy in proxies:
        mats[proxy] = agreement_matrix(signed(models[proxy].to_numpy(float), proxy), truth)
        tau = stats.kendalltau(signed(models[proxy].to_numpy(float), proxy), truth).statistic
        for pairs, mask in masks.items():
            point = mean_over_pairs(mats[proxy], mask)
            boot = np.array([mean_over_pairs(mats[proxy], mask, d) for d in draws])
            reps[(proxy, pairs)] = boot
            n_pairs = int(np.triu(mask, 1).sum())
            rows.append({"truth": truth_name, "proxy": proxy, "pairs": pairs, "n_pairs": n_pairs, "agreement": point,
                         "ci_low": float(np.nanpercentile(boot, 2.5)), "ci_high": float(np.nanpercentile(boot, 97.5)),
                         "kendall_tau": float(tau)})
    return pd.DataFrame(rows), reps


def decide(claims: list[dict], agree: pd.DataFrame, reps: dict, proxies: list[str]) -> pd.DataFrame:
    out = []
    primary = agree[agree["truth"] == agree["truth"].iloc[0]].set_index(["proxy", "pairs"])
    for c in claims:
        row = primary.loc[(c["proxy"], c["pairs"])]
        if c.get("kind") == "best_other":
            others = [p for p in proxies if p != c["proxy"]]
            best = max(others, key=lambda p: primary.loc[(p, c["pairs"]), "agreement"])
            diff = reps[(best, c["pairs"])] - reps[(c["proxy"], c["pairs"])]
            value = primary.loc[(best, c["pairs"]), "agreement"] - row["agreement"]
            lo, hi = float(np.nanpercentile(diff, 2.5)), float(np.nanpercentile(diff, 97.5))
            verdict = "fails" if lo > 0 else "holds"
            said = f"best other proxy {best}: {value:+.3f} [{lo:+.3f}, {hi:+.3f}] over {c['proxy']}"
        else:
            value, lo, hi = row["agreement"], row["ci_low"], row["ci_high"]
            t = c["threshold"]
            verdict = "holds" if lo > t else ("fails" if hi < t else "inconclusive")
            said = f"{value:.3f} [{lo:.3f}, {hi:.3f}] against {t} over {int(row['n_pairs'])} pairs"
        out.append({"id": c["id"], "statement": c["statement"], "result": said, "verdict": verdict})
    return pd.DataFrame(out)


def md_table(frame: pd.DataFrame, floats: str = "{:.3f}") -> str:
    cols = list(frame.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in frame.iterrows():
        cells = [floats.format(v) if isinstance(v, float) else str(v) for v in r]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(models: pd.DataFrame, truth: str, proxies: list[str], out: Path) -> None:
    from matplotlib.lines import Line2D

    trained = models[models["role"] == "model"].assign(short=lambda f: f["method"].str.split(" [", regex=False).str[0])
    methods = sorted(trained["short"].unique())
    colours = dict(zip(methods, plt.cm.tab10.colors))
    markers = {2: "o", 4: "s", 8: "^"}
    cols = 4
    rows = -(-(len(proxies) + 1) // cols)  # one panel more: the legend
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows))
    floor = models[models["role"] == "exact_score"]
    for ax, proxy in zip(axes.flat, proxies):
        for (method, rounds), g in trained.groupby(["short", "rounds"]):
            ax.scatter(g[truth], g[proxy], c=[colours[method]], marker=markers.get(int(rounds), "x"), s=28)
        if len(floor) and np.isfinite(floor[proxy]).all():
            ax.axhline(float(floor[proxy].iloc[0]), color="0.4", ls="--", lw=1)
        ax.set_xscale("log")
        if (trained[proxy] > 0).all() and table.better(proxy) == "lower":
            ax.set_yscale("log")
        ax.set_xlabel(f"{truth} (exact)")
        ax.set_ylabel(f"{proxy} ({table.better(proxy)} is better)")
    rest = list(axes.flat)[len(proxies):]
    for ax in rest:
        ax.axis("off")
    handles = ([Line2D([], [], ls="", marker="o", color=colours[m], label=m) for m in methods]
               + [Line2D([], [], ls="", marker=mk, color="0.3", label=f"{r} rounds") for r, mk in markers.items()]
               + [Line2D([], [], ls="--", color="0.4", label="floor (the exact score, sampled)")])
    rest[0].legend(handles=handles, loc="center", fontsize=8, frameon=False)
    fig.suptitle(f"gmm:fmnist28: every image proxy against the exact score error, {len(trained)} models "
                 "(5 methods x 2/4/8 rounds x 3 seeds; 400 samples each)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default=str(HERE / "runs"), help="the study's run folders (default: runs/ beside this file)")
    args = parser.parse_args()
    spec = tomllib.loads((HERE / "claims.toml").read_text())
    proxies, truths = list(spec["proxies"]), [spec["truth"], spec["second_truth"]]
    runs = load_runs(args.runs)
    models = models_frame(runs, truths + proxies)
    prereg = check_preregistration(HERE / "claims.toml", models.drop_duplicates("run_id")[["run_id", "path"]])
    trained = models[models["role"] == "model"].reset_index(drop=True)
    missing = trained[truths + proxies].isna().any()
    if missing.any():
        raise SystemExit(f"analyze.py: some models lack {list(missing[missing].index)}; finish the grid first")
    models.drop(columns=["path"]).to_csv(HERE / "models.csv", index=False, float_format="%.6g")
    frames, reps_by_truth = [], {}
    for truth in truths:
        agree, reps = agreement_rows(trained, truth, proxies, spec)
        frames.append(agree)
        reps_by_truth[truth] = reps
    agreement = pd.concat(frames, ignore_index=True)
    agreement.to_csv(HERE / "agreement.csv", index=False, float_format="%.4f")
    verdicts = decide(spec["claim"], frames[0], reps_by_truth[truths[0]], proxies)
    if prereg.failure:
        verdicts["verdict"] = "not decided (not pre-registered)"
    claims_md = [f"Claims of `claims.toml`, decided by analyze.py on {len(trained)} models "
                 f"({len(trained) * (len(trained) - 1) // 2} pairs).", "",
                 prereg.line, "", md_table(verdicts), ""]
    (HERE / "proxy_claims.md").write_text("\n".join(claims_md))
    shown = agreement.copy()
    shown["agreement"] = [f"{a:.3f} [{lo:.3f}, {hi:.3f}]" for a, lo, hi in zip(shown["agreement"], shown["ci_low"], shown["ci_high"])]
    shown = shown.drop(columns=["ci_low", "ci_high"])
    anchors = models[models["role"] != "model"][["role", *truths, *proxies]]
    ranges = trained[[*truths, *proxies]].agg(["min", "median", "max"]).T.reset_index().rename(columns={"index": "metric"})
    text = ["Generated by analyze.py from the runs (nothing retyped).", "",
            "**Agreement of each proxy with each truth** (95 % bootstrap interval over models):", "",
            md_table(shown), "", "**The anchors** (not paired):", "", md_table(anchors.reset_index(drop=True), "{:.4g}"), "",
            "**Range over the trained models:**", "", md_table(ranges, "{:.4g}"), ""]
    (HERE / "agreement.md").write_text("\n".join(text))
    plot(models, truths[0], proxies, HERE / "proxy_vs_exact.png")
    print(prereg.line)
    print(md_table(verdicts))


if __name__ == "__main__":
    main()
