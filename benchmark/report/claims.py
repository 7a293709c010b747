"""Claims generated from the data: a study declares what it claims, the report decides each from its runs.

A study's claims file sits next to its grid, in the study's results folder (``results/<study>/<study>.claims.toml``)::

    margin = 0.10                  # equivalence margin, a fraction of B's score (default 0.10)
    metric = "fd_fmnist"           # default metric (default: the report's ranking metric)
    preregistered = true           # optional: the report checks that the claims were committed before the runs

    [[claim]]
    id = "C1"
    statement = "Top-k masks beat random masks at keep 0.5"
    source = "Qiao et al., ICML 2025"          # optional: where the claim comes from
    a = "topk_prune?keep_ratio=0.5"            # the setting the claim is about (a grid method spec)
    b = "random_prune?keep_ratio=0.5"          # what it is compared with
    expect = "better"                          # better | worse | equivalent | at_most
    # bound = 1.75                             # at_most only: A / B <= bound (a ratio; positive metrics)
    # where = { partition = "dirichlet:0.5" }  # optional: dataset, partition or any config key, on A and B
    # a_where = { partition = "iid" }          # optional: on A only, over `where` (b_where: on B only), for
    #                                          # a claim whose sides differ in dataset or partition
    # treatment = ["partitions"]               # optional: pairing records the compared factor itself changes
    #                                          # (partitions, initial models, evaluation noises): runs of a
    #                                          # seed are paired although these differ, everything else held
    # metric = "fd_fmnist_ae"; margin = 0.05   # optional: per claim
    # confound = "top-k trains half the client work"  # optional: a budget difference the claim keeps on purpose

A method spec selects the runs of that method whose hyperparameters include the given ones (values
compared as numbers where they are numbers; a dotted key is a config field: ``fedavg?train.lr=0.003``);
``untrained`` selects the rounds = 0 baseline. Each side
must name exactly one setting: more than one is an error that lists them.

Each claim is decided seed-paired with the statistics of `verdicts` (paired t, TOST at the margin, a
one-sided t against the bound for ``at_most``), Holm-corrected over the claims of the file; the outcome
is *holds* (the verdict is the expected one), *does not hold* (another decided verdict) or *undecided*
with the seeds that would decide it. The claims come from the per-run table (``runs.csv``, which
`dfbench report` writes beside the leaderboard), so a committed study re-decides its claims without
its run folders: ``python scripts/claims.py results/<study>``.

**Agreement across metrics.** A claim on the ranking metric, or on one of the metrics the metric table
declares independent checks of it (``metrics.table.INDEPENDENT_CHECKS``: the label-free space fd_fmnist_ae and
the held-out loss denoise_loss, where defined for the dataset), is tested the same way on each of the others
that runs.csv records (Holm over the file per metric); the ``metrics`` column shows each one's estimate and
verdict, or that runs.csv does not record it (then it is not counted). The ``verdict`` stays the claim's own
metric's; the ``outcome`` is *holds* / *does not hold* only when every metric checked decides it the same way,
*metric-dependent* when only some decide it or their estimates point different ways, else *undecided*. A
claim on a leakage, traffic or client metric is not checked.

**Budget.** ``budget`` says whether A and B had the same client work (runs.csv's ``client_images`` where every
run records it, else rounds x local_steps x batch_size x clients x participation from the config columns) and
the same rounds: "equal", or "unequal budget (client work A: x, B: y; rounds A: ..., B: ...)". A claim may
declare a difference it keeps on purpose, ``confound = "..."``, which is shown beside it.

**Registration** (every claims file, from git): the ``registration`` column says whether each claim was
committed before its evidence (*confirmatory*), or why not (*exploratory (why)*, *unchecked (why)*);
`report.preregistration` holds the rules and the git calls.

The table is written as claims.md / claims.csv and quoted into the study README between the markers
`BEGIN` and `END` (whatever stands there is replaced; a README without them is left alone).

**Pre-registration** (``preregistered = true``): claims.md says above the table whether every run started
after the claims file's last commit (`report.preregistration.check_preregistration`); when not, everything is
still written, then `NotPreregistered` is raised (``dfbench report`` exits 1 with one line naming the file, the
commit and the first run that started before it). Without the key nothing of this is done.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dfbench.benchmark.grid import matching
from dfbench.benchmark.metrics import table as metric_table
from dfbench.benchmark.report import budget as B
from dfbench.benchmark.report import preregistration as P
from dfbench.benchmark.report import verdicts as V

BEGIN = "<!-- claims: generated by dfbench report --claims from runs.csv; do not edit by hand -->"
END = "<!-- claims: end -->"
EXPECT = ("better", "worse", "equivalent", "at_most")
CLAIM_KEYS = {"id", "statement", "source", "a", "b", "expect", "bound", "where", "a_where", "b_where", "metric", "margin",
              "confound", "treatment"}
FILE_KEYS = {"margin", "metric", "claim", "preregistered"}
COLUMNS = ["id", "statement", "source", "metric", "a", "b", "expect", "bound", "margin", "seeds", "estimate", "low", "high",
           "p_holm", "p_equivalence_holm", "verdict", "metrics", "outcome", "seeds_to_decide", "budget", "confound",
           "registration", "note"]
DECIDED = {"better", "worse", "equivalent", "within the bound", "beyond the bound"}  # a verdict that decides


class ClaimsError(ValueError):
    """A claims file that cannot be read, naming the claim and the fix."""


class NotPreregistered(ClaimsError):
    """The claims file says ``preregistered = true`` but was not committed before every run; raised after
    everything was written (`written`: the files, by name)."""

    def __init__(self, message: str, written: dict[str, Path]) -> None:
        super().__init__(message)
        self.written = written


@dataclass(frozen=True)
class Claim:
    id: str
    statement: str
    a: str
    b: str
    expect: str
    metric: str | None = None
    margin: float = V.MARGIN
    bound: float | None = None
    source: str = ""
    where: Mapping[str, Any] = field(default_factory=dict)
    a_where: Mapping[str, Any] = field(default_factory=dict)  # over `where`, on A only (its dataset, its partition)
    b_where: Mapping[str, Any] = field(default_factory=dict)  # over `where`, on B only
    treatment: tuple[str, ...] = ()  # pairing records the factor itself changes (verdicts.pairing_problem)
    confound: str = ""  # a difference between A and B the claim knowingly keeps (e.g. "half the client work")


def _read_spec(path: Path) -> dict[str, Any]:
    """The claims file's TOML with its top-level keys checked."""
    try:
        spec = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ClaimsError(f"{path}: no such claims file; write one next to the study's grid (see dfbench.benchmark.report.claims)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ClaimsError(f"{path}: not valid TOML ({exc})") from None
    if unknown := set(spec) - FILE_KEYS:
        raise ClaimsError(f"{path}: unknown top-level key(s) {sorted(unknown)}; allowed: {sorted(FILE_KEYS)}")
    if not isinstance(spec.get("preregistered", False), bool):
        raise ClaimsError(f"{path}: preregistered = {spec['preregistered']!r}; write true or false")
    return spec


def preregistered(path: str | Path) -> bool:
    """Whether the claims file says ``preregistered = true`` (see the module doc)."""
    return bool(_read_spec(Path(path)).get("preregistered", False))


def load_claims(path: str | Path) -> list[Claim]:
    """The claims of a file, checked before any work: unknown keys, a missing field, an unknown
    expectation, a bound without at_most (or the reverse), duplicate ids, a bad margin."""
    path = Path(path)
    spec = _read_spec(path)
    margin, metric = spec.get("margin", V.MARGIN), spec.get("metric")
    claims, seen = [], set()
    for i, c in enumerate(spec.get("claim", [])):
        where = f"{path}: [[claim]] #{i + 1}" + (f" ({c.get('id')})" if isinstance(c, dict) and c.get("id") else "")
        if not isinstance(c, dict):
            raise ClaimsError(f"{where}: write each claim as a [[claim]] table")
        if unknown := set(c) - CLAIM_KEYS:
            raise ClaimsError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(CLAIM_KEYS)}")
        missing = [k for k in ("id", "statement", "a", "b", "expect") if not c.get(k)]
        if missing:
            raise ClaimsError(f"{where}: missing {', '.join(missing)}")
        if c["expect"] not in EXPECT:
            raise ClaimsError(f"{where}: expect = {c['expect']!r}; allowed: {', '.join(EXPECT)}")
        if (c["expect"] == "at_most") != ("bound" in c):
            raise ClaimsError(f"{where}: a bound (A / B <= bound) goes with expect = \"at_most\" and only with it")
        if "bound" in c and not (isinstance(c["bound"], (int, float)) and c["bound"] > 0):
            raise ClaimsError(f"{where}: bound = {c['bound']!r}; give a positive ratio, e.g. 1.75")
        m = c.get("margin", margin)
        if not (isinstance(m, (int, float)) and 0 < m < 1):
            raise ClaimsError(f"{where}: margin = {m!r}; give a fraction of B's score in (0, 1), e.g. 0.1")
        if "confound" in c and not (isinstance(c["confound"], str) and c["confound"].strip()):
            raise ClaimsError(f"{where}: confound = {c['confound']!r}; say in words what differs, e.g. "
                              "confound = \"random pruning trains half the client work\"")
        for key in ("where", "a_where", "b_where"):
            if not isinstance(c.get(key, {}), dict):
                raise ClaimsError(f"{where}: {key} = {c[key]!r}; write a table, e.g. {key} = {{ partition = \"iid\" }}")
        allowed = sorted(V.FINGERPRINT_NAMES.values())
        if not (isinstance(c.get("treatment", []), list) and set(c.get("treatment", [])) <= set(allowed)):
            raise ClaimsError(f"{where}: treatment = {c['treatment']!r}; give a list of {', '.join(allowed)}")
        if c["id"] in seen:
            raise ClaimsError(f"{where}: id {c['id']!r} is used twice")
        seen.add(c["id"])
        claims.append(Claim(id=str(c["id"]), statement=str(c["statement"]), a=str(c["a"]), b=str(c["b"]),
                            expect=str(c["expect"]), metric=c.get("metric", metric), margin=float(m),
                            bound=float(c["bound"]) if "bound" in c else None, source=str(c.get("source", "")),
                            where=dict(c.get("where", {})), a_where=dict(c.get("a_where", {})),
                            b_where=dict(c.get("b_where", {})), treatment=tuple(c.get("treatment", [])),
                            confound=str(c.get("confound", "")).strip()))
    if not claims:
        raise ClaimsError(f"{path}: no [[claim]] table")
    return claims


def spec_column(key: str) -> str:
    """The run-table column a method spec's key names: a dotted key ("train.lr") is a config field
    (cfg.lr), any other a hyperparameter (param.mixing)."""
    return f"cfg.{key.rpartition('.')[2]}" if "." in key else f"param.{key}"


def matches_spec(row: Mapping[str, Any], spec: str) -> bool:
    """Whether a run's or a setting's row is of the setting `spec` names (`grid.matching.matches`): the method with
    every hyperparameter and config value it gives, read from the row's columns (`spec_column`; a key the row
    does not record matches nothing); ``untrained``: an untrained baseline."""
    return matching.matches(spec, method=str(row.get("method")), untrained=str(row.get("baseline")).lower() == "true",
                            value=lambda key: row[spec_column(key)] if spec_column(key) in row else matching.MISSING)


def select(runs: pd.DataFrame, spec: str, where: Mapping[str, Any]) -> pd.DataFrame:
    """The runs of the one setting `spec` names (see the module doc); ClaimsError listing the settings
    when it names none or several."""
    if spec == "untrained":
        rows = runs[runs["baseline"].astype(str).str.lower() == "true"]
    else:
        rows = runs.loc[np.array([matches_spec(r, spec) for _, r in runs.iterrows()], dtype=bool)] if len(runs) else runs
    for key, wanted in where.items():
        col = key.removeprefix("data.") if key in ("dataset", "partition", "data.dataset", "data.partition") else (
            key if key.startswith("cfg.") else f"cfg.{key.rpartition('.')[2]}")
        if col not in rows:
            raise ClaimsError(f"where {key} = {wanted!r}: no run records {key}; the runs' keys: "
                              f"{', '.join(sorted(c for c in runs.columns if c.startswith('cfg.')))}")
        # a value the table leaves empty (a field at its empty default, e.g. train.init_sha256 = "" for a run that
        # starts from scratch) matches an empty wanted value
        rows = rows.loc[np.array([matching.same("" if v is None or (isinstance(v, float) and math.isnan(v)) else v, wanted)
                                  for v in rows[col]], dtype=bool)]
    groups = rows["group_key"].unique()
    if len(groups) == 0:
        return rows  # no runs of it (yet): the claim stays undecided, saying so
    if len(groups) > 1:
        keys = [c for c in rows.columns if c in ("dataset", "partition") or c.startswith(("param.", "cfg."))]
        differ = [c for c in keys if rows[c].astype(str).nunique() > 1]
        found = sorted({"; ".join([str(r["setting"])] + [f"{c} = {r[c]}" for c in differ]) for _, r in rows.iterrows()})
        raise ClaimsError(f"{spec!r}{' where ' + str(dict(where)) if where else ''} selects {len(groups)} settings, "
                          f"which differ in {', '.join(differ) or 'their group'}: {' | '.join(found)} "
                          "(add those keys to the spec, e.g. 'fedavg?train.lr=0.003', or a `where` to name one)")
    return rows


def _setting(rows: pd.DataFrame, metric: str) -> V.Setting:
    return V.setting_of_runs(rows, metric, str(rows["group_key"].iloc[0]) if len(rows) else "")


@dataclass(frozen=True)
class _Contrast:
    """One claim's contrast on one metric before the Holm correction: the paired estimate (back on the
    metric's scale), the raw p-values of the claim's test and of its counter-test, and what `verdicts.seeds_needed`
    needs; `problem` (and nothing else) when it cannot be tested."""

    seeds: int = 0
    estimate: float = math.nan
    low: float = math.nan
    high: float = math.nan
    p: float = math.nan
    p_eq: float = math.nan
    mean: float = math.nan
    sd: float = math.nan
    bounds: tuple[float, float] = (-math.inf, math.inf)
    problem: str = ""
    spread: str = ""  # verdicts.NO_SPREAD: the difference is the same at every seed, so the contrast is undecidable


def _contrast(sides: Sequence[pd.DataFrame], claim: Claim, metric: str, alpha: float) -> _Contrast:
    """The claim's test on `metric` over the seeds both settings have it on (see the module doc)."""
    a, b = _setting(sides[0], metric), _setting(sides[1], metric)
    seeds = sorted(set(a.values) & set(b.values), key=lambda s: (str(type(s)), s))
    problem = V.pairing_problem(a, b, seeds, claim.treatment) if seeds else "no seed shared by A and B"
    if problem:
        return _Contrast(problem=problem)
    scale = metric_table.scale(metric)
    if claim.expect == "at_most" and scale != "log":
        raise ClaimsError(f"claim {claim.id}: a ratio bound needs a positive metric; {metric} is compared by differences")
    x, r = V.transform([a.values[s] for s in seeds], scale), V.transform([b.values[s] for s in seeds], scale)
    t = V.paired_t(x - r, alpha)
    bounds = V.equivalence_bounds(scale, claim.margin, float(np.mean([b.values[s] for s in seeds])))
    if claim.expect == "at_most":
        p = _one_sided(x - r, math.log(claim.bound), below=True)  # type: ignore[arg-type]
        p_eq = _one_sided(x - r, math.log(claim.bound), below=False)  # evidence that A / B exceeds the bound
        bounds = (-math.inf, math.log(claim.bound))  # type: ignore[arg-type]
    else:
        p, p_eq = t.p, V.tost_p(x, r, bounds)
    spread = V.spread_problem(x, r) or ""
    if spread:  # no test applies (verdicts.spread_problem), whatever a rule would say
        p, p_eq = math.nan, math.nan
    return _Contrast(seeds=len(seeds), estimate=V.back(t.mean, scale), low=V.back(t.low, scale), high=V.back(t.high, scale),
                     p=p, p_eq=p_eq, mean=t.mean, sd=t.sd, bounds=bounds, spread=spread)


def _verdict(claim: Claim, metric: str, p: float, q: float, c: _Contrast, alpha: float) -> str:
    """The verdict of contrast `c` from its Holm-adjusted p-values (the claim's test, its counter-test): `verdicts.verdict`."""
    return V.verdict(p, q, c.mean, lower_better=metric_table.better(metric) != "higher", alpha=alpha,
                     bound=claim.expect == "at_most", spread=c.spread)


def _lean(claim: Claim, metric: str, c: _Contrast) -> str | None:
    """Which way a contrast points, decided or not: A better or worse than B (better / worse claims), below or
    above the bound (at_most); None for an equivalence claim (its question is a size, not a side) or no estimate."""
    if c.problem or not math.isfinite(c.mean):
        return None
    if claim.expect == "at_most":
        return "within" if c.mean < math.log(claim.bound) else "beyond"  # type: ignore[arg-type]
    if claim.expect == "equivalent" or c.mean == 0:
        return None
    return "better" if (c.mean < 0) == (metric_table.better(metric) != "higher") else "worse"


def quality_metrics(ranking: str | None, dataset: str | None) -> tuple[str, ...]:
    """The metrics a claim is decided on together: the report's ranking metric and the independent checks
    declared for the dataset (`metrics.table.independent_checks`). A claim on one of them is checked on the others."""
    return tuple(dict.fromkeys([*([ranking] if ranking else []), *metric_table.independent_checks(dataset)]))


def _budget(sides: Sequence[pd.DataFrame], claim: Claim) -> str:
    """The budget cell (`budget.compare`): whether A and B had the same client work and rounds."""
    if "untrained" in (claim.a, claim.b):
        return "— (vs the untrained model)"
    return B.compare(sides)


def _barely_trained(runs: pd.DataFrame, reference: pd.DataFrame, claim: Claim, metric: str | None) -> str:
    """`budget.barely_trained` for the claim's reference B against the untrained runs of its dataset and partition."""
    if "untrained" in (claim.a, claim.b) or "baseline" not in runs:
        return ""
    floors = runs[runs["baseline"].astype(str).str.lower() == "true"]
    for key in ("dataset", "partition"):
        if key in floors and key in reference and len(reference):
            floors = floors[floors[key].astype(str) == str(reference[key].iloc[0])]
    return B.barely_trained(reference, floors, metric)


def decide(runs: pd.DataFrame, claims: Sequence[Claim], default_metric: str | None = None,
           alpha: float = V.ALPHA) -> pd.DataFrame:
    """One row per claim (`COLUMNS`): the paired estimate, its interval, the Holm-corrected verdict, the same
    contrast on every other metric of `quality_metrics` present (``metrics``), whether the claim holds, and
    whether A and B had the same budget. `runs` is the per-run table (runs.csv / `frames.runs_frame`).
    The ``registration`` column is left empty: `registration` fills it from git."""
    rows: list[dict[str, Any]] = []
    primary: list[tuple[int, _Contrast]] = []
    checks: dict[str, list[tuple[int, _Contrast]]] = {}  # metric -> (row, contrast): Holm per metric
    absent: dict[int, list[str]] = {}
    for claim in claims:
        metric = claim.metric or default_metric
        row: dict[str, Any] = {"id": claim.id, "statement": claim.statement, "source": claim.source, "metric": metric,
                               "a": claim.a, "b": claim.b, "expect": claim.expect, "bound": claim.bound,
                               "margin": claim.margin, "seeds": 0, "note": "", "metrics": "", "budget": "",
                               "confound": claim.confound, "registration": ""}
        rows.append(row)
        i = len(rows) - 1
        sides = P.claim_sides(runs, claim, select)
        if all(not s.empty for s in sides):
            row["budget"] = _budget(sides, claim) + _barely_trained(runs, sides[1], claim, metric)
        if metric is None or metric not in runs:
            row.update(verdict="no data", outcome="undecided", note=f"no run records {metric}")
            continue
        if empty := [spec for spec, s in zip((claim.a, claim.b), sides) if s.empty]:
            row.update(verdict="no data", outcome="undecided", note=f"no runs of {' or '.join(empty)}")
            continue
        c = _contrast(sides, claim, metric, alpha)
        if c.problem:
            row.update(verdict="unpaired", outcome="undecided", note=c.problem)
            continue
        row.update(seeds=c.seeds, estimate=c.estimate, low=c.low, high=c.high)
        primary.append((i, c))
        dataset = str(sides[0]["dataset"].iloc[0]) if "dataset" in sides[0] else None
        family = quality_metrics(default_metric or (metric if metric in metric_table.PRIMARY else None), dataset)
        if metric not in family:
            continue  # a leakage, traffic or client metric: no declared check of it
        for other in (m for m in family if m != metric):
            recorded = other in runs and all(pd.to_numeric(s[other], errors="coerce").notna().any() for s in sides)
            if not recorded:
                absent.setdefault(i, []).append(other)
            else:
                checks.setdefault(other, []).append((i, _contrast(sides, claim, other, alpha)))
    m = max(1, sum(1 for _, c in primary if math.isfinite(c.p)))
    for (i, c), p, q in zip(primary, V.holm([c.p for _, c in primary]), V.holm([c.p_eq for _, c in primary])):
        row, claim = rows[i], claims[i]
        row["p_holm"], row["p_equivalence_holm"] = p, q
        row["verdict"] = _verdict(claim, row["metric"], p, q, c, alpha)
        if row["verdict"] == "undecidable":
            row["note"] = c.spread
        elif row["verdict"] == "inconclusive":
            if row["seeds"] < 2:
                row["note"] = "one paired seed: no spread to test"
            else:  # what the observed spread asks for (the sample sd, as the leaderboard's column)
                row["seeds_to_decide"] = V.seeds_needed(c.mean, c.sd, c.seeds, c.bounds, alpha / m, confidence=None,
                                                        test="bound" if claim.expect == "at_most" else "decide")
    leans: dict[int, list[str | None]] = {i: [_lean(claims[i], row["metric"], c)] for i, c in primary}
    said: dict[int, list[tuple[str, str, str]]] = {}  # row -> (metric, estimate, verdict)
    for other, tested in checks.items():
        ratio = metric_table.scale(other) == "log"
        ok = [(i, c) for i, c in tested if not c.problem]
        for i, c in tested:
            if c.problem:
                said.setdefault(i, []).append((other, "", f"not tested ({c.problem})"))
        for (i, c), p, q in zip(ok, V.holm([c.p for _, c in ok]), V.holm([c.p_eq for _, c in ok])):
            said.setdefault(i, []).append((other, _fmt(c.estimate, ratio), _verdict(claims[i], other, p, q, c, alpha)))
            leans[i].append(_lean(claims[i], other, c))
    for i, row in enumerate(rows):
        if "verdict" not in row or row["verdict"] in ("no data", "unpaired"):
            continue
        order = list(metric_table.METRICS)
        mine = sorted(said.get(i, []), key=lambda t: order.index(t[0]) if t[0] in order else len(order))
        row["metrics"] = "; ".join([" ".join(x for x in t if x) for t in mine]
                                   + [f"{name} not recorded" for name in absent.get(i, [])])
        verdicts = [row["verdict"]] + [v for _, _, v in mine]
        if all(v in DECIDED for v in verdicts) and len(set(verdicts)) == 1:  # every metric decided it, the same way
            expected = "within the bound" if claims[i].expect == "at_most" else claims[i].expect
            row["outcome"] = "holds" if row["verdict"] == expected else "does not hold"
        elif any(v in DECIDED for v in verdicts) or len({x for x in leans.get(i, []) if x is not None}) > 1:
            row["outcome"] = "metric-dependent"  # some decide and others do not, or they point different ways
        else:
            row["outcome"] = "undecided"
    table = pd.DataFrame(rows)
    for col in COLUMNS:
        if col not in table:
            table[col] = None
    return table[COLUMNS]


def _one_sided(d: np.ndarray, limit: float, *, below: bool) -> float:
    """p of the one-sided paired t-test that mean(d) < limit (below) or > limit (not below)."""
    from scipy import stats

    d = np.asarray(d, dtype=np.float64)
    if d.size < 2:
        return math.nan
    if V.no_spread(float(d.std(ddof=1)), float(d.mean())):
        return 0.0 if (d.mean() < limit if below else d.mean() > limit) else 1.0
    res = stats.ttest_1samp(d, limit, alternative="less" if below else "greater")
    return float(res.pvalue)


def _fmt(x: Any, ratio: bool) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return ""
    return f"×{x:.3g}" if ratio else f"{x:+.3g}"


# What denoise_loss is computed on (engine/heldout.py: DENOISE_TIMES, DENOISE_IMAGES; tests/unit/test_claims.py
# holds this line to those constants), said under every claims table that checks a claim on it
DENOISE_SAID = ("denoise_loss is the held-out velocity loss at 8 fixed times t = 1/16, 3/16, …, 15/16 (uniform over "
                "[0, 1]) on 256 seeded test images with fixed noises, the same for every run: a fixed time distribution, "
                "not the one each run trained with (benchmark/engine/heldout.py).")


def _cell(x: Any) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else str(x)


def registration_summary(table: pd.DataFrame) -> str:
    """One sentence above the claims table: which claims are confirmatory and which exploratory (the
    `registration` column, from git), so that a README quoting the table says it in words."""
    kinds: dict[str, list[str]] = {}
    for _, r in table.iterrows():
        kind = _cell(r["registration"]).split(" (")[0].split(":")[0].strip() or "not computed"
        kinds.setdefault(kind, []).append(str(r["id"]))
    n = len(table)
    conf, expl = kinds.pop("confirmatory", []), kinds.pop("exploratory", [])
    every = "both" if n == 2 else f"all {n}"
    if conf and not expl and not kinds:
        text = (f"{every} claims are confirmatory (committed before their runs, on seeds that did not grow, "
                "at equal budgets or with the confound declared)" if n > 1 else "the claim is confirmatory")
    elif expl and not conf and not kinds:
        text = (f"{every} claims are exploratory" if n > 1 else "the claim is exploratory") + (
            " (the registration column says why): read them as hypotheses for a confirmatory re-run, not as results")
    else:
        parts = []
        if conf:
            parts.append(f"{len(conf)} of {n} confirmatory ({', '.join(conf)})")
        if expl:
            parts.append(f"{len(expl)} exploratory ({', '.join(expl)}; the registration column says why)")
        parts += [f"{len(ids)} {kind} ({', '.join(ids)})" for kind, ids in kinds.items()]
        text = "; ".join(parts)
    return f"**Registration (from git):** {text}."


def to_markdown(table: pd.DataFrame, notes: Sequence[str] = ()) -> str:
    """The claims table as the study README quotes it, with its footer and `notes` (the registration's);
    deterministic: the test re-makes it from runs.csv and git."""
    lines = [registration_summary(table), ""] if "registration" in table and table["registration"].map(_cell).any() else []
    lines += ["| claim | statement | A vs B | metric | seeds | A / B (or A − B) [95% paired t] | verdict (Holm) | "
             "other metrics (Holm) | expected | outcome | budget | registration |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        ratio = isinstance(r["metric"], str) and metric_table.scale(r["metric"]) == "log"
        est = _fmt(r["estimate"], ratio)
        if est and _fmt(r["low"], ratio):
            est += f" [{_fmt(r['low'], ratio).lstrip('×')}, {_fmt(r['high'], ratio).lstrip('×')}]"
        expected = f"A / B ≤ {r['bound']:g}" if r["expect"] == "at_most" else (
            f"{r['expect']} (±{r['margin']:.0%})" if r["expect"] == "equivalent" else r["expect"])
        outcome = str(r["outcome"])
        need = r["seeds_to_decide"]
        if outcome == "undecided" and need is not None and not (isinstance(need, float) and math.isnan(need)):
            outcome += f": {int(need)} seeds would decide it"
        elif outcome == "undecided" and _cell(r["note"]):
            outcome += f": {r['note']}"
        statement = str(r["statement"]) + (f" ({r['source']})" if _cell(r["source"]) else "")
        budget = _cell(r["budget"]) + (f"; confound declared: {r['confound']}" if _cell(r["confound"]) else "")
        lines.append(f"| {r['id']} | {statement} | {r['a']} vs {r['b']} | {r['metric']} | {int(r['seeds'])} | {est} | "
                     f"{r['verdict']} | {_cell(r['metrics']) or '—'} | {expected} | {outcome} | {budget} | "
                     f"{_cell(r['registration'])} |")
    lines += ["", "Paired by seed (same partition, initial model and noises); a ratio for a positive metric. Verdicts "
              "at level 0.05 after Holm's correction over the claims of this table: better / worse by the paired "
              "t-test, equivalent by two one-sided tests within the margin, `at_most` by a one-sided t-test against "
              "the bound; seeds to decide: power 0.8 at the observed spread (benchmark/report/verdicts.py)."]
    checked, absent = _checked_metrics(table)
    if checked or absent:
        said = f"checked here: {', '.join(checked) or 'none'}" + (f"; not recorded in runs.csv, so not counted: "
                                                                   f"{', '.join(absent)}" if absent else "")
        lines += ["", f"Other metrics ({said}): a claim on the ranking metric or on one of its declared independent "
                  "checks (benchmark/metrics/table.py: INDEPENDENT_CHECKS) is tested the same way on each of the "
                  "others runs.csv records, Holm-corrected over this table per metric. The primary metric alone no "
                  "longer decides: the outcome is decided only when every metric checked decides it the same way, "
                  "and reads metric-dependent when only some decide it, or their estimates point different ways (A better "
                  "by one, worse by another; below the bound by one, above by another); the verdict column stays the "
                  "primary metric's. A claim on another kind of metric (leakage, traffic) shows —."
                  + (f" {DENOISE_SAID}" if "denoise_loss" in checked or (table["metric"] == "denoise_loss").any() else "")]
    lines += ["", P.REGISTRATION_SAID] + ([" ".join(notes)] if notes else [])
    return "\n".join(lines) + "\n"


def _checked_metrics(table: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(metrics some claim was checked on, metrics some claim could not be checked on: not recorded), in
    the metric table's order, read back from the ``metrics`` cells."""
    checked, absent = set(), set()
    for cell in table["metrics"].dropna().astype(str):
        for part in filter(None, cell.split("; ")):
            (absent if part.endswith(" not recorded") else checked).add(part.split(" ")[0])
    order = list(metric_table.METRICS)

    def key(m: str) -> tuple[int, str]:
        return (order.index(m) if m in order else len(order), m)
    return sorted(checked, key=key), sorted(absent - checked, key=key)


def quote_into_readme(readme: str | Path, markdown: str) -> bool:
    """Replace the block between `BEGIN` and `END` in `readme` with `markdown`; False (untouched) when the
    README has no such block. ClaimsError for a BEGIN without END (nothing is written then)."""
    path = Path(readme)
    if not path.is_file():
        return False
    text = path.read_text(encoding="utf-8")
    if BEGIN not in text:
        return False
    head, _, rest = text.partition(BEGIN)
    if END not in rest:
        raise ClaimsError(f"{path}: the claims block opens ({BEGIN}) but never closes; add {END} after it")
    _, _, tail = rest.partition(END)
    new = f"{head}{BEGIN}\n{markdown}{END}{tail}"
    if new != text:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(new, encoding="utf-8")
        tmp.replace(path)
    return True


def quoted(readme: str | Path) -> str | None:
    """The claims block a README quotes (between the markers), or None."""
    text = Path(readme).read_text(encoding="utf-8")
    if BEGIN not in text:
        return None
    return text.partition(BEGIN)[2].partition(END)[0].lstrip("\n")


def with_run_records(runs: pd.DataFrame, root: str | Path) -> pd.DataFrame:
    """`runs` with what its run folders under `root` record and an older runs.csv lacks: each run's start
    (`preregistration.START_COLUMNS`, as `preregistration.with_starts`) and its client work (``client_images``), matched by run id; a run
    whose folder is not there (or is there twice) keeps NaN. Columns runs.csv has are kept as they are."""
    from dfbench.benchmark.core.runfolder import iter_runs

    need_start, need_work = "started_epoch" not in runs, "client_images" not in runs
    if not (need_start or need_work) or "run_id" not in runs or not Path(root).is_dir():
        return runs
    folders: dict[str, Any] = {}
    for folder in iter_runs(root):
        folders[folder.path.name] = None if folder.path.name in folders else folder
    starts, work = [], []
    for run_id in runs["run_id"].astype(str):
        folder = folders.get(run_id)
        try:
            start = folder.started() if folder is not None else None
            images = (folder.metrics() or {}).get("client_images") if folder is not None else None
        except (OSError, ValueError):  # a file that no longer parses: unknown, and said so
            start, images = None, None
        starts.append(start)
        work.append(float(images) if isinstance(images, (int, float)) else math.nan)
    out = runs.copy()
    if need_start:
        out["started_epoch"] = [s[0] if s else math.nan for s in starts]
        out["started_how"] = [s[1] if s else "" for s in starts]
    if need_work:
        out["client_images"] = work
    return out


def decide_file(runs: pd.DataFrame, claims_file: str | Path, default_metric: str | None,
                runs_csv: str | Path | None = None) -> tuple[pd.DataFrame, list[str]]:
    """`decide` the claims of `claims_file` on `runs` and fill each claim's registration (`registration`; its
    seeds are checked against the git history of `runs_csv`, the study's runs.csv); (the table, the footer's notes)."""
    claims = load_claims(claims_file)
    table = decide(runs, claims, default_metric)
    cells, notes = P.registration(claims_file, claims, runs, table, runs_csv, default_metric, select)
    table["registration"] = table["id"].astype(str).map(cells)
    return table, notes


def write_claims(runs: pd.DataFrame, claims_file: str | Path, out: str | Path, default_metric: str | None,
                 readme: str | Path | None = None) -> dict[str, Path]:
    """claims.csv and claims.md in `out` from the per-run table, and the README's block (`readme`,
    default `out`/README.md) when it has one; each claim's registration from git (`decide_file`, with
    `out`/runs.csv's history for its seeds). For a file with ``preregistered = true``, claims.md says
    above the table whether it was (`preregistration.check_preregistration`; the README's block never does), and
    `NotPreregistered` is raised after writing when it was not."""
    load_claims(claims_file)  # a bad file is refused before anything is made
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table, notes = decide_file(runs, claims_file, default_metric, out / "runs.csv")
    check = P.check_preregistration(claims_file, runs) if preregistered(claims_file) else None
    md = to_markdown(table, notes)
    said = f"{check.line}\n\n" if check is not None else ""
    (out / "claims.md").write_text(f"# Claims\n\nFrom `{P.shown_path(claims_file)}`.\n\n{said}{md}", encoding="utf-8")
    table.to_csv(out / "claims.csv", index=False)
    written = {"claims_md": out / "claims.md", "claims_csv": out / "claims.csv"}
    target = Path(readme) if readme is not None else out / "README.md"
    if quote_into_readme(target, md):
        written["readme"] = target
    if check is not None and check.failure is not None:
        raise NotPreregistered(check.failure, written)
    return written
