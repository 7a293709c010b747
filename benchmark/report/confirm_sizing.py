"""How many fresh seeds a confirmatory study's claims get, from the spread of the exploratory studies they re-decide
(issue 54, item 6): the rules behind results/confirmatory/sizing.py, results/confirmatory-2/sizing.py and
results/confirmatory-3/sizing.py, which declare their `Study` and call `main` (through dfbench.benchmark.api).

A confirmatory study (`Study`) re-decides claims that earlier studies decided exploratorily. Before any number, the
checks that make the re-run confirmatory of *those* claims:

- each claim keeps its source claim's settings, metric, expectation, bound and margin (`check_claims`); it may add
  a `where` key that every source cell of the claim already satisfies (it then names the same runs there, and
  tells the claim's settings apart from another claim's in the new grid), and a `confound`;
- each cell of the study's grid is, key for key, the resolved config of a cell of a source grid but for its seed and
  the metrics it records (`check_cells`): a cell may record more metrics than its source (the independent checks
  of issue 54, item 1) but never fewer, and trains exactly what the source trained.

Then the sizing: per claim, the paired log-ratio A / B of its metric over the source study's committed runs.csv,
and the seeds at which the report's own test of the claim reaches power 0.8 with that mean taken as the truth and
the sd at its one-sided 80 % upper confidence bound over the source's seeds (`Study.confidence`; a few exploratory
seeds underestimate the spread: 2-13x in confirmatory-2), at Holm's strictest level over the study's claims
(alpha = 0.05 / claims): `sizing.size_seeds`, i.e. `verdicts.seeds_needed` (a one-sided t-test against the
bound for `at_most`, the difference or equivalence test otherwise), at least `sizing.MIN_SEEDS`. confirmatory
and confirmatory-2 were sized at the sample sd, before that rule, and keep it to reproduce their tables. Claims that share a setting (the server optimizers' common FedAvg) form
a *block* whose settings all run on the same seeds (issue 54: "all settings on the same seeds"): the block gets
the largest need of its claims within reach (a claim out of reach does not drive it). A seed of a block costs the
median wall_seconds of each of its settings' exploratory runs, summed; when the blocks do not fit the study's
budget with its workers, the block with the most seeds is cut to what fits (at least MIN_SEEDS), and again while
they still do not fit. Every claim's expected power at the seeds it gets is printed (at 0.05 / claims, and at 0.05:
Holm's last step), and the seeds the two independent metrics would need, for information. Reads only committed
files; trains nothing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from dfbench.benchmark.grid import matching
from dfbench.benchmark.grid.spec import Cell, load_grid
from dfbench.benchmark.report import claims as C
from dfbench.benchmark.report import sizing
from dfbench.benchmark.report import verdicts as V

CHECKS = ("fd_fmnist_ae", "denoise_loss")  # the independent metrics, shown for information


@dataclasses.dataclass(frozen=True)
class Study:
    folder: Path  # results/<name>: holds <name>.toml and <name>.claims.toml
    sources: Mapping[str, tuple[str, str]]  # claim id -> (the exploratory study, its claim id)
    budget_s: float  # the whole grid, wall clock
    workers: int = 2  # one-thread grid workers on the 2-core machine
    # the exploratory sd is taken at this one-sided upper confidence bound (verdicts.seeds_needed); None: the sample
    # sd itself, as confirmatory and confirmatory-2 were sized (before issue 62), to reproduce their tables
    confidence: float | None = V.SIZING_CONFIDENCE

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def grid(self) -> Path:
        return self.folder / f"{self.name}.toml"

    @property
    def claims(self) -> Path:
        return self.folder / f"{self.name}.claims.toml"

    @property
    def results(self) -> Path:
        return self.folder.parent


def _source_claim(study: Study, claim: C.Claim) -> C.Claim:
    name, source_id = study.sources[claim.id]
    return {c.id: c for c in C.load_claims(study.results / name / f"{name}.claims.toml")}[source_id]


def _source_cells(study: Study, names: Sequence[str] | None = None) -> list[Cell]:
    names = sorted({s for s, _ in study.sources.values()}) if names is None else names
    return [c for name in names for c in load_grid(study.results / name / f"{name}.toml").cells]


def check_claims(study: Study, claims: Sequence[C.Claim]) -> None:
    """Each claim re-decides its source claim unchanged: same settings, metric, expectation, bound and margin; a
    `where` of its own only where every source cell of the claim's two settings satisfies it."""
    for claim in claims:
        name, source_id = study.sources[claim.id]
        source = _source_claim(study, claim)
        for key in ("a", "b", "expect", "bound", "metric", "margin"):
            if getattr(claim, key) != getattr(source, key):
                raise SystemExit(f"{claim.id}: {key} = {getattr(claim, key)!r}, but {name}'s {source_id} has "
                                 f"{getattr(source, key)!r}; a confirmatory claim keeps its source's {key}")
        for key, wanted in source.where.items():
            if key not in claim.where or not matching.same(claim.where[key], wanted):
                raise SystemExit(f"{claim.id}: where {key} = {claim.where.get(key)!r}, but {name}'s {source_id} has "
                                 f"{wanted!r}; a confirmatory claim keeps its source's where")
        added = {k: v for k, v in claim.where.items() if k not in source.where}
        source_grid = _source_cells(study, [name])
        for spec in (claim.a, claim.b):
            mine = matching.cells_of(source_grid, spec, source.where)
            if mine and matching.cells_of(mine, spec, added) != mine:
                raise SystemExit(f"{claim.id}: where {added} leaves out some of {name}'s cells of {spec!r}; a "
                                 "confirmatory claim may only add a where its source's cells all satisfy")


def _trained(cfg):  # the config but the metrics it records
    return dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, metrics="auto"))


def _metric_set(cfg) -> set[str] | None:  # None: auto (every metric the dataset has)
    named = str(cfg.eval.metrics)
    return None if named == "auto" else {m.strip() for m in named.split(",") if m.strip()}


def check_cells(study: Study, cells: Sequence[Cell]) -> None:
    """Every cell is a cell of one source grid but for its seed and the metrics it records (never fewer)."""
    sources = _source_cells(study)
    for cell in cells:
        found = False
        for src in sources:
            if _trained(dataclasses.replace(cell.cfg, seed=src.cfg.seed)) != _trained(src.cfg):
                continue
            mine, theirs = _metric_set(cell.cfg), _metric_set(src.cfg)
            if mine is None or (theirs is not None and theirs <= mine):
                found = True
                break
        if not found:
            raise SystemExit(f"{study.grid.name}: cell {cell.label} is no source grid's cell with another seed (and "
                             f"the same or more metrics); copy the source cell's keys (the source grids: "
                             f"{', '.join(sorted({s for s, _ in study.sources.values()}))})")


def _settings(claim: C.Claim) -> list[tuple[str, tuple]]:
    where = tuple(sorted((k, str(v)) for k, v in claim.where.items()))
    return [(claim.a, where), (claim.b, where)]


def blocks(claims: Sequence[C.Claim]) -> list[list[C.Claim]]:
    """The claims grouped by the settings they share (connected components; in the file's order)."""
    out: list[list[C.Claim]] = []
    for claim in claims:
        mine = set(_settings(claim))
        joined = [b for b in out if mine & {s for c in b for s in _settings(c)}]
        merged = [c for b in joined for c in b] + [claim]
        out = [b for b in out if b not in joined]
        out.append(merged)
    order = {c.id: i for i, c in enumerate(claims)}
    return sorted(out, key=lambda b: min(order[c.id] for c in b))


def seed_seconds(study: Study, block: Sequence[C.Claim]) -> float:
    """The median wall_seconds of each setting of the block in its exploratory runs, summed: one more seed's cost."""
    total, seen = 0.0, set()
    for claim in block:
        name, _ = study.sources[claim.id]
        runs = pd.read_csv(study.results / name / "runs.csv")
        source = _source_claim(study, claim)
        for spec, key in zip((claim.a, claim.b), _settings(claim)):
            if key not in seen:
                seen.add(key)
                total += float(C.select(runs, spec, source.where)["wall_seconds"].median())
    return total


def power_at(n: int, sized: sizing.Sizing, claim: C.Claim, alpha: float) -> float:
    """The power at n seeds of the test that sizes the claim, at the sd it was sized from (`sizing.Sizing.power`)."""
    return sized.power(n, alpha)


def seeds_used(needed: Mapping[int, int], cost: Mapping[int, float], budget_s: float, workers: int) -> dict[int, int]:
    """Per block: its need, or, while the blocks do not fit the budget, the block with the most seeds cut to what
    fits (at least MIN_SEEDS)."""
    used = dict(needed)
    cut: set[int] = set()
    while sum(used[b] * cost[b] for b in used) / workers > budget_s:
        left = [b for b in used if b not in cut and used[b] > sizing.MIN_SEEDS]
        if not left:
            break
        largest = max(left, key=lambda b: used[b])
        rest = sum(used[b] * cost[b] for b in used if b != largest)
        used[largest] = max(sizing.MIN_SEEDS, int((budget_s * workers - rest) // cost[largest]))
        cut.add(largest)
    return used


def main(study: Study, script: str) -> int:
    claims = C.load_claims(study.claims)
    check_claims(study, claims)
    cells = load_grid(study.grid).cells
    check_cells(study, cells)
    alpha = V.ALPHA / len(claims)
    groups = blocks(claims)
    rows, extra, within = {}, {}, {}
    for claim in claims:
        name, _ = study.sources[claim.id]
        evidence = study.results / name / "runs.csv"

        def sized(metric: str | None = None, claim: C.Claim = claim, evidence: Path = evidence) -> sizing.Sizing:
            mapping = {} if metric is None else {claim.metric or "": metric}
            row = {s.claim: s for s in sizing.size_seeds(study.claims, evidence, cells, evidence_metrics=mapping,
                                                            cap=V.MAX_SEEDS, confidence=study.confidence)}[claim.id]
            if row.status == "no evidence" and metric is None:
                raise SystemExit(f"{claim.id}: {evidence} has no paired runs of {claim.a} and {claim.b}")
            return row

        rows[claim.id] = sized()
        within[claim.id] = rows[claim.id].needed is not None and rows[claim.id].needed <= V.MAX_SEEDS
        extra[claim.id] = [sized(m) for m in CHECKS]
    needed = {i: max([sizing.MIN_SEEDS] + [rows[c.id].needed for c in b if within[c.id]]) for i, b in enumerate(groups)}
    cost = {i: seed_seconds(study, b) for i, b in enumerate(groups)}
    used = seeds_used(needed, cost, study.budget_s, study.workers)
    at = {c.id: used[i] for i, b in enumerate(groups) for c in b}
    total = sum(used[i] * cost[i] for i in used) / study.workers
    bound = study.confidence is not None
    print(f"Sizing ({script}): paired log-ratio A / B of each claim's metric in its exploratory study's runs.csv; seeds "
          f"for power {V.POWER} at alpha 0.05/{len(claims)} = {alpha:.4f} (Holm's first step), at least "
          f"{sizing.MIN_SEEDS}" + (f"; the sd taken at its one-sided {study.confidence:.0%} upper confidence bound "
                                     "(chi-square, over the source's seeds), not the sample sd" if bound else ""))
    shared = len(groups) < len(claims)
    print("| claim | source (its seeds) | metric | mean log-ratio (ratio) | sd |" + (" sd sized from |" if bound else "")
          + " seeds needed | seeds used | power at used | s per seed |" + (" block |" if shared else ""))
    print("|---|---|---|---:|---:|" + ("---:|" if bound else "") + "---:|---:|---:|---:|" + ("---:|" if shared else ""))
    for i, block in enumerate(groups):
        for claim in block:
            s, (name, source_id) = rows[claim.id], study.sources[claim.id]
            print(f"| {claim.id} | {name} {source_id} ({s.evidence_seeds}) | {s.metric} | {math.log(s.estimate):+.4f} "
                  f"(x{s.estimate:.3f}) | {s.sd:.4f} |" + (f" {s.sd_sized:.4f} |" if bound else "")
                  + f" {s.needed if within[claim.id] else 'out of reach'} | "
                  f"{at[claim.id]} | {power_at(at[claim.id], s, claim, alpha):.2f} | {cost[i]:.0f} |"
                  + (f" {i + 1} |" if shared else ""))
    wanted = sum(needed[i] * cost[i] for i in needed) / study.workers
    print(f"Budget: {total / 60:.1f} min with {study.workers} workers at the exploratory runs' median wall_seconds, "
          f"{wanted / 60:.1f} min at the seeds needed (limit {study.budget_s / 60:.0f} min)")
    for claim in claims:
        n, s = at[claim.id], rows[claim.id]
        need = s.needed if within[claim.id] else None
        if need is None or n < need:
            print(f"UNDERPOWERED {claim.id}: {n} seeds of {need if need is not None else 'more than ' + str(V.MAX_SEEDS)}"
                  f" needed; expected power at {n} seeds {power_at(n, s, claim, alpha):.2f} at alpha "
                  f"0.05/{len(claims)}, {power_at(n, s, claim, V.ALPHA):.2f} at 0.05 (Holm's last step)")
    for claim in claims:
        if rows[claim.id].grid_seeds != at[claim.id]:
            print(f"MISMATCH {claim.id}: the grid gives {rows[claim.id].grid_seeds} shared seeds, the sizing "
                  f"{at[claim.id]}")
    print("Independent metrics (information; issue 54 item 1), seeds needed at the same level: " + "; ".join(
        f"{c.id}: " + ", ".join(f"{s.evidence_metric} not recorded" if s.status == "no evidence" else
                                f"{s.evidence_metric} x{s.estimate:.3f} sd {s.sd:.4f} -> "
                                f"{s.needed if s.needed is not None else 'out of reach'}" for s in extra[c.id])
        for c in claims))
    return 0
