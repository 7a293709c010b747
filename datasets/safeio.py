"""Hardened readers for untrusted container formats (pickles, tar archives), and the mode of written files.

Both are only ever applied to bytes whose checksum has already been verified against a
published value (see :mod:`datasets.sources`); these guards are the second line of defence
for the case where a checksum table was overridden or the published file itself is hostile.

* :func:`safe_unpickle` runs a :class:`pickle.Unpickler` whose ``find_class`` resolves
  exactly the globals that numpy needs to rebuild a plain ``ndarray`` and refuses every
  other global (so ``os.system``, ``builtins.eval``, ``subprocess.Popen``... never load and
  no ``__reduce__`` payload can run). Plain containers (dict, list, tuple, str, bytes, int,
  float) need no globals at all.
* :func:`check_tar_member` / :func:`safe_extract` / :func:`read_tar_members` refuse absolute
  paths, ``..`` components, symbolic and hard links, devices and FIFOs. :func:`safe_extract`
  checks *every* member before it writes anything, then extracts with tarfile's ``"data"``
  filter as well.
* :func:`follow_umask` gives a file made by ``tempfile.mkstemp`` (always ``-rw-------``) the mode
  ``open()`` would have given it, so the atomic writers (write a temporary file, rename it over
  the target) leave files a group or a web server can read where the umask says so.
"""
from __future__ import annotations

import io
import os
import pickle
import re
import shutil
import tarfile
from pathlib import Path, PurePosixPath
from typing import Iterable

import numpy as np

from .errors import DatasetError

__all__ = [
    "UnsafePickleError",
    "UnsafeArchiveError",
    "ALLOWED_PICKLE_GLOBALS",
    "safe_unpickle",
    "check_tar_member",
    "safe_extract",
    "read_tar_members",
    "follow_umask",
]

try:  # numpy >= 2 (and the 1.26 forward-compat alias)
    from numpy._core import multiarray as _multiarray
    from numpy._core import numeric as _numeric
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core import multiarray as _multiarray  # type: ignore[no-redef]
    from numpy.core import numeric as _numeric  # type: ignore[no-redef]


class UnsafePickleError(DatasetError):
    """A pickle referenced a global outside the numpy-array allowlist."""


class UnsafeArchiveError(DatasetError):
    """An archive member would escape the target folder or is not a plain file/folder."""


# Exactly what numpy needs to rebuild an ndarray, keyed by the (module, name) pair written in
# the pickle. Checked in practice:
#   * the CIFAR-10 python batches (Python 2 cPickle, numpy 1.x): numpy.core.multiarray._reconstruct,
#     numpy.ndarray, numpy.dtype
#   * numpy 2 with pickle protocol 2-4: numpy._core.multiarray._reconstruct, numpy.ndarray, numpy.dtype
#   * protocol 5 (the Python 3.8+ default): numpy._core.numeric._frombuffer (numpy 1.x: numpy.core...)
# Protocol 2 written by Python 3 also needs ``_codecs.encode`` for bytes; it is deliberately NOT
# allowed (no published file needs it) - re-pickle such files with protocol >= 3.
ALLOWED_PICKLE_GLOBALS: dict[tuple[str, str], object] = {
    ("numpy.core.multiarray", "_reconstruct"): _multiarray._reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _multiarray._reconstruct,
    ("numpy.core.numeric", "_frombuffer"): _numeric._frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _numeric._frombuffer,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # noqa: D401 - pickle hook
        try:
            return ALLOWED_PICKLE_GLOBALS[(module, name)]
        except KeyError:
            raise UnsafePickleError(
                f"refused to load global {module}.{name}: only numpy array constructors "
                f"({', '.join(sorted(f'{m}.{n}' for m, n in ALLOWED_PICKLE_GLOBALS))}) are allowed"
            ) from None

    def persistent_load(self, pid):  # pragma: no cover - no published file uses it
        raise UnsafePickleError("refused a persistent id: not allowed in data files")


def safe_unpickle(data: bytes, *, encoding: str = "latin1"):
    """Unpickle ``data`` allowing only plain containers and numpy arrays.

    ``encoding="latin1"`` reads Python 2 pickles (the CIFAR batches) the way numpy expects.
    Raises :class:`UnsafePickleError` for a forbidden global; other malformed input raises
    whatever :mod:`pickle` raises (``UnpicklingError``, ``EOFError``, ...).
    """
    return _RestrictedUnpickler(io.BytesIO(data), encoding=encoding).load()


# ---------------------------------------------------------------------------------------------
# tar archives

_DRIVE = re.compile(r"^[A-Za-z]:")
_FILTER_ERROR = getattr(tarfile, "FilterError", UnsafeArchiveError)


def _member_kind(m: tarfile.TarInfo) -> str:
    if m.issym():
        return f"symbolic link -> {m.linkname!r}"
    if m.islnk():
        return f"hard link -> {m.linkname!r}"
    if m.ischr():
        return "character device"
    if m.isblk():
        return "block device"
    if m.isfifo():
        return "FIFO"
    return f"tar type {m.type!r}"


def check_tar_member(member: tarfile.TarInfo, dest: str | os.PathLike | None = None) -> str:
    """Return the member's normalised relative path, or raise :class:`UnsafeArchiveError`.

    Refuses empty names, NUL bytes, absolute paths (``/x``, ``\\x``, ``C:x``), any ``..``
    component, and every member that is not a regular file or a directory (symbolic/hard
    links, devices, FIFOs). With ``dest`` given, also refuses a path whose real location
    (following symlinks already present under ``dest``) would lie outside ``dest``.
    """
    name = member.name
    if not name or "\x00" in name:
        raise UnsafeArchiveError(f"archive member {name!r}: empty name or NUL byte")
    norm = name.replace("\\", "/")
    if norm.startswith("/") or _DRIVE.match(norm) or os.path.isabs(name):
        raise UnsafeArchiveError(f"archive member {name!r}: absolute path")
    parts = norm.split("/")
    if ".." in parts:
        raise UnsafeArchiveError(f"archive member {name!r}: '..' path component")
    if not (member.isreg() or member.isdir()):
        raise UnsafeArchiveError(
            f"archive member {name!r}: {_member_kind(member)}; only regular files and folders are allowed"
        )
    rel = str(PurePosixPath(*[p for p in parts if p not in ("", ".")])) if norm.strip("/.") else "."
    if dest is not None:
        root = os.path.realpath(dest)
        target = os.path.realpath(os.path.join(root, rel))
        if os.path.commonpath([root, target]) != root:
            raise UnsafeArchiveError(f"archive member {name!r}: resolves to {target}, outside {root}")
    return rel


def _open_tar(archive: str | os.PathLike | bytes) -> tarfile.TarFile:
    try:
        if isinstance(archive, (bytes, bytearray, memoryview)):
            return tarfile.open(fileobj=io.BytesIO(bytes(archive)), mode="r:*")
        return tarfile.open(os.fspath(archive), mode="r:*")
    except (tarfile.TarError, OSError, EOFError) as e:
        raise DatasetError(f"cannot read tar archive {_label(archive)}: {e}") from e


def _label(archive) -> str:
    return "<in-memory>" if isinstance(archive, (bytes, bytearray, memoryview)) else os.fspath(archive)


def safe_extract(
    archive: str | os.PathLike | bytes,
    dest: str | os.PathLike,
    *,
    max_total_bytes: int = 4 << 30,
) -> list[Path]:
    """Extract ``archive`` (path or bytes, any tar compression) into ``dest``.

    Every member is checked with :func:`check_tar_member` and the total size is bounded
    BEFORE anything is written; extraction itself then runs with tarfile's ``"data"`` filter.
    Returns the extracted paths. Raises :class:`UnsafeArchiveError` / :class:`DatasetError`.
    """
    dest_path = Path(dest)
    dest_path.mkdir(parents=True, exist_ok=True)
    root = os.path.realpath(dest_path)
    with _open_tar(archive) as tf:
        try:
            members = tf.getmembers()
        except (tarfile.TarError, OSError, EOFError) as e:
            raise DatasetError(f"cannot read tar archive {_label(archive)}: {e}") from e
        total = 0
        rels = []
        for m in members:
            rels.append(check_tar_member(m, root))
            total += max(int(m.size), 0)
        if total > max_total_bytes:
            raise UnsafeArchiveError(
                f"archive {_label(archive)} would extract {total} bytes (limit {max_total_bytes})"
            )
        try:
            if hasattr(tarfile, "data_filter"):
                tf.extractall(root, members=members, filter="data")
            else:  # pragma: no cover - Python < 3.11.4: members are already vetted
                for m, rel in zip(members, rels):
                    target = Path(root, rel)
                    if m.isdir():
                        target.mkdir(parents=True, exist_ok=True)
                        continue
                    target.parent.mkdir(parents=True, exist_ok=True)
                    src = tf.extractfile(m)
                    assert src is not None
                    with src, open(target, "wb") as out:
                        shutil.copyfileobj(src, out)
        except _FILTER_ERROR as e:
            raise UnsafeArchiveError(f"archive {_label(archive)}: {e}") from e
        except (tarfile.TarError, OSError, EOFError) as e:
            raise DatasetError(f"extracting {_label(archive)} into {root} failed: {e}") from e
    return [Path(root, r) for r in rels]


def read_tar_members(archive: str | os.PathLike | bytes, wanted: Iterable[str]) -> dict[str, bytes]:
    """Read the regular-file members named in ``wanted`` (normalised relative paths) into
    memory, without writing anything. Every member of the archive is vetted with
    :func:`check_tar_member`; one unsafe member refuses the whole archive."""
    wanted = set(wanted)
    out: dict[str, bytes] = {}
    with _open_tar(archive) as tf:
        try:
            for m in tf:
                rel = check_tar_member(m)
                if rel in wanted and m.isreg():
                    f = tf.extractfile(m)
                    assert f is not None
                    with f:
                        out[rel] = f.read()
        except (tarfile.TarError, OSError, EOFError) as e:
            raise DatasetError(f"cannot read tar archive {_label(archive)}: {e}") from e
    return out


def _umask() -> int:
    """The process umask, read without changing it where Linux tells it (os.umask can only be read by setting it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore (a thread creating a file meanwhile gets 0o022)
    os.umask(mask)
    return mask


def follow_umask(fd: int) -> None:
    """chmod the open file `fd` to 0o666 less the umask: the mode a plain ``open(path, "w")`` creates.

    ``tempfile.mkstemp`` creates its file 0o600 whatever the umask (it is meant to be private);
    an atomic writer renames that file over its target, which would then be private too."""
    os.fchmod(fd, 0o666 & ~_umask())
