"""Re-decide a committed study's claims and refresh the generated blocks of its README, without run folders.

    python scripts/claims.py results/paper-fmnist

reads ``results/paper-fmnist/runs.csv`` (written by `dfbench report`), decides the claims of the file
that ``claims.md`` names (or ``--claims FILE``), rewrites claims.md / claims.csv and the README's claims
block, and refreshes every include block of the README::

    <!-- include: paper_rules.md -->
    ... the file's text, copied here by this command ...
    <!-- include: end -->

so that no table a README shows is typed by hand. ``--check`` writes nothing and exits 1 naming
each block that differs from what the CSVs give (tests/results/test_readme_numbers.py runs it on every study).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from dfbench.benchmark.api import REGISTRATION_SAID, primary_metric
from dfbench.benchmark.api import claims as C

INCLUDE = re.compile(r"<!-- include: (?P<name>[^ >]+) -->\n(?P<body>.*?)<!-- include: end -->", re.S)
SOURCE = re.compile(r"^From `(?P<path>[^`]+)`\.", re.M)


def claims_file_of(study: Path) -> Path | None:
    """The claims file a study's claims.md was made from (its "From `...`." line), or None."""
    md = study / "claims.md"
    if not md.is_file():
        return None
    found = SOURCE.search(md.read_text(encoding="utf-8"))
    if not found:
        return None
    path = Path(found["path"])  # written relative to the repository root (the make targets run there)
    return path if path.is_absolute() else Path(__file__).resolve().parents[1] / path


def read_runs(study: Path) -> pd.DataFrame:
    """The study's runs.csv, with the runs' starts and client work read from its committed run folders where
    an older runs.csv lacks them (`claims.with_run_records`)."""
    path = study / "runs.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: `dfbench report --runs RUNS --out {study}` writes it")
    return C.with_run_records(pd.read_csv(path), study)


def expected_claims(study: Path, claims_file: Path | None = None) -> str | None:
    """The claims table the study's runs.csv gives (markdown, as the README quotes it), or None. Where git cannot
    tell a claim's registration (no git, a shallow clone), the one the committed claims.csv records is shown."""
    claims_file = claims_file or claims_file_of(study)
    if claims_file is None:
        return None
    runs = read_runs(study)
    table, notes = C.decide_file(runs, claims_file, _primary(runs), study / "runs.csv")
    recorded = study / "claims.csv"
    unchecked = table["registration"].astype(str).str.startswith("unchecked")
    if unchecked.any() and recorded.is_file():
        before = pd.read_csv(recorded)
        if "registration" in before:
            kept = dict(zip(before["id"].astype(str), before["registration"]))
            table.loc[unchecked, "registration"] = table.loc[unchecked, "id"].astype(str).map(kept)
            notes = _recorded_notes(recorded.with_name("claims.md"), notes)
    return C.to_markdown(table, notes)


def _recorded_notes(claims_md: Path, notes: list[str]) -> list[str]:
    """The registration notes the committed claims.md states (its last paragraph after the registration's),
    for a check made where git cannot tell; `notes` when it states none."""
    if not claims_md.is_file():
        return notes
    text = claims_md.read_text(encoding="utf-8").rstrip("\n")
    head, found, tail = text.rpartition(REGISTRATION_SAID)
    return [tail.strip()] if found and tail.strip() else []


def _primary(runs: pd.DataFrame) -> str | None:
    """The report's ranking metric among runs.csv's metric columns."""
    return primary_metric(c for c in runs.columns if not c.startswith(("param.", "cfg.")) and "__" not in c)


def stale_blocks(readme: Path) -> list[str]:
    """The README's generated blocks that differ from what the study's files give: the claims block
    (from runs.csv) and each include block (from the file it names)."""
    study, text, out = readme.parent, readme.read_text(encoding="utf-8"), []
    for m in INCLUDE.finditer(text):
        source = study / m["name"]
        if not source.is_file():
            out.append(f"include {m['name']}: no such file in {study}")
        elif m["body"] != _included(source):
            out.append(f"include {m['name']}: differs from the file")
    if C.BEGIN in text:
        want = expected_claims(study)
        if want is None:
            out.append("claims block: no claims.md naming its claims file")
        elif C.quoted(readme) != want:
            out.append("claims block: differs from the claims decided from runs.csv")
    return out


def _included(source: Path) -> str:
    body = source.read_text(encoding="utf-8")
    return body if body.endswith("\n") else body + "\n"


def refresh(readme: Path, claims_file: Path | None = None) -> list[str]:
    """Rewrite the README's include blocks and claims (claims.md, claims.csv and the block); the names of
    what was written."""
    study = readme.parent
    written = []
    text = readme.read_text(encoding="utf-8")
    new = INCLUDE.sub(lambda m: f"<!-- include: {m['name']} -->\n{_included(study / m['name'])}<!-- include: end -->", text)
    if new != text:
        readme.write_text(new, encoding="utf-8")
        written.append(str(readme))
    claims_file = claims_file or claims_file_of(study)
    if claims_file is not None:
        runs = read_runs(study)
        written += [str(p) for p in C.write_claims(runs, claims_file, study, _primary(runs), readme).values()]
    return written


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/claims.py", description=__doc__.split("\n\n")[0])
    p.add_argument("study", help="a study's results folder (with runs.csv and README.md), e.g. results/paper-fmnist")
    p.add_argument("--claims", metavar="FILE", help="the claims file (default: the one claims.md names)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each README block that is stale")
    a = p.parse_args(argv)
    readme = Path(a.study) / "README.md"
    if not readme.is_file():
        print(f"error: {readme} not found", file=sys.stderr)
        return 2
    try:
        if a.check:
            stale = stale_blocks(readme)
            for line in stale:
                print(f"{readme}: {line}")
            return 1 if stale else 0
        for path in refresh(readme, Path(a.claims) if a.claims else None):
            print(path)
    except (C.ClaimsError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
