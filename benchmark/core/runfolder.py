"""The run-folder format: the ONE owner of every file name, the run states and the readers.

<out>/<dataset>/<partition>/<method>/<run-id>/
    config.json     the full RunConfig (+ run_id); the folder name is derived from it
    plugin.json     only for a method from outside dfbench: the plugin module that registered it and how
                    it was loaded, so a rerun knows what to load (not part of the config: no run id changes)
    partition.json  per-client sizes and label histograms
    numerics.json   the device numerics of every start of the run (benchmark/core/numerics.py)
    rounds.jsonl    one row per finished round
    metrics.json    evaluations, communication totals, wall time, diagnostics
    rescored.json   metric rows added later by `dfbench eval` (metrics the run's code did not have)
    drift.json      same-noise drift recorded after the run's evaluation (its dense reference finished
                    later: benchmark/metrics/drift.py); metrics.json stays what the evaluation wrote
    grid.png        the fixed-noise sample grid; samples.npz holds every evaluated sample (uint8)
    status.json     running / interrupted / done / failed (error, traceback) / diverged (reason); when it was
                    written (updated, updated_epoch) and when the run first started (started, started_epoch)
    checkpoints/    ckpt-<round>.pt, written atomically; the last two are kept
    .lock           the owner's lock (benchmark/core/lock.py)

Every other module names these files through the constants below, and reads rounds.jsonl
through `read_rounds` (one tolerant rule: a damaged line is skipped with a warning), so
metrics.json and the report are always built from the same rounds.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dfbench.benchmark.core.config import RunConfig
from dfbench.benchmark.core.numerics import cpu_record, device_name
from dfbench.datasets.safeio import follow_umask

# -- file names (the format; change nothing here without a migration) -----------------------
CONFIG = "config.json"
PLUGIN = "plugin.json"  # where a method from a plugin came from (methods/plugins.py `method_origin`)
PARTITION = "partition.json"
NUMERICS = "numerics.json"  # the device numerics of every start of the run (benchmark/core/numerics.py)
ROUNDS = "rounds.jsonl"
CURVE = "curve.jsonl"  # quality-curve points (eval.every), one JSON object per line like rounds.jsonl
#: the fields of a rounds.jsonl / curve.jsonl row that are measured wall-clock times: everything else in a row
#: is a function of the config (bitwise, on one machine), these never are
WALL_CLOCK = ("wall_seconds", "client_train_seconds")


def without_wall_clock(row: dict[str, Any]) -> dict[str, Any]:
    """`row` without its measured wall-clock fields (WALL_CLOCK): what two runs of one config share bit for bit."""
    return {k: v for k, v in row.items() if k not in WALL_CLOCK}
METRICS = "metrics.json"
RESCORED = "rescored.json"  # rows `dfbench eval` added after the run (new metrics); metrics.json stays the run's own
DRIFT = "drift.json"  # drift recorded after the evaluation (the reference finished later); read beside metrics.json
STATUS = "status.json"
SAMPLES = "samples.npz"
SAMPLES_FLOAT = "samples_float.npz"  # ground-truth runs (gmm: data): the samples as drawn, float32, unclipped
GRID = "grid.png"
CHECKPOINTS = "checkpoints"
LOCK = ".lock"

# -- run states (status.json "state") ------------------------------------------------------
RUNNING = "running"  # a process is (or was, if it died without a word) training or evaluating it
INTERRUPTED = "interrupted"  # stopped by a signal (SIGTERM: Slurm time limit, preemption); resumable
DONE = "done"
FAILED = "failed"  # an error; the traceback is in status.json; a rerun resumes from the checkpoint
DIVERGED = "diverged"  # the global model became non-finite; final (the same config diverges again)
STATES = (RUNNING, INTERRUPTED, DONE, FAILED, DIVERGED)
FINAL_STATES = (DONE, DIVERGED)  # a rerun skips these unless forced
RESUMABLE_STATES = (RUNNING, INTERRUPTED, FAILED)  # a rerun continues from the newest checkpoint


def slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in text)


def dataset_folder(cfg: RunConfig) -> str:
    """The run folder's first level: a built-in dataset's name; for data users bring (which records its content
    digest, data.sha256) its kind and digest, e.g. folder-3fa9c2d1e0b4: what the data is, not where it is; a
    ground-truth mixture its canonical spec made file-name safe (gmm-fmnist16-n-60000-rank-8-seed-0-test-10000)."""
    if cfg.data.sha256:
        return f"{slug(cfg.data.dataset.partition(':')[0].strip().lower())}-{cfg.data.sha256[:12]}"
    return slug(cfg.data.dataset).replace("?", "-")


def run_dir(out: str | os.PathLike, cfg: RunConfig) -> Path:
    return Path(out) / dataset_folder(cfg) / slug(cfg.data.partition) / slug(cfg.method) / cfg.run_id()


def nearest_existing(path: str | os.PathLike) -> Path:
    """`path` or its nearest ancestor that exists: where a mkdir -p of `path` would start."""
    probe = Path(path)
    while not os.path.lexists(probe) and probe != probe.parent:
        probe = probe.parent
    return probe


def write_problem(path: str | os.PathLike, flag: str = "--out", target: str | os.PathLike | None = None) -> str | None:
    """Why files cannot be written under `path` (the value of `flag`), or under `target` below it (a run folder,
    made if missing), in one sentence with the fix; None when they can.

    Asked before any work, so a command refuses an unusable `flag` in one line instead of failing deep in its
    first write. The nearest part of `target` (default `path`) that exists must be a folder this process may
    write to: os.access, which says no on a read-only filesystem even to root (a folder merely chmod'ed
    read-only does not stop root; then the write itself is the check, and its error is one line too)."""
    p = Path(path)
    probe = nearest_existing(p if target is None else target)
    culprit = f"{flag} {p}" if probe == p else f"{flag} {p}: {probe}"
    if not probe.is_dir():
        if probe == p:
            return f"{flag} {p} is a file, not a folder; pass a folder as {flag} (a missing one is made), or move the file away"
        return (f"{culprit} is a file, not a folder, so the folders below it cannot be made; pass another {flag} "
                f"(one whose parents are folders), or move the file away")
    if not os.access(probe, os.W_OK | os.X_OK):
        try:
            read_only_fs = bool(os.statvfs(probe).f_flag & os.ST_RDONLY)
        except (OSError, AttributeError):
            read_only_fs = False
        if read_only_fs:
            return f"{culprit} is on a read-only filesystem; pass a {flag} on a writable one"
        return (f"{culprit} is not writable by this user (permission denied); make it writable (chmod -R u+w {probe}) "
                f"or pass another {flag}")
    return None


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over the target (mode as the umask says)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            follow_umask(f.fileno())
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(err, OSError) and err.filename is None:
            err.filename = str(path)  # a failed write (ENOSPC) names the file it was writing
        raise


def write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n").encode())


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def _stamp(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(epoch))


def write_status(d: Path, state: str, **extra: Any) -> None:
    """status.json: the state, when it was written ("updated", "updated_epoch") and when the run began
    ("started", "started_epoch"), which the first status of the folder sets and every later one keeps
    (a resume, `dfbench eval`). A status written before that field existed, or one that does not parse,
    gets none: a resume must not pass its own time off as the run's start (the report's pre-registration
    check, benchmark/report/claims.py, then dates the run by updated_epoch - wall_seconds)."""
    assert state in STATES, state
    now = time.time()  # "updated_epoch": sub-second, so grid workers can tell what a peer wrote after they started
    write_json(d / STATUS, {"state": state, "updated": _stamp(now), "updated_epoch": round(now, 3),
                            **_first_start(d, now), **extra})


def _first_start(d: Path, now: float) -> dict[str, Any]:
    """The started fields the status in `d` keeps: its own, none for a status without them, `now`'s for a first one."""
    path = Path(d) / STATUS
    if not path.exists():
        return {"started": _stamp(now), "started_epoch": round(now, 3)}
    try:
        before = read_json(path)
    except (OSError, ValueError):  # damaged: when the run began is lost, not now
        return {}
    if not isinstance(before, dict) or not isinstance(before.get("started_epoch"), (int, float)):
        return {}
    return {"started": before.get("started") or _stamp(before["started_epoch"]), "started_epoch": before["started_epoch"]}


def read_status(d: Path) -> dict[str, Any] | None:
    p = Path(d) / STATUS
    return read_json(p) if p.exists() else None


def _unparsable(path: Path) -> str | None:
    """What is wrong with `path` as a JSON object file (one phrase), or None if it is one or is not there."""
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        return f"{path.name} does not parse ({err})"
    return None if isinstance(obj, dict) else f"{path.name} is not a JSON object"


def damaged(d: Path) -> str | None:
    """Why the run in `d` is not finished although it may say so, or None.

    A final state counts only while the files it stands on parse: status.json itself, config.json,
    and for "done" metrics.json (a copy cut short, a damaged disk). Every run and grid decides
    "done" through this, so such a run is run again, not skipped. None for a folder without a
    status or with an unfinished one (a rerun resumes those anyway)."""
    status = Path(d) / STATUS
    if (problem := _unparsable(status)) is not None or not status.exists():
        return problem
    state = read_json(status).get("state")
    if state not in FINAL_STATES:
        return None
    names = (CONFIG, METRICS) if state == DONE else (CONFIG,)
    return next((p for p in (_unparsable(Path(d) / n) for n in names) if p is not None), None)


def append_round(d: Path, row: dict[str, Any], name: str = ROUNDS) -> None:
    """Append one row to rounds.jsonl (or `name`, e.g. CURVE), fsynced."""
    try:
        with open(d / name, "a") as f:
            f.write(json.dumps(row, default=_json_default) + "\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:  # a torn last line is skipped when read and dropped at the next start
        if err.filename is None:
            err.filename = str(d / name)
        raise


def read_rounds_checked(d: Path, name: str = ROUNDS) -> tuple[list[dict[str, Any]], list[str]]:
    """(rows of rounds.jsonl in file order, a warning per line that was skipped).

    The one reading rule, for the run's own metrics.json, for resume and for the reporter: a
    line that is not a JSON object (a torn last line after a crash, a damaged byte) is skipped
    and named; the rows around it are kept. Appends are fsynced row by row, and a resume
    rewrites the file up to its checkpoint, so a torn line never outlives the next start.
    `name`: another file of rows (CURVE), read by the same rule.
    """
    p = Path(d) / name
    if not p.exists():
        return [], []
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return [], [f"{name} unreadable: {exc}"]
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"{name} line {number} skipped: {exc}")
            continue
        if not isinstance(row, dict):
            problems.append(f"{name} line {number} skipped: not a JSON object")
            continue
        rows.append(row)
    return rows, problems


def read_rounds(d: Path, name: str = ROUNDS) -> list[dict[str, Any]]:
    """The rows of rounds.jsonl or `name` (damaged lines skipped: see `read_rounds_checked`)."""
    return read_rounds_checked(d, name)[0]


def clear_run_dir(d: Path, keep: tuple[str, ...] = ()) -> None:
    """Delete a run folder's contents except the names in `keep` (--force keeps the run's lock)."""
    import shutil

    if not d.exists():
        return
    for p in d.iterdir():
        if p.name in keep:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def truncate_rounds(d: Path, last_round: int, name: str = ROUNDS) -> None:
    """Keep rows with round <= last_round (the checkpoint's), so a resume never duplicates rows."""
    rows = [r for r in read_rounds(d, name) if isinstance(r.get("round"), int) and r["round"] <= last_round]
    atomic_write_bytes(d / name, "".join(json.dumps(r, default=_json_default) + "\n" for r in rows).encode())


# -- checkpoints ----------------------------------------------------------------------------

def save_checkpoint(d: Path, round_: int, payload: dict[str, Any], keep: int = 2) -> Path:
    ck = d / CHECKPOINTS
    ck.mkdir(parents=True, exist_ok=True)
    path = ck / f"ckpt-{round_:06d}.pt"
    import io

    buf = io.BytesIO()
    torch.save({"round": round_, **payload}, buf)
    atomic_write_bytes(path, buf.getvalue())
    for old in sorted(ck.glob("ckpt-*.pt"))[:-keep]:
        old.unlink()
    return path


def load_checkpoint(d: Path, device: str = "cpu") -> dict[str, Any] | None:
    """The newest readable checkpoint; a truncated or unreadable one falls back to the previous."""
    ck = Path(d) / CHECKPOINTS
    for path in sorted(ck.glob("ckpt-*.pt"), reverse=True):
        try:
            return torch.load(path, map_location=device, weights_only=True)
        except Exception as err:  # noqa: BLE001 - any unreadable file means: try the previous one
            warnings.warn(f"checkpoint {path} is unreadable ({type(err).__name__}: {err}); falling back to the previous one")
    return None


def environment(device: str = "cpu") -> dict[str, Any]:
    """What the run ran on (for metrics.json and the leaderboard header): versions and hardware."""
    import platform
    import subprocess

    import numpy

    cpu = cpu_record()
    dev = device
    if device.startswith("cuda") and torch.cuda.is_available():
        dev = f"{device} ({device_name(device)})"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
                                capture_output=True, text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        # the model alone cannot tell an AVX2 EPYC from an AVX-512 one, whose scores differ: the flags say it
        "hardware": f"{cpu['model']}, {cpu['cores']} cores ({' '.join(cpu['flags']) or 'no vector flags read'}), device {dev}",
        "cpu": cpu,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "dfbench_commit": commit,
    }


# -- the one reader of a tree of run folders ------------------------------------------------

@dataclass(frozen=True)
class RunFolder:
    """One run folder found under a root: its path, and readers of its files that read when called.

    Every module that walks run folders (the report, `dfbench eval`, the studies) takes them from
    `iter_runs`, so what counts as a run folder and how its files are named is decided here alone.
    The readers raise what `read_json` raises (OSError, ValueError) for a file that does not parse;
    a caller that must name such a run rather than stop catches those.
    """

    path: Path

    @property
    def run_id(self) -> str:
        """The folder's name: the run id for every folder `run_dir` named."""
        return self.path.name

    def has(self, name: str) -> bool:
        """Whether the file `name` (one of this module's constants) is in the folder."""
        return (self.path / name).is_file()

    def config(self) -> dict[str, Any]:
        """config.json as written (no defaults filled in, nothing validated)."""
        return read_json(self.path / CONFIG)

    def status(self) -> dict[str, Any] | None:
        """status.json, or None when the run never started."""
        return read_status(self.path)

    def state(self) -> str | None:
        """status.json's "state", or None when there is no status."""
        status = self.status()
        return None if status is None else status.get("state")

    def metrics(self) -> dict[str, Any] | None:
        """metrics.json (the run's own evaluation), or None when the run has not written one."""
        p = self.path / METRICS
        return read_json(p) if p.is_file() else None

    def started(self) -> tuple[float, str] | None:
        """When the run first started (epoch seconds) and how that is known: "recorded" (status.json's
        started_epoch) or, for a run written before that field, "derived" (status.json's updated_epoch minus
        metrics.json's wall_seconds: the latest it can have started, since wall_seconds counts the rounds and
        the evaluation, not the setup or the pauses between a run's starts); None when neither is there."""
        status = self.status() or {}
        if isinstance(status.get("started_epoch"), (int, float)):
            return float(status["started_epoch"]), "recorded"
        wall = (self.metrics() or {}).get("wall_seconds")
        if isinstance(status.get("updated_epoch"), (int, float)) and isinstance(wall, (int, float)):
            return float(status["updated_epoch"]) - float(wall), "derived"
        return None


def iter_runs(root: str | os.PathLike) -> Iterator[RunFolder]:
    """Every run folder (a folder holding config.json) at or under `root`, in sorted path order.

    os.walk, not rglob: grid workers may create and remove folders while a reader walks (an
    emptied run folder is removed when its lock is released); os.walk skips a folder that
    vanished mid-walk, where rglob raises FileNotFoundError. The walk is finished and sorted
    before the first folder is returned, so the order never depends on the file system's.
    A `root` that is not a folder raises FileNotFoundError at the call, not at the first step.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"runs directory {root} does not exist; pass the folder that holds the run folders")
    return iter([RunFolder(Path(d)) for d in sorted(Path(d) for d, _, files in os.walk(root) if CONFIG in files)])
