"""The one command line of the study reports that compare every setting with a reference
(paired, frontier, privacy): --runs, --out, --reference, --metric, then `write` and the paths."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path


def study_main(argv: Sequence[str] | None, module: str, doc: str, writes: str, reference_help: str,
               write: Callable[[str, str, str, str | None], list[Path]], runs_help: str = "root of the run folders") -> int:
    """Parse the shared flags, call `write(runs, out, reference, metric)`, print each path it wrote;
    a ValueError (no runs, no reference) exits with its message."""
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n\n")[0])
    p.add_argument("--runs", required=True, help=runs_help)
    p.add_argument("--out", required=True, help=f"folder for {writes}")
    p.add_argument("--reference", default="fedavg", help=reference_help)
    p.add_argument("--metric", default=None, help="default: the report's primary metric")
    a = p.parse_args(argv)
    try:
        for path in write(a.runs, a.out, a.reference, a.metric):
            print(path)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    return 0
