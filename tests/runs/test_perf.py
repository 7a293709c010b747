"""`dfbench perf` at a tiny size: it runs and writes its table (no timing assertions)."""

from __future__ import annotations

import pytest

from dfbench.benchmark.cli import main

pytestmark = pytest.mark.slow  # the whole `dfbench perf` table


def test_perf_runs_and_writes_the_table(tmp_path, capsys):
    out = tmp_path / "sub" / "perf.md"
    # execute
    rc = main(["perf", "--preset", "tiny", "--clients", "2", "--steps", "1", "--rounds", "1", "--batch-size", "4",
               "--methods", "fedavg,random_prune,no_such_method", "--fid-images", "2", "--batched-clients", "2",
               "--repeats", "1", "--variants", "--out", str(out)])
    # assert: every section, the machine it ran on, and the rows asked for
    assert rc == 0
    text = out.read_text()
    assert capsys.readouterr().out == text + f"written to {out}\n"
    for needle in ("# dfbench perf", "- machine:", "torch ", "- date:", "## (a, b) Simulation overhead",
                   "| plain loop |", "| fedavg |", "| random_prune |", "| no_such_method | not registered |",
                   "## (c) FID feature extraction", "| dfbench Extractor.features |", "| pytorch-fid InceptionV3 forward |",
                   "## (d) Batched vs sequential clients", "## (e) Training-step variants", "| bf16 autocast |"):
        assert needle in text, needle
    # both extraction paths compute the same features (same weights, same images)
    assert "weights:" in text
    diff = text.split("max |feature difference| between the two paths: ")[1].split()[0]
    assert float(diff) < 1e-3
