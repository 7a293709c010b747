"""Whether a study's claims were fixed before their evidence: the git archaeology behind the claims table's
``registration`` column and the ``preregistered = true`` check (`report.claims` decides the claims, this module
dates them; it reads git and the runs' starts, and never the claims' numbers).

**Registration** (every claims file, from git): ``registration`` is *confirmatory* only when (i) the first
commit of the claims file holding the claim as it stands (a, b, expect, metric, bound, the margin of an
equivalence, where; a change of any of them registers it anew) came before every run of its two settings
started (the run's start in runs.csv or its folder, or the commit that first listed it in runs.csv, whichever is
earlier), (ii) no result table of the study folder (leaderboard.md, table.md, runs.csv ...: the folder's .md and
.csv files but README.md and the claims) naming both its methods was committed at or before that commit, (iii)
the seeds A and B share are those they shared in the first committed runs.csv that held both (skipped, and
said, without a committed runs.csv), and (iv) the budgets are equal or the confound is declared. Otherwise
*exploratory (why)*: claims after runs, claim changed after runs, results seen before the claims, seeds grew:
n0 -> n, unequal budget; *unchecked (why)* where git cannot tell (not a checkout, no git, a shallow clone, runs
without a start). A few git calls per file; every file version read is kept for the process.

**Pre-registration** (``preregistered = true``): the claims were fixed before the evidence. The report
finds the last commit that changed the claims file (``git log -1 -- FILE``, committer time) and checks
that every run of the runs table (every finished run the report reads, whichever claim names it: the
simpler rule, and the stricter) started after it; claims.md says so in one line above the table
("Pre-registered: claims committed in <hash> at <UTC>; all N runs started after it", or "NOT
pre-registered: K of N runs started before ..."). A claims file with uncommitted changes, or never
committed, is not pre-registered. Outside a git checkout, or without git, the line says
"Pre-registration not checked" and why. A run's start is status.json's ``started_epoch``; for a run
written before that field, its updated_epoch minus metrics.json's wall_seconds (the latest it can have
started; the line counts those). The report writes the starts into runs.csv (``started_epoch``,
``started_how``), so the check is made again from a committed runs.csv. When the check fails, everything
is still written, then `NotPreregistered` is raised (``dfbench report`` exits 1 with one line naming the
file, the commit and the first run that started before it). Without the key nothing of this is done.
"""

from __future__ import annotations

import io
import math
import re
import subprocess
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from dfbench.benchmark.report import verdicts as V
from dfbench.benchmark.report.budget import UNEQUAL

if TYPE_CHECKING:  # report.claims imports this module
    from dfbench.benchmark.report.claims import Claim

START_COLUMNS = ("started_epoch", "started_how")  # what `with_starts` adds to the runs table (and runs.csv)
# the runs of one setting of a claim: (runs, spec, where) -> rows (`report.claims.select`; a ValueError when it
# names none or several, a KeyError when the table lacks a column)
Select = Callable[[pd.DataFrame, str, Mapping[str, Any]], pd.DataFrame]


def shown_path(path: str | Path) -> str:
    """A claims file as claims.md names it: relative to the repository root when inside it (as the make targets pass
    it), so a committed claims.md never holds one machine's absolute path; else as given."""
    path = Path(path)
    if path.is_absolute():
        root = Path(__file__).resolve().parents[2]
        try:
            return path.resolve().relative_to(root).as_posix()
        except ValueError:
            pass
    return path.as_posix()


# -- pre-registration: the claims file's last commit came before every run -------------------

class _Unchecked(Exception):
    """Why git cannot tell when the claims file was committed (not a checkout, no git)."""


@dataclass(frozen=True)
class Preregistration:
    """The check's outcome: `line` for claims.md; `failure`, one line naming the file, the commit and
    the first run that started before it, when the claims are not pre-registered (None otherwise)."""

    line: str
    failure: str | None = None


def with_starts(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs table with each run's start (`START_COLUMNS`), read from its folder (the "path" column)
    by `RunFolder.started`: "recorded" in status.json, or "derived" for an older folder; NaN when unknown."""
    from dfbench.benchmark.core.runfolder import RunFolder

    starts: list[tuple[float, str] | None] = []
    for path in runs["path"] if "path" in runs else [None] * len(runs):
        try:
            starts.append(RunFolder(Path(path)).started() if isinstance(path, str) and path else None)
        except (OSError, ValueError):  # a file that no longer parses: the start is unknown, and said so
            starts.append(None)
    return runs.assign(started_epoch=pd.Series([s[0] if s else math.nan for s in starts], index=runs.index, dtype=float),
                       started_how=pd.Series([s[1] if s else "" for s in starts], index=runs.index, dtype=object))


def _utc(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


def _git(where: Path, *args: str) -> str:
    """git's output for `args`, run in `where`; _Unchecked with git's own reason when it cannot answer."""
    try:
        done = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise _Unchecked("git is not installed") from None
    except (OSError, subprocess.SubprocessError) as err:
        raise _Unchecked(f"git failed ({err})") from None
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[0]
        raise _Unchecked(f"git cannot say when {where} was committed ({said.removeprefix('fatal: ')})")
    return done.stdout


def check_preregistration(claims_file: str | Path, runs: pd.DataFrame) -> Preregistration:
    """Whether every run of `runs` started after the last commit that changed `claims_file` (see the
    module doc). `runs` holds `START_COLUMNS` (runs.csv of a pre-registered study) or the run folders' "path"."""
    shown, path = shown_path(claims_file), Path(claims_file).resolve()
    if "started_epoch" not in runs and "path" not in runs:
        return Preregistration("Pre-registration not checked: the runs table holds neither the runs' start times "
                               "nor their folders (a runs.csv written by a report of a claims file without "
                               "`preregistered = true`).")
    try:
        dirty = _git(path.parent, "status", "--porcelain", "--", path.name).strip()
        last = _git(path.parent, "log", "-1", "--format=%H%x09%ct", "--", path.name).strip()
    except _Unchecked as why:
        return Preregistration(f"Pre-registration not checked: {why}.")
    fix = "commit the claims file, then make the runs (again: --force), or remove `preregistered = true`"
    if dirty:
        return Preregistration(f"NOT pre-registered: `{shown}` has uncommitted changes (git status), so no commit "
                               "holds these claims.", f"{shown}: not pre-registered: it has uncommitted changes; {fix}")
    if not last:
        return Preregistration(f"NOT pre-registered: `{shown}` was never committed (git log names no commit of it).",
                               f"{shown}: not pre-registered: it was never committed; {fix}")
    commit, committed = last.split("\t")[0][:7], float(last.split("\t")[1])
    when = f"{commit} ({_utc(committed)})"
    if "started_epoch" not in runs:
        runs = with_starts(runs)
    start = pd.to_numeric(runs["started_epoch"], errors="coerce")
    how = runs["started_how"].fillna("").astype(str) if "started_how" in runs else pd.Series("", index=runs.index)
    ids = runs["run_id"].astype(str) if "run_id" in runs else pd.Series(runs.index.astype(str), index=runs.index)
    n, unknown = len(runs), start.isna()
    early = start.le(committed) & ~unknown  # commit times are whole seconds: a run in that second counts as before
    if not early.any() and not unknown.any():
        derived = int(how[start.notna()].eq("derived").sum())
        note = (f" ({derived} of them dated by status.json's updated_epoch minus metrics.json's wall_seconds, the "
                "latest such a run can have started)" if derived else "")
        runs_said = f"all {n} runs started after it{note}" if n else "no finished run to check yet"
        return Preregistration(f"Pre-registered: claims committed in {commit} at {_utc(committed)}; {runs_said}.")
    parts, failure = [], []
    if early.any():
        first = start[early].idxmin()
        parts.append(f"{int(early.sum())} of {n} runs started before the claims' last commit {when}, "
                     f"e.g. {ids[first]} (started {_utc(start[first])})")
        failure.append(f"{int(early.sum())} of {n} runs started before its last commit {when}, the first "
                       f"{ids[first]} at {_utc(start[first])}")
    if unknown.any():
        example = ids[unknown].iloc[0]
        parts.append(f"{int(unknown.sum())} of {n} runs have no start time (status.json has no started_epoch, and "
                     f"no updated_epoch with metrics.json's wall_seconds), e.g. {example}")
        failure.append(f"{int(unknown.sum())} of {n} runs have no start time to compare with its last commit "
                       f"{when}, e.g. {example}")
    return Preregistration(f"NOT pre-registered: {'; '.join(parts)}.", f"{shown}: not pre-registered: "
                           f"{'; '.join(failure)}; {fix}")


# -- registration: was each claim fixed before its evidence? (git, for every claims file) --------------

REGISTRATION_SAID = (
    "Registration (from git, per claim): confirmatory when the claims file's first commit holding the claim as it "
    "stands (its a, b, expect, metric, bound, equivalence margin and where) came before every run of its two "
    "settings started and before any result table of this folder naming both its methods, the seeds A and B share "
    "are those they shared in the first committed runs.csv that held both (none added after a first result), and A "
    "and B had the same client work and rounds, or the claim declares the confound; otherwise exploratory, saying "
    "why. Client work: runs.csv's client_images (images trained on by clients, in full-model units) where every run "
    "records it, else rounds × local steps × batch size × clients × participation.")

_BLOBS: dict[str, str | None] = {}  # "commit:path" -> the file's text there (a commit never changes: kept per process)


@dataclass(frozen=True)
class _Version:
    """One committed version of a file: its commit, committer time and text (None: absent there)."""

    commit: str
    time: float
    text: str | None


def _cat_files(where: Path, specs: Sequence[str]) -> dict[str, str | None]:
    """The texts of `specs` ("commit:path") in one `git cat-file --batch` call; None for one git does not hold."""
    try:
        done = subprocess.run(["git", "-C", str(where), "cat-file", "--batch"], input="".join(f"{s}\n" for s in specs).encode(),
                              capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as err:
        raise _Unchecked(f"git failed ({err})") from None
    if done.returncode != 0:
        raise _Unchecked(f"git cat-file failed ({done.stderr.decode(errors='replace').strip()[:200]})")
    out, pos, texts = done.stdout, 0, {}
    for spec in specs:
        end = out.index(b"\n", pos)
        header = out[pos:end].decode(errors="replace").split()
        pos = end + 1
        if len(header) != 3 or header[1] != "blob":  # "<spec> missing" (a deletion), or not a file
            texts[spec] = None
            continue
        size = int(header[2])
        texts[spec] = out[pos:pos + size].decode("utf-8", errors="replace")
        pos += size + 1
    return texts


def _history(path: Path) -> list[_Version]:
    """Every committed version of `path`, oldest first, following renames (``git log --follow``): two git calls,
    and none for a version read before. _Unchecked when git cannot tell (no git, not a checkout, a shallow clone)."""
    where = path.parent
    if _git(where, "rev-parse", "--is-shallow-repository").strip() == "true":
        raise _Unchecked("a shallow clone holds only part of the history")
    log = _git(where, "log", "--follow", "--format=%x01%H%x09%ct", "--name-only", "--", path.name)
    entries: list[tuple[str, float, str | None]] = []
    for chunk in log.split("\x01")[1:]:
        lines = [line for line in chunk.splitlines() if line.strip()]
        commit, when = lines[0].split("\t")
        entries.append((commit, float(when), lines[1] if len(lines) > 1 else None))
    wanted = [f"{c}:{n}" for c, _, n in entries if n and f"{c}:{n}" not in _BLOBS]
    if wanted:
        _BLOBS.update(_cat_files(where, wanted))
    return [_Version(c, t, _BLOBS.get(f"{c}:{n}") if n else None) for c, t, n in reversed(entries)]


Definition = tuple[Any, ...]


def claim_sides(frame: pd.DataFrame, claim: Claim, select: Select) -> list[pd.DataFrame]:
    """A claim's A and B runs in `frame`: each side's spec under `where` and its own `a_where` / `b_where`."""
    return [select(frame, spec, {**claim.where, **extra}) for spec, extra in ((claim.a, claim.a_where), (claim.b, claim.b_where))]


def _definition(a: Any, b: Any, expect: Any, metric: Any, bound: Any, margin: Any, where: Any,
                a_where: Any = None, b_where: Any = None, treatment: Any = None) -> Definition:
    """What a claim says, as compared between versions of its file: a later change of any of it is a new claim."""
    number = (lambda x: float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else x)
    places = tuple(sorted((prefix + str(k), str(v)) for prefix, w in (("", where), ("a:", a_where), ("b:", b_where))
                          if isinstance(w, Mapping) for k, v in w.items()))
    if treatment:  # kept out when absent, so the claims written before the key define as they did
        places = (*places, ("treatment", ",".join(sorted(map(str, treatment)))))
    return (str(a), str(b), str(expect), str(metric), number(bound), number(margin) if expect == "equivalent" else None, places)


def _claim_definition(claim: Claim, ranking: str | None) -> Definition:
    return _definition(claim.a, claim.b, claim.expect, claim.metric or ranking, claim.bound, claim.margin, claim.where,
                       claim.a_where, claim.b_where, claim.treatment)


def _definitions(text: str | None, ranking: str | None) -> dict[str, Definition]:
    """id -> definition of each claim of one version of a claims file ({} for one that does not parse)."""
    try:
        spec = tomllib.loads(text) if text is not None else {}
    except tomllib.TOMLDecodeError:
        return {}
    out: dict[str, Definition] = {}
    for c in spec.get("claim", []) if isinstance(spec.get("claim"), list) else []:
        if isinstance(c, dict) and "id" in c:
            metric = c.get("metric", spec.get("metric")) or ranking
            out[str(c["id"])] = _definition(c.get("a"), c.get("b"), c.get("expect"), metric, c.get("bound"),
                                            c.get("margin", spec.get("margin", V.MARGIN)), c.get("where", {}),
                                            c.get("a_where"), c.get("b_where"), c.get("treatment"))
    return out


def _registered(claim: Claim, versions: Sequence[_Version], ranking: str | None) -> tuple[_Version | None, _Version | None]:
    """(the first version holding the claim's id, the version from which it has said what it says today):
    None for the second when no commit holds it as it stands."""
    want, first, since = _claim_definition(claim, ranking), None, None
    for v in versions:
        d = _definitions(v.text, ranking).get(claim.id)
        if d is not None and first is None:
            first = v
        since = (since or v) if d == want else None
    return first, since


def _seed_set(rows: pd.DataFrame) -> set[str]:
    return {str(s) for s in rows["seed"]} if "seed" in rows else set()


def registration(claims_file: str | Path, claims: Sequence[Claim], runs: pd.DataFrame, table: pd.DataFrame,
                 runs_csv: str | Path | None, ranking: str | None, select: Select) -> tuple[dict[str, str], list[str]]:
    """(claim id -> its registration cell, notes for the footer): confirmatory or exploratory (why), from the
    claims file's and `runs_csv`'s git history, the runs' starts (each side's runs found by `select`) and
    `table`'s budget cells (`report.claims.decide`); see `REGISTRATION_SAID`. "unchecked (why)" where git cannot
    tell and nothing else makes the claim exploratory."""
    path = Path(claims_file).resolve()
    notes: list[str] = []
    try:
        versions: list[_Version] | None = _history(path)
        unchecked = ""
    except _Unchecked as why:
        versions, unchecked = None, "not a git checkout" if "not a git repository" in str(why) else str(why)
    csv_versions: list[_Version] = []
    tables: list[tuple[str, _Version]] = []  # the study's result tables as committed: results someone could see
    if versions is not None and runs_csv is not None:
        try:
            if Path(runs_csv).parent.is_dir():  # (a report's new --out folder holds nothing committed)
                csv_versions = _history(Path(runs_csv).resolve())
                tables = _result_tables(Path(runs_csv).resolve().parent)
        except _Unchecked:
            csv_versions = []
        if not csv_versions:
            notes.append("runs.csv has no committed version, so whether the seeds grew after a first result is not checked.")
    frames = [(v, pd.read_csv(io.StringIO(v.text))) for v in csv_versions if v.text]
    first_listed: dict[str, float] = {}  # run id -> when runs.csv first held it: the run had started by then
    for v, frame in frames:
        for run_id in frame["run_id"].astype(str) if "run_id" in frame else []:
            first_listed.setdefault(run_id, v.time)
    if "started_epoch" not in runs and "path" in runs:
        runs = with_starts(runs)
    budget = dict(zip(table["id"].astype(str), table["budget"].fillna("").astype(str)))
    cells: dict[str, str] = {}
    derived: set[str] = set()
    for claim in claims:
        reasons: list[str] = []
        if budget.get(claim.id, "").startswith(UNEQUAL) and not claim.confound:
            reasons.append("unequal budget")
        sides = claim_sides(runs, claim, select)
        if any(s.empty for s in sides):
            cells[claim.id] = "exploratory (" + "; ".join(reasons) + ")" if reasons else "unchecked (no runs yet)"
            continue
        rows = pd.concat(sides)
        front: list[str] = []
        if versions is None:
            front.append(f"unchecked ({unchecked})")
        else:
            first, since = _registered(claim, versions, ranking)
            ids = rows["run_id"].astype(str) if "run_id" in rows else pd.Series([""] * len(rows), index=rows.index)
            start = (pd.to_numeric(rows["started_epoch"], errors="coerce") if "started_epoch" in rows
                     else pd.Series(math.nan, index=rows.index))
            listed = ids.map(first_listed).astype(float)
            latest = pd.concat([start, listed], axis=1).min(axis=1)  # the latest each run can have started
            how = rows["started_how"].fillna("").astype(str) if "started_how" in rows else pd.Series("", index=rows.index)

            def before(t: float) -> bool:  # commit times are whole seconds: a run in that second counts as before
                return bool(latest.le(t).any())
            if since is None:
                reasons.insert(0, "claim not committed" if first is None else "claim changed since its last commit")
            elif before(first.time):  # type: ignore[union-attr]
                reasons.insert(0, "claims after runs")
            elif before(since.time):
                reasons.insert(0, "claim changed after runs")
            elif shown := _shown_before(tables, claim, since.time):
                reasons.insert(0, f"results seen before the claims: {shown}")
            elif start.isna().any():
                front.append(f"unchecked ({int(start.isna().sum())} of {len(rows)} runs have no start time)")
            seen = next(((v, f) for v, f in frames if _sides_in(f, claim, select) is not None), None)
            if seen is not None:
                then, now = _sides_in(seen[1], claim, select), _seed_set(sides[0]) & _seed_set(sides[1])
                if then != now:
                    word = "grew" if then < now else "changed"
                    reasons.append(f"seeds {word}: {len(then)} -> {len(now)}")
        if reasons:
            cells[claim.id] = f"exploratory ({'; '.join(reasons)})"
        else:
            cells[claim.id] = front[0] if front else "confirmatory"
            if not front:
                derived |= set(ids[how.eq("derived")])
    if derived:
        notes.insert(0, f"{len(derived)} of the runs behind the confirmatory claims are dated by status.json's updated_epoch "
                        "minus metrics.json's wall_seconds (the latest they can have started).")
    return cells, notes


RESULT_TABLES = (".md", ".csv")  # a study folder's files that can show results (its grids, .toml, cannot)
NOT_RESULTS = {"README.md", "claims.md", "claims.csv"}  # prose, and the claims themselves


def _result_tables(folder: Path) -> list[tuple[str, _Version]]:
    """Every committed version of the result tables directly in the study folder (leaderboard.md, runs.csv,
    table.md ...; not README.md, the claims or the run folders), oldest first: two git calls."""
    log = _git(folder, "log", "--format=%x01%H%x09%ct", "--name-only", "--", ".")
    prefix = _git(folder, "rev-parse", "--show-prefix").strip()
    entries: list[tuple[str, float, str]] = []
    for chunk in log.split("\x01")[1:]:
        lines = [line for line in chunk.splitlines() if line.strip()]
        commit, when = lines[0].split("\t")
        for name in lines[1:]:
            rest = name[len(prefix):] if name.startswith(prefix) else None
            if rest and "/" not in rest and rest.endswith(RESULT_TABLES) and rest not in NOT_RESULTS:
                entries.append((commit, float(when), name))
    wanted = [f"{c}:{n}" for c, _, n in entries if f"{c}:{n}" not in _BLOBS]
    if wanted:
        _BLOBS.update(_cat_files(folder, wanted))
    return [(n.rpartition("/")[2], _Version(c, t, _BLOBS.get(f"{c}:{n}"))) for c, t, n in reversed(entries)]


def _shown_before(tables: Sequence[tuple[str, _Version]], claim: Claim, registered: float) -> str:
    """"<file> in <commit>" for the first result table committed at or before `registered` that names both of
    the claim's methods (an earlier run of the study the claim could have been written from), or ""."""
    from dfbench.benchmark.grid.spec import parse_method

    names = {spec if spec == "untrained" else parse_method(spec)[0] for spec in (claim.a, claim.b)}
    for name, v in tables:
        if v.time <= registered and v.text and all(
                re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", v.text, flags=re.IGNORECASE) for n in names):
            return f"{name} in {v.commit[:7]}"
    return ""


def _sides_in(frame: pd.DataFrame, claim: Claim, select: Select) -> set[str] | None:
    """The seeds A and B share in one version of runs.csv, or None when it lacks either setting (or cannot tell)."""
    try:
        sides = claim_sides(frame, claim, select)
    except (ValueError, KeyError):  # a ClaimsError (a ValueError): this version names none or several
        return None
    if any(s.empty for s in sides):
        return None
    return _seed_set(sides[0]) & _seed_set(sides[1])
