"""Every committed rounds.jsonl row (the first of each file) holds only declared fields (benchmark/core/rounds.py,
and the privacy mechanism's), the round's own in the declared order: the row's declaration describes the files."""

from __future__ import annotations

import json
from pathlib import Path

from dfbench.benchmark.core import rounds as R
from dfbench.benchmark.engine import privacy

ROOT = Path(__file__).resolve().parents[2]


def test_committed_rounds_hold_only_declared_fields_in_order():
    files = sorted((ROOT / "results").glob("**/rounds.jsonl"))
    if not files:
        import pytest

        pytest.skip("no committed run folders in this checkout")
    for path in files:
        with path.open(encoding="utf-8") as fh:
            line = fh.readline()
        if not line.strip():
            continue
        row = json.loads(line)
        unknown = [k for k in row if k not in R.FIELDS and k not in R.ADDED and k not in privacy.ROUND_FIELDS]
        assert not unknown, f"{path.relative_to(ROOT)}: undeclared fields {unknown}"
        own = [k for k in row if k in R.FIELDS]
        assert own == [k for k in R.FIELDS if k in row], f"{path.relative_to(ROOT)}: fields out of the declared order"
