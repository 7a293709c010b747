"""The side-by-side benchmark against Flower (benchmark/flower_bench.py): its numbers from given timings
(hand-computed), the machine line, the page, and, where flwr is installed, one --quick run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dfbench.benchmark import flower_bench as fb

ROOT = Path(__file__).resolve().parents[2]


def _run(steps: int, variant: str, whole: float, rounds: list[float], **extra: float) -> dict:
    return {"steps": steps, "variant": variant, "repeat": 0, "whole_s": whole, "round_s": rounds, **extra}


F1, F2 = fb.flower_variant(1), fb.flower_variant(2)
RUNS = [
    # 2 local steps, three repeats each; round_s sums to whole minus set-up, rounds 2..R are the tail
    _run(2, fb.OURS, 12.0, [6.0, 2.0, 2.0]), _run(2, fb.OURS, 10.0, [5.0, 2.0, 1.0]), _run(2, fb.OURS, 11.0, [5.0, 3.0, 1.0]),
    _run(2, fb.OURS_FP32, 20.0, [9.0, 4.0, 4.0]), _run(2, fb.OURS_FP32, 22.0, [9.0, 5.0, 5.0]),
    _run(2, fb.OURS_FP32, 21.0, [9.0, 5.0, 4.0]),
    _run(2, F1, 30.0, [20.0, 4.0, 4.0], startup_s=9.0, client_setup_s=0.5),
    _run(2, F1, 33.0, [20.0, 6.0, 6.0], startup_s=11.0, client_setup_s=0.7),
    _run(2, F1, 31.0, [20.0, 5.0, 5.0], startup_s=10.0, client_setup_s=0.6),
    _run(2, F2, 25.0, [15.0, 3.0, 3.0], startup_s=8.0, client_setup_s=0.4),
    _run(2, F2, 29.0, [15.0, 4.0, 4.0], startup_s=7.0, client_setup_s=0.3),
    _run(2, F2, 27.0, [15.0, 3.5, 3.5], startup_s=9.0, client_setup_s=0.2),
    # 10 local steps, one repeat, Flower at num_cpus=1 only
    _run(10, fb.OURS, 40.0, [20.0, 20.0]), _run(10, fb.OURS_FP32, 50.0, [25.0, 25.0]),
    _run(10, F1, 60.0, [35.0, 25.0], startup_s=10.0, client_setup_s=1.0),
]


def test_summarize_whole_run_min_median_and_ratios():
    # prepare / execute
    rows = fb.summarize(RUNS, (1, 2), "whole")
    # assert: by hand, medians of (12, 10, 11) = 11, (20, 22, 21) = 21, (30, 33, 31) = 31, (25, 29, 27) = 27
    two, ten = rows
    assert two["steps"] == 2 and ten["steps"] == 10
    assert two[fb.OURS] == (10.0, 11.0)
    assert two[fb.OURS_FP32] == (20.0, 21.0)
    assert two[F1] == (30.0, 31.0) and two[F2] == (25.0, 27.0)
    assert two["flower_best"] == 27.0 and two["flower_best_num_cpus"] == 2  # the better median, not the better min
    assert two["ratio"] == pytest.approx(27 / 11)
    assert two["ratio_float32"] == pytest.approx(27 / 21)
    assert ten[F2] is None and ten["flower_best_num_cpus"] == 1
    assert ten["ratio"] == pytest.approx(60 / 40) and ten["ratio_float32"] == pytest.approx(60 / 50)


def test_summarize_rounds_after_the_first():
    rows = fb.summarize(RUNS, (1, 2), "rounds")
    two, ten = rows
    # rounds 2..R: ours 4, 3, 4 -> (3, 4); Flower num_cpus=1 8, 12, 10 -> (8, 10); num_cpus=2 6, 8, 7 -> (6, 7)
    assert two[fb.OURS] == (3.0, 4.0)
    assert two[F1] == (8.0, 10.0) and two[F2] == (6.0, 7.0)
    assert two["ratio"] == pytest.approx(7 / 4)
    assert two["ratio_float32"] == pytest.approx(7 / 9)  # ours float32: 8, 10, 9 -> median 9
    assert ten[fb.OURS] == (20.0, 20.0) and ten["ratio"] == pytest.approx(25 / 20)


def test_one_round_has_no_rounds_span():
    runs = [_run(1, fb.OURS, 3.0, [2.0]), _run(1, fb.OURS_FP32, 3.0, [2.0]), _run(1, F1, 9.0, [4.0])]
    assert fb.span_seconds(runs[0], "rounds") is None
    (row,) = fb.summarize(runs, (1,), "rounds")
    assert row[fb.OURS] is None and row["ratio"] is None and row["ratio_float32"] is None
    (whole,) = fb.summarize(runs, (1,), "whole")
    assert whole["ratio"] == pytest.approx(3.0)


def test_startup_rows_are_medians_per_num_cpus():
    rows = fb.startup_rows(RUNS, (1, 2))
    # num_cpus=1: startups 9, 11, 10, 10 -> median 10; set-up 0.5, 0.7, 0.6, 1.0 -> 0.65
    assert rows[0] == {"num_cpus": 1, "startup_s": 10.0, "client_setup_s": pytest.approx(0.65)}
    assert rows[1] == {"num_cpus": 2, "startup_s": 8.0, "client_setup_s": pytest.approx(0.3)}


MACHINE = {"cpu": {"model": "AMD EPYC 9B14", "cores": 2, "flags": ["avx2", "fma", "avx512f", "avx512_bf16"],
                   "torch_capability": "AVX512"},
           "torch": "2.14.1", "flwr": "1.42.0", "ray": "2.55.1", "python": "3.11.7", "date": "2026-12-06 05:00 UTC"}


def test_machine_line_names_the_cpu_its_flags_and_versions():
    assert fb.machine_line(MACHINE) == (
        "AMD EPYC 9B14, 2 cores (avx2 fma avx512f avx512_bf16; torch CPU capability AVX512); "
        "torch 2.14.1, flwr 1.42.0 (Ray 2.55.1), Python 3.11.7")
    bare = {**MACHINE, "cpu": {**MACHINE["cpu"], "flags": []}, "flwr": "not installed"}
    assert "(no vector flags read;" in fb.machine_line(bare) and "flwr not installed" in fb.machine_line(bare)


def test_machine_reads_this_cpu_and_the_versions():
    m = fb.machine()
    assert m["cpu"]["cores"] == os.cpu_count() and isinstance(m["cpu"]["flags"], list)
    assert m["torch"] and m["date"].endswith("UTC") and m["flwr"]  # a version or "not installed"


def _report(runs=RUNS, cpus=(1, 2)) -> dict:
    return {"machine": MACHINE, "options": {"num_cpus": list(cpus), "repeats": 3},
            "work": {"clients": 10, "rounds": 3, "preset": "small28", "batch_size": 32, "data": "synthetic",
                     "synthetic_images": 60000},
            "threads": 2, "parameters": 1234, "ours_amp": "bf16", "ours_amp_used": "bf16",
            "tables": {span: fb.summarize(runs, cpus, span) for span in fb.SPANS},
            "startup": fb.startup_rows(runs, cpus), "same_work": [{"steps": 2, "num_cpus": 1, "rel_diff": 3e-7}]}


def test_page_has_the_machine_both_spans_and_the_ratios():
    page = fb.render(_report())
    assert fb.machine_line(MACHINE) in page
    assert "synthetic uint8 images" in page and "train.amp, resolved to bf16 (runs as bf16)" in page
    head = ("| local steps | ours (default) min / median s | ours float32 min / median s | Flower num_cpus=1 min / median s "
            "| Flower num_cpus=2 min / median s | Flower best / ours (default) | Flower best / ours (float32) |")
    assert page.count(head) == 2  # whole run and rounds 2..R
    assert "| 2 | 10.00 / 11.00 | 20.00 / 21.00 | 30.00 / 31.00 | 25.00 / 27.00 | 2.45 | 1.29 |" in page
    assert "| 10 | 40.00 / 40.00 | 50.00 / 50.00 | 60.00 / 60.00 | - | 1.50 | 1.20 |" in page
    assert "| 1 | 10.00 | 0.65 |" in page  # start-up
    assert "2 local steps, num_cpus=1: 3.0e-07" in page


def test_write_puts_the_page_and_the_report_side_by_side(tmp_path):
    md, js = fb.write(_report(), tmp_path / "perf")
    assert md.read_text() == fb.render(_report())
    assert json.loads(js.read_text())["tables"]["whole"][0]["flower_best_num_cpus"] == 2


def test_bad_sizes_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="exceeds the 2 CPUs given to Ray: pass --num-cpus of at most 2"):
        fb.run_bench(fb.BenchOptions(num_cpus=(1, 4), threads=2))
    with pytest.raises(ValueError, match=">= 1"):
        fb.run_bench(fb.BenchOptions(steps=(0,)))


def test_without_flwr_main_names_the_extra(monkeypatch, capsys):
    for name in ("FLWR_TELEMETRY_ENABLED", "RAY_USAGE_STATS_ENABLED", "FLWR_LOG_LEVEL"):
        monkeypatch.setenv(name, "0" if name != "FLWR_LOG_LEVEL" else "WARNING")  # main sets them: undone after
    monkeypatch.setitem(sys.modules, "flwr", None)  # import flwr raises ImportError
    assert fb.main(["--quick"]) == 2
    assert "pip install -e '.[flower]'" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_run_times_both_sides_and_they_train_the_same_model(tmp_path):
    pytest.importorskip("flwr")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    proc = subprocess.run([sys.executable, "-m", "dfbench.benchmark.flower_bench", "--quick", "--threads", "1",
                           "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "flower.json").read_text())
    runs = report["runs"]
    assert [r["variant"] for r in runs] == [fb.OURS, fb.OURS_FP32, fb.flower_variant(1)]
    assert all(r["steps"] == 1 and len(r["round_s"]) == 1 and r["whole_s"] > 0 for r in runs)
    flower = runs[2]
    assert 0 < flower["startup_s"] < flower["whole_s"] and flower["client_setup_s"] > 0
    (row,) = report["tables"]["whole"]
    assert row["ratio"] == pytest.approx(flower["whole_s"] / runs[0]["whole_s"])
    # the same work: 2 clients x 1 step from the same seeded model, partition and generators, one thread each
    (same,) = report["same_work"]
    assert same["rel_diff"] < 1e-5
    page = (tmp_path / "flower.md").read_text()
    assert page in proc.stdout and fb.machine_line(report["machine"]) in page
