"""How many fresh seeds each confirmatory claim gets, from the spread of the exploratory study it re-decides:

    python results/confirmatory/sizing.py

For every claim of confirmatory.claims.toml, its exploratory study (`SOURCES`) is read from the study's committed
runs.csv: the runs of the claim's two settings paired by seed, the log-ratio A / B of the claim's metric, its mean
and standard deviation. The seeds needed are those at which the report's own test of the claim reaches power 0.8
with that mean and sd taken as the truth, at Holm's strictest level over this file's claims (alpha = 0.05 / 3):
`benchmark/studies/gpu_plan.size_seeds`, the helper that sized cifar10-gpu (a one-sided t-test against the bound
for `at_most`, `verdicts.seeds_to_decide` otherwise), at least `gpu_plan.MIN_SEEDS`. The seeds used fit `BUDGET_S`
with `WORKERS` one-thread workers, at the median wall_seconds of each setting's exploratory runs: when the needs do
not fit, the claim with the largest need is cut to what fits, and its expected power at that number is printed (at
0.05 / 3, and at 0.05: Holm's last step, where it is tested if the other two claims are decided first).

Before any number it checks what makes the re-run confirmatory of *that* claim: each claim has its source claim's
settings, metric, expectation, bound and margin, and each cell of confirmatory.toml has, key for key, the resolved
config of a cell of its source grid but for the seed. It also prints, for information, the seeds the two
independent metrics (fd_fmnist_ae, denoise_loss) would need for the same claim, since a claim decided by
fd_fmnist alone may be metric-dependent (issue 54, item 1). The printed lines are the table in confirmatory.toml's
header. Reads only committed files; trains nothing.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd
from scipy import stats

from dfbench.benchmark.grid.spec import Cell, load_grid
from dfbench.benchmark.report import claims as C
from dfbench.benchmark.report import verdicts as V
from dfbench.benchmark.studies import gpu_plan

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent
GRID = HERE / "confirmatory.toml"
CLAIMS = HERE / "confirmatory.claims.toml"
# claim of this study -> (the exploratory study, its claim id)
SOURCES = {
    "C-qiao-0.5": ("paper-fmnist", "C1-0.5"),
    "C-feddm-8bit": ("cpu-compression", "feddm-8bit"),
    "C-ddm-top1": ("cpu-experts", "top1-no-worse"),
}
CHECKS = ("fd_fmnist_ae", "denoise_loss")  # the independent metrics, shown for information
BUDGET_S = 35 * 60  # the whole grid, wall clock
WORKERS = 2  # one-thread grid workers on the 2-core machine


def check_claims(claims: list[C.Claim]) -> None:
    """Each claim re-decides its source claim unchanged: same settings, metric, expectation, bound and margin."""
    for claim in claims:
        study, source_id = SOURCES[claim.id]
        source = {c.id: c for c in C.load_claims(RESULTS / study / f"{study}.claims.toml")}[source_id]
        for key in ("a", "b", "expect", "bound", "metric", "margin", "where"):
            if getattr(claim, key) != getattr(source, key):
                raise SystemExit(f"{claim.id}: {key} = {getattr(claim, key)!r}, but {study}'s {source_id} has "
                                 f"{getattr(source, key)!r}; a confirmatory claim keeps its source's {key}")


def check_cells(cells: tuple[Cell, ...]) -> None:
    """Every cell is a cell of one source grid but for its seed (the resolved configs compared field by field)."""
    studies = sorted({s for s, _ in SOURCES.values()})
    sources = [c for study in studies for c in load_grid(RESULTS / study / f"{study}.toml").cells]
    for cell in cells:
        if not any(dataclasses.replace(cell.cfg, seed=src.cfg.seed) == src.cfg for src in sources):
            raise SystemExit(f"{GRID.name}: cell {cell.label} is no source grid's cell with another seed; copy the "
                             f"source cell's keys (the source grids: {', '.join(studies)})")


def pair_seconds(runs: pd.DataFrame, claim: C.Claim) -> float:
    """The median wall_seconds of A's plus B's exploratory runs: the cost of one more seed of the claim."""
    return float(sum(C.select(runs, spec, claim.where)["wall_seconds"].median() for spec in (claim.a, claim.b)))


def power_at(n: int, sizing: gpu_plan.Sizing, claim: C.Claim, alpha: float) -> float:
    """The power at n seeds of the test that sizes the claim (the same rules as gpu_plan.size_seeds)."""
    mean = math.log(sizing.estimate)
    if claim.expect == "at_most":  # one-sided t against log(bound), on the side the mean lies
        df, ncp = n - 1, abs(mean - math.log(claim.bound or 1.0)) / sizing.sd * math.sqrt(n)
        return float(stats.nct.sf(stats.t.ppf(1 - alpha, df), df, ncp))
    bounds = V.equivalence_bounds("log", claim.margin, 1.0)
    return max(V.power_difference(n, mean, sizing.sd, alpha), V.power_equivalence(n, mean, sizing.sd, bounds, alpha))


def seeds_used(needed: dict[str, int], cost: dict[str, float]) -> dict[str, int]:
    """The needs, or, when they do not fit the budget, the largest need cut to what fits (at least MIN_SEEDS)."""
    used = dict(needed)
    total = sum(used[c] * cost[c] for c in used) / WORKERS
    if total > BUDGET_S:
        largest = max(used, key=lambda c: used[c])
        rest = sum(used[c] * cost[c] for c in used if c != largest)
        used[largest] = max(gpu_plan.MIN_SEEDS, int((BUDGET_S * WORKERS - rest) // cost[largest]))
    return used


def main() -> int:
    claims = C.load_claims(CLAIMS)
    check_claims(claims)
    cells = load_grid(GRID).cells
    check_cells(cells)
    alpha = V.ALPHA / len(claims)
    rows, needed, cost, extra = {}, {}, {}, {}
    for claim in claims:
        study, source_id = SOURCES[claim.id]
        evidence = RESULTS / study / "runs.csv"
        runs = pd.read_csv(evidence)

        def sized(metric: str | None = None, claim: C.Claim = claim, evidence: Path = evidence) -> gpu_plan.Sizing:
            mapping = {} if metric is None else {claim.metric or "": metric}
            row = {s.claim: s for s in gpu_plan.size_seeds(CLAIMS, evidence, cells, evidence_metrics=mapping,
                                                            cap=V.MAX_SEEDS)}[claim.id]
            if row.status == "no evidence":
                raise SystemExit(f"{claim.id}: {evidence} has no paired runs of {claim.a} and {claim.b}")
            return row

        rows[claim.id] = sized()
        needed[claim.id] = max(gpu_plan.MIN_SEEDS, rows[claim.id].needed or V.MAX_SEEDS)
        cost[claim.id] = pair_seconds(runs, claim)
        extra[claim.id] = [sized(m) for m in CHECKS]
    used = seeds_used(needed, cost)
    total = sum(used[c] * cost[c] for c in used) / WORKERS
    print(f"Sizing (results/confirmatory/sizing.py): paired log-ratio A / B of each claim's metric in its exploratory "
          f"study's runs.csv; seeds for power {V.POWER} at alpha 0.05/{len(claims)} = {alpha:.4f} (Holm's first step), "
          f"at least {gpu_plan.MIN_SEEDS}")
    print("| claim | source (its seeds) | metric | mean log-ratio (ratio) | sd | seeds needed | seeds used | "
          "power at used | s per seed |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for claim in claims:
        s, (study, source_id) = rows[claim.id], SOURCES[claim.id]
        print(f"| {claim.id} | {study} {source_id} ({s.evidence_seeds}) | {s.metric} | {math.log(s.estimate):+.4f} "
              f"(x{s.estimate:.3f}) | {s.sd:.4f} | {s.needed if s.needed is not None else 'out of reach'} | "
              f"{used[claim.id]} | {power_at(used[claim.id], s, claim, alpha):.2f} | {cost[claim.id]:.0f} |")
    wanted = sum(needed[c] * cost[c] for c in needed) / WORKERS
    print(f"Budget: {total / 60:.1f} min with {WORKERS} workers at the exploratory runs' median wall_seconds, "
          f"{wanted / 60:.1f} min at the seeds needed (limit {BUDGET_S / 60:.0f} min)")
    for claim in claims:
        if used[claim.id] < needed[claim.id]:
            n, s = used[claim.id], rows[claim.id]
            print(f"UNDERPOWERED {claim.id}: {n} seeds of {needed[claim.id]} needed; expected power at {n} seeds "
                  f"{power_at(n, s, claim, alpha):.2f} at alpha 0.05/{len(claims)}, {power_at(n, s, claim, V.ALPHA):.2f} "
                  f"at 0.05 (Holm's last step)")
    for claim in claims:
        if rows[claim.id].grid_seeds != used[claim.id]:
            print(f"MISMATCH {claim.id}: the grid gives {rows[claim.id].grid_seeds} shared seeds, the sizing "
                  f"{used[claim.id]}")
    print("Independent metrics (information; issue 54 item 1), seeds needed at the same level: " + "; ".join(
        f"{c.id}: " + ", ".join(f"{s.evidence_metric} x{s.estimate:.3f} sd {s.sd:.4f} -> "
                                f"{s.needed if s.needed is not None else 'out of reach'}" for s in extra[c.id])
        for c in claims))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
