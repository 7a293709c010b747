"""Scale-out on torch.distributed: 2 gloo ranks on the CPU compute the single-process run.

The multi-rank tests start real processes (this file run as a script, one per rank) with
the environment torchrun gives its workers (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT on 127.0.0.1), so `distributed.init_from_env` and the loop run unchanged.
Each rank is given its OWN output root (<root>/rank<R>): that rank 1's root never appears
shows it wrote nothing and needed nothing from rank 0's folder (no shared filesystem).

Starting a rank costs seconds (importing torch), so one launch runs every happy-path job
in sequence (as a grid would in one process group) and the tests read its runfolder.

What "the same run" means here: 2 ranks add the clients' sums in another order than one
process does, so a round's result differs in the last float32 bits (about 1e-8 relative).
The next round's Adam steps start with lr * sign(gradient), which turns such a difference
on a near-zero gradient into a full step, so end-to-end parameters after several rounds
can differ by ~1e-4 relative in either setting (one process versus another reduction
order). So each ROUND is checked: round 1 against the single-process round 1, and round 2
against one single-process round resumed from the 2-rank run's round-1 checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from dfbench import methods
from dfbench.benchmark.engine import distributed
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.engine.lifecycle import run
from helpers import tiny_config

pytestmark = pytest.mark.slow  # 2 gloo rank processes per run

HERE = Path(__file__).resolve().parents[1]  # tests/, where helpers.py is
WORKER_LIMIT_S = 240  # hard bound on a launch: a hang fails the test instead of the suite
SECOND_METHOD = "random_prune" if "random_prune" in methods.list_methods() else "fedprox"
METHODS = [
    ("fedavg", {}),
    (SECOND_METHOD, {}),
    ("experts", {"router_steps": 2, "router_batch": 8}),  # [K, P] sums; rank 0 trains expert 0, rank 1 expert 1
]
OVER = {"data.clients": 4, "checkpoint_every": 1}  # 2 rounds (helpers.TINY); every round checkpointed
RESUME_OVER = {"data.clients": 3, "checkpoint_every": 1}  # 3 clients: ranks train 2 and 1


# -- the worker (this file run as a script) ---------------------------------------------------

def _worker(spec: dict[str, Any]) -> int:
    """One rank: join the group from the environment, run each job, report like `dfbench run`."""
    torch.set_num_threads(1)
    from conftest import make_imageset

    distributed.init_from_env("cpu")
    rank, world = distributed.rank_world()
    assert world == spec["world"], (world, spec)
    if spec.get("fault") and rank == 1:
        _inject_fault(spec["fault"], spec["fault_round"])
    data = make_imageset()
    for i, job in enumerate(spec["jobs"]):
        cfg = tiny_config(job["method"], job.get("params"), job.get("over"))
        try:
            d = run(cfg, Path(spec["root"]) / f"rank{rank}", data=data, progress=False)
        except distributed.DistributedError as err:
            print(f"dfbench: error: {err}", file=sys.stderr, flush=True)
            return 1
        print(f"rank {rank} job {i} returned {d}", flush=True)
    distributed.shutdown()
    return 0


def _inject_fault(kind: str, at_round: int) -> None:
    """Make this rank die (SIGKILL) or hang as it starts local training in round `at_round`."""
    import signal

    import dfbench.benchmark.engine.lifecycle as loop
    import dfbench.benchmark.engine.training as training

    real_train, real_round = training.local_train, loop.train_round
    current = {"round": 0}

    def train_round(method: Any, state: Any, ctx: Any, r: int) -> Any:
        current["round"] = r
        return real_round(method, state, ctx, r)

    def local_train(*args: Any, **kwargs: Any) -> Any:
        if current["round"] >= at_round:
            if kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(3600)  # "hang": alive and silent; the test kills this process afterwards
        return real_train(*args, **kwargs)

    loop.train_round, training.local_train = train_round, local_train  # type: ignore[assignment]


# -- launching ------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(spec: dict[str, Any], logs: Path, timeout_s: float = 60.0) -> list[subprocess.Popen]:
    """Start spec["world"] ranks of this file as a worker, as torchrun would on one machine."""
    logs.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    procs = []
    for rank in range(spec["world"]):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "LOCAL_RANK": str(rank), "WORLD_SIZE": str(spec["world"]), "LOCAL_WORLD_SIZE": str(spec["world"]),
               distributed.TIMEOUT_ENV: str(timeout_s), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
        with open(logs / f"rank{rank}.log", "w") as out:
            procs.append(subprocess.Popen([sys.executable, str(Path(__file__).resolve()), json.dumps(spec)],
                                          env=env, stdout=out, stderr=subprocess.STDOUT, cwd=HERE.parent))
    return procs


def _wait(procs: list[subprocess.Popen], logs: Path, ranks: list[int] | None = None) -> list[int]:
    """Exit codes of the given ranks; a rank still running after the limit fails the test."""
    ranks = list(range(len(procs))) if ranks is None else ranks
    deadline = time.monotonic() + WORKER_LIMIT_S
    codes = []
    try:
        for r in ranks:
            codes.append(procs[r].wait(timeout=max(1.0, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        pytest.fail(f"rank(s) hung past {WORKER_LIMIT_S} s:\n{_logs(logs)}")
    finally:
        for p in procs:  # every process this test started ends with it
            if p.poll() is None:
                p.kill()
                p.wait()
    return codes


def _logs(logs: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(logs.glob("rank*.log")))


def _ckpt(d: Path, r: int) -> torch.Tensor:
    return torch.load(d / "checkpoints" / f"ckpt-{r:06d}.pt", map_location="cpu", weights_only=True)["params"]


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _crash_in_round_2(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the in-process loop raise when round 2 starts training (leaves round 1's checkpoint)."""
    import dfbench.benchmark.engine.lifecycle as loop

    real_round = loop.train_round

    def train_round(method: Any, state: Any, ctx: Any, r: int) -> Any:
        if r == 2:
            raise RuntimeError("simulated crash")
        return real_round(method, state, ctx, r)

    monkeypatch.setattr(loop, "train_round", train_round)


# -- tests without processes ----------------------------------------------------------------

def test_round_robin_share_covers_every_client_once():
    clients = [0, 3, 4, 7, 8, 9, 11]
    for world in (1, 2, 3, 8):
        shares = [distributed.my_share(clients, r, world) for r in range(world)]
        assert sorted(c for s in shares for c in s) == clients
        assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_single_process_collectives_are_identity():
    acc = {"b": torch.ones(3), "a": torch.zeros(2, 2)}
    distributed.all_reduce_(acc)
    assert torch.equal(acc["b"], torch.ones(3)) and torch.equal(acc["a"], torch.zeros(2, 2))
    tree = {"params": torch.arange(3.0), "extra": {"router": {"w": torch.ones(2)}, "n": 3}, "ema": None}
    assert distributed.broadcast_tree(tree, "cpu") is tree
    assert distributed.broadcast_object(True) is True
    assert distributed.gather_dict({1: (2, 0.5)}) == {1: (2, 0.5)}


def test_device_per_rank_and_timeout_from_env(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert distributed.local_device("cuda") == "cuda" and distributed.local_device("cuda:1") == "cuda:1"
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert distributed.local_device("cuda") == "cuda:3"
    assert distributed.local_device("cpu") == "cpu"
    with pytest.raises(ValueError, match="pass --device cuda"):
        distributed.local_device("cuda:0")
    monkeypatch.delenv(distributed.TIMEOUT_ENV, raising=False)
    assert distributed.timeout_from_env() == distributed.DEFAULT_TIMEOUT_S
    monkeypatch.setenv(distributed.TIMEOUT_ENV, "12.5")
    assert distributed.timeout_from_env() == 12.5
    for bad in ("soon", "0", "-3", "inf", "nan"):
        monkeypatch.setenv(distributed.TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=distributed.TIMEOUT_ENV):
            distributed.timeout_from_env()


def test_exit_barrier_timeout_from_env(monkeypatch):
    monkeypatch.delenv(distributed.EXIT_TIMEOUT_ENV, raising=False)
    assert distributed.timeout_from_env(distributed.DEFAULT_EXIT_TIMEOUT_S, distributed.EXIT_TIMEOUT_ENV) == 86400.0
    monkeypatch.setenv(distributed.EXIT_TIMEOUT_ENV, "7200")
    assert distributed.timeout_from_env(distributed.DEFAULT_EXIT_TIMEOUT_S, distributed.EXIT_TIMEOUT_ENV) == 7200.0
    monkeypatch.setenv(distributed.EXIT_TIMEOUT_ENV, "never")
    with pytest.raises(ValueError, match=distributed.EXIT_TIMEOUT_ENV):
        distributed.timeout_from_env(distributed.DEFAULT_EXIT_TIMEOUT_S, distributed.EXIT_TIMEOUT_ENV)


# -- two gloo ranks, one launch -------------------------------------------------------------

@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One 2-rank launch: every method of METHODS, then a resume, then a rerun of a done run.

    Before it, a single-process run of the resume config crashes in round 2, leaving round
    1's checkpoint in rank 0's root only (as on machines without a shared filesystem).
    """
    from conftest import make_imageset

    root = tmp_path_factory.mktemp("two_ranks")
    with pytest.MonkeyPatch.context() as mp:
        _crash_in_round_2(mp)
        with pytest.raises(RuntimeError, match="simulated crash"):
            run(tiny_config(over=RESUME_OVER), root / "rank0", data=make_imageset(), progress=False)
    jobs = [{"method": m, "params": p, "over": OVER} for m, p in METHODS]
    jobs += [{"method": "fedavg", "over": RESUME_OVER}] * 2  # resume, then rerun the finished run
    spec = {"world": 2, "jobs": jobs, "root": str(root)}
    codes = _wait(_launch(spec, root / "logs"), root / "logs")
    assert codes == [0, 0], f"exit codes {codes}\n{_logs(root / 'logs')}"
    return root


@pytest.mark.parametrize("method,params", METHODS)
def test_two_ranks_compute_the_single_process_run(two_ranks, tmp_path, tiny_data, method, params):
    # prepare: the single-process reference
    cfg = tiny_config(method, params, OVER)
    single = run(cfg, tmp_path / "single", data=tiny_data, progress=False)
    dist_dir = runfolder.run_dir(two_ranks / "rank0", cfg)
    # assert: rank 0 wrote the run folder, rank 1 created nothing at all
    assert runfolder.read_status(dist_dir)["state"] == "done"
    assert not (two_ranks / "rank1").exists()
    # round 1 from the same initial state; round 2 from the same round-1 state (see the module doc)
    assert _rel_err(_ckpt(dist_dir, 1), _ckpt(single, 1)) <= 1e-6
    again = tmp_path / "again" / dist_dir.relative_to(two_ranks / "rank0")
    shutil.copytree(dist_dir, again)
    shutil.rmtree(again / "checkpoints")
    (again / "checkpoints").mkdir()
    shutil.copy(dist_dir / "checkpoints" / "ckpt-000001.pt", again / "checkpoints")
    (again / "status.json").unlink()
    assert run(cfg, tmp_path / "again", data=tiny_data, progress=False) == again
    assert _rel_err(_ckpt(dist_dir, 2), _ckpt(again, 2)) <= 1e-6
    # end to end: the aggregation sums are float64, so the order of addition across ranks
    # disappears when the mean is rounded to float32 and the final parameters agree too
    assert _rel_err(_ckpt(dist_dir, 2), _ckpt(single, 2)) <= 1e-6
    # the rounds' bookkeeping rows agree (every rank's clients are in them)
    a, b = runfolder.read_rounds(dist_dir), runfolder.read_rounds(single)
    assert [r["clients"] for r in a] == [r["clients"] for r in b] == [[0, 1, 2, 3]] * 2
    for key in ("steps", "uplink_bits", "downlink_bits", "gamma"):
        assert [r[key] for r in a] == [r[key] for r in b], key
    assert a[0]["client_loss"] == b[0]["client_loss"]  # round 1: same start, same batches: bitwise


def test_resume_reads_rank0_checkpoint_only_and_a_done_run_returns_on_every_rank(two_ranks, tmp_path, tiny_data):
    cfg = tiny_config(over=RESUME_OVER)
    d = runfolder.run_dir(two_ranks / "rank0", cfg)
    reference = run(cfg, tmp_path, data=tiny_data, progress=False)
    # resumed from round 1 (the checkpoint only rank 0 could read): rows not duplicated
    assert runfolder.read_status(d)["state"] == "done"
    assert [r["round"] for r in runfolder.read_rounds(d)] == [1, 2]
    assert torch.equal(_ckpt(d, 1), _ckpt(reference, 1))  # round 1 was the single process's
    assert _rel_err(_ckpt(d, 2), _ckpt(reference, 2)) <= 1e-6  # round 2 is one round on 2 ranks
    # the rerun (last job) returned on both ranks: rank 1 did not go on to train alone
    logs = two_ranks / "logs"
    last = len(METHODS) + 1
    for rank in (0, 1):
        assert f"rank {rank} job {last} returned {runfolder.run_dir(two_ranks / f'rank{rank}', cfg)}" in (logs / f"rank{rank}.log").read_text()
    assert not (two_ranks / "rank1").exists()


# -- a rank that dies or hangs ----------------------------------------------------------------

@pytest.mark.parametrize("fault,timeout_s", [
    ("kill", 30.0),  # the peer's socket closes: rank 0 fails at once, well before the timeout
    ("hang", 4.0),  # the peer stays alive and silent: rank 0 fails when the timeout expires
])
def test_a_dead_or_hung_rank_fails_the_run_with_a_clear_error(tmp_path, fault, timeout_s):
    # prepare / execute: rank 1 dies or hangs in round 2, after round 1's all_reduce
    spec = {"world": 2, "jobs": [{"method": "fedavg", "over": {"train.rounds": 3}}], "root": str(tmp_path / "dist"),
            "fault": fault, "fault_round": 2}
    logs = tmp_path / "logs"
    codes = _wait(_launch(spec, logs, timeout_s=timeout_s), logs, ranks=[0])  # rank 1 is killed after
    # assert: rank 0 exits by itself with a clear error, on stderr and in the run folder
    log0 = (logs / "rank0.log").read_text()
    assert codes == [1], _logs(logs)
    assert f"rank 0 of 2: round 2's all_reduce did not complete within {timeout_s:g} s" in log0, _logs(logs)
    assert "another rank died, hung or raised; see its log" in log0
    status = [runfolder.read_json(p) for p in (tmp_path / "dist" / "rank0").rglob("status.json")]
    assert len(status) == 1 and status[0]["state"] == "failed"
    assert "round 2's all_reduce did not complete" in status[0]["error"]


if __name__ == "__main__":
    sys.exit(_worker(json.loads(sys.argv[1])))
