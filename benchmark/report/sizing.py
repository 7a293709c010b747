"""How many seeds each claim of a claims file needs for a paired verdict, from the paired spread of the same
contrasts in an earlier study's runs.csv (the evidence), and how many a grid gives it: the study-level use of
`verdicts.seeds_needed` (the one sizing rule), shared by the studies that plan their seeds (results/cifar10-gpu's
plan, the confirmatory studies' sizing through `confirm_sizing`). Reads only a claims file, a runs.csv and a
grid's cells; trains nothing. Re-exported by dfbench.benchmark.api.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dfbench.benchmark.grid import matching
from dfbench.benchmark.grid.spec import Cell
from dfbench.benchmark.metrics import table
from dfbench.benchmark.report import claims as C
from dfbench.benchmark.report import verdicts as V
from dfbench.benchmark.report.verdicts import SIZING_CONFIDENCE

SEED_CAP = 12  # a claim needing more seeds than this is out of reach at the study's budget (listed, not sized for)
MIN_SEEDS = 3  # every setting: the fewest seeds with a spread to test
# a claim's `where` keys that select a study's cells but not the evidence's runs: the earlier study trained its
# own network, and its same specs stand in for the new one's whatever the network
EVIDENCE_FREE_KEYS = ("train.model",)


@dataclass(frozen=True)
class Sizing:
    """How many seeds one claim needs for a paired verdict, from the evidence, and what the grid gives it."""

    claim: str
    metric: str
    evidence_metric: str
    evidence_seeds: int
    estimate: float  # A / B (ratio) or A - B (difference) in the evidence
    sd: float  # of the per-seed paired differences on the comparison scale
    needed: int | None  # verdicts.seeds_needed at the file's strictest Holm level (None: not within `cap`)
    grid_seeds: int  # seeds the grid's cells of A and B share
    status: str  # "sized" | "short" | "out of reach" | "no evidence"
    confidence: float | None = None  # the sd's upper confidence bound sized from (None: the sample sd itself)
    sd_sized: float = math.nan  # the sd the seeds were sized from: sd's `confidence` upper bound, or sd
    bounds: tuple[float, float] = (-math.inf, math.inf)  # the test's bounds on the comparison scale
    test: str = "decide"  # verdicts.SIZING_TESTS: "bound" for an at_most claim
    mean: float = math.nan  # the evidence's mean difference on the comparison scale

    def power(self, n: int, alpha: float) -> float:
        """The power of the claim's test at n seeds with the evidence's mean and `sd_sized` as the truth."""
        return V.sizing_power(n, self.mean, self.sd_sized, self.bounds, alpha, self.test)  # type: ignore[arg-type]


def size_seeds(claims_file: str | Path, evidence: str | Path, cells: Sequence[Cell], *,
               evidence_metrics: Mapping[str, str] | None = None, cap: int = SEED_CAP,
               confidence: float | None = SIZING_CONFIDENCE) -> list[Sizing]:
    """Per claim of `claims_file`: the seeds a paired verdict needs with power 0.8 at the spread of the same
    contrast in `evidence` (a runs.csv), at alpha / (number of claims) -- the strictest Holm level of the
    file -- and the seeds `cells` give it (shared by A and B). The sizing is `verdicts.seeds_needed`: the
    evidence's sd at its one-sided `confidence` upper bound over the evidence's seeds (None: the sample sd, as
    studies sized before that rule were). `evidence_metrics`: the evidence's metric that stands in for a claim's
    (a CIFAR-10 claim on fid sized from Fashion-MNIST's fd_fmnist); a metric not in it is the evidence's own."""
    mapping = evidence_metrics or {}
    claims = C.load_claims(claims_file)
    runs = pd.read_csv(evidence)
    alpha = V.ALPHA / len(claims)
    out = []
    for claim in claims:
        metric = claim.metric or table.PRIMARY[0]
        ev_metric = mapping.get(metric, metric)
        a_cells, b_cells = matching.cells_of(cells, claim.a, claim.where), matching.cells_of(cells, claim.b, claim.where)
        grid_seeds = len({c.cfg.seed for c in a_cells} & {c.cfg.seed for c in b_cells})
        ev_where = {k: v for k, v in claim.where.items() if k not in EVIDENCE_FREE_KEYS}
        rows_a, rows_b = (C.select(runs, spec, ev_where) for spec in (claim.a, claim.b))
        if ev_metric not in runs or rows_a.empty or rows_b.empty:
            out.append(Sizing(claim.id, metric, ev_metric, 0, math.nan, math.nan, None, grid_seeds, "no evidence"))
            continue
        va = dict(zip(rows_a["seed"], rows_a[ev_metric]))
        vb = dict(zip(rows_b["seed"], rows_b[ev_metric]))
        seeds = sorted(s for s in set(va) & set(vb) if np.isfinite(va[s]) and np.isfinite(vb[s]))
        scale = table.scale(ev_metric)
        d = V.transform([va[s] for s in seeds], scale) - V.transform([vb[s] for s in seeds], scale)
        mean, sd = float(d.mean()), float(d.std(ddof=1)) if len(d) > 1 else math.nan
        if claim.expect == "at_most":  # the report's own test: one-sided against the bound
            test, bounds = "bound", (-math.inf, math.log(claim.bound or 1.0))
        else:
            test, bounds = "decide", V.equivalence_bounds(scale, claim.margin, float(np.mean([vb[s] for s in seeds])))
        needed = V.seeds_needed(mean, sd, len(seeds), bounds, alpha, test=test, confidence=confidence)
        if needed is None or needed > cap:
            status = "out of reach"
        else:
            status = "sized" if grid_seeds >= needed else "short"
        sd_sized = sd if confidence is None else V.sd_upper_bound(sd, len(seeds), confidence)
        out.append(Sizing(claim.id, metric, ev_metric, len(seeds), V.back(mean, scale), sd, needed, grid_seeds, status,
                          confidence, sd_sized, bounds, test, mean))
    return out


def seeds_per_setting(sizing: Sequence[Sizing], claims_file: str | Path, *, minimum: int = MIN_SEEDS,
                      cap: int = SEED_CAP) -> dict[str, int]:
    """The seeds each setting of the claims gets: the most any of its claims within reach needs, at least
    `minimum` (the rule the study's grid follows)."""
    need = {s.claim: s.needed for s in sizing}
    out: dict[str, int] = {}
    for claim in C.load_claims(claims_file):
        n = need.get(claim.id)
        for spec in (claim.a, claim.b):
            out[spec] = max(out.get(spec, minimum), n if n is not None and n <= cap else minimum)
    return out
