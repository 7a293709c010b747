"""datasets.safeio: the restricted unpickler and the tar-archive guards."""
from __future__ import annotations

import io
import os
import pickle
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest

from dfbench.datasets import DatasetError
from dfbench.datasets.safeio import (
    ALLOWED_PICKLE_GLOBALS,
    UnsafeArchiveError,
    UnsafePickleError,
    read_tar_members,
    safe_extract,
    safe_unpickle,
)


# ---------------------------------------------------------------------------------------------
# pickles


@pytest.mark.parametrize("protocol", [3, 4, 5])
def test_numpy_arrays_and_plain_containers_load(protocol):
    obj = {"data": np.arange(3072 * 2, dtype=np.uint8).reshape(2, 3072) % 251,
           "labels": [1, 2], "name": "batch", b"raw": b"\x00\x01", "t": (1.5, None, True)}
    out = safe_unpickle(pickle.dumps(obj, protocol=protocol))
    np.testing.assert_array_equal(out["data"], obj["data"])
    assert out["labels"] == [1, 2] and out["name"] == "batch" and out[b"raw"] == b"\x00\x01"
    assert out["t"] == (1.5, None, True)


def test_allowlist_is_exactly_numpy_array_reconstruction():
    assert set(ALLOWED_PICKLE_GLOBALS) == {
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
        ("numpy", "ndarray"), ("numpy", "dtype"),
    }


class _Reduce:
    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


@pytest.mark.parametrize("fn,args", [
    (os.system, ("touch {marker}",)),
    (subprocess.call, (["touch", "{marker}"],)),
    (eval, ("open({marker!r}, 'w').close()",)),
    (exec, ("open({marker!r}, 'w').close()",)),
    (np.save, ("{marker}", np.zeros(1))),
    (open, ("{marker}", "w")),
])
def test_code_execution_refused(tmp_path, fn, args):
    marker = str(tmp_path / "marker")
    args = tuple(a.format(marker=marker) if isinstance(a, str)
                 else [x.format(marker=marker) for x in a] if isinstance(a, list) else a for a in args)
    blob = pickle.dumps({"data": _Reduce(fn, args)})
    with pytest.raises(UnsafePickleError, match="refused to load global"):
        safe_unpickle(blob)
    assert not os.path.exists(marker)
    assert issubclass(UnsafePickleError, DatasetError)


def test_protocol2_codecs_global_refused():
    # Python 3 writes bytes in protocol 2 via _codecs.encode; no published file needs it.
    with pytest.raises(UnsafePickleError, match="_codecs.encode"):
        safe_unpickle(pickle.dumps(b"\x00\x01", protocol=2))


# ---------------------------------------------------------------------------------------------
# tar archives


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            else:
                tf.addfile(info)
    return path


def _file(name: str) -> tarfile.TarInfo:
    return tarfile.TarInfo(name)


def _link(name: str, target: str, kind=tarfile.SYMTYPE) -> tarfile.TarInfo:
    t = tarfile.TarInfo(name)
    t.type, t.linkname = kind, target
    return t


def _dev(name: str, kind) -> tarfile.TarInfo:
    t = tarfile.TarInfo(name)
    t.type = kind
    return t


def _tree(p: Path) -> list[str]:
    return sorted(str(q.relative_to(p)) for q in p.rglob("*")) if p.exists() else []


@pytest.mark.parametrize("bad,reason", [
    ((_file("../escaped.txt"), b"x"), "'..'"),
    ((_file("ok/../../escaped.txt"), b"x"), "'..'"),
    ((_file("/tmp/dfbench-abs-escape.txt"), b"x"), "absolute"),
    ((_link("ok/link", "../../escaped.txt"), None), "symbolic link"),
    ((_link("ok/abs-link", "/etc/passwd"), None), "symbolic link"),
    ((_link("ok/hard", "/etc/passwd", tarfile.LNKTYPE), None), "hard link"),
    ((_dev("ok/dev", tarfile.CHRTYPE), None), "character device"),
    ((_dev("ok/blk", tarfile.BLKTYPE), None), "block device"),
    ((_dev("ok/fifo", tarfile.FIFOTYPE), None), "FIFO"),
])
def test_unsafe_archives_refused_before_writing(tmp_path, bad, reason):
    # a harmless first member proves nothing is written before the whole archive is checked
    arc = _tar(tmp_path / "a.tar.gz", [(_file("ok/first.txt"), b"first"), bad, (_file("ok/last.txt"), b"z")])
    dest = tmp_path / "work" / "dest"
    dest.mkdir(parents=True)
    with pytest.raises(UnsafeArchiveError, match=reason):
        safe_extract(arc, dest)
    assert _tree(dest) == []
    assert _tree(tmp_path / "work") == ["dest"]
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "work" / "escaped.txt").exists()
    assert not Path("/tmp/dfbench-abs-escape.txt").exists()
    with pytest.raises(UnsafeArchiveError, match=reason):  # the in-memory reader refuses too
        read_tar_members(arc.read_bytes(), {"ok/first.txt"})


def test_symlink_already_in_destination_is_not_followed(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (dest / "sub").symlink_to(outside)
    arc = _tar(tmp_path / "a.tar", [(_file("sub/x.txt"), b"x")])
    with pytest.raises(UnsafeArchiveError, match="outside"):
        safe_extract(arc, dest)
    assert _tree(outside) == []


def test_safe_archive_extracts(tmp_path):
    d = tarfile.TarInfo("top")
    d.type = tarfile.DIRTYPE
    arc = _tar(tmp_path / "a.tar.gz", [(d, None), (_file("top/a.bin"), b"abc"), (_file("./top/b/c.bin"), b"de")])
    dest = tmp_path / "dest"
    out = safe_extract(arc, dest)
    assert (dest / "top" / "a.bin").read_bytes() == b"abc"
    assert (dest / "top" / "b" / "c.bin").read_bytes() == b"de"
    assert {p.relative_to(dest.resolve()).as_posix() for p in out} == {"top", "top/a.bin", "top/b/c.bin"}
    assert read_tar_members(arc.read_bytes(), {"top/b/c.bin"}) == {"top/b/c.bin": b"de"}


def test_size_limit_and_garbage(tmp_path):
    arc = _tar(tmp_path / "a.tar", [(_file("big.bin"), b"x" * 1000)])
    with pytest.raises(UnsafeArchiveError, match="limit"):
        safe_extract(arc, tmp_path / "d", max_total_bytes=999)
    assert _tree(tmp_path / "d") == []
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not an archive at all" * 10)
    with pytest.raises(DatasetError, match="cannot read tar archive"):
        safe_extract(junk, tmp_path / "d")
