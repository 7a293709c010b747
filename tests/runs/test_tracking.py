"""Experiment trackers (`--log`, benchmark/tracking/): what TensorBoard, MLflow and W&B hold, read back
with each tool's own reader; results unchanged with trackers working, failing to import or failing
to start; a SIGKILLed run resumed into the same tracker runs; unknown names refused before any work.

One tracked run (all three trackers, with a quality curve and a scored evaluation) and one plain
run of the same config are shared by the module (tiny runs on the synthetic image set).
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dfbench import datasets
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.core.config import ConfigError
from dfbench.benchmark.engine.lifecycle import run
from dfbench.benchmark.tracking import base
from dfbench.benchmark.tracking.base import hyperparameters, stable_id
from helpers import tiny_config, write_grid

pytestmark = pytest.mark.slow  # whole runs logged to every tracker

TESTS = Path(__file__).parents[1]  # tests/, where helpers.py is
GROUP = "trk-test"
# a scored run with a quality curve at every round (round 0 = the untrained model)
OVER = {"eval.metrics": "fd_fmnist", "eval.every": 1, "eval.curve_samples": 12, "train.rounds": 2}
WALL = ("wall_seconds", "train_wall_seconds", "eval_wall_seconds", "inference_variants_wall_seconds")


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> Any:
    """What the autouse fixtures give a function (synthetic data, a temporary cache), for module
    fixtures too; the trackers' own settings from the environment are cleared, their homes temporary."""
    from conftest import make_imageset

    data = make_imageset()
    home = tmp_path_factory.mktemp("tracker_home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(datasets, "load", lambda name, split="train", root=None, **kw: data)
        mp.setenv("DFBENCH_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        for var in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_DIR", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
            mp.delenv(var, raising=False)
        for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR",
                    "XDG_CACHE_HOME"):  # (W&B's service writes its debug log under the user's cache folder)
            mp.setenv(var, str(home / var.lower()))
        torch.set_num_threads(1)
        yield data


@pytest.fixture(scope="module")
def plain(env, tmp_path_factory) -> Path:
    return run(tiny_config(over=OVER), tmp_path_factory.mktemp("plain"), data=env, progress=False)


@pytest.fixture(scope="module")
def tracked(env, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tracked")
    return run(tiny_config(over=OVER), out, data=env, progress=False, log=["tensorboard", "wandb,mlflow"],
               log_group=GROUP)


def _out(d: Path) -> Path:
    return d.parents[3]  # <out>/<dataset>/<partition>/<method>/<run-id>


def _rows(d: Path, name: str = runfolder.ROUNDS) -> list[dict[str, Any]]:
    return runfolder.read_rounds(d, name)


def _numbers(row: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in row.items() if isinstance(v, (int, float)) and k != "round"}


def _plain(obj: Any) -> Any:
    """A checkpoint's contents as comparable values (tensors as dtype, shape and bytes)."""
    if isinstance(obj, torch.Tensor):
        return (str(obj.dtype), tuple(obj.shape), obj.detach().cpu().contiguous().numpy().tobytes())
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def results(d: Path) -> dict[str, Any]:
    """Everything a run folder holds, less what is wall-clock time: the file list; config,
    partition, numerics, the sample grid and every sample byte for byte; rounds and curve rows and
    metrics.json without their wall times; the status without its timestamps; the checkpoints'
    tensors bitwise (their totals without wall time)."""
    out: dict[str, Any] = {"files": sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file())}
    for name in (runfolder.CONFIG, runfolder.PARTITION, runfolder.NUMERICS, runfolder.GRID, runfolder.SAMPLES):
        out[name] = (d / name).read_bytes()
    for name in (runfolder.ROUNDS, runfolder.CURVE):
        out[name] = [runfolder.without_wall_clock(r) for r in _rows(d, name)]
    metrics = json.loads((d / runfolder.METRICS).read_text())
    out[runfolder.METRICS] = {k: v for k, v in metrics.items() if k not in WALL}
    out[runfolder.STATUS] = {k: v for k, v in runfolder.read_status(d).items() if k not in ("updated", "updated_epoch", "started", "started_epoch")}
    for ck in sorted((d / runfolder.CHECKPOINTS).glob("*.pt")):
        state = torch.load(ck, weights_only=True)
        state["totals"] = {k: v for k, v in state["totals"].items() if k != "wall_seconds"}
        out[ck.name] = _plain(state)
    return out


# -- 1. TensorBoard --------------------------------------------------------------------------

def _tensorboard(logdir: Path) -> Any:
    """A log folder as `tensorboard --logdir` reads it: its plugin_event_accumulator (the data
    ingester's), which honours a restart's purge for every summary (the legacy
    event_accumulator.EventAccumulator purges simple-value scalars only, not the tensor summaries
    the trackers write, double precision), every event kept (size guidance 0)."""
    from tensorboard.backend.event_processing import plugin_event_accumulator as pea

    acc = pea.EventAccumulator(str(logdir), size_guidance={pea.TENSORS: 0})
    acc.Reload()
    return acc


def _series(acc: Any, tag: str) -> list[tuple[int, float]]:
    from tensorboard.util import tensor_util

    return [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]


def test_tensorboard_holds_every_round_the_curve_the_final_metrics_the_grid_and_the_config(tracked):
    from PIL import Image
    import io

    d = tracked
    logdir = _out(d) / "trackers" / "tensorboard" / d.relative_to(_out(d))
    assert logdir.is_dir() and list(logdir.glob("events.out.tfevents.*"))
    acc = _tensorboard(logdir)
    rows = _rows(d)
    assert [r["round"] for r in rows] == [1, 2]
    for key in {k for r in rows for k in _numbers(r)}:  # every numeric rounds.jsonl field, once per round, exact
        assert _series(acc, f"round/{key}") == [(r["round"], _numbers(r)[key]) for r in rows if key in _numbers(r)], key
    assert {"round/loss", "round/uplink_bits", "round/downlink_bits", "round/sim_seconds"} <= set(acc.Tags()["tensors"])
    assert acc.SummaryMetadata("round/loss").plugin_data.plugin_name == "scalars"  # shown as scalars
    assert "round/clients" not in acc.Tags()["tensors"]  # lists are left out
    curve = _rows(d, runfolder.CURVE)
    assert [p["round"] for p in curve] == [0, 1, 2]
    assert _series(acc, "curve/fd_fmnist") == [(p["round"], p["value"]) for p in curve]
    assert _series(acc, "curve/fd_fmnist_ci_high") == [(p["round"], p["ci_high"]) for p in curve]
    metrics = json.loads((d / runfolder.METRICS).read_text())
    fd = next(r for r in metrics["evaluations"] if r["metric"] == "fd_fmnist")
    assert _series(acc, "final/fd_fmnist") == [(2, fd["value"])]
    assert _series(acc, "final/fd_fmnist_ci_low") == [(2, fd["ci_low"])]
    assert _series(acc, "final/fd_fmnist_ci_high") == [(2, fd["ci_high"])]
    assert _series(acc, "final/uplink_bits") == [(2, float(metrics["uplink_bits"]))]
    (image,) = acc.Tensors("samples/grid")
    width, height, png = image.tensor_proto.string_val  # the images plugin's tensor: width, height, encoded image
    assert acc.SummaryMetadata("samples/grid").plugin_data.plugin_name == "images"
    shown = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    assert image.step == 2 and (int(width), int(height)) == (shown.shape[1], shown.shape[0])
    assert np.array_equal(shown, np.asarray(Image.open(d / runfolder.GRID).convert("RGB")))
    # the config, flattened, in the HPARAMS tab
    from tensorboard.plugins.hparams import plugin_data_pb2

    start = plugin_data_pb2.HParamsPluginData.FromString(
        acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]).session_start_info
    shown = {k: v.string_value if v.HasField("string_value") else v.bool_value if v.HasField("bool_value")
             else v.number_value for k, v in start.hparams.items()}
    config = json.loads((d / runfolder.CONFIG).read_text())
    assert shown == hyperparameters(config) and shown["run_id"] == d.name and shown["train.rounds"] == 2


# -- 2. MLflow -------------------------------------------------------------------------------

def _mlflow(out: Path) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{out / 'trackers' / 'mlflow.db'}")


def _history(client: Any, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_mlflow_holds_every_round_the_final_metrics_the_config_and_the_tags(tracked, tmp_path):
    d = tracked
    client = _mlflow(_out(d))
    exp = client.get_experiment_by_name(GROUP)
    (r,) = client.search_runs([exp.experiment_id])
    assert r.info.status == "FINISHED"
    assert r.data.tags["dfbench.run_id"] == d.name and r.data.tags["dfbench.run_dir"] == str(d.absolute())
    assert r.data.tags["dfbench.state"] == "done" and r.info.run_name == f"fmnist/iid/fedavg {d.name}"
    config = json.loads((d / runfolder.CONFIG).read_text())
    assert r.data.params == {k: str(v) for k, v in hyperparameters(config).items()}
    assert r.data.params["train.lr"] == "0.001" and r.data.params["eval.metrics"] == "fd_fmnist"
    rows = _rows(d)
    for key in ("loss", "uplink_bits", "downlink_bits", "sim_seconds", "gamma_star"):
        assert _history(client, r.info.run_id, f"round/{key}") == [(row["round"], float(row[key])) for row in rows], key
    curve = _rows(d, runfolder.CURVE)
    assert _history(client, r.info.run_id, "curve/fd_fmnist") == [(p["round"], p["value"]) for p in curve]
    metrics = json.loads((d / runfolder.METRICS).read_text())
    for row in metrics["evaluations"]:
        assert r.data.metrics[f"final/{row['metric']}"] == row["value"]
        for bound in ("ci_low", "ci_high"):
            if row.get(bound) is not None:
                assert r.data.metrics[f"final/{row['metric']}_{bound}"] == row[bound]
    assert _history(client, r.info.run_id, "final/fd_fmnist") == [(2, metrics["evaluations"][0]["value"])]
    grid = client.download_artifacts(r.info.run_id, "samples/grid.png", str(tmp_path))
    assert Path(grid).read_bytes() == (d / runfolder.GRID).read_bytes()
    assert "mlflow-artifacts" in r.info.artifact_uri and str(_out(d)) in r.info.artifact_uri  # not ./mlruns


# -- 3. W&B (offline) ------------------------------------------------------------------------

def wandb_records(path: Path) -> list[Any]:
    """The records of a .wandb file (a LevelDB-style log: a 7-byte header, then 32 KiB blocks of
    records with a crc32, length and type each; a record split over blocks is FIRST..LAST), parsed
    with W&B's own protobufs. (wandb 0.31 dropped its Python reader, wandb.sdk.internal.datastore.)"""
    from wandb.proto import wandb_internal_pb2 as pb

    raw, block, head = path.read_bytes(), 32768, 7
    assert raw[:4] == b":W&B", raw[:7]
    pos, parts, records = head, [], []
    while pos + head <= len(raw):
        if block - pos % block < head:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        crc, size, kind = struct.unpack("<IHB", raw[pos:pos + head])
        data = raw[pos + head:pos + head + size]
        pos += head + size
        if kind == 0:  # zero padding
            continue
        assert crc == zlib.crc32(data, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF, "damaged record"
        parts.append(data)
        if kind in (1, 4):  # FULL, or LAST of a split record
            rec = pb.Record()
            rec.ParseFromString(b"".join(parts))
            records.append(rec)
            parts = []
    return records


def _key(item: Any) -> str:
    return item.key or ".".join(item.nested_key)  # ("samples/grid", "path") -> "samples/grid.path"


def wandb_run(folder: Path) -> dict[str, Any]:
    """One offline run folder: its run record, config, history rows (and merged by round), summary."""
    (path,) = folder.glob("run-*.wandb")
    out: dict[str, Any] = {"run": None, "config": {}, "history": {}, "rows": [], "summary": {}, "exit": None}
    for rec in wandb_records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out["run"] = rec.run
            out["config"].update({u.key: json.loads(u.value_json) for u in rec.run.config.update})
        elif kind == "config":
            out["config"].update({u.key: json.loads(u.value_json) for u in rec.config.update})
        elif kind == "history":  # one row per log call, merged by its round
            row = {_key(i): json.loads(i.value_json) for i in rec.history.item}
            out["rows"].append(row)
            out["history"].setdefault(row["round"], {}).update(row)
        elif kind == "summary":
            out["summary"].update({_key(u): json.loads(u.value_json) for u in rec.summary.update})
        elif kind == "exit":
            out["exit"] = rec.exit
    return out


def _wandb_folders(out: Path) -> list[Path]:
    return sorted((out / "trackers" / "wandb").glob("offline-run-*"))


def test_wandb_offline_run_holds_every_round_the_final_metrics_and_the_config(tracked):
    d = tracked
    (folder,) = _wandb_folders(_out(d))
    w = wandb_run(folder)
    info_id = w["run"].run_id
    assert folder.name.endswith(info_id) and d.name in info_id and len(info_id) <= 64
    assert w["run"].run_group == GROUP and w["run"].project == "dfbench" and d.name in w["run"].display_name
    assert list(w["run"].tags) == [d.name]
    config = json.loads((d / runfolder.CONFIG).read_text())
    got = {k: v for k, v in w["config"].items() if k != "_wandb"}
    assert got == {**config, "run_dir": str(d.absolute())}
    rows = _rows(d)
    for row in rows:  # every numeric rounds.jsonl field at step = round
        logged = {k[len("round/"):]: v for k, v in w["history"][row["round"]].items() if k.startswith("round/")}
        assert logged == _numbers(row)
    for p in _rows(d, runfolder.CURVE):
        assert w["history"][p["round"]]["curve/fd_fmnist"] == p["value"]
    assert w["history"][2]["samples/grid._type"] == "image-file"
    metrics = json.loads((d / runfolder.METRICS).read_text())
    for row in metrics["evaluations"]:
        assert w["summary"][f"final/{row['metric']}"] == row["value"]
        if row.get("ci_low") is not None:
            assert w["summary"][f"final/{row['metric']}_ci_low"] == row["ci_low"]
            assert w["summary"][f"final/{row['metric']}_ci_high"] == row["ci_high"]
    assert w["summary"]["dfbench/state"] == "done" and w["exit"].exit_code == 0


# -- 4. results never depend on trackers -----------------------------------------------------

def test_working_trackers_leave_the_results_identical(tracked, plain):
    assert results(tracked) == results(plain)
    assert not any(p.name == "trackers" for p in tracked.rglob("*"))  # nothing of theirs in the run folder


def test_trackers_that_fail_to_import_start_or_log_are_switched_off_with_one_warning_and_change_nothing(
        env, plain, tmp_path, monkeypatch, caplog):
    from dfbench.benchmark.tracking import mlflow_log, tensorboard_log

    monkeypatch.setattr(base, "_import_warned", set())
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError

    def boom(*a: Any, **k: Any) -> None:
        raise RuntimeError("tracking server unreachable")

    monkeypatch.setattr(mlflow_log.Tracker, "start", boom)
    monkeypatch.setattr(tensorboard_log.Tracker, "log_round", boom)
    caplog.set_level("WARNING", logger="dfbench.tracking")
    d = run(tiny_config(over=OVER), tmp_path, data=env, progress=False, log="wandb,mlflow,tensorboard", log_group=GROUP)
    assert results(d) == results(plain)
    said = [r.getMessage() for r in caplog.records if r.name == "dfbench.tracking"]
    assert len(said) == 3, said
    wandb_msg, mlflow_msg, tb_msg = (next(m for m in said if repr(n) in m) for n in ("wandb", "mlflow", "tensorboard"))
    assert "could not be imported" in wandb_msg and "pip install 'dfbench[wandb]'" in wandb_msg
    assert "failed in start" in mlflow_msg and "tracking server unreachable" in mlflow_msg
    assert "MLFLOW_TRACKING_URI" in mlflow_msg  # the fix
    assert "failed in log_round" in tb_msg  # once, though two rounds were logged: it was off after the first
    assert not (tmp_path / "trackers" / "mlflow.db").exists() and not (tmp_path / "trackers" / "wandb").exists()


def test_a_done_run_logs_nothing_again(tracked, env):
    out = _out(tracked)
    before = sorted(p.relative_to(out).as_posix() + f":{p.stat().st_size}" for p in (out / "trackers").rglob("*")
                    if p.is_file() and p.suffix not in (".log", ".lock"))
    again = run(tiny_config(over=OVER), out, data=env, progress=False, log="tensorboard,wandb,mlflow", log_group=GROUP)
    assert again == tracked
    after = sorted(p.relative_to(out).as_posix() + f":{p.stat().st_size}" for p in (out / "trackers").rglob("*")
                   if p.is_file() and p.suffix not in (".log", ".lock"))
    assert after == before


# -- 5. resume after SIGKILL -----------------------------------------------------------------

RESUME = {"train.rounds": 3, "checkpoint_every": 2}

# A fresh interpreter trains tiny_config(RESUME) with the three trackers and SIGKILLs itself after
# the trackers logged round KILL_AT (its rounds.jsonl row is written, its checkpoint is not).
KILL_SCRIPT = """
import json, os, signal, sys, time
sys.path.insert(0, {tests!r})
import torch
torch.set_num_threads(1)
from conftest import make_imageset
from helpers import tiny_config
from dfbench import datasets
from dfbench.benchmark.engine.lifecycle import run
from dfbench.benchmark.tracking import base

out, kill_at, over, group = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
data = make_imageset()
datasets.load = lambda name, split="train", root=None, **kw: data
log_round = base.Trackers.log_round

def log_then_die(self, step, row):
    log_round(self, step, row)
    if step == kill_at:
        time.sleep(2)  # W&B writes its file every second: die with round KILL_AT on disk everywhere
        os.kill(os.getpid(), signal.SIGKILL)

base.Trackers.log_round = log_then_die
run(tiny_config(over=over), out, data=data, progress=False, log=["tensorboard", "mlflow", "wandb"], log_group=group)
"""


def fresh_env() -> dict[str, str]:
    """The environment of a new command: W&B shares its service process with children through
    WANDB_SERVICE, and a rerun after a SIGKILL is not the child of a process that has one."""
    return {**{k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}, "OMP_NUM_THREADS": "1"}


def test_a_run_killed_and_resumed_continues_its_tracker_runs(env, tmp_path):
    cfg = tiny_config(over=RESUME)
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT.format(tests=str(TESTS)), str(tmp_path), "3",
                           json.dumps(RESUME), GROUP], cwd=TESTS.parent, capture_output=True, text=True, timeout=300,
                          env=fresh_env())
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    d = runfolder.run_dir(tmp_path, cfg)
    assert runfolder.load_checkpoint(d)["round"] == 2 and [r["round"] for r in _rows(d)] == [1, 2, 3]
    logdir = tmp_path / "trackers" / "tensorboard" / d.relative_to(tmp_path)
    assert [s for s, _ in _series(_tensorboard(logdir), "round/loss")] == [1, 2, 3]  # the killed process's, on disk
    client = _mlflow(tmp_path)
    (killed,) = client.search_runs([client.get_experiment_by_name(GROUP).experiment_id])
    assert killed.info.status == "RUNNING"

    assert run(cfg, tmp_path, data=env, progress=False, log=["tensorboard", "mlflow", "wandb"], log_group=GROUP) == d
    rows = _rows(d)
    assert [r["round"] for r in rows] == [1, 2, 3] and runfolder.read_status(d)["state"] == "done"
    # TensorBoard: the redone round 3 is there once (purge_step), every round equal to rounds.jsonl
    acc = _tensorboard(logdir)
    assert len(list(logdir.glob("events.out.tfevents.*"))) == 2
    assert _series(acc, "round/loss") == [(r["round"], r["loss"]) for r in rows]
    assert _series(acc, "round/uplink_bits") == [(r["round"], float(r["uplink_bits"])) for r in rows]
    # MLflow: the same run continued (one run in the experiment), finished; round 3 logged by both
    # processes at step 3 with the same value (resume is bitwise)
    (resumed,) = client.search_runs([client.get_experiment_by_name(GROUP).experiment_id])
    assert resumed.info.run_id == killed.info.run_id and resumed.info.status == "FINISHED"
    assert _history(client, resumed.info.run_id, "round/loss") == sorted(
        [(r["round"], r["loss"]) for r in rows] + [(3, rows[2]["loss"])])
    assert resumed.data.params == killed.data.params
    # W&B offline: a second folder of the same run id, its history from the resumed round on
    first, second = _wandb_folders(tmp_path)
    a, b = wandb_run(first), wandb_run(second)
    wanted = stable_id(base.RunInfo(d.name, d.absolute(), tmp_path, "", GROUP, "", 3))  # from run id and folder
    assert a["run"].run_id == b["run"].run_id == wanted
    assert [h["round"] for h in a["rows"] if "round/loss" in h] == [1, 2, 3]  # up to the kill
    assert [h["round"] for h in b["rows"] if "round/loss" in h] == [3]  # from the checkpoint on
    assert b["history"][3]["round/loss"] == rows[2]["loss"] and b["exit"].exit_code == 0


# -- 6. unknown trackers, grids ----------------------------------------------------------------

def test_unknown_tracker_names_are_refused_before_any_work(env, tmp_path, capsys):
    from dfbench.benchmark.cli import main

    for argv in (["run", "--log", "tensorboard,neptune", "--out", str(tmp_path)],
                 ["run", "--dry-run", "--log", "comet"],
                 ["grid", "demo", "--dry-run", "--log", "mlflow", "--log", "aim", "--out", str(tmp_path)]):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert "argument --log: unknown tracker" in err and "valid: tensorboard, wandb, mlflow" in err
    import dfbench

    with pytest.raises(ConfigError, match="unknown tracker 'tb'.*valid: tensorboard, wandb, mlflow"):
        dfbench.run(out=tmp_path, log="tb", rounds=1)
    with pytest.raises(ConfigError, match="unknown tracker"):
        run(tiny_config(), tmp_path, data=env, progress=False, log=["tensorboard", "TensorBoardX"])
    with pytest.raises(ConfigError, match="unknown tracker"):
        dfbench.run_grid("demo", out=tmp_path, log=["wandb", "sacred"])
    assert list(tmp_path.iterdir()) == []  # nothing was written
    assert base.parse_trackers(["TensorBoard, wandb", "wandb", ""]) == ("tensorboard", "wandb")


def test_a_grid_logs_every_cell_in_its_own_group_and_workers_get_the_trackers(env, tmp_path):
    from dfbench.benchmark.cli import build_parser
    from dfbench.benchmark.grid.spec import load_grid
    from dfbench.benchmark.grid.workers import run_with_workers, worker_argv

    base_keys = {"train.rounds": 1, "data.clients": 2, "data.min_client_size": 4, "train.local_steps": 1,
                 "train.batch_size": 8, "train.model": "tiny", "eval.samples": 4, "eval.grid": 2,
                 "eval.sampler_steps": 2, "eval.metrics": "none"}
    grid = load_grid(write_grid(tmp_path / "g.toml", base_keys, {"seed": [0]}, name="tgrid"))
    argv = worker_argv(grid, tmp_path / "o", log=("tensorboard", "wandb"), log_group="mine")
    assert argv[-5:] == ["--log", "tensorboard,wandb", "--log-group", "mine", "--no-progress"]
    a = build_parser().parse_args(argv)
    assert a.log == [("tensorboard", "wandb")] and a.log_group == "mine"
    summary = run_with_workers(grid, tmp_path / "o", data=env, progress=False, log="wandb")
    assert summary.ok
    (folder,) = _wandb_folders(tmp_path / "o")
    assert wandb_run(folder)["run"].run_group == "tgrid"
