"""bound: the seed claims, image track against ground truth (issue 62).

For each seed-paper claim the bound study re-decides, one row: the verdict the image track gave it
(image_track_verdicts.csv: the committed Fashion-MNIST study that decided it, its claim, verdict, estimate and
budget, copied from that study's claims.csv; the confirmatory study's where one re-decided it), the verdict the
ground truth gives it at the plateau (this study's claims.csv, written by `dfbench report --claims
results/bound/bound.claims.toml`), and whether the two agree: "yes" when both are the same decided verdict, "no"
when both are decided and differ, "—" with the reason when either is undecided or untested, or when the two
claims ask different questions (a ratio bound on one side, a direction or an equivalence on the other).

Writes seed_claims.md (the table docs/studies.md includes, and a note per claim); nothing is retyped: every value
is read from the two CSVs.

Run: .venv/bin/python results/bound/seed_claims.py  (make bench-bound runs it after the report)
     .venv/bin/python results/bound/seed_claims.py --claims /tmp/rep/claims.csv --out /tmp/rep/seed_claims.md
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from dfbench.benchmark.api import claims as C
from dfbench.benchmark.api import metric_table

HERE = Path(__file__).resolve().parent
BOUND_VERDICTS = {"within the bound", "beyond the bound"}  # an at_most claim's decided verdicts


def _cell(x) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else str(x).strip()


def _number(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def estimate_text(row: dict) -> str:
    """The estimate and its 95 % interval as claims.md prints them: ×0.959 [0.921, 0.999] for a ratio metric."""
    metric = _cell(row.get("metric"))
    ratio = bool(metric) and metric_table.scale(metric) == "log"

    def fmt(x) -> str:
        v = _number(x)
        return "" if not math.isfinite(v) else (f"×{v:.3g}" if ratio else f"{v:+.3g}")

    est = fmt(row.get("estimate"))
    if est and fmt(row.get("low")):
        est += f" [{fmt(row.get('low')).lstrip('×')}, {fmt(row.get('high')).lstrip('×')}]"
    return f"{est} {metric}".strip()


def expected_text(row: dict) -> str:
    """What a claim expects, as claims.md's `expected` column says it."""
    expect = _cell(row.get("expect"))
    if expect == "at_most":
        return f"A / B ≤ {_number(row.get('bound')):g}"
    if expect == "equivalent":
        return f"equivalent (±{_number(row.get('margin')):.0%})"
    return expect


def budget_text(budget: str, convergence: bool) -> str:
    """A budget cell's first clause (equal / unequal budget (...) / both at their plateau (...)); with
    `convergence`, also the clause saying a side stopped at the cap before its plateau."""
    clauses = [c.strip() for c in _cell(budget).split(" · ") if c.strip()]
    if not clauses:
        return ""
    kept = clauses[:1] + [c for c in clauses[1:] if convergence and c.startswith("at budget")]
    return " · ".join(kept)


def verdict_text(row: dict) -> str:
    verdict, outcome = _cell(row.get("verdict")), _cell(row.get("outcome"))
    return f"{verdict} ({outcome})" if outcome else verdict


def undecided_reason(side: str, row: dict) -> str:
    verdict = _cell(row.get("verdict")) or "no verdict"
    seeds = _number(row.get("seeds_to_decide"))
    more = f": {int(seeds)} seeds would decide it" if math.isfinite(seeds) else ""
    return f"{side} {verdict}{more}"


def agreement(image: dict, truth: dict) -> str:
    """yes / no / — (reason): the two verdicts compared where both are decided and answer the same question."""
    iv, tv = _cell(image.get("verdict")), _cell(truth.get("verdict"))
    open_sides = [undecided_reason(side, row) for side, row, v in (("image track", image, iv), ("ground truth", truth, tv))
                  if v not in C.DECIDED]
    if open_sides:
        return f"— ({'; '.join(open_sides)})"
    same_form = (iv in BOUND_VERDICTS) == (tv in BOUND_VERDICTS) and (
        iv not in BOUND_VERDICTS or _number(image.get("bound")) == _number(truth.get("bound")))
    if not same_form:
        return (f"— (different questions: the image track's {expected_text(image)} is {iv}, the ground truth's "
                f"{expected_text(truth)} is {tv})")
    return "yes" if iv == tv else "no"


def table(image: pd.DataFrame, truth: pd.DataFrame) -> str:
    """The markdown the docs include: one row per seed claim, then each claim's note."""
    decided = {str(r["id"]): r for r in truth.to_dict("records")}
    lines = ["| claim | source | image track: verdict (study, estimate, budget) | ground truth: verdict (estimate [95% CI], "
             "budget) | agree? |",
             "|---|---|---|---|---|"]
    notes = []
    for r in image.to_dict("records"):
        cid = _cell(r["bound_claim_id"])
        t = decided.get(cid)
        if t is None:
            truth_cell, agree, statement, source = "not in claims.csv", "— (ground truth not decided)", "", ""
            t = {}
        else:
            statement, source = _cell(t.get("statement")), _cell(t.get("source"))
            truth_cell = " · ".join(x for x in (verdict_text(t), estimate_text(t), budget_text(t.get("budget"), True)) if x)
            agree = agreement(r, t)
        if _cell(r["study"]):
            where = f"{_cell(r['study'])} {_cell(r['claim_id'])}, {_cell(r['registration'])}: {expected_text(r)}"
            image_cell = " · ".join(x for x in (verdict_text(r), where, estimate_text(r), budget_text(r.get("budget"), False)) if x)
        else:
            image_cell = _cell(r["verdict"])
        claim = f"{cid}: {statement}" if statement else cid
        lines.append(f"| {claim} | {source} | {image_cell} | {truth_cell} | {agree} |")
        if _cell(r.get("note")):
            notes.append(f"- {cid}: {_cell(r['note'])}.")
    out = lines
    if notes:
        out += ["", "Which image-track claim stands for each seed claim (`results/bound/image_track_verdicts.csv`):", "", *notes]
    out += ["", "Written by `results/bound/seed_claims.py` from `results/bound/image_track_verdicts.csv` (the image "
            "track: fd_fmnist on Fashion-MNIST, each from its study's claims.csv) and `results/bound/claims.csv` (the "
            "ground truth on gmm:dim4, paired by seed, Holm over the bound study's claims)."]
    return "\n".join(out) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image", type=Path, default=HERE / "image_track_verdicts.csv", help="the image track's verdicts")
    p.add_argument("--claims", type=Path, default=HERE / "claims.csv", help="the bound study's decided claims")
    p.add_argument("--out", type=Path, default=HERE / "seed_claims.md", help="where the table goes")
    a = p.parse_args()
    if not a.claims.is_file():
        p.error(f"{a.claims} not found: `dfbench report --runs results/bound/runs --out results/bound "
                "--claims results/bound/bound.claims.toml` writes it")
    image = pd.read_csv(a.image, dtype=str, keep_default_na=False)
    truth = pd.read_csv(a.claims)
    a.out.write_text(table(image, truth), encoding="utf-8")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
