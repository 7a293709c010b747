"""The sub-model speed benchmark (results/perf/submodel_speed.py, `make bench-submodel-speed`): its numbers from given
timings (hand-computed), the page, its files, its refusals, and one --quick run (no timing is asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import load_script

sp = load_script("results/perf/submodel_speed.py")

REF = "fedavg"
ROWS = [
    # 20 steps x batch 16 = 320 images a call
    sp.Row(REF, 1.0, 320, seconds=[2.0, 1.6, 1.8], flop_fractions=[1.0, 1.0, 1.0]),
    sp.Row("heterofl", 0.5, 320, seconds=[1.0, 0.8, 1.2], flop_fractions=[0.25, 0.25, 0.25]),
    sp.Row("fjord", 0.5, 320, seconds=[1.5, 0.9, 1.1], flop_fractions=[0.1, 0.2, 0.3]),
    sp.Row("random_prune", 0.5, 320, seconds=[1.9, 1.8, 1.7], flop_fractions=[0.5, 0.5, 0.5]),
]


def test_summary_is_median_and_best_images_per_s_and_the_speedup_over_the_full_reference():
    s = {(r["method"], r["capacity"]): r for r in sp.summarize(ROWS, REF)}
    # by hand: medians 1.8, 1.0, 1.1, 1.8 s; bests 1.6, 0.8, 0.9, 1.7 s
    assert s[(REF, 1.0)]["images_per_s"] == pytest.approx(320 / 1.8) and s[(REF, 1.0)]["speedup"] == pytest.approx(1.0)
    assert s[(REF, 1.0)]["best_images_per_s"] == pytest.approx(320 / 1.6)
    assert s[("heterofl", 0.5)]["images_per_s"] == pytest.approx(320.0) and s[("heterofl", 0.5)]["speedup"] == pytest.approx(1.8)
    assert s[("heterofl", 0.5)]["best_images_per_s"] == pytest.approx(400.0)
    assert s[("fjord", 0.5)]["speedup"] == pytest.approx(1.8 / 1.1) and s[("fjord", 0.5)]["flop_fraction"] == pytest.approx(0.2)
    assert s[("random_prune", 0.5)]["speedup"] == pytest.approx(1.0) and s[("random_prune", 0.5)]["flop_fraction"] == 0.5
    assert [r["rounds"] for r in s.values()] == [3, 3, 3, 3]


def test_without_a_full_reference_row_there_is_nothing_to_compare_with():
    with pytest.raises(ValueError, match="no timed row of the reference 'fedavg' at capacity 1.0"):
        sp.summarize([r for r in ROWS if r.method != REF], REF)


def _report() -> dict:
    m = {"cpu": {"model": "Test CPU", "cores": 2, "flags": ["avx2", "fma"], "torch_capability": "AVX2"},
         "torch": "2.x", "python": "3.11", "threads": 1, "date": "2025-01-01 00:00 UTC"}
    o = {"preset": "small28", "batch_size": 16, "steps": 20, "repeats": 3}
    return {"machine": m, "options": o, "reference": REF, "parameters": 267_313, "rows": [],
            "summary": sp.summarize(ROWS, REF)}


def test_page_names_the_machine_the_work_and_every_row():
    page = sp.render(_report())
    assert "Test CPU, 2 cores (avx2 fma; torch CPU capability AVX2); torch 2.x with 1 thread(s)" in page
    assert "20 steps at batch 16 on small28 (267,313 parameters)" in page
    assert "| heterofl | 0.5 | 320.0 | 400.0 | 1.80x | 0.250 |" in page
    assert "| fedavg | 1 | 177.8 | 200.0 | 1.00x | 1.000 |" in page
    assert "speed-up over full fedavg" in page


def test_write_puts_the_page_and_the_report_side_by_side(tmp_path):
    md, js = sp.write(_report(), tmp_path / "perf")
    assert md.read_text() == sp.render(_report())
    assert json.loads(js.read_text())["summary"][1]["speedup"] == pytest.approx(1.8)


@pytest.mark.parametrize("change,words", [
    ({"steps": 0}, "at least 1"), ({"capacities": (1.0, 1.5)}, "distinct numbers in (0, 1]"),
    ({"capacities": ()}, "distinct numbers in (0, 1]"), ({"methods": ("heterofl", "no_such_method")}, "no_such_method"),
])
def test_bad_options_are_refused_in_one_line(change, words):
    with pytest.raises(ValueError) as err:
        sp.SpeedOptions(**change).check()
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow  # trains 25 clients of the tiny preset (about 5-11 s)
def test_quick_run_prints_every_method_row_and_writes_only_where_told(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # a default --out would land here
    threads = torch.get_num_threads()
    assert sp.main(["--quick"]) == 0
    page = capsys.readouterr().out
    assert torch.get_num_threads() == threads  # restored after timing with one thread
    assert list(tmp_path.iterdir()) == []  # --quick writes nothing unless told
    assert f"| {REF} | 1 |" in page
    for method in sp.DEFAULT_METHODS:
        for capacity in ("1", "0.75", "0.5", "0.25"):
            assert f"| {method} | {capacity} |" in page, (method, capacity)
    assert sp.main(["--quick", "--methods", "heterofl", "--capacities", "1.0,0.5", "--out", str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["submodel_speed.json", "submodel_speed.md"]
    report = json.loads((tmp_path / "out" / "submodel_speed.json").read_text())
    assert [(r["method"], r["capacity"]) for r in report["rows"]] == [(REF, 1.0), ("heterofl", 1.0), ("heterofl", 0.5)]
    half = report["summary"][2]
    assert 0 < half["flop_fraction"] < 0.5 and half["images_per_s"] > 0  # a narrower network: fewer FLOPs (speed not asserted)
    assert report["machine"]["threads"] == 1 and report["options"]["preset"] == "tiny"


def test_an_unknown_method_is_an_error_naming_it(capsys):
    assert sp.main(["--quick", "--methods", "nope"]) == 2
    assert "unknown method(s) nope" in capsys.readouterr().err
