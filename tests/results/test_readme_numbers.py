"""A study README says what its CSVs say: every generated block (the claims table, decided again from the
committed runs.csv; each included table, from its file) is what the data give today, every claims file
is quoted by a study, and in a README that declares `<!-- numbers: from csv -->` every decimal number
outside those blocks is a value of one of the study's CSV files at the precision shown.

The documentation site (docs/) is held to the same rule: a page that quotes a decimal number outside code
names the files its numbers come from, `<!-- numbers: from FILE FILE ... -->` (paths from the repository
root), and each such number is a value of one of them at the precision shown: a CSV's values, or the
numbers written in any other text file (a study's JSON or Markdown table, or a test that computes the
number again and pins it, e.g. tests/results/test_docs.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from dfbench.benchmark.report import claims as C
from helpers import load_script

study_claims = load_script("claims")  # scripts/claims.py

ROOT = Path(__file__).resolve().parents[2]
# The committed studies' READMEs. A folder with a reference/ study (results/demo) is where `make demo` writes a
# fresh page (git-ignored, this machine's numbers): its committed study is reference/, so only that is read.
READMES = sorted([*(r for r in (ROOT / "results").glob("*/README.md") if not (r.parent / "reference" / "README.md").is_file()),
                  *(ROOT / "results").glob("*/reference/README.md")])
NUMBERS_MARKER = "<!-- numbers: from csv -->"
NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+\.\d+|\d{4,})(?![\w.]*\d)")
DOC_PAGES = sorted((ROOT / "docs").rglob("*.md"))
# a docs page's sources: <!-- numbers: from results/x/leaderboard.csv tests/results/test_docs.py -->
DOC_SOURCES = re.compile(r"<!-- numbers: from (?!csv -->)(?P<paths>[^<>]+?) -->")
# a number as a JSON, Markdown or Python file writes it: 0.905, 267_313, 1,062,497, 8.34e-07
SNIPPET = re.compile(r'^--8<-- "(?P<path>[^"]+)"$', flags=re.M)  # pymdownx.snippets, base path the repository root
LITERAL = re.compile(r"(?<![\w.])(?:\d{1,3}(?:,\d{3})+|\d[\d_]*(?:\.\d+)?(?:[eE][-+]?\d+)?)")


@pytest.mark.parametrize("readme", READMES + DOC_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_generated_blocks_are_what_the_csvs_give(readme):
    assert study_claims.stale_blocks(readme) == [], (
        f"regenerate with `python scripts/claims.py {readme.parent.relative_to(ROOT)}`")


def test_every_study_reported_under_the_verdicts_quotes_its_claims():
    """A grid's claims file (NAME.claims.toml, in its study's folder results/NAME/ or shipped) is decided by that
    study once it has been reported under the verdicts (it has runs.csv); a study that has not been re-run since
    keeps its older page until it is, and says nothing generated."""
    quoted = {study_claims.claims_file_of(r.parent).resolve() for r in READMES if study_claims.claims_file_of(r.parent)}
    shipped = sorted((ROOT / "benchmark" / "grid" / "builtin").glob("*.claims.toml"))
    homed = sorted((ROOT / "results").glob("*/*.claims.toml"))  # a study's own, in its results folder
    assert homed, "no results/<study>/<study>.claims.toml found"
    for claims_file in shipped + homed:
        study = claims_file.parent if claims_file in homed else ROOT / "results" / claims_file.name.removesuffix(".claims.toml")
        if (study / "runs.csv").is_file():
            assert claims_file.resolve() in quoted, f"{claims_file.name}: {study} has runs.csv but no claims.md made from it"
    for readme in READMES:
        if (readme.parent / "claims.md").is_file():
            assert C.BEGIN in readme.read_text(encoding="utf-8"), f"{readme}: has claims.md but does not quote it"


def _outside_blocks(text: str) -> str:
    text = study_claims.INCLUDE.sub("", text)
    while C.BEGIN in text:
        head, _, rest = text.partition(C.BEGIN)
        text = head + rest.partition(C.END)[2]
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.sub(r"`[^`]*`", "", text)  # code spans: commands, file names, config values


def _csv_values(study: Path) -> list[float]:
    values: list[float] = []
    for csv in study.rglob("*.csv"):
        if "runs" in csv.relative_to(study).parts[:-1]:
            continue  # run folders
        values += _values_of_csv(csv)
    return values


def _values_of_csv(csv: Path) -> list[float]:
    frame = pd.read_csv(csv)
    values: list[float] = []
    for col in frame.columns:
        values += pd.to_numeric(frame[col], errors="coerce").dropna().tolist()
    return values


def _source_values(path: Path) -> list[float]:
    """The numbers of a docs page's source: a CSV's values, else every number written in the text file."""
    if path.suffix == ".csv":
        return _values_of_csv(path)
    return [float(t.replace("_", "").replace(",", "")) for t in LITERAL.findall(path.read_text(encoding="utf-8"))]


def docs_numbers_missing(text: str, root: Path = ROOT) -> tuple[list[str], list[str]]:
    """(numbers the page quotes that none of its declared sources holds, declared sources that are no file).
    A page without a decimal number needs no source; one with numbers and no declaration misses them all."""
    # a page's text as the site shows it: a snippet line (--8<-- "CHANGELOG.md") is the file it includes
    text = SNIPPET.sub(lambda m: (root / m["path"]).read_text(encoding="utf-8"), text)
    markers = re.sub(r"`[^`]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))  # not a marker quoted as code
    sources = [root / p for m in DOC_SOURCES.finditer(markers) for p in m["paths"].split()]
    absent = sorted(str(p.relative_to(root)) for p in sources if not p.is_file())
    prose = _outside_blocks(re.sub(r"<!--.*?-->", "", text, flags=re.S))
    quoted = sorted({t for t in NUMBER.findall(prose) if not _is_year(t)})
    values = [v for p in sources if p.is_file() for v in _source_values(p)]
    return [t for t in quoted if not _matches(t, values)], absent


def _is_year(token: str) -> bool:
    """A citation's year (Qiao et al., ICML 2025), not a result."""
    return token.isdigit() and len(token) == 4 and 1900 <= int(token) <= 2099


def _matches(token: str, values: list[float]) -> bool:
    number = float(token.replace(",", ""))
    decimals = len(token.partition(".")[2]) if "." in token else 0
    half = 0.5 * 10 ** -decimals + 1e-9
    return any(abs(v - number) <= half or abs(round(v, decimals) - number) <= 1e-9 for v in values)


@pytest.mark.parametrize("readme", [r for r in READMES if NUMBERS_MARKER in r.read_text(encoding="utf-8")],
                         ids=lambda p: p.parent.name)
def test_numbers_in_the_prose_come_from_the_csvs(readme):
    values = _csv_values(readme.parent)
    text = _outside_blocks(readme.read_text(encoding="utf-8"))
    missing = sorted({t for t in NUMBER.findall(text) if not _is_year(t) and not _matches(t, values)})
    assert not missing, f"{readme}: numbers in no CSV of the study: {missing} (quote the CSV, or generate the table)"


def test_the_number_check_catches_a_typo(tmp_path):
    study = tmp_path / "s"
    study.mkdir()
    pd.DataFrame({"fd": [144.679, 267313]}).to_csv(study / "x.csv", index=False)
    values = _csv_values(study)
    assert _matches("144.7", values) and _matches("267,313", values)
    assert not _matches("144.8", values) and not _matches("1.5", values)
    text = _outside_blocks("FedAvg 144.7, `lr 1e-3 0.5`, small28 has 267,313 parameters, 1.5 M (ICML 2025).")
    assert sorted(set(NUMBER.findall(text))) == ["1.5", "144.7", "2025", "267,313"]
    assert _is_year("2025") and not _is_year("1500.5") and not _is_year("3000")


@pytest.mark.parametrize("study", [r.parent for r in READMES if (r.parent / "runs.csv").is_file()], ids=lambda p: p.name)
def test_every_trained_setting_of_a_committed_leaderboard_has_a_paired_verdict(study):
    """Every block of a study reported under the verdicts compares its settings with a reference seed by seed:
    no trained setting is left without a verdict (a block of FedAvg variants used to read all "reference")."""
    table = pd.read_csv(study / "leaderboard.csv")
    trained = table[table["baseline"].astype(str).str.lower() != "true"]
    for (dataset, partition), block in trained.groupby(["dataset", "partition"]):
        verdicts = block["verdict"].fillna("").astype(str)
        allowed = {"reference", "better", "worse", "equivalent", "inconclusive", "undecidable", "unpaired"}
        assert set(verdicts) <= allowed, f"{study.name} {dataset}/{partition}: settings without a verdict: {sorted(set(verdicts) - allowed)}"
        compared = verdicts[verdicts != "reference"]
        if len(block) == 1:  # the block's one trained setting (a study's factor level alone on its data): nothing to pair
            assert set(verdicts) == {"reference"}, f"{study.name} {dataset}/{partition}: one setting, verdict {set(verdicts)}"
            continue
        assert len(compared) >= (verdicts == "reference").sum(), (
            f"{study.name} {dataset}/{partition}: more reference settings than settings compared with one")


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: str(p.relative_to(ROOT / "docs")))
def test_every_number_on_a_docs_page_comes_from_its_sources(page):
    missing, absent = docs_numbers_missing(page.read_text(encoding="utf-8"))
    assert not absent, f"{page}: <!-- numbers: from ... --> names files that do not exist: {absent}"
    assert not missing, (f"{page}: numbers in none of the page's sources: {missing} (name the CSV or file they come "
                         "from in <!-- numbers: from FILE ... -->, or a test that computes them; or drop them)")


def test_the_docs_number_check_catches_a_typo_and_an_unsourced_number(tmp_path):
    (tmp_path / "r.csv").write_text("fd\n144.679\n", encoding="utf-8")
    (tmp_path / "t.py").write_text("assert bits == 4_445_833 and round(x, 3) == 0.905\n", encoding="utf-8")
    page = "<!-- numbers: from r.csv t.py -->\nFedAvg 144.7, 4,445,833 bits, accuracy 0.905, `keep 0.5`.\n"
    assert docs_numbers_missing(page, tmp_path) == ([], [])
    assert docs_numbers_missing(page.replace("144.7", "144.8"), tmp_path) == (["144.8"], [])
    assert docs_numbers_missing(page.replace(" t.py", ""), tmp_path) == (["0.905", "4,445,833"], [])
    assert docs_numbers_missing("A score of 12.5 (ICML 2025).\n", tmp_path) == (["12.5"], [])  # no sources named
    assert docs_numbers_missing("<!-- numbers: from gone.csv -->\n1.5\n", tmp_path) == (["1.5"], ["gone.csv"])
    assert docs_numbers_missing("No decimals here: 4 clients, 9 rounds, `0.5`.\n", tmp_path) == ([], [])
    (tmp_path / "CHANGES.md").write_text("Faster by 12.5 %.\n", encoding="utf-8")
    assert docs_numbers_missing('<!-- numbers: from r.csv -->\n--8<-- "CHANGES.md"\n', tmp_path) == (["12.5"], [])
    assert docs_numbers_missing("Quoted, not declared: `<!-- numbers: from r.csv -->` 144.7\n", tmp_path) == (["144.7"], [])


@pytest.mark.parametrize("study", [r.parent for r in READMES if (r.parent / "runs.csv").is_file()], ids=lambda p: p.name)
def test_a_study_that_ran_the_plateau_rule_keeps_its_outcome_in_runs_csv(study):
    """The claims decided again from runs.csv (scripts/claims.py, the README check above) say what the report said
    from the run folders: where a run used the plateau rule, its outcome (plateau_reached, plateau_gain, rounds_done)
    is in runs.csv, so a claim's budget column can say "not converged" without the run folders."""
    runs = pd.read_csv(study / "runs.csv")
    used = pd.to_numeric(runs.get("cfg.plateau", pd.Series(dtype=float)), errors="coerce").fillna(0).gt(0)
    if used.any():
        missing = [c for c in ("rounds_done", "plateau_reached", "plateau_gain") if c not in runs]
        assert not missing, f"{study.name}: runs.csv lacks {missing}; regenerate it with dfbench report"
        assert runs.loc[used, "plateau_reached"].notna().all()
    else:  # a study that never ran the rule keeps the runs.csv it had (build.PLATEAU_COLUMNS only where a run used it)
        assert not {"plateau_reached", "plateau_gain", "rounds_done"} & set(runs.columns), study.name
