"""Reporter tests on hand-built run folders (no training)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from scipy import stats  # noqa: E402
from PIL import Image  # noqa: E402

from dfbench.benchmark.report.build import (  # noqa: E402
    build_report,
    collect,
    format_params,
    normalize_config,
    parse_alpha,
    read_run,
)
from helpers import fd, make_run  # noqa: E402

pytestmark = pytest.mark.slow  # whole reports (plots, mosaics, HTML)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, Path]]:
    """One report over: fedavg x2 seeds, random_prune x1, failed, diverged, baseline, corrupted, running."""
    runs = tmp_path_factory.mktemp("runs")
    out = tmp_path_factory.mktemp("out")
    make_run(runs, "s0-fa", seed=0, evaluations=[fd(10.0)])
    make_run(runs, "s1-fa", seed=1, evaluations=[fd(14.0)])
    make_run(runs, "s0-rp", method="random_prune", params={"keep_ratio": 0.5, "scope": "layer"},
             evaluations=[fd(11.0), {"metric": "kid", "value": 0.02, "std_err": 0.003}],
             uplink_bits=20_000_000, grid_color=(30, 30, 200), extra_metrics={"gamma_star": 2, "w2_mean": 0.25})
    make_run(runs, "s0-tk", method="topk_prune", params={"keep_ratio": 0.25, "scope": "layer"},
             evaluations=[fd(13.0)], uplink_bits=20_000_000, extra_metrics={"gamma_star": 1, "w2_mean": 0.5})
    make_run(runs, "s0-base", rounds=0, evaluations=[fd(300.0)], uplink_bits=0)
    make_run(runs, "s0-fail", method="quantized", params={"bits": 4}, state="failed", error="CUDA out of memory")
    make_run(runs, "s0-div", method="fedprox", params={"mu": 0.1}, state="diverged", error="loss is NaN at round 2")
    make_run(runs, "s0-run", method="fedavg", params={"x": 1}, state="running")
    bad = make_run(runs, "s0-bad", method="topk_prune", params={"keep_ratio": 0.25}, evaluations=[fd(9.0)])
    (bad / "metrics.json").write_text('{"evaluations": [ {"metric": "fd_fmnist", ')
    written = build_report(runs, out)
    return runs, out, written


def test_outputs_exist(report: tuple[Path, Path, dict[str, Path]]) -> None:
    _, out, written = report
    for key in ("leaderboard_md", "leaderboard_csv", "leaderboard_html"):
        assert written[key].is_file() and written[key].stat().st_size > 0
        assert written[key].parent == out


def test_mean_std_n_and_rank(report: tuple[Path, Path, dict[str, Path]]) -> None:
    _, out, _ = report
    csv = pd.read_csv(out / "leaderboard.csv")
    fedavg = csv[(csv["method"] == "fedavg") & ~csv["baseline"]].iloc[0]
    # prepare: seeds 10 and 14 -> mean 12, sample std sqrt(((10-12)^2 + (14-12)^2) / 1) = sqrt(8)
    assert fedavg["fd_fmnist_mean"] == pytest.approx(12.0)
    assert fedavg["fd_fmnist_std"] == pytest.approx(math.sqrt(8.0))
    assert fedavg["n"] == 2 and fedavg["fd_fmnist_n"] == 2
    assert fedavg["uplink_mb_mean"] == pytest.approx(10.0)  # 80e6 bits / 8 / 1e6
    rp = csv[csv["method"] == "random_prune"].iloc[0]
    assert rp["n"] == 1 and math.isnan(rp["fd_fmnist_std"])
    assert rp["kid_stderr"] == pytest.approx(0.003)  # n=1: the estimator's own standard error
    assert rp["compression_ratio"] == pytest.approx(4.0)
    assert rp["param.keep_ratio"] == pytest.approx(0.5) and rp["param.scope"] == "layer"
    assert rp["params"] == "keep_ratio=0.5, scope=layer"
    # rank: the order of the scores on the one seed every setting ran (seed 0): fedavg 10, random_prune 11,
    # topk_prune 13 -- not fedavg's mean over its own two seeds (sqrt(140) = 11.83), which would put it between
    # them; one untrained seed without recorded intervals shows none of them better than the untrained model,
    # so all three are flagged alike and the order stands
    ranks = dict(zip(csv["method"] + csv["baseline"].map({True: "-base", False: ""}), csv["rank"]))
    assert (ranks["fedavg"], ranks["random_prune"], ranks["topk_prune"]) == (1, 2, 3)
    assert fedavg["rank_seeds"] == 1
    assert fedavg["fd_fmnist_gmean"] == pytest.approx(math.sqrt(140.0))
    # the interval of the geometric mean: mean log +- t(0.975, 1) x sd(log) / sqrt(2), mapped back
    logs = [math.log(10.0), math.log(14.0)]
    half = stats.t.ppf(0.975, 1) * abs(logs[1] - logs[0]) / math.sqrt(2) / math.sqrt(2)
    assert fedavg["fd_fmnist_ci_low"] == pytest.approx(math.exp(sum(logs) / 2 - half))
    assert fedavg["fd_fmnist_ci_low"] > 0
    assert fedavg["verdict"] == "reference" and rp["verdict"] == "inconclusive" and rp["paired_seeds"] == 1
    assert rp["estimate"] == pytest.approx(11.0 / 10.0)  # paired on the one seed they share (seed 0)
    assert math.isnan(ranks["fedavg-base"])
    assert list(csv["method"])[:3] == ["fedavg", "random_prune", "topk_prune"]


def test_markdown_content(report: tuple[Path, Path, dict[str, Path]]) -> None:
    _, _, written = report
    md = written["leaderboard_md"].read_text()
    assert "## fmnist / iid" in md
    assert "11.83 [" in md  # fedavg's geometric mean [interval]
    assert "4.0× less" in md  # random_prune's uplink vs fedavg's
    assert "untrained (fedavg)" in md
    assert "0.02 ± 0.003 (s.e.)" in md
    failures = md.split("## Failed and diverged runs", 1)[1].split("## Plots", 1)[0]
    for run_id, reason in [("s0-fail", "CUDA out of memory"), ("s0-div", "loss is NaN at round 2"),
                           ("s0-run", "reached round 0 of 3"), ("s0-bad", "metrics.json")]:
        line = next(ln for ln in failures.splitlines() if f"| {run_id} |" in ln)
        assert reason in line
    assert "| diverged |" in failures and "| failed |" in failures and "| unreadable |" in failures


def _block(md: str, title: str) -> str:
    return md.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def _table_rows(text: str, header_start: str) -> list[list[str]]:
    """The rows of the first markdown table whose header line starts with `header_start`."""
    lines = text.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith(header_start))
    rows = []
    for ln in lines[i:]:
        if not ln.startswith("|"):
            break
        rows.append([c.strip() for c in ln.strip().strip("|").split("|")])
    return [rows[0]] + rows[2:]


def test_main_table_reads_at_a_glance(report: tuple[Path, Path, dict[str, Path]]) -> None:
    """The main table holds the ranking metric only; the others are in their own tables; a
    hyperparameter is named where it tells rows apart (a method's headline one even at its default);
    provenance is stated once per block."""
    _, _, written = report
    block = _block(written["leaderboard_md"].read_text(), "fmnist / iid")
    main = _table_rows(block, "| rank | method |")
    header = main[0]
    assert header[:3] == ["rank", "method", "hyperparameters"] and "fd_fmnist ↓" in header
    assert not any(h.startswith("kid") for h in header)  # a secondary metric, not in the main table
    assert {"seeds", "uplink vs fedavg", "wall time"} <= set(header) and len(header) <= 10
    cost = _table_rows(block.split("### Communication and time", 1)[1], "| rank | setting |")[0]
    assert ("uplink MB" in header) != ("uplink MB" in cost)  # in the main table where it has room, else in the costs
    rows = {r[1]: dict(zip(header, r)) for r in main[1:]}
    # random_prune's keep_ratio=0.5 is its default but its headline (Method.headline_params): shown;
    # scope is not one of its hyperparameters: shown
    assert rows["random_prune"]["hyperparameters"] == "keep_ratio=0.5, scope=layer"
    assert rows["fedavg"]["fd_fmnist ↓"].startswith("11.83 [")
    secondary = _table_rows(block, "| rank | setting |")
    assert "kid ↓" in secondary[0] and any(r[1] == "random_prune (keep_ratio=0.5, scope=layer)" for r in secondary[1:])
    # the first sentence says who ranks first and with what
    # (fedavg: 10 on seed 0, which every setting ran; its own two seeds' mean is 11.83, above random_prune's 11)
    assert block.strip().splitlines()[0].startswith("**fedavg** ranks first on the 1 seed every setting ran "
                                                    "(fd_fmnist 11.83 [")
    assert block.count("extractor=fmnist_cnn") == 1  # fd_fmnist's provenance, once for the block


def test_rerender_from_csv_matches_the_report(report: tuple[Path, Path, dict[str, Path]], tmp_path: Path) -> None:
    """A report re-rendered from its leaderboard.csv and report.json alone (no run folders) is the same page."""
    import shutil

    from dfbench.benchmark.report.build import rerender

    _, out, written = report
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    again = rerender(copy)
    assert again["leaderboard_md"].read_text() == written["leaderboard_md"].read_text()
    assert again["leaderboard_html"].read_text() == written["leaderboard_html"].read_text()
    assert (copy / "skipped.txt").read_text() == written["skipped"].read_text()
    (copy / "leaderboard.csv").unlink()
    with pytest.raises(FileNotFoundError, match="leaderboard.csv"):
        rerender(copy)


def test_html_self_contained(report: tuple[Path, Path, dict[str, Path]]) -> None:
    _, _, written = report
    page = written["leaderboard_html"].read_text()
    assert "<style>" in page and "stylesheet" not in page
    assert page.count("data:image/png;base64,") >= 2  # mosaic + plots
    assert "CUDA out of memory" in page
    assert 'src="plots/' not in page  # no external image references


def test_plots_written_or_skipped(report: tuple[Path, Path, dict[str, Path]]) -> None:
    _, out, written = report
    for name in ("metric_vs_keep_ratio", "metric_vs_uplink", "loss_per_round", "metric_vs_gamma_star", "metric_vs_w2"):
        path = written[f"plot_{name}"]
        assert path.parent == out / "plots" and path.is_file()
        with Image.open(path) as img:
            assert img.width > 100 and img.height > 100
    # all runs are iid: the alpha plot has no data, so it is skipped with a note, not drawn empty
    assert "plot_metric_vs_alpha" not in written
    assert not (out / "plots" / "metric_vs_alpha.png").exists()
    assert "metric_vs_alpha" in written["skipped"].read_text()
    assert "metric_vs_alpha" in written["leaderboard_md"].read_text().split("## Skipped", 1)[1]


def test_a_plot_without_a_relation_is_skipped_and_its_old_file_removed(tmp_path: Path) -> None:
    """One keep ratio, one Gamma*: nothing to plot against; a PNG an earlier report drew there goes."""
    runs = tmp_path / "runs"
    make_run(runs, "s0-rp", method="random_prune", params={"keep_ratio": 0.5}, evaluations=[fd(11.0)],
             extra_metrics={"gamma_star": 2, "w2_mean": 0.25})
    make_run(runs, "s0-fa", evaluations=[fd(10.0)], extra_metrics={"gamma_star": 2})
    stale = tmp_path / "out" / "plots" / "metric_vs_keep_ratio.png"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"an old plot")
    written = build_report(runs, tmp_path / "out")
    notes = written["skipped"].read_text()
    assert "metric_vs_keep_ratio: only one keep ratio (0.5)" in notes and not stale.exists()
    assert "metric_vs_gamma_star: gamma_star is 2 for every scored setting" in notes


def test_mosaic(report: tuple[Path, Path, dict[str, Path]]) -> None:
    _, out, written = report
    mosaic = written["mosaic_fmnist_iid"]
    assert mosaic == out / "mosaic_fmnist_iid.png"
    with Image.open(mosaic) as img:
        rgb = img.convert("RGB")
        colors = {c for _, c in rgb.getcolors(maxcolors=1 << 20)}
    # both seeds' grids exist for fedavg, but only the first seed's is shown: red (fedavg) and blue (random_prune)
    assert (200, 30, 30) in colors and (30, 30, 200) in colors
    # 4 settings with grids -> 4 tiles side by side of >=192 px
    assert rgb.width >= 4 * 192


def test_alpha_plot_and_mosaic_name(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for alpha, value in [("0.1", 30.0), ("1.0", 20.0)]:
        make_run(runs, f"s0-{alpha}", partition=f"dirichlet:{alpha}", evaluations=[fd(value)])
    written = build_report(runs, tmp_path / "out")
    assert written["plot_metric_vs_alpha"].is_file()
    assert written["mosaic_fmnist_dirichlet-0.1"].name == "mosaic_fmnist_dirichlet-0.1.png"
    # no pruning runs here: that plot is skipped
    assert "plot_metric_vs_keep_ratio" not in written


def test_corrupted_config_is_a_failure(tmp_path: Path) -> None:
    d = make_run(tmp_path, "s0-x", evaluations=[fd(1.0)])
    (d / "config.json").write_text("not json")
    result = read_run(d)
    assert result.state == "unreadable" and "config.json" in result.reason
    data = collect(tmp_path)
    assert data.table.empty and len(data.failures) == 1


def test_nested_config_is_read(tmp_path: Path) -> None:
    nested = {"run_id": "s3-abc", "method": "fedavg", "method_params": {}, "seed": 3, "device": "cuda",
              "data": {"dataset": "svhn", "partition": "iid", "clients": 10, "root": "/data"},
              "train": {"rounds": 5, "lr": 0.001}, "eval": {"samples": 100, "root": "x"}}
    flat = normalize_config(nested)
    assert flat["dataset"] == "svhn" and flat["rounds"] == 5 and flat["seed"] == 3
    assert flat["data.root"] == "/data" and flat["eval.root"] == "x"  # a shared leaf name keeps its section


def test_helpers() -> None:
    assert format_params({"scope": "layer", "keep_ratio": 0.5}) == "keep_ratio=0.5, scope=layer"
    assert format_params({}) == ""
    assert parse_alpha("dirichlet:0.5") == 0.5
    assert math.isnan(parse_alpha("iid"))
    assert parse_alpha("flwr:dirichlet?alpha=0.3") == 0.3  # Flower Datasets' name, any parameter order
    assert parse_alpha("flwr:dirichlet?min_partition_size=5&alpha=2") == 2.0
    assert math.isnan(parse_alpha("flwr:iid"))


def test_only_failures_still_reports(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    make_run(runs, "s0-fail", state="failed", error="boom")
    written = build_report(runs, tmp_path / "out")
    md = written["leaderboard_md"].read_text()
    assert "| s0-fail |" in md and "boom" in md
    assert not any(k.startswith(("plot_", "mosaic_")) for k in written)
    # every plot is skipped, each with a reason (the six of the runs and the quality curves)
    skipped = written["skipped"].read_text().strip().splitlines()
    assert len(skipped) == 7 and any("quality_curves" in line and "eval.every" in line for line in skipped)


def test_real_run_folders_are_ranked_and_say_their_hardware(tmp_path: Path, tiny_data) -> None:
    # prepare: two real tiny runs (no scoring), as the loop writes them
    from dfbench.benchmark.engine.lifecycle import run
    from helpers import tiny_config

    for method in ("fedavg", "fedprox"):
        run(tiny_config(method), tmp_path / "runs", data=tiny_data, progress=False)
    # execute
    paths = build_report(tmp_path / "runs", tmp_path / "out")
    # assert: both runs are read (none "unreadable"), and the header names the machine
    md = paths["leaderboard_md"].read_text()
    assert "fedavg" in md and "fedprox" in md
    assert "0 run(s) failed" in md
    assert "Hardware: " in md and " cores (" in md and "), device cpu." in md  # the CPU's flags named
    assert "machines" not in md.split("Hardware: ")[1].split("\n")[0]  # one machine: no mixed-machines warning


def test_metric_notes_flag_mixed_settings_only_when_they_differ() -> None:
    from dfbench.benchmark.report.formatting import metric_notes as _metric_notes

    row = {"group_key": "g", "metric": "fd_fmnist", "extractor": "fmnist", "extractor_sha256": "ab" * 32,
           "backend": "dfbench", "num_samples": 400, "sampler": "heun", "sampler_steps": 8,
           "reference": "fmnist/train", "resize": "none-28"}
    same = pd.DataFrame([row, dict(row)])
    assert "MIXED" not in _metric_notes(same, ["g"])[0]
    differ = pd.DataFrame([row, {**row, "num_samples": 1000}])
    note = _metric_notes(differ, ["g"])[0]
    assert "MIXED" in note and "num_samples=1000 | 400" in note


def test_later_fields_at_their_neutral_value_and_memory_knobs_do_not_split_a_setting(tmp_path):
    """A run folder written before `train.lr_decay` / `train.time_sampling` / the eval batches existed
    and one written after, at their neutral values, are seeds of ONE setting, not two."""
    from dfbench.benchmark.report.frames import runs_frame
    from dfbench.benchmark.report.run_records import RunRecord

    base = {"method": "fedavg", "method_params": {}, "dataset": "fmnist", "partition": "iid", "rounds": 2, "lr": 0.002}
    old = RunRecord(path=tmp_path / "a", config={**base, "seed": 0}, metrics={}, rounds=[])
    new = RunRecord(path=tmp_path / "b", config={**base, "seed": 1, "lr_decay": "none", "time_sampling": "uniform",
                                                 "sample_batch": 64, "feature_batch": 128, "deterministic": True},
                    metrics={}, rounds=[])
    other = RunRecord(path=tmp_path / "c", config={**base, "seed": 2, "time_sampling": "logit_normal"}, metrics={}, rounds=[])
    runs, _, _ = runs_frame([old, new, other])
    keys = list(runs["group_key"])
    assert keys[0] == keys[1] != keys[2]


def test_dodge_spreads_only_points_that_share_an_x_and_keeps_lone_points_in_place() -> None:
    from dfbench.benchmark.report.plots import _dodged

    # prepare: three settings at x = 2, one at x = 1 and one a hair from 2.5 / 2.5 (a near tie)
    panel = pd.DataFrame({"label": ["a", "b", "c", "d", "e", "f"], "partition": ["iid"] * 6,
                          "xv": [2.0, 2.0, 2.0, 1.0, 2.5, 2.5001]})
    # execute
    xp = _dodged(panel, labels=["a", "b", "c", "d", "e", "f"], log=False, span=1.5, step=0.02)
    # assert: the lone point keeps its x; the group of three is centred on 2, 0.02 * 1.5 apart in label order
    assert xp.iloc[3] == 1.0
    assert xp.iloc[:3].tolist() == pytest.approx([2.0 - 0.03, 2.0, 2.0 + 0.03])
    assert xp.iloc[4:].tolist() == pytest.approx([2.50005 - 0.015, 2.50005 + 0.015])
    # on a log axis the step is in decades
    log = _dodged(panel.iloc[:3], labels=["a", "b", "c"], log=True, span=0.0, step=0.1)
    assert log.tolist() == pytest.approx([2.0 * 10 ** -0.1, 2.0, 2.0 * 10 ** 0.1])


def test_a_setting_keeps_its_colour_whatever_a_plot_leaves_out(tmp_path: Path, monkeypatch) -> None:
    """The uplink plot leaves out a setting without uplink; the setting colours come from the whole
    table, so fedavg has the same colour there as in a plot that holds every setting."""
    import matplotlib.axes

    from dfbench.benchmark.report.plots import plot_metric_vs_gamma_star, plot_metric_vs_uplink, setting_colors

    runs = tmp_path / "runs"
    make_run(runs, "s0-fa", evaluations=[fd(10.0)], extra_metrics={"gamma_star": 2})
    make_run(runs, "s0-ex", method="experts", evaluations=[fd(12.0)], uplink_bits=0, extra_metrics={"gamma_star": 1})
    make_run(runs, "s0-rp", method="random_prune", params={"keep_ratio": 0.25}, evaluations=[fd(20.0)],
             extra_metrics={"gamma_star": 0, "w2_mean": 0.5})
    data = collect(runs)
    colors = setting_colors(data.table, data.metrics)
    assert set(colors) == {"fedavg", "experts", "random_prune (keep_ratio=0.25)"}
    drawn: list[Any] = []
    real = matplotlib.axes.Axes.errorbar
    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar",
                        lambda self, *a, **k: (drawn.append(tuple(k["color"])), real(self, *a, **k))[1])
    # execute: the uplink plot (experts left out: no uplink) and the Γ* plot (every setting)
    assert isinstance(plot_metric_vs_uplink(data.table, data.metrics, tmp_path / "u.png"), Path)
    uplink, drawn[:] = list(drawn), []
    assert isinstance(plot_metric_vs_gamma_star(data.table, data.metrics, tmp_path / "g.png"), Path)
    # assert: one bar per setting, in label order, each in the report's colour of its setting
    assert uplink == [tuple(colors["fedavg"]), tuple(colors["random_prune (keep_ratio=0.25)"])]
    assert drawn == [tuple(colors[k]) for k in ("experts", "fedavg", "random_prune (keep_ratio=0.25)")]


def test_a_blocks_usual_config_value_does_not_depend_on_the_row_order():
    """Two widths with as many rows each: the usual value (the one a name leaves out) is the smaller, whichever
    row comes first, so the verdicts' reference names and the page's names agree after the ranking reorders."""
    import pandas as pd

    from dfbench.benchmark.report.names import setting_names, usual

    block = pd.DataFrame({"dataset": "fmnist", "partition": "iid", "method": "fedavg", "baseline": False,
                          "cfg.model": ["small32", "small28", "small32", "small28"], "cfg.rounds": [28, 14, 14, 28]})
    assert usual(block, "cfg.model") == usual(block.iloc[::-1], "cfg.model") == "small28"
    assert usual(block, "cfg.rounds") == usual(block.iloc[::-1], "cfg.rounds") == "14"
    names = setting_names(block)
    assert names == {i: n for i, n in setting_names(block.iloc[::-1]).items()}
    assert names[1] == "fedavg" and names[0] == "fedavg (model=small32, rounds=28)"
