"""bound: the training part of the generation-error bound of Qiao et al. (ICML 2025) against the exact score error.

Reads the finished runs through the one reader (dfbench.benchmark.api.iter_runs), names each run's setting from
make_study.py's tables (method spec + the factors that differ from BASE), and writes beside this file (--out):
  runs_bound.csv         one row per trained run (no rounds-0 anchor, no exact_score): the bound's quantities, the
                         exact metrics, and the three training terms under each reading of G
  regression.md/.csv     score_kl on the terms (log-linear, linear OLS, linear NNLS: R^2, 95 % bootstrap intervals,
                         sign against the bound's +), and the log-log slope on each single factor in its family
  bound_vs_measured.png  the fitted bound (averaged reading), and the literal term sum, against score_kl
  terms.md               the bound term by term: what it predicts, the registered claims' paired estimates and
                         verdicts (claims.csv, written by the report), the one-factor slope, what the data say
                         (quoted by docs/diagnostics.md and this study's README)
  factors.md             per family and setting: mean score_kl / frechet_exact with 95 % t-intervals over seeds,
                         the bound's ratio to the base's, and what make_study.py's CLAIMS predict

The bound's training part (the authors' answers), its three terms as columns drift / noise / eta2:
  B_train = eta S R w2 L N / G  +  eta S R N (s1 + s2) / G  +  eta^2 S R L N s1 / G^2
eta = train.lr (the clients' Adam step size: an assumption, the bound is written for SGD), S = train.local_steps,
R = metrics.json "rounds" (rounds trained), N = data.clients, w2 = the mean over rounds of rounds.jsonl w2,
s1 / s2 = the means over rounds of sigma1_sq / sigma2_sq. L (smoothness) is unknown: the terms are written with
L = 1 and the regressions fit a free coefficient per term. score_kl is the score-estimation error (no sampler),
so only the training terms enter, each multiplied by d (the bound is linear in d; d from data.dataset "gmm:dimD");
the sampler part ((d+M2) e^{-2T} + kappa^2 d K + kappa M2 + kappa d T) is not modelled. The K settings (the base's
model sampled with other step counts: the same score_kl) are in runs_bound.csv and factors.md, not in the fits.
Readings of G:
  literal     G = Gamma* as recorded; runs with Gamma* = 0 (random and top-k masks, FedRolex) have an infinite
              bound: counted, shown at the plot's edge, left out of every fit.
  averaged    G = G_bar = N x (fraction of the deployed entries one client trains), from the config (ASSUMED):
              1 for FedAvg-like methods; keep_ratio for random/top-k/balanced masks; rate^2 for FedRolex (the
              hidden layers of an MLP at channel rate r); 1 for HeteroFL (every client holds the rate-r network,
              which is all it deploys: recorded Gamma* = N, w2 = 0); 1/num_experts for the experts (a client
              trains one expert of those deployed).
  per_sample  the averaged terms divided by S R (the displayed sums read as averages over the steps).

Run: .venv/bin/python results/bound/analyze.py [--runs DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import re
import runpy
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import optimize  # noqa: E402

from dfbench.benchmark.api import iter_runs, runfolder, t_interval  # noqa: E402

HERE = Path(__file__).resolve().parent
STUDY = runpy.run_path(str(HERE / "make_study.py"))  # its tables (SETTINGS, BASE, FACTORS, CLAIMS); main() not run
SETTINGS, BASE, FACTORS, CLAIMS = STUDY["SETTINGS"], STUDY["BASE"], STUDY["FACTORS"], STUDY["CLAIMS"]
METRICS = ("score_kl", "frechet_exact", "nll_gap", "component_tv", "velocity_mse", "denoise_loss")
TERMS = ("drift", "noise", "eta2")
READINGS = ("literal", "averaged", "per_sample")
REPS, SEED = 2000, 62
FACTOR_FAMILY = {"data.partition": "sigma_2^2 (partition)", "train.lr": "eta", "train.local_steps": "S",
                 "train.rounds": "R", "data.clients": "N", "data.dataset": "d", "eval.sampler_steps": "K (sampler)"}
MASK_METHODS = ("random_prune", "topk_prune", "balanced_prune")
METHOD_FAMILY = {"random_prune": "w2 (random masks)", "topk_prune": "Gamma* (mask kind)", "heterofl": "sub-models",
                 "balanced_prune": "Gamma* (mask kind)", "fedrolex": "sub-models", "fedavgm": "server optimizer",
                 "fedadam": "server optimizer", "scaffold": "server optimizer"}
MASKS = [n for n, (s, _) in SETTINGS.items() if s.split("?")[0] in MASK_METHODS]
# factor, x column, settings (base + that factor's), the bound's exponent range (lo, hi), what it says
SLOPES = [
    ("eta", "eta", ["base", "lr-0.003", "lr-0.03"], (1, 2), "+1 (drift, noise terms) to +2 (eta^2 term)"),
    ("S", "S", ["base", "S-3", "S-30"], (1, 1), "+1 as written (0 if the terms are averages over steps)"),
    ("R", "R", ["R-64", "R-128", "R-256"], (1, 1), "+1 as written (0 if averages); the budget family, no plateau"),
    ("N", "N", ["base", "N-5", "N-20"], (-1, 0), "N/G = 1 at full participation: 0 (noise term) to -1 (eta^2 term)"),
    ("d", "d", ["base", "d-2", "d-8", "d-16"], (1, 1), "+1 (linear in d)"),
    ("w2", "w2", [n for n in MASKS if n.startswith("random")], (0, 1),
     "between 0 and +1 (w2 enters the drift term); random masks only: the base has w2 = 0"),
    ("1/G_bar", "inv_gamma_bar", ["base", *MASKS], (1, 2), "+1 (1/G) to +2 (1/G^2); w2 moves with it here"),
    ("s2", "sigma2_sq", ["base", "iid", "dirichlet-0.1"], (0, 1), "between 0 and +1 (s1 + s2 in the noise term)"),
]


def same(a, b) -> bool:
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def spec_parts(spec: str) -> tuple[str, dict]:
    method, _, query = spec.partition("?")
    return method, dict(p.split("=", 1) for p in query.split("&") if p)


def label(cfg: dict, scale: float) -> str | None:
    """The SETTINGS name whose method spec and factor values the config has (train.rounds scaled by `scale`, so a
    smoke copy of the grid, 4 rounds for 256, is named too); None unless exactly one matches."""
    flat = {f"{s}.{k}": v for s in ("data", "train", "eval") for k, v in cfg[s].items()}
    flat["data.dataset"] = str(flat["data.dataset"]).split("?")[0]
    hits = []
    for name, (spec, over) in SETTINGS.items():
        method, params = spec_parts(spec)
        if method != cfg["method"] or not all(same(cfg["method_params"].get(k), v) for k, v in params.items()):
            continue
        want = {k: over.get(k, BASE[k]) for k in FACTORS}
        want["train.rounds"] = max(1, round(want["train.rounds"] * scale))
        if all(same(flat[k], want[k]) for k in FACTORS):
            hits.append(name)
    return hits[0] if len(hits) == 1 else None


def family(name: str) -> str:
    spec, over = SETTINGS[name]
    method = spec.split("?")[0]
    if method != "fedavg":
        return METHOD_FAMILY.get(method, method)
    moved = [k for k in FACTORS if k in over and k != "train.plateau"]
    return FACTOR_FAMILY[moved[0]] if moved else "base"


def trained_fraction(method: str, params: dict) -> float:
    """The fraction of the deployed entries one client trains (the averaged reading's assumption, module doc)."""
    if method in MASK_METHODS:
        return float(params["keep_ratio"])
    return float(params["rate"]) ** 2 if method == "fedrolex" else 1 / int(params.get("num_experts", 1))


def terms(eta, S, R, N, w2, s1, s2, G) -> tuple[float, float, float]:
    if not G > 0:
        return (np.inf,) * 3
    common = eta * S * R * N / G
    return common * w2, common * (s1 + s2), eta * common * s1 / G


def run_rows(root: Path) -> tuple[pd.DataFrame, list[str]]:
    folders = [(rf, rf.config()) for rf in iter_runs(root) if rf.state() == runfolder.DONE]
    plateau_rounds = Counter(c["train"]["rounds"] for _, c in folders if c["train"]["plateau"] > 0)
    scale = plateau_rounds.most_common(1)[0][0] / BASE["train.rounds"] if plateau_rounds else 1.0
    rows, skipped = [], []
    for rf, cfg in folders:
        m = rf.metrics() or {}
        if not m.get("rounds") or cfg["method"] == "exact_score":
            continue
        name = label(cfg, scale)
        evals = {}  # the result's rows (an inference variant's say configured = false)
        for e in (e for e in m.get("evaluations", []) if e.get("configured", True) is not False):
            evals.setdefault(e["metric"], e["value"])
        if name is None or "score_kl" not in evals:
            skipped.append(f"{rf.run_id} ({'no setting' if name is None else 'no score_kl'})")
            continue
        rounds = runfolder.read_rounds(rf.path)
        mean = lambda k: float(np.mean([r[k] for r in rounds if r.get(k) is not None]))  # noqa: E731
        dim = re.match(r"gmm:dim(\d+)", cfg["data"]["dataset"])
        if dim is None:
            raise SystemExit(f"analyze.py: {rf.run_id}: data.dataset {cfg['data']['dataset']!r} is not gmm:dimD")
        t = cfg["train"]
        row = {"setting": name, "family": family(name), "run_id": rf.run_id, "seed": cfg["seed"], "eta": t["lr"],
               "S": t["local_steps"], "R": int(m["rounds"]), "N": cfg["data"]["clients"], "d": int(dim.group(1)),
               "w2": mean("w2"), "gamma_star": float(m["gamma_star"]),
               "gamma_bar": cfg["data"]["clients"] * trained_fraction(cfg["method"], cfg["method_params"]),
               "sigma1_sq": mean("sigma1_sq"), "sigma2_sq": mean("sigma2_sq"),
               "sampler_steps": cfg["eval"]["sampler_steps"], **{k: evals.get(k, np.nan) for k in METRICS}}
        q = [row[k] for k in ("eta", "S", "R", "N", "w2", "sigma1_sq", "sigma2_sq")]
        for reading, G, per in (("literal", row["gamma_star"], 1), ("averaged", row["gamma_bar"], 1),
                                ("per_sample", row["gamma_bar"], row["S"] * row["R"])):
            row.update({f"{k}_{reading}": v / per for k, v in zip(TERMS, terms(*q, G))})
        rows.append(row)
    frame = pd.DataFrame(rows)
    order = {n: i for i, n in enumerate(SETTINGS)}
    frame = frame.sort_values(["setting", "seed"], key=lambda c: c.map(order) if c.name == "setting" else c)
    frame["inv_gamma_bar"] = 1.0 / frame["gamma_bar"]
    return frame.reset_index(drop=True), skipped


def design(T: np.ndarray, log: bool) -> tuple[np.ndarray, list[str]]:
    """The intercept and the d-multiplied terms, or their logs; in the log design a term that is 0 in some runs
    (drift: w2 = 0 without masks) enters as log(term) where > 0 plus an indicator of its zeros."""
    cols, names = [np.ones(len(T))], ["intercept"]
    for t, col in zip(TERMS, T.T):
        pos = col > 0
        if not log or pos.all():
            cols.append(np.log(col) if log else col)
            names.append(f"log d*{t}" if log else f"d*{t}")
        elif pos.any():
            cols += [np.log(np.where(pos, col, 1)), (~pos).astype(float)]
            names += [f"log d*{t} (where > 0)", f"{t} = 0"]
    return np.column_stack(cols), names


def ols(X, y):
    return np.linalg.lstsq(X, y, rcond=None)[0]


def nnls(X, y):
    s = np.abs(X).max(0)
    s[s == 0] = 1
    return optimize.nnls(X / s, y)[0] / s


def r2(X, y, coef) -> float:
    return float(1 - np.sum((y - X @ coef) ** 2) / np.sum((y - y.mean()) ** 2))


def verdict(lo: float, hi: float, pred: tuple[float, float]) -> str:
    """yes / no / opposite / inconclusive: the CI's sign against the predicted exponent range (or sign)."""
    if lo > 0 or hi < 0:
        sign = 1 if lo > 0 else -1
        if (sign > 0 and pred[1] > 0) or (sign < 0 and pred[0] < 0):
            return "yes"
        return "no" if pred == (0, 0) else "opposite"
    if lo == hi == 0:
        return "no (fitted as 0)"
    return "yes" if pred == (0, 0) else "inconclusive"


def bound(runs: pd.DataFrame, reading: str) -> pd.Series:
    """d x the sum of the three terms with L = 1 (inf where G = 0)."""
    return runs[[f"{t}_{reading}" for t in TERMS]].sum(axis=1) * runs["d"]


def regressions(runs: pd.DataFrame) -> tuple[pd.DataFrame, dict, dict]:
    """The fits over `runs` (the K family left out by the caller) and the one-factor slopes."""
    rng = np.random.default_rng(SEED)
    rows, fits, excluded = [], {}, {}
    for reading in READINGS:
        T = runs[[f"{t}_{reading}" for t in TERMS]].to_numpy(float) * runs[["d"]].to_numpy(float)
        ok = np.isfinite(T).all(1)
        excluded[reading] = int((~ok).sum())
        if ok.sum() < 6:  # too few runs for four or five coefficients
            continue
        y = runs["score_kl"].to_numpy(float)[ok]
        for model, log, fit in (("log-linear", True, ols), ("linear OLS", False, ols), ("linear NNLS", False, nnls)):
            X, names = design(T[ok], log)
            yy = np.log(y) if log else y
            coef = fit(X, yy)
            boot = np.array([fit(X[i], yy[i]) for i in rng.integers(0, len(yy), (REPS, len(yy)))])
            fits[(reading, model)] = (X, coef)
            for j, nm in enumerate(names):
                lo, hi = np.percentile(boot[:, j], [2.5, 97.5])
                pred = "+" if nm.startswith(("d*", "log d*")) else "none"
                rows.append({"kind": "fit", "reading": reading, "model": model, "n_runs": int(ok.sum()),
                             "r2": r2(X, yy, coef), "term": nm, "estimate": coef[j], "ci_low": lo, "ci_high": hi,
                             "predicted": pred,
                             "supported": verdict(lo, hi, (1, 1)) if pred == "+" else "n/a"})
    for factor, col, names, pred, said in SLOPES:
        sub = runs[runs["setting"].isin(names)]
        x, y = np.log(sub[col].to_numpy(float)), np.log(sub["score_kl"].to_numpy(float))
        row = {"kind": "slope", "reading": "one factor", "model": "log-log slope", "n_runs": len(sub), "term": factor,
               "settings": " ".join(n for n in names if n in set(sub["setting"])), "predicted": said,
               "predicted_lo": pred[0], "predicted_hi": pred[1]}
        if len(sub) < 3 or np.ptp(x) == 0:
            rows.append({**row, "estimate": np.nan, "ci_low": np.nan, "ci_high": np.nan, "predicted_in_ci": "-",
                         "supported": "no data"})
            continue
        groups = [np.flatnonzero(sub["setting"].to_numpy() == n) for n in sub["setting"].unique()]
        slope = lambda i: np.polyfit(x[i], y[i], 1)[0] if np.ptp(x[i]) > 0 else np.nan  # noqa: E731
        boot = np.array([slope(np.concatenate([rng.choice(g, len(g)) for g in groups])) for _ in range(REPS)])
        lo, hi = np.nanpercentile(boot, [2.5, 97.5])
        X = np.column_stack([np.ones_like(x), x])
        rows.append({**row, "r2": r2(X, y, ols(X, y)), "estimate": slope(np.arange(len(x))), "ci_low": lo,
                     "ci_high": hi, "supported": verdict(lo, hi, pred),
                     "predicted_in_ci": "yes" if lo <= pred[1] and hi >= pred[0] else "no"})
    return pd.DataFrame(rows), fits, excluded


def md_table(frame: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    for _, r in frame.iterrows():
        lines.append("| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in r) + " |")
    return "\n".join(lines)


def ci(est, lo, hi) -> str:
    return f"{est:+.3g} [{lo:+.3g}, {hi:+.3g}]" if np.isfinite(est) else "-"


def write_regression(reg: pd.DataFrame, excluded: dict, runs: pd.DataFrame, out: Path) -> None:
    reg.to_csv(out / "regression.csv", index=False, float_format="%.6g")
    fit, slope = reg[reg["kind"] == "fit"], reg[reg["kind"] == "slope"]
    summary = fit.drop_duplicates(["reading", "model"])[["reading", "model", "n_runs", "r2"]]
    coefs = fit.assign(**{"estimate [95 % CI]": [ci(*r) for r in fit[["estimate", "ci_low", "ci_high"]].to_numpy()]})
    slopes = slope.assign(**{"slope [95 % CI]": [ci(*r) for r in slope[["estimate", "ci_low", "ci_high"]].to_numpy()]})
    text = [f"Written by results/bound/analyze.py from {len(runs)} trained runs ({runs['setting'].nunique()} "
            f"settings); {REPS} bootstrap resamples over runs (seed {SEED}), 95 % percentile intervals. The K family "
            "is left out: the base's trained model sampled with other step counts, so the same score_kl.", "",
            "score_kl against the bound's training terms, each multiplied by d (L free: one coefficient per term). "
            "Literal reading: G = Gamma* as recorded; "
            f"{excluded['literal']} runs have Gamma* = 0 (an infinite bound) and are left out of its fits. Averaged: "
            "G = N x the fraction of the deployed entries a client trains (an assumption, analyze.py's doc). "
            "Per-sample: the averaged terms / (S R). Log-linear: log score_kl on the terms' logs (a term that is 0 "
            "in some runs enters as its log where > 0 plus an indicator of its zeros); R^2 on the log scale.", "",
            "**Fits** (R^2: the share of the variance the fit explains):", "", md_table(summary), "",
            "**Coefficients** (the bound predicts + for every term; NNLS cannot go below 0):", "",
            md_table(coefs[["reading", "model", "term", "estimate [95 % CI]", "predicted", "supported"]]), "",
            "**One factor at a time**: the log-log slope of score_kl on each factor within the base and that factor's "
            "settings (the interval resamples runs within each setting), against the exponent the bound predicts:", "",
            md_table(slopes[["term", "settings", "n_runs", "slope [95 % CI]", "predicted", "predicted_in_ci",
                             "supported"]].rename(columns={"term": "factor"})), "",
            "supported?: yes = the interval excludes 0 on the predicted side; opposite = it excludes 0 on the other; "
            "no = it excludes 0 where the bound predicts 0 (or the fit sets the term to 0); inconclusive = it "
            "covers 0. predicted_in_ci: whether the interval meets the predicted exponent range.", ""]
    (out / "regression.md").write_text("\n".join(text))


def write_factors(runs: pd.DataFrame, out: Path) -> None:
    said, ref = {}, {}
    for _, a, b, expect, _, source, extra in CLAIMS:
        said.setdefault(a, []).append(f"{expect} than {b} on {extra.get('metric', 'score_kl')} ({source})")
        ref.setdefault(b, []).append(a)
    base = {r: bound(runs[runs["setting"] == "base"], r).mean() for r in ("literal", "averaged")}
    text = ["Written by results/bound/analyze.py: per family, each setting's mean over seeds with its 95 % "
            "t-interval; d x B_train (L = 1) over the base's under the literal and averaged readings (> 1: the "
            "bound predicts worse; inf: Gamma* = 0); and what the claims (make_study.py's CLAIMS) predict.", ""]
    for fam in dict.fromkeys(runs["family"]):
        names = [n for n in dict.fromkeys(runs["setting"]) if family(n) == fam]
        rows = []
        for n in (["base", *names] if fam not in ("base", "R") else names):
            g = runs[runs["setting"] == n]
            spec, over = SETTINGS[n]
            cells = {"setting": n, "method / change": " ".join([spec, *(f"{k}={v}" for k, v in over.items())]),
                     "seeds": len(g)}
            for metric in ("score_kl", "frechet_exact"):
                mean, iv = t_interval(g[metric].tolist()) if g[metric].notna().any() else (np.nan, None)
                cells[metric] = f"{mean:.4g}" + (f" [{iv.low:.4g}, {iv.high:.4g}]" if iv else "")
            for r in ("literal", "averaged"):
                cells[f"d B_train / base's, {r}"] = f"{bound(g, r).mean() / base[r]:.3g}" if len(g) else "-"
            cells["predicted"] = "; ".join(said.get(n, ["(the reference)" if n == "base" else
                                                        f"(reference of {', '.join(ref.get(n, ['none']))})"]))
            rows.append(cells)
        text += [f"## {fam}", "", md_table(pd.DataFrame(rows)), ""]
    (out / "factors.md").write_text("\n".join(text))


def plot(runs: pd.DataFrame, fits: dict, out: Path) -> None:
    fams = list(dict.fromkeys(runs["family"]))
    colour = dict(zip(fams, plt.cm.tab20.colors[::2] + plt.cm.tab20.colors[1::2]))
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.6))
    X, coef = fits[("averaged", "linear NNLS")]  # every run has a finite averaged bound
    pred, y = X @ coef, runs["score_kl"].to_numpy(float)
    literal = bound(runs, "literal").to_numpy(float)
    finite = np.isfinite(literal) & (literal > 0)
    edge = literal[finite].max() * 3 if finite.any() else 1.0
    for f in fams:
        i = (runs["family"] == f).to_numpy()
        axes[0].scatter(pred[i], y[i], s=22, color=colour[f], label=f)
        axes[1].scatter(literal[i & finite], y[i & finite], s=22, color=colour[f])
        axes[1].scatter(np.full((i & ~np.isfinite(literal)).sum(), edge), y[i & ~np.isfinite(literal)], s=40,
                        marker=">", color=colour[f])
    lo, hi = min(pred.min(), y.min()) * 0.8, max(pred.max(), y.max()) * 1.25
    axes[0].plot([lo, hi], [lo, hi], color="0.4", ls="--", lw=1, label="identity")
    axes[0].set(xscale="log", yscale="log", xlabel="fitted bound: NNLS of score_kl on d x terms, averaged G",
                ylabel="measured score_kl", title=f"fitted bound (averaged reading), R^2 = {r2(X, y, coef):.2f}")
    axes[1].set(xscale="log", yscale="log", xlabel="literal B_train term sum x d (L = 1, G = Gamma* recorded)",
                ylabel="measured score_kl", title="measured against the literal bound (not fitted)")
    if (~np.isfinite(literal)).any():
        axes[1].axvline(edge / 1.7, color="0.6", ls=":", lw=1)
        axes[1].annotate(f"infinite:\nGamma* = 0\n({(~np.isfinite(literal)).sum()} runs)", (edge, y.max()),
                         ha="center", va="top", fontsize=8)
        axes[1].set_xlim(literal[finite].min() / 2 if finite.any() else None, edge * 2)
    for ax in axes:
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if str(f"{v:g}")[0] in "1235" else ""))
    fig.legend(*axes[0].get_legend_handles_labels(), loc="center right", fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 0.86, 1))
    fig.savefig(out / "bound_vs_measured.png", dpi=100)
    plt.close(fig)


# the bound's factors in the order of docs/diagnostics.md: (factor, [(claim, the bound's sign for A against B: +1 A worse,
# -1 A better, 0 no prediction)], the slope's term in regression.csv or "", what the bound predicts). The signs are the
# bound's own, read from the seed text (README: "the predictions"), not the claim's source: FedRolex's and top-k's
# claims come from their papers, and the bound predicts FedRolex worse (its Gamma*: 0 recorded, rate^2 N averaged,
# against HeteroFL's N) and top-k better (at equal Gamma_bar its w2, norm-weighted, is the smaller).
TERM_ROWS = [
    ("w² (pruning extent)", [("w2-0.75", 1), ("w2-0.5", 1), ("w2-0.25", 1)], "w2", "more pruning is worse"),
    ("Γ* (coverage)", [("gamma-balanced", -1), ("fedrolex", 1)], "1/G_bar",
     "higher Γ* is better: balanced over random masks, HeteroFL over FedRolex; literally infinite at Γ* = 0 (random "
     "and top-k masks, FedRolex)"),
    ("w² at equal Γ̄: top-k against random masks", [("qiao-topk-0.75", -1), ("qiao-topk-0.5", -1), ("qiao-topk-0.25", -1)],
     "", "top-k better (its w², weighted by the weights' norm, is far smaller); the literal reading cannot rank them"),
    ("σ₂² (dispersion between clients)", [("sigma2-iid", -1), ("sigma2-0.1", 1)], "s2", "more label skew is worse"),
    ("η (learning rate)", [("eta-0.003", -1), ("eta-0.03", 1)], "eta", "a smaller learning rate is better"),
    ("S (local steps)", [("S-3", -1), ("S-30", 1)], "S", "literal: fewer local steps are better"),
    ("R (rounds)", [("R-64", -1), ("R-128", -1)], "R", "literal: fewer rounds are better"),
    ("N (clients, full participation)", [("N-20", -1), ("N-5", 1)], "N", "more clients are better (the η² term)"),
    ("d (dimension)", [("d-2", -1), ("d-8", 1), ("d-16", 1)], "d", "linear in d"),
    ("K (sampler steps), on frechet_exact", [("K-200", -1), ("K-10", 1)], "", "more steps are better"),
]


def write_terms(reg: pd.DataFrame, claims_csv: Path, out: Path) -> None:
    """terms.md: per factor of the bound, the registered claims (as the report decided them) beside the one-factor
    slope, and whether the measured direction is the one the bound predicts."""
    if not claims_csv.is_file():
        print(f"analyze.py: no {claims_csv} (run dfbench report --claims first): terms.md not written")
        return
    claims = pd.read_csv(claims_csv).set_index("id")
    slopes = reg[reg["kind"] == "slope"].set_index("term")
    lines = ["| factor | the bound predicts | claims (A / B [95 % CI], verdict after Holm) | one-factor slope of log score_kl "
             "[95 % CI] | measured against the bound |", "|---|---|---|---|---|"]
    for factor, pairs, term, predicted in TERM_ROWS:
        cells, signs = [], []
        for cid, sign in pairs:
            c = claims.loc[cid]
            cells.append(f"{cid}: ×{c['estimate']:.3g} [{c['low']:.3g}, {c['high']:.3g}], {c['verdict']}")
            if sign and (c["low"] > 1 or c["high"] < 1):  # the interval excludes no difference (before Holm)
                signs.append("as predicted" if (c["low"] > 1) == (sign > 0) else "opposite")
        slope = ""
        if term and term in slopes.index:
            r = slopes.loc[term]
            slope = f"{r['estimate']:+.3g} [{r['ci_low']:+.3g}, {r['ci_high']:+.3g}] (predicted {r['predicted']})"
        direction = (", ".join(sorted(set(signs))) + f" ({len(signs)} of {len(pairs)} intervals exclude 1)") if signs \
            else f"undecided (no interval of the {len(pairs)} excludes 1)"
        lines.append(f"| {factor} | {predicted} | {'; '.join(cells)} | {slope} | {direction} |")
    lines += ["", "Claims: `claims.csv` (score_kl unless the factor says otherwise; paired by seed, the verdict after "
              "Holm over the study's claims). Slopes: `regression.csv` (the interval resamples runs within each setting). "
              "Measured against the bound: from each claim's unadjusted 95 % interval, so it can be decided where the "
              "Holm-adjusted verdict is not; the bound's sign for each claim is analyze.py's TERM_ROWS."]
    (out / "terms.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=Path, default=HERE / "runs", help="the study's run folders (default: runs/ here)")
    p.add_argument("--out", type=Path, default=HERE, help="where the outputs go (default: beside this file)")
    a = p.parse_args()
    runs, skipped = run_rows(a.runs)
    if skipped:
        print(f"analyze.py: left out {len(skipped)} runs: " + ", ".join(skipped))
    fitted = runs[runs["sampler_steps"] == BASE["eval.sampler_steps"]].reset_index(drop=True)  # no K family
    if len(fitted) < 6:
        raise SystemExit(f"analyze.py: {len(fitted)} finished trained runs under {a.runs}: too few to fit")
    a.out.mkdir(parents=True, exist_ok=True)
    runs.drop(columns=["inv_gamma_bar"]).to_csv(a.out / "runs_bound.csv", index=False, float_format="%.6g")
    reg, fits, excluded = regressions(fitted)
    write_regression(reg, excluded, fitted, a.out)
    write_factors(runs, a.out)
    write_terms(reg, a.out / "claims.csv", a.out)
    plot(fitted, fits, a.out)
    print((a.out / "regression.md").read_text())


if __name__ == "__main__":
    main()
