"""One-off migration: write report.json for a report folder written before report.json existed.

`dfbench report --from-csv DIR` re-renders a report from DIR/leaderboard.csv and DIR/report.json
(what the CSV cannot hold: hardware, failures, how each metric was computed, notes). Reports
written before that file existed have the same facts in their leaderboard.md, which the same
reporter wrote from the same runs: this script reads them from there. Nothing is recomputed.

    python scripts/report_meta_from_markdown.py results/demo [--runs-dir runs] [--target fd_fmnist=300]
    dfbench report --out results/demo --from-csv
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from dfbench.benchmark.report.frames import parse_target
from dfbench.benchmark.report.layout import META_FILE, PageMeta


def _cells(line: str) -> list[str]:
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def meta_from_markdown(md: str) -> PageMeta:
    meta = PageMeta()
    head = re.search(r"^(\d+) finished run\(s\) in \d+ setting\(s\); (\d+) run\(s\) failed", md, re.M)
    if head is None:
        raise ValueError("not a dfbench leaderboard.md (no 'N finished run(s) in M setting(s)' line)")
    meta.n_runs, meta.n_failed = int(head.group(1)), int(head.group(2))
    hardware = re.search(r"^Hardware: (.*)\.$", md, re.M)
    if hardware:
        meta.hardware = hardware.group(1).split("; ")
    sections = re.split(r"^## ", md, flags=re.M)[1:]
    for sec in sections:
        title, _, body = sec.partition("\n")
        title = title.strip()
        lines = body.splitlines()
        if title == "Failed and diverged runs":
            rows = [_cells(ln) for ln in lines if ln.startswith("|")][2:]
            meta.failures = rows
        elif title == "Skipped":
            meta.notes = [ln[2:] for ln in lines if ln.startswith("- ")]
        elif title == "Read warnings":
            meta.warnings = [ln[2:] for ln in lines if ln.startswith("- ")]
        elif " / " in title:
            prov = {}
            for ln in lines:
                m = re.match(r"^- ([A-Za-z0-9_]+): (.*)$", ln)
                if m and not ln.startswith("- not computed:"):
                    prov[m.group(1)] = m.group(2)
            meta.provenance[title] = prov
    return meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path, help="a report folder with leaderboard.md and leaderboard.csv")
    ap.add_argument("--runs-dir", default="runs", help="the run folders, relative to the report folder (links)")
    ap.add_argument("--target", help="the report's --target METRIC=VALUE, if it had one")
    a = ap.parse_args()
    meta = meta_from_markdown((a.report / "leaderboard.md").read_text(encoding="utf-8"))
    meta.runs_dir = a.runs_dir
    if a.target:
        meta.target = list(parse_target(a.target))
    if (a.report / META_FILE).exists():
        raise SystemExit(f"{a.report / META_FILE} exists already: nothing to migrate")
    print(meta.write(a.report))


if __name__ == "__main__":
    main()
