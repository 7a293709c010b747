"""What a new user met (issue 61): a filesystem that refuses writes, a misspelt --reference or method pattern,
`dfbench run --help` without defaults, `--dry-run` that leaves train.model=auto unresolved. Each refusal is one
line, before any work, with a non-zero exit status.

`dfbench` runs in this process (cli.main, the `dfbench` fixture of tests/conftest.py) on the small synthetic image set. The suite runs as root in CI, where
chmod does not stop a write: a read-only folder is then simulated through os.access (what the check before the
work asks) and the write itself through a PermissionError (what the last-resort message handles), so no test here
passes just because it ran as root.
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from dfbench.benchmark import cli
from dfbench.benchmark.cli import build_parser, config_from_args
from dfbench.benchmark.core import lock, runfolder
from dfbench.benchmark.engine import lifecycle
from helpers import one_line

RUN_ARGS = ["--dataset", "fmnist", "--clients", "2", "--local-steps", "1", "--batch-size", "8", "--eval-samples", "16",
            "--sampler-steps", "3", "--rounds", "2", "--set", "train.model=tiny", "--set", "eval.metrics=none",
            "--set", "eval.grid=4", "--set", "data.min_client_size=4", "--set", "train.sigma1_probe_steps=0",
            "--no-progress"]


def _argv(out: Path | str, *extra: str) -> list[str]:
    return ["run", *RUN_ARGS, "--out", str(out), *extra]


def _no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any training or report fails the test: the refusals come before the work."""
    def work(*a: Any, **k: Any) -> None:
        raise AssertionError("work started")

    monkeypatch.setattr(lifecycle, "run", work)
    import dfbench.benchmark.report.build as build

    monkeypatch.setattr(build, "collect", work)


def _read_only(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`folder` and everything in it read-only: chmod where that stops this user (not root), else os.access
    answers as it would (the check before the work asks it; root's writes would still go through)."""
    for p in [folder, *folder.rglob("*")]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    if os.access(folder, os.W_OK):  # root: chmod stops nothing, so say what a read-only tree would say
        real = os.access
        inside = str(folder.resolve())

        def access(path: Any, mode: int, *a: Any, **k: Any) -> bool:
            if mode & os.W_OK and str(Path(path).resolve()).startswith(inside):
                return False
            return real(path, mode, *a, **k)

        monkeypatch.setattr(os, "access", access)
    assert not os.access(folder, os.W_OK)


@pytest.fixture
def writable_again(tmp_path: Path):
    yield
    for p in [tmp_path, *tmp_path.rglob("*")]:  # so pytest can remove it
        p.chmod(p.stat().st_mode | stat.S_IWUSR)


# -- item 1: filesystem errors in one line -------------------------------------------------------------

@pytest.mark.parametrize("command", ["run", "report"])
def test_an_out_that_is_a_file_is_one_line_naming_it_before_any_work(command, tmp_path, dfbench, monkeypatch):
    _no_work(monkeypatch)
    afile = tmp_path / "results.txt"
    afile.write_text("not a folder")
    for out, said in ((afile, f"--out {afile} is a file, not a folder"),
                      (afile / "runs", f"--out {afile / 'runs'}: {afile} is a file, not a folder")):
        argv = _argv(out) if command == "run" else ["report", "--runs", str(tmp_path), "--out", str(out)]
        code, _, err = dfbench(argv)
        line = one_line(err)
        assert code != 0 and said in line and ("pass a folder" in line or "pass another --out" in line), line
    assert afile.read_text() == "not a folder" and sorted(tmp_path.iterdir()) == [afile]


@pytest.mark.parametrize("command", ["run", "report"])
def test_a_read_only_out_is_one_line_naming_it_before_any_work(command, tmp_path, dfbench, monkeypatch, writable_again):
    _no_work(monkeypatch)
    ro = tmp_path / "shared"
    ro.mkdir()
    _read_only(ro, monkeypatch)
    out = ro / "runs"  # a folder still to be made inside it
    argv = _argv(out) if command == "run" else ["report", "--runs", str(tmp_path), "--out", str(out)]
    code, _, err = dfbench(argv)
    line = one_line(err)
    assert code != 0 and f"--out {out}: {ro} is not writable" in line and f"chmod -R u+w {ro}" in line, line
    assert list(ro.iterdir()) == []


def test_a_finished_run_in_a_read_only_tree_says_already_done_and_takes_no_lock(tmp_path, dfbench, monkeypatch,
                                                                                 writable_again):
    argv = _argv(tmp_path / "runs")
    a = build_parser().parse_args(argv)
    cfg = config_from_args(a)
    d = runfolder.run_dir(a.out, cfg)
    d.mkdir(parents=True)
    runfolder.write_json(d / runfolder.CONFIG, cfg.record())
    runfolder.write_json(d / runfolder.METRICS, {"evaluations": [], "wall_seconds": 1.0})
    runfolder.write_status(d, runfolder.DONE)
    _read_only(tmp_path / "runs", monkeypatch)

    def no_lock(self: Any) -> bool:  # (as root the lock file could be written: the test must not depend on it)
        raise AssertionError(f"took the lock of {self.folder}")

    monkeypatch.setattr(lock.RunLock, "try_acquire", no_lock)
    code, out, err = dfbench(argv)
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[0].startswith("already done") and lines[-1] == str(d)
    assert not (d / runfolder.LOCK).exists()


def test_an_unfinished_run_in_a_read_only_tree_is_refused_inone_line(tmp_path, dfbench, monkeypatch, writable_again):
    _no_work(monkeypatch)
    argv = _argv(tmp_path / "runs")
    a = build_parser().parse_args(argv)
    d = runfolder.run_dir(a.out, config_from_args(a))
    d.mkdir(parents=True)
    runfolder.write_status(d, runfolder.INTERRUPTED)
    _read_only(tmp_path / "runs", monkeypatch)
    code, _, err = dfbench(argv)
    line = one_line(err)
    assert code == 1 and f"--out {tmp_path / 'runs'}: {d} is not writable" in line, line


def test_a_write_refused_during_the_work_is_one_line_naming_the_file(tmp_path, dfbench, monkeypatch):
    # what the checks before the work cannot foresee (root in a chmod'ed folder, a tree changed meanwhile)
    target = tmp_path / "runs" / "fmnist" / "status.json"

    def refused(*a: Any, **k: Any) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(target))

    monkeypatch.setattr(lifecycle, "run", refused)
    code, _, err = dfbench(_argv(tmp_path / "runs"))
    line = one_line(err)
    assert code == 1 and f"Permission denied: {target}" in line and "--out" in line, line


# -- item 2: a misspelt --reference, a method pattern that matches nothing ---------------------------------

def test_an_unknown_reference_is_refused_naming_the_settings_closest_first(tmp_path, dfbench):
    from helpers import fd, make_run

    runs, out = tmp_path / "runs", tmp_path / "report"
    make_run(runs, "s0-fa", evaluations=[fd(10.0)])
    make_run(runs, "s0-fp", method="fedprox", params={"mu": 0.01}, evaluations=[fd(9.0)])
    code, _, err = dfbench(["report", "--runs", str(runs), "--out", str(out), "--reference", "fedavgg"])
    line = one_line(err)
    assert code != 0 and "'fedavgg' is no setting" in line and "did you mean 'fedavg'" in line, line
    listed = line.split("closest first: ", 1)[1]
    assert listed.startswith("'fedavg'") and "fedprox" in listed
    assert not out.exists()


def test_a_method_pattern_that_matches_nothing_is_refused_naming_the_methods(dfbench):
    code, out, err = dfbench(["methods", "xyz"])
    line = one_line(err)
    assert code != 0 and out == "" and "no method matches 'xyz'" in line and "fedavg" in line and "fedprox" in line
    code, _, err = dfbench(["methods", "fedprx"])
    assert code != 0 and "did you mean 'fedprox'" in one_line(err)
    code, out, _ = dfbench(["methods", "fedprox"])
    assert code == 0 and out.startswith("fedprox:")


# -- item 6: --help shows the defaults; --dry-run resolves the model and names the run folder ---------------

def test_run_help_shows_every_default(dfbench):
    code, out, _ = dfbench(["run", "--help"])
    assert code == 0
    text = " ".join(out.split()).split("options:", 1)[1]
    run = build_parser()._subparsers._group_actions[0].choices["run"]
    shown = 0
    for action in run._actions:
        if not action.option_strings or action.default in (None, False, []) or action.default is argparse.SUPPRESS:
            continue
        flag = action.option_strings[-1]
        after = text.split(f"{flag} {action.metavar or action.dest.upper()} ", 1)[1].split(" --", 1)[0]
        assert f"(default: {action.default})" in after or f"default {action.default}" in after, (flag, after)
        shown += 1
    assert shown >= 12  # --seed, --clients, --rounds, --local-steps, --batch-size, --lr, ... --out
    assert "(default: False)" not in text and "(default: [])" not in text and "(default: None)" not in text


def test_dry_run_resolves_model_auto_and_ends_with_the_run_folder(tmp_path, dfbench, monkeypatch):
    from dfbench.benchmark.engine.model import resolve_preset

    _no_work(monkeypatch)
    out = tmp_path / "runs"
    argv = ["run", "--out", str(out), "--dry-run"]
    code, said, err = dfbench(argv)
    assert code == 0, err
    lines = said.strip().splitlines()
    a = build_parser().parse_args(argv)
    folder = runfolder.run_dir(out, config_from_args(a))
    assert lines[-1] == str(folder)
    assert f"train.model: auto = {resolve_preset('auto', 'fmnist')}" in said and "not there yet" in lines[-2]
    assert not out.exists()


@pytest.mark.parametrize("objective", ["ddpm", "fm"])
def test_experts_train_the_runs_objective_unless_told_otherwise(tmp_path, dfbench, monkeypatch, objective):
    # before: `--method experts --set train.objective=ddpm` still recorded objectives fm (the experts' own default)
    import json

    _no_work(monkeypatch)
    code, said, err = dfbench(["run", "--method", "experts", "--set", f"train.objective={objective}", "--dry-run",
                               "--out", str(tmp_path)])
    assert code == 0, err
    config = json.loads(said[:said.rindex("}") + 1])
    assert config["method_params"]["objectives"] == objective
    # an explicit mixture of objectives is kept as asked (Heterogeneous DDM's DDPM and flow-matching experts)
    code, said, err = dfbench(["run", "--method", "experts", "--set", f"train.objective={objective}", "--set",
                               "method.objectives=ddpm,fm", "--dry-run", "--out", str(tmp_path)])
    assert code == 0, err
    assert json.loads(said[:said.rindex("}") + 1])["method_params"]["objectives"] == "ddpm,fm"


def test_a_ranking_metric_computed_under_different_settings_is_said_in_the_headline_and_the_main_table():
    # before: "(MIXED settings: not comparable)" sat only in the block's collapsed provenance section
    import pandas as pd

    from dfbench.benchmark.report import formatting, layout

    evals = pd.DataFrame({"group_key": ["a", "b"], "metric": ["fd_fmnist"] * 2, "extractor": ["fmnist"] * 2,
                          "extractor_sha256": ["x"] * 2, "backend": ["torch"] * 2, "num_samples": [400, 400],
                          "sampler": ["ddim", "heun"], "sampler_steps": [8, 8], "reference": ["fmnist/train"] * 2,
                          "resize": [None, None]})
    prov = formatting.metric_provenance(evals, ["a", "b"])
    assert prov["fd_fmnist"].endswith(formatting.MIXED) and "sampler=ddim | heun" in prov["fd_fmnist"]
    same = formatting.metric_provenance(evals.assign(sampler="heun"), ["a", "b"])
    assert formatting.MIXED not in same["fd_fmnist"]
    assert "NOT COMPARABLE" in layout.not_comparable_sentence("fd_fmnist", prov)
    assert layout.not_comparable_sentence("fd_fmnist", same) == ""
