"""Grid files: expansion, validation, selection, cost, failure isolation and the rerun policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dfbench import methods
from dfbench.benchmark.grid import plan as P, runner as R, spec as S
from dfbench.benchmark.engine import lifecycle
from dfbench.benchmark.cli import main
from dfbench.benchmark.core.config import ConfigError
from helpers import TINY, write_grid


def seeds_grid(tmp_path: Path, rounds: int = 2) -> S.Grid:
    return S.load_grid(write_grid(tmp_path / "three.toml", {**TINY, "train.rounds": rounds}, {"seed": [0, 1, 2]}))


# -- the shipped grids -----------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name", S.builtin_grids())
def test_shipped_grid_validates(name):
    grid = S.load_grid(name)
    assert grid.cells and grid.name == name
    assert len({c.run_id for c in grid.cells}) == len(grid.cells)


def test_a_study_named_like_a_shipped_grid_is_pointed_to_its_file(monkeypatch):
    """A study's grid lives in its results folder: its bare name, run from the repository root, says which file."""
    monkeypatch.chdir(Path(S.__file__).resolve().parents[2])
    with pytest.raises(S.GridError, match="pass its file, results/cpu-aggregation/cpu-aggregation.toml"):
        S.load_grid("cpu-aggregation")
    assert S.load_grid("results/cpu-aggregation/cpu-aggregation.toml").name == "cpu-aggregation"


def test_demo_covers_every_method_family_and_the_baseline_within_its_budget():
    grid = S.load_grid("demo")
    families = methods.method_families()
    assert {methods.get_method_class(c.cfg.method).family for c in grid.cells} == set(families)
    assert any(c.cfg.train.rounds == 0 for c in grid.cells)
    assert all(c.cfg.data.dataset == "fmnist" and c.cfg.data.partition == "iid" for c in grid.cells)
    assert sum(P.estimate_cost(c.cfg).cpu_seconds for c in grid.cells) < 6 * 60


@pytest.mark.slow
def test_full_grid_is_methods_x_datasets_x_partitions_x_seeds_plus_baselines():
    cells = S.load_grid("full").cells
    trained = [c for c in cells if c.cfg.train.rounds > 0]
    assert {(c.cfg.data.dataset, c.cfg.data.partition, c.cfg.seed) for c in trained} == {
        (d, p, s) for d in ("fmnist", "svhn", "cifar10") for p in ("iid", "dirichlet:0.5", "dirichlet:0.1") for s in (0, 1, 2)}
    assert {c.cfg.method for c in trained} == set(methods.list_methods())
    assert len([c for c in cells if c.cfg.train.rounds == 0]) == 9


# -- expansion -----------------------------------------------------------------------------------

def test_method_spec_parses_values_like_set_and_round_trips():
    assert S.parse_method("quantized?bits=4&rounding=deterministic") == ("quantized", {"bits": 4, "rounding": "deterministic"})
    assert S.parse_method("fedprox?mu=1e-2") == ("fedprox", {"mu": 0.01})
    assert S.format_method(*S.parse_method("fedprox?mu=0.5")) == "fedprox?mu=0.5"
    for bad in ("fedprox?mu", "?mu=1", "fedprox?mu=1&mu=2", 3):
        with pytest.raises(ConfigError, match="'method'"):
            S.parse_method(bad)


def test_product_then_cells_with_method_parameters_and_base(tmp_path):
    path = write_grid(tmp_path / "g.toml", {**TINY, "train.lr": 0.002},
                      {"method": ["fedavg", "fedprox?mu=0.1"], "seed": [0, 1]},
                      [{"method": "fedavg", "train.rounds": 0}])
    cells = S.load_grid(path).cells
    assert [c.label for c in cells] == ["fmnist/iid/fedavg/0", "fmnist/iid/fedavg/1", "fmnist/iid/fedprox?mu=0.1/0",
                                        "fmnist/iid/fedprox?mu=0.1/1", "fmnist/iid/fedavg/0"]
    assert cells[2].cfg.method_params["mu"] == 0.1
    assert all(c.cfg.train.lr == 0.002 for c in cells)
    assert [c.cfg.train.rounds for c in cells] == [2, 2, 2, 2, 0]


def test_device_override_keeps_run_ids_within_a_device_type(tmp_path):
    """The GPU index never moves a run id (workers on cuda:0 and cuda:1 share the cells); the device
    type does (a GPU grid does not skip the cells a CPU finished: other random streams)."""
    path = write_grid(tmp_path / "g.toml", TINY, {"seed": [0, 1]})
    plain, cuda, cuda1 = S.load_grid(path), S.load_grid(path, extra={"device": "cuda"}), S.load_grid(path, extra={"device": "cuda:1"})
    assert [c.run_id for c in cuda.cells] == [c.run_id for c in cuda1.cells]
    assert not {c.run_id for c in plain.cells} & {c.run_id for c in cuda.cells}
    assert {c.cfg.device for c in cuda.cells} == {"cuda"}


# -- validation ----------------------------------------------------------------------------------

def test_unknown_keys_and_bad_method_specs_are_reported_together(tmp_path):
    path = write_grid(tmp_path / "g.toml", {**TINY, "train.roundz": 3}, {"method": ["fedavg", "fedprox?mu"], "sede": [0]})
    with pytest.raises(S.GridError) as err:
        S.load_grid(path)
    msg = str(err.value)
    assert "3 problem(s)" in msg
    assert "unknown key 'train.roundz' (did you mean train.rounds" in msg
    assert "unknown key 'sede'" in msg and "valid keys:" in msg
    assert "'fedprox?mu'" in msg


def test_every_bad_cell_is_named_in_one_error_and_nothing_runs(tmp_path, capsys):
    path = write_grid(tmp_path / "g.toml", TINY,
                      {"method": ["fedavg", "nope", "fedprox?mu=-1"], "data.dataset": ["fmnist", "mnist"]},
                      [{"train.rounds": -1}, {"train.lr": 0}])
    with pytest.raises(S.GridError) as err:
        S.load_grid(path)
    msg = str(err.value)
    assert f"registered methods: {', '.join(methods.list_methods())}" in msg  # unknown method
    assert "invalid value for 'method.mu' of 'fedprox': -1.0; allowed: a finite number >= 0" in msg
    assert "invalid value for 'data.dataset': 'mnist'; allowed: fmnist, svhn, cifar10" in msg
    assert "cell 6 ([[cells]] #0) (fmnist/iid/fedavg/0): invalid value for 'train.rounds': -1" in msg
    assert "cell 7 ([[cells]] #1)" in msg and "'train.lr'" in msg
    assert "cell 0 " not in msg  # fedavg on fmnist is fine
    # the CLI says the same and creates nothing
    out = tmp_path / "runs"
    assert main(["grid", str(path), "--out", str(out), "--no-progress"]) == 2
    assert "invalid value for 'train.rounds'" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("text,needle", [
    ('name = "x"\n[base]\n"seed" = [1, 2]\n', "a single value is needed"),
    ('name = "x"\n[axes]\nseed = []\n', "a non-empty list"),
    ('name = "x"\ncolour = 1\n[axes]\nseed = [0]\n', "unknown top-level key(s) 'colour'"),
    ('name = "x"\n', "no cells"),
    ('name = "x"\n[axes\n', "not valid TOML"),
])
def test_malformed_grid_files(tmp_path, text, needle):
    path = tmp_path / "g.toml"
    path.write_text(text)
    with pytest.raises(S.GridError) as err:
        S.load_grid(path)
    assert needle in str(err.value)


def test_duplicate_cells_are_an_error(tmp_path):
    path = write_grid(tmp_path / "g.toml", TINY, {"seed": [0]}, [{"seed": 0}])
    with pytest.raises(S.GridError, match="cells 0 and 1 are the same run"):
        S.load_grid(path)


def test_unknown_grid_name_lists_the_shipped_ones(tmp_path):
    with pytest.raises(ConfigError, match="shipped grids: .*demo"):
        S.load_grid("no_such_grid")
    with pytest.raises(FileNotFoundError):
        S.load_grid(tmp_path / "missing.toml")


# -- selection, state, cost -----------------------------------------------------------------------

def test_shards_partition_the_selection_round_robin(tmp_path):
    path = write_grid(tmp_path / "g.toml", TINY, {"method": ["fedavg", "fedprox"], "seed": [0, 1, 2, 3]})
    cells = S.load_grid(path).cells
    shards = [P.select_cells(cells, shard=(i, 3)) for i in range(3)]
    assert sorted(c.index for s in shards for c in s) == list(range(8))
    assert [c.index for c in shards[1]] == [1, 4, 7]
    assert [c.index for c in P.select_cells(cells, only=["*/fedprox/*"])] == [4, 5, 6, 7]
    assert [c.index for c in P.select_cells(cells, only=["fmnist/iid/fedavg/2", cells[7].run_id])] == [2, 7]
    assert [c.index for c in P.select_cells(cells, only=["*/fedprox/*"], shard=(1, 2))] == [5, 7]
    with pytest.raises(ConfigError, match="matches no cell"):
        P.select_cells(cells, only=["cifar10/*"])


@pytest.mark.parametrize("text", ["1/1", "a/b", "-1/2", "2", "0/0"])
def test_bad_shard_is_a_clear_error(text):
    with pytest.raises(ConfigError, match=r"'--shard'.*0 <= I < N"):
        P.parse_shard(text)


@pytest.mark.parametrize("state,default,retry,force", [
    ("missing", True, True, True), ("unfinished", True, True, True), ("failed", False, True, True),
    ("diverged", False, False, True), ("done", False, False, True),
])
def test_rerun_policy(state, default, retry, force):
    assert P.should_run(state) is default
    assert P.should_run(state, retry_failed=True) is retry
    assert P.should_run(state, force=True) is force


@pytest.mark.parametrize("run_state,cell_state", [
    (None, "missing"), ("running", "unfinished"), ("interrupted", "unfinished"), ("failed", "failed"),
    ("diverged", "diverged"), ("done", "done"),
])
def test_cell_state_from_the_run_state_an_interrupted_run_is_unfinished(tmp_path, run_state, cell_state):
    from dfbench.benchmark.core import runfolder

    cell = seeds_grid(tmp_path).cells[0]
    if run_state is not None:
        cell.folder(tmp_path / "runs").mkdir(parents=True)
        runfolder.write_status(cell.folder(tmp_path / "runs"), run_state)
    assert P.cell_state(tmp_path / "runs", cell) == cell_state


def test_cost_estimate_matches_a_hand_count():
    from helpers import tiny_config

    cfg = tiny_config(over={"train.rounds": 3, "train.local_steps": 10, "system.participation": 0.5,
                            "system.stragglers": 0.5, "system.straggler_steps": 0.5})
    cost = P.estimate_cost(cfg)
    # 2 of 4 clients per round; 2 clients run 10 steps, 2 stragglers 5: mean 7.5; batch 8
    assert cost.sample_grads == 3 * 2 * 7.5 * 8
    assert cost.eval_forwards == 16 * 3  # ddim: one network evaluation per step
    assert cost.cpu_seconds > 0


def test_cost_estimate_counts_fedbuff_buffers_deadline_drops_and_curve_points():
    from helpers import tiny_config

    base = {"train.rounds": 6, "train.local_steps": 10, "data.clients": 4}
    # FedBuff: a server step applies K = 2 reports, not every client's
    cost = P.estimate_cost(tiny_config(over={**base, "train.driver": "fedbuff", "train.buffer": 2}))
    assert cost.sample_grads == 6 * 2 * 10 * 8
    # half the clients 4x slower: 10 x 8 / (100 x 0.25) = 3.2 s misses a 1 s deadline and is never trained
    # (fast: 0.8 s), so 2 of 4 clients per round
    slow = {**base, "system.speed": "1.0:0.5,0.25:0.5", "system.deadline": 1.0}
    assert P.estimate_cost(tiny_config(over=slow)).sample_grads == 6 * 2 * 10 * 8
    assert P.estimate_cost(tiny_config(over={**slow, "system.deadline": 4.0})).sample_grads == 6 * 4 * 10 * 8
    # curve points at rounds 0, 4 and 6 (the last) on 5 noises, ddim 3 steps, beside the final 16 samples
    curve = P.estimate_cost(tiny_config(over={**base, "eval.every": 4, "eval.curve_samples": 5, "eval.metrics": "auto"}))
    assert curve.eval_forwards == 16 * 3 + 3 * 5 * 3


def test_dry_run_lists_cells_and_cost_and_creates_nothing(tmp_path, capsys):
    path = write_grid(tmp_path / "g.toml", TINY, {"seed": [0, 1, 2]})
    out = tmp_path / "runs"
    assert main(["grid", str(path), "--out", str(out), "--dry-run", "--shard", "1/2"]) == 0
    text = capsys.readouterr().out
    cells = S.load_grid(path).cells
    assert cells[1].run_id in text and cells[0].run_id not in text
    assert "to run: 1 cell(s), 128 sample-gradient evaluations" in text  # 2 rounds x 4 clients x 2 steps x 8
    assert not out.exists()


# -- running ---------------------------------------------------------------------------------------

def _record_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the seed of every cell the grid hands to lifecycle.run."""
    seen: list[int] = []
    real = lifecycle.run

    def run(cfg, out, **kw):
        seen.append(cfg.seed)
        return real(cfg, out, **kw)

    monkeypatch.setattr(lifecycle, "run", run)
    return seen


@pytest.mark.slow
def test_a_failing_cell_is_isolated_and_a_rerun_runs_only_it(tmp_path, tiny_data, monkeypatch):
    grid, out = seeds_grid(tmp_path), tmp_path / "runs"
    lines: list[str] = []
    # prepare: the middle cell (seed 1) raises in its second round
    real_round = lifecycle.train_round

    def train_round(method, state, ctx, r):
        if ctx.cfg.seed == 1 and r == 2:
            raise RuntimeError("boom in round 2")
        return real_round(method, state, ctx, r)

    with monkeypatch.context() as m:
        m.setattr(lifecycle, "train_round", train_round)
        summary = R.run_grid(grid, out, progress=False, data=tiny_data, echo=lines.append)
    # assert: the other two finished; the failure is recorded with its traceback
    assert [o.after for o in summary.outcomes] == ["done", "failed", "done"]
    assert not summary.ok and "boom in round 2" in summary.text()
    status = json.loads((grid.cells[1].folder(out) / "status.json").read_text())
    assert status["state"] == "failed" and "RuntimeError: boom in round 2" in status["traceback"]
    assert len(lines) == 3 and lines[1].startswith("[2/3] failed") and "status.json" in lines[1]
    assert "no metric" in lines[0]
    # a plain rerun runs nothing: done cells are skipped, the failed one is listed
    seen = _record_runs(monkeypatch)
    again = R.run_grid(grid, out, progress=False, data=tiny_data, echo=lines.append)
    assert seen == [] and "--retry-failed" in again.text()
    # --retry-failed runs only the failed cell (resuming from its round-1 checkpoint)
    retried = R.run_grid(grid, out, progress=False, data=tiny_data, retry_failed=True, echo=lines.append)
    assert seen == [1] and retried.ok
    assert [o.ran for o in retried.outcomes] == [False, True, False]
    # --force reruns a done cell
    R.run_grid(grid, out, progress=False, data=tiny_data, force=True, only=["*/0"], echo=lines.append)
    assert seen == [1, 0]


@pytest.mark.slow
def test_unfinished_and_missing_cells_run_done_and_diverged_are_skipped(tmp_path, tiny_data, monkeypatch):
    from dfbench.benchmark.core import runfolder

    grid, out = seeds_grid(tmp_path, rounds=1), tmp_path / "runs"
    for cell, state in zip(grid.cells, ("running", "diverged")):
        cell.folder(out).mkdir(parents=True)
        runfolder.write_status(cell.folder(out), state, **({"error": "nan at round 1"} if state == "diverged" else {}))
    assert [P.cell_state(out, c) for c in grid.cells] == ["unfinished", "diverged", "missing"]
    seen = _record_runs(monkeypatch)
    summary = R.run_grid(grid, out, progress=False, data=tiny_data, echo=lambda _: None)
    assert seen == [0, 2]
    assert [o.after for o in summary.outcomes] == ["done", "diverged", "done"] and summary.ok


def test_cli_grid_runs_and_reports(tmp_path, tiny_data, monkeypatch, capsys):
    from dfbench import datasets

    monkeypatch.setattr(datasets, "load", lambda name, split, root=None: tiny_data)
    path = write_grid(tmp_path / "g.toml", {**TINY, "train.rounds": 1}, {"seed": [0]})
    out = tmp_path / "runs"
    assert main(["grid", str(path), "--out", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "[1/1] done" in text and "1 done" in text
    assert P.cell_state(out, S.load_grid(path).cells[0]) == "done"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_cells_without_a_gpu_are_refused_before_any_run(tmp_path):
    path = write_grid(tmp_path / "g.toml", TINY, {"seed": [0]})
    with pytest.raises(ConfigError, match="'device': 'cuda'; allowed: cpu"):
        R.run_grid(S.load_grid(path, extra={"device": "cuda"}), tmp_path / "runs", progress=False)
    assert not (tmp_path / "runs").exists()


# -- workers sharing one --out (locks; the multi-process tests are in tests/runs/test_workers.py) -------

def _two_lengths(tmp_path: Path) -> S.Grid:
    """Cells of 1 and 2 rounds: the 2-round cells cost more."""
    return S.load_grid(write_grid(tmp_path / "two.toml", TINY, {"train.rounds": [1, 2], "seed": [0, 1]}))


def test_dry_run_shows_which_cells_are_locked_and_by_whom(tmp_path, capsys):
    import os
    import socket
    import subprocess
    import sys

    from dfbench.benchmark.core.lock import LOCK_NAME, RunLock

    grid, out = _two_lengths(tmp_path), tmp_path / "runs"
    live = RunLock(grid.cells[0].folder(out))
    live.acquire()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = grid.cells[1].folder(out)
    stale.mkdir(parents=True)
    (stale / LOCK_NAME).write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "started": 0, "token": "x",
                                               "boot_id": __import__("dfbench.benchmark.core.lock", fromlist=["_boot_id"])._boot_id()}))
    try:
        text = P.describe(grid, grid.cells, out)
    finally:
        live.release()
    rows = {line.split()[1]: line for line in text.splitlines() if line.split() and line.split()[0].isdigit()}
    row0, row1 = rows[grid.cells[0].run_id], rows[grid.cells[1].run_id]
    assert " busy " in row0 and f"{socket.gethostname()}:{os.getpid()} since " in row0 and "heartbeat" in row0
    assert " run " in row1 and f"stale (pid {dead.pid} no longer exists on this host)" in row1
    assert "to run: 3 cell(s)" in text and "busy: 1 cell(s) locked by a live process" in text


@pytest.mark.slow
def test_a_worker_runs_longest_first_and_leaves_locked_cells_to_their_owner(tmp_path, tiny_data, monkeypatch):
    from dfbench.benchmark.core.lock import RunLock

    grid, out = _two_lengths(tmp_path), tmp_path / "runs"
    order: list[tuple[int, int]] = []
    real = lifecycle.run

    def run(cfg, out_, **kw):
        order.append((cfg.train.rounds, cfg.seed))
        assert kw["lock"].held  # the worker holds the cell's lock while it runs
        return real(cfg, out_, **kw)

    monkeypatch.setattr(lifecycle, "run", run)
    other = RunLock(grid.cells[3].folder(out))  # 2 rounds, seed 1: another worker is on it
    other.acquire()
    lines: list[str] = []
    try:
        summary = R.run_grid(grid, out, progress=False, data=tiny_data, echo=lines.append)
    finally:
        other.release()
    assert order == [(2, 0), (1, 0), (1, 1)]  # longest first, ties in grid order; the locked one skipped
    assert [o.after for o in summary.outcomes] == ["done", "done", "done", "running"]
    assert summary.ok and "running: fmnist/iid/fedavg/1" in summary.text() and "locked by" in summary.text()
    assert lines[0].startswith("[1/4] done") and any(line.startswith("[2/4] busy") for line in lines)
    # --shard keeps the grid order (static split)
    order.clear()
    R.run_grid(grid, out, shard=(0, 1), progress=False, data=tiny_data, force=True, echo=lines.append)
    assert order == [(1, 0), (1, 1), (2, 0), (2, 1)]


@pytest.mark.slow
def test_a_cell_a_peer_finished_after_this_worker_started_is_not_rerun_even_with_force(tmp_path, tiny_data, monkeypatch):
    from dfbench.benchmark.core import runfolder

    grid, out = seeds_grid(tmp_path, rounds=1), tmp_path / "runs"
    R.run_grid(grid, out, progress=False, data=tiny_data, echo=lambda _: None)  # all done, before this worker
    ran: list[int] = []
    real = lifecycle.run

    def run(cfg, out_, **kw):
        ran.append(cfg.seed)
        if cfg.seed == 0:  # meanwhile a peer worker of the same launch reruns seed 1 to the end
            runfolder.write_status(grid.cells[1].folder(out), "done")
        return real(cfg, out_, **kw)

    monkeypatch.setattr(lifecycle, "run", run)
    R.run_grid(grid, out, progress=False, data=tiny_data, force=True, echo=lambda _: None)
    assert ran == [0, 2]


def test_the_held_out_grid_of_paper_fmnist_has_its_setting_key_for_key():
    """paper-fmnist-rules.toml chooses paper-fmnist's lr and inference rules on seed 7: the same
    [base] (but the evaluation's sample count: 1000 there, 400 in the study), pruning cells at the
    same keep ratios, and no seed of the study."""
    import tomllib

    home = Path(S.__file__).resolve().parents[2] / "results" / "paper-fmnist"
    study_file, held_out_file = home / "paper-fmnist.toml", home / "rules" / "paper-fmnist-rules.toml"
    study, held_out = (tomllib.loads(f.read_text()) for f in (study_file, held_out_file))
    assert (held_out["base"].pop("eval.samples"), study["base"].pop("eval.samples")) == (1000, 400)
    assert held_out["base"] == study["base"]
    def pruning(grid: dict) -> list[tuple[str, float]]:  # (family, keep ratio); the rule the study chose may differ
        return [(name, params["keep_ratio"]) for name, params in map(S.parse_method, grid["axes"]["method"]) if "prune" in name]

    assert pruning(held_out) == pruning(study) and len(pruning(study)) == 6
    seeds = {c.cfg.seed for c in S.load_grid(held_out_file).cells}
    assert seeds == {7} and not seeds & {c.cfg.seed for c in S.load_grid(study_file).cells}
