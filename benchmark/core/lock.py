"""One owner per run folder: an exclusive lock file, a heartbeat, and race-free takeover.

The lock is `<run folder>/.lock`, created with os.open(O_CREAT | O_EXCL): the kernel (or, on
a network filesystem, the server) creates it only if it does not exist, atomically. That is
the one primitive that is exclusive on local filesystems and on the shared ones clusters use
(NFSv3+ exclusive create, Lustre, GPFS, BeeGFS). fcntl/flock locks were not chosen: on NFS
they go through a separate lock manager (lockd) that is often disabled, silently local to a
node ("local_lock=" mount options), or lost when the server restarts; and a lock *file* can be
read by anyone (`dfbench grid --dry-run`, the reporter) to say who owns a run.

The file holds the owner as JSON: host, pid, boot id, start time and a random token. While it
runs, the owner refreshes the file's modification time every `heartbeat` seconds (a daemon
thread; torch releases the GIL, so a busy run still beats), setting it from its own clock so
that readers compare like with like. A lock is stale, and is taken over with a warning, when

    the owner is on this host (same hostname and boot id) and its pid no longer exists or is a
    zombie (exited, not yet reaped by its parent: on Linux, state Z in /proc/<pid>/stat), or
    no heartbeat came for longer than $DFBENCH_LOCK_STALE seconds (default 300), any host.

The second rule covers dead owners on other nodes, a reused pid, and a reboot. It assumes the
nodes' clocks agree to well under the threshold (NTP). A paused owner (SIGSTOP) that loses its
lock notices at its next heartbeat (`RunLock.lost`) and the loop stops writing.

Takeover is race-free: the stale file is renamed to a unique name first (of several
contenders, exactly one rename finds it), the renamed file is checked to be the stale one that
was judged (if another contender had already replaced it with a fresh lock, that lock is linked
back and nothing is taken), and only then is a new lock created with O_EXCL.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dfbench.benchmark.core import runfolder
from dfbench.benchmark.core.parsing import seconds_from_env

LOCK_NAME = runfolder.LOCK  # the run-folder format owns the name
STALE_ENV = "DFBENCH_LOCK_STALE"
DEFAULT_STALE_S = 300.0


class LockHeld(RuntimeError):
    """The run folder belongs to another live process (the message names it)."""

    def __init__(self, message: str, owner: "LockInfo | None" = None) -> None:
        super().__init__(message)  # one positional argument: picklable, so ranks can pass it on
        self.owner = owner


def held_message(folder: Path, owner: "LockInfo") -> str:
    """What a second process on a locked run folder is told."""
    return (f"run folder {folder} is in use by {owner.describe()}; stopping so the run is not trained twice. "
            f"Wait for that process (`dfbench run --wait` waits for it); if it is gone, its lock is taken over "
            f"once stale (same host: as soon as its pid has exited; any host: after ${STALE_ENV} = "
            f"{stale_from_env():g} s without a heartbeat)")


class LockLost(RuntimeError):
    """Another process took this run's lock over (this one was presumed dead): stop writing."""


def stale_from_env(default: float = DEFAULT_STALE_S) -> float:
    """Seconds without a heartbeat after which a lock is stale, from $DFBENCH_LOCK_STALE."""
    return seconds_from_env(STALE_ENV, default)


def _boot_id() -> str:
    """Changes at every reboot (Linux), so a pid from before one is known to be gone."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _zombie(pid: int) -> bool:
    """True when `pid` has exited but its parent has not reaped it yet (Linux: state 'Z' in /proc/<pid>/stat).
    Such a process still answers os.kill(pid, 0) -- a SIGKILLed grid worker whose parent is busy elsewhere
    is one -- yet it will never heartbeat again. False where /proc is not there (the os.kill answer stands)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # "<pid> (<comm>) <state> ...": comm may hold spaces and parentheses, so split after the last ')'
    fields = stat.rpartition(")")[2].split()
    return bool(fields) and fields[0] in ("Z", "X")  # zombie, or dead (seen for a moment while it is reaped)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:  # os.kill(0 or -1, ...) would address a process group, not a process
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return not _zombie(pid)
    return not _zombie(pid)


@dataclass(frozen=True)
class LockInfo:
    """Who holds a lock, as read from its file, and how fresh its heartbeat is."""

    host: str
    pid: int
    started: float  # epoch seconds (the owner's clock)
    heartbeat: float  # epoch seconds of the last heartbeat (the file's mtime)
    token: str
    boot_id: str = ""

    @property
    def since(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))

    def describe(self) -> str:
        return f"host {self.host}, pid {self.pid}, since {self.since}"

    def stale_reason(self, stale_s: float | None = None) -> str | None:
        """Why this lock's owner is presumed gone, or None while it is alive."""
        stale_s = stale_from_env() if stale_s is None else stale_s
        if self.host == socket.gethostname() and self.boot_id == _boot_id():
            if not _pid_alive(self.pid):
                zombie = " (it exited; a zombie its parent has not reaped yet)" if _zombie(self.pid) else ""
                return f"pid {self.pid} no longer exists on this host{zombie}"
        quiet = time.time() - self.heartbeat
        if quiet > stale_s:
            return f"no heartbeat for {quiet:.0f} s (> ${STALE_ENV} = {stale_s:g} s)"
        return None


def read_lock(folder: str | os.PathLike) -> LockInfo | None:
    """The lock of a run folder, or None if it has none. Never raises on a half-written file."""
    return _read(Path(folder) / LOCK_NAME)


def _read(path: Path) -> LockInfo | None:
    for attempt in range(3):
        try:
            text = path.read_text()
            mtime = path.stat().st_mtime
        except FileNotFoundError:
            return None
        except OSError:
            text, mtime = "", time.time()
        try:
            d: dict[str, Any] = json.loads(text)
            return LockInfo(host=str(d["host"]), pid=int(d["pid"]), started=float(d["started"]), heartbeat=mtime,
                            token=str(d["token"]), boot_id=str(d.get("boot_id", "")))
        except (ValueError, KeyError, TypeError):
            if attempt < 2:
                time.sleep(0.05)  # created a moment ago, content not written yet: look again
    # empty or garbled for good (the owner died between create and write): the mtime decides
    return LockInfo(host="?", pid=-1, started=mtime, heartbeat=mtime, token="")


class RunLock:
    """The lock of one run folder. `acquire()` or `try_acquire()`, then `release()` (or `with`)."""

    def __init__(self, folder: str | os.PathLike, *, stale_s: float | None = None, heartbeat_s: float | None = None) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.stale_s = stale_from_env() if stale_s is None else float(stale_s)
        self.heartbeat_s = heartbeat_s if heartbeat_s is not None else max(0.2, min(30.0, self.stale_s / 10))
        self.token = ""
        self.created: list[Path] = []  # the folders try_acquire made, deepest first
        self._lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def held(self) -> bool:
        return bool(self.token)

    @property
    def lost(self) -> bool:
        """True once another process has taken this lock over (seen at a heartbeat)."""
        return self._lost.is_set()

    def try_acquire(self) -> bool:
        """Take the lock if it is free or stale (with a warning); False if a live owner holds it."""
        if self.held:
            raise RuntimeError(f"{self.path} is already held by this RunLock")
        for _ in range(20):  # a few rounds of races (folder removed, lock released or replaced meanwhile)
            if not self.folder.exists():
                missing = [p for p in (self.folder, *self.folder.parents) if not p.exists()]
                try:
                    self.folder.mkdir(parents=True, exist_ok=True)
                except FileNotFoundError:
                    continue  # a parent was removed meanwhile by a releasing owner: again
                self.created = missing  # deepest first; removed again on release if still empty
            if self._create():
                self._start_heartbeat()
                return True
            owner = _read(self.path)
            if owner is None:
                continue  # released between our create and our read: try again
            reason = owner.stale_reason(self.stale_s)
            if reason is None:
                return False
            if self._take_over(owner):
                warnings.warn(f"took over the stale lock of {self.folder} from {owner.describe()}: {reason}", stacklevel=2)
                self._start_heartbeat()
                return True
        return False

    def acquire(self, *, wait: bool = False, poll_s: float = 2.0) -> None:
        """Take the lock; if a live owner holds it, raise LockHeld, or with wait=True poll until free."""
        while not self.try_acquire():
            if not wait:
                owner = _read(self.path) or LockInfo("?", -1, time.time(), time.time(), "")
                raise LockHeld(held_message(self.folder, owner), owner)
            time.sleep(poll_s)

    def release(self) -> None:
        """Stop the heartbeat and remove the lock file if it is still ours; safe to call twice."""
        if not self.held:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        current = _read(self.path)
        if current is not None and current.token == self.token:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
        self.token = ""
        # leave no empty folders behind (a run that failed before writing anything creates none)
        for p in self.created:
            try:
                p.rmdir()
            except OSError:
                break  # not empty (the run wrote something, or another run lives beside it), or gone
        self.created = []

    def __enter__(self) -> "RunLock":
        if not self.held:
            self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    # -- internals --------------------------------------------------------------------------------

    def _create(self) -> bool:
        """O_EXCL-create the lock file with our identity in it; False if it exists."""
        token = uuid.uuid4().hex
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        except FileNotFoundError:  # the (empty) folder was just removed by a releasing owner
            return False
        now = time.time()
        body = {"host": socket.gethostname(), "pid": os.getpid(), "boot_id": _boot_id(), "started": now, "token": token}
        try:
            os.write(fd, (json.dumps(body) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        self.token = token
        self._lost.clear()
        self._stop.clear()
        return True

    def _take_over(self, stale: LockInfo) -> bool:
        """Move the stale lock aside (one contender wins), check it was the one judged, create ours."""
        aside = self.folder / f"{LOCK_NAME}.stale-{uuid.uuid4().hex}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False  # another contender moved it first
        moved = _read(aside)
        if moved is not None and moved.token != stale.token:
            # we moved a fresh lock that a faster contender had just created: put it back
            try:
                os.link(aside, self.path)
            except FileExistsError:
                pass  # a third process created one meanwhile; the moved owner sees `lost` at its heartbeat
            aside.unlink(missing_ok=True)
            return False
        aside.unlink(missing_ok=True)
        return self._create()

    def _start_heartbeat(self) -> None:
        self._thread = threading.Thread(target=self._beat, name=f"dfbench-lock-heartbeat {self.folder.name}", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            current = _read(self.path)
            if current is None or current.token != self.token:
                self._lost.set()  # taken over: the loop checks `lost` before it writes again
                return
            now = time.time()
            try:
                os.utime(self.path, (now, now))  # explicit time: the owner's clock, as readers compare with theirs
            except OSError:
                pass  # a transient filesystem error: the next beat tries again
