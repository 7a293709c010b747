"""datasets.sources: locating, verifying and decoding Fashion-MNIST, CIFAR-10 and SVHN.

Real Fashion-MNIST comes from the Debian package dataset-fashion-mnist (tests that need it are
skipped when it is not installed). CIFAR-10 and SVHN are not on the machine: small files in
the real formats are generated, and their digests registered by monkeypatching CHECKSUMS.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import shutil
import struct
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch

from dfbench import datasets
from dfbench.datasets import DATASETS, DatasetError, ImageSet, data_info, load
from dfbench.datasets import sources
from dfbench.datasets.sources import download_files
from http_files import serve

FMNIST_SYS = Path("/usr/share/datasets/fashion-mnist")
needs_fmnist = pytest.mark.skipif(
    not (FMNIST_SYS / "train-images-idx3-ubyte.gz").is_file(),
    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)",
)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """No user data root, a private download cache, an empty decode cache."""
    monkeypatch.delenv("DFBENCH_DATA", raising=False)
    monkeypatch.setenv("DFBENCH_CACHE", str(tmp_path / "cache"))
    sources.clear_cache()
    yield
    sources.clear_cache()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def trust(monkeypatch, name: str, logical: str, data: bytes | Path) -> None:
    """Register the digest of a generated test file (the documented test hook)."""
    if isinstance(data, Path):
        data = data.read_bytes()
    monkeypatch.setitem(sources.CHECKSUMS[name], logical, ("sha256", sha256(data)))


# ---------------------------------------------------------------------------------------------
# API surface


def test_public_api():
    assert DATASETS == ("fmnist", "svhn", "cifar10")
    assert issubclass(DatasetError, ValueError)
    for name in ("load", "data_info", "partition", "parse_partition", "Partition", "ImageSet"):
        assert hasattr(datasets, name)


@pytest.mark.parametrize("name,channels,size", [("fmnist", 1, 28), ("svhn", 3, 32), ("cifar10", 3, 32)])
def test_data_info(name, channels, size):
    info = data_info(name)
    assert info["name"] == name
    assert (info["channels"], info["size"], info["num_classes"]) == (channels, size, 10)
    assert info["image_shape"] == (channels, size, size)
    assert len(info["classes"]) == 10
    for split in ("train", "test"):
        for f in info["files"][split]:
            algo, digest = info["checksums"][f].split(":")
            assert algo in ("sha256", "md5") and len(digest) in (64, 32)
    assert info["how_to_get"]
    # a copy: editing it does not touch the verified table
    info["checksums"].clear()
    assert sources.CHECKSUMS[name]


def test_data_info_fmnist_sha256():
    assert data_info("fmnist")["sha256"] == {
        "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
        "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
        "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
        "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
    }
    assert "apt-get install dataset-fashion-mnist" in data_info("fmnist")["how_to_get"]


def test_published_cifar_svhn_md5s_recorded():
    # torchvision's CIFAR10 / SVHN classes list the authors' md5s; ours must be the same.
    from torchvision.datasets import CIFAR10, SVHN

    c = sources.CHECKSUMS["cifar10"]
    assert c["cifar-10-python.tar.gz"] == ("md5", CIFAR10.tgz_md5)
    for fname, md5 in CIFAR10.train_list + CIFAR10.test_list:
        assert c[fname] == ("md5", md5)
    for split in ("train", "test"):
        _, fname, md5 = SVHN.split_list[split]
        assert sources.CHECKSUMS["svhn"][fname] == ("md5", md5)


def test_bad_name_and_split():
    with pytest.raises(DatasetError, match="unknown dataset 'mnist'.*fmnist, svhn, cifar10"):
        load("mnist")
    with pytest.raises(DatasetError, match="unknown split 'val'.*train, test"):
        load("fmnist", "val")


# ---------------------------------------------------------------------------------------------
# Fashion-MNIST (real files)


@needs_fmnist
def test_debian_files_match_published_sha256():
    for logical, (algo, digest) in sources.CHECKSUMS["fmnist"].items():
        assert algo == "sha256"
        with gzip.open(FMNIST_SYS / f"{logical}.gz") as f:
            assert sha256(f.read()) == digest, logical


@needs_fmnist
@pytest.mark.parametrize("split,n", [("train", 60000), ("test", 10000)])
def test_fmnist_real(split, n):
    t0 = time.perf_counter()
    ds = load("fmnist", split)
    first = time.perf_counter() - t0
    assert isinstance(ds, ImageSet)
    assert (ds.name, ds.split, ds.num_classes) == ("fmnist", split, 10)
    assert ds.images.shape == (n, 1, 28, 28) and ds.images.dtype == torch.uint8
    assert ds.images.is_contiguous()
    assert ds.labels.shape == (n,) and ds.labels.dtype == torch.int64
    assert ds.labels.min() == 0 and ds.labels.max() == 9
    assert torch.bincount(ds.labels).tolist() == [n // 10] * 10
    assert len(ds) == n
    assert len(ds.sha256) == 64
    assert ds.source == str(FMNIST_SYS)
    assert ds.images.float().mean() > 50  # real pixels, not zeros
    assert first < 10, f"loading took {first:.1f}s"
    t0 = time.perf_counter()
    again = load("fmnist", split)
    assert again is ds and time.perf_counter() - t0 < 0.1  # in-process cache


@needs_fmnist
def test_fmnist_uncompressed_copy_in_subfolder(tmp_path):
    raw = tmp_path / "data" / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for f in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        with gzip.open(FMNIST_SYS / f"{f}.gz") as src:
            (raw / f).write_bytes(src.read())
    copy = load("fmnist", "test", root=tmp_path / "data")
    sysv = load("fmnist", "test")
    assert copy.source == str(raw)
    assert copy.sha256 == sysv.sha256  # identity is over the verified content, not the wrapper
    assert torch.equal(copy.images, sysv.images) and torch.equal(copy.labels, sysv.labels)


@needs_fmnist
def test_fmnist_env_var_root(tmp_path, monkeypatch):
    d = tmp_path / "envroot" / "fashion-mnist"
    d.mkdir(parents=True)
    for f in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(FMNIST_SYS / f, d / f)
    monkeypatch.setenv("DFBENCH_DATA", str(tmp_path / "envroot"))
    assert load("fmnist", "test").source == str(d)
    assert sources.locate("fmnist", "test") == d


def _copy_fmnist_test(dst: Path) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for f in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(FMNIST_SYS / f, dst / f)
    return dst


def _flip(path: Path, offset: int) -> None:
    b = bytearray(path.read_bytes())
    b[offset] ^= 0x01
    path.write_bytes(bytes(b))


@needs_fmnist
def test_fmnist_corrupted_gz(tmp_path):
    d = _copy_fmnist_test(tmp_path / "fm")
    target = d / "t10k-images-idx3-ubyte.gz"
    _flip(target, target.stat().st_size // 2)
    with pytest.raises(DatasetError) as e:
        load("fmnist", "test", root=d)
    msg = str(e.value)
    assert "t10k-images-idx3-ubyte" in msg
    assert "apt-get install dataset-fashion-mnist" in msg and "--data-root" in msg


@needs_fmnist
def test_fmnist_corrupted_raw_idx_names_expected_digest(tmp_path):
    d = tmp_path / "fm"
    d.mkdir()
    shutil.copy(FMNIST_SYS / "t10k-images-idx3-ubyte.gz", d)
    with gzip.open(FMNIST_SYS / "t10k-labels-idx1-ubyte.gz") as f:
        labels = bytearray(f.read())
    labels[100] = (labels[100] + 1) % 10  # still a valid label: only the checksum can tell
    (d / "t10k-labels-idx1-ubyte").write_bytes(bytes(labels))
    with pytest.raises(DatasetError) as e:
        load("fmnist", "test", root=d)
    msg = str(e.value)
    assert "t10k-labels-idx1-ubyte" in msg and "checksum mismatch" in msg
    assert sources.CHECKSUMS["fmnist"]["t10k-labels-idx1-ubyte"][1] in msg
    assert "apt-get install dataset-fashion-mnist" in msg


@needs_fmnist
def test_fmnist_truncated_gz(tmp_path):
    d = _copy_fmnist_test(tmp_path / "fm")
    target = d / "t10k-labels-idx1-ubyte.gz"
    target.write_bytes(target.read_bytes()[:2000])
    with pytest.raises(DatasetError, match="t10k-labels-idx1-ubyte.gz.*(corrupted|truncated)"):
        load("fmnist", "test", root=d)


@needs_fmnist
def test_fmnist_missing_file(tmp_path):
    d = tmp_path / "fm"
    d.mkdir()
    shutil.copy(FMNIST_SYS / "t10k-images-idx3-ubyte.gz", d)
    with pytest.raises(DatasetError) as e:
        load("fmnist", "test", root=d)
    msg = str(e.value)
    assert "t10k-labels-idx1-ubyte" in msg and "missing" in msg and str(d) in msg
    assert "apt-get install dataset-fashion-mnist" in msg


def test_fmnist_nothing_at_root(tmp_path):
    with pytest.raises(DatasetError) as e:
        load("fmnist", "train", root=tmp_path / "empty")
    msg = str(e.value)
    assert "not found" in msg and "train-images-idx3-ubyte" in msg and str(tmp_path / "empty") in msg
    assert "apt-get install dataset-fashion-mnist" in msg and "DFBENCH_DATA" in msg
    assert "download=True" in msg


def _idx(dims: tuple[int, ...], payload: bytes) -> bytes:
    return struct.pack(">I", 0x0800 | len(dims)) + struct.pack(f">{len(dims)}I", *dims) + payload


def test_fmnist_idx_layout_errors(tmp_path, monkeypatch):
    """Files that pass a (patched) checksum but are not valid idx files give clear errors."""
    d = tmp_path / "fm"
    d.mkdir()
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, (5, 28, 28), dtype=np.uint8).tobytes()
    labs = bytes([1, 2, 3, 4, 5])
    cases = {
        "magic": (struct.pack(">I", 0x0D03) + _idx((5, 28, 28), imgs)[4:], "magic number"),
        "dims": (_idx((5, 27, 28), imgs[: 5 * 27 * 28]), "dimensions"),
        "truncated": (_idx((5, 28, 28), imgs[:-10]), "truncated"),
    }
    (d / "t10k-labels-idx1-ubyte").write_bytes(_idx((5,), labs))
    trust(monkeypatch, "fmnist", "t10k-labels-idx1-ubyte", d / "t10k-labels-idx1-ubyte")
    for blob, expect in cases.values():
        (d / "t10k-images-idx3-ubyte").write_bytes(blob)
        trust(monkeypatch, "fmnist", "t10k-images-idx3-ubyte", blob)
        with pytest.raises(DatasetError, match=f"t10k-images-idx3-ubyte.*{expect}"):
            load("fmnist", "test", root=d)
    # a valid pair loads (and labels out of range are refused)
    (d / "t10k-images-idx3-ubyte").write_bytes(_idx((5, 28, 28), imgs))
    trust(monkeypatch, "fmnist", "t10k-images-idx3-ubyte", _idx((5, 28, 28), imgs))
    ds = load("fmnist", "test", root=d)
    assert ds.images.shape == (5, 1, 28, 28) and ds.labels.tolist() == [1, 2, 3, 4, 5]
    bad = _idx((5,), bytes([1, 2, 3, 4, 12]))
    (d / "t10k-labels-idx1-ubyte").write_bytes(bad)
    trust(monkeypatch, "fmnist", "t10k-labels-idx1-ubyte", bad)
    with pytest.raises(DatasetError, match=r"labels in \[1, 12\], expected \[0, 9\]"):
        load("fmnist", "test", root=d)


def test_unpatched_checksums_always_apply(tmp_path):
    """Without a registered digest a generated file is refused: production always verifies."""
    d = tmp_path / "fm"
    d.mkdir()
    (d / "t10k-images-idx3-ubyte").write_bytes(_idx((1, 28, 28), bytes(784)))
    (d / "t10k-labels-idx1-ubyte").write_bytes(_idx((1,), b"\x00"))
    with pytest.raises(DatasetError, match="checksum mismatch"):
        load("fmnist", "test", root=d)


def test_cache_reverifies_replaced_file(tmp_path, monkeypatch):
    d = tmp_path / "fm"
    d.mkdir()
    imgs = _idx((2, 28, 28), bytes(range(256)) * 6 + bytes(32))
    labs = _idx((2,), b"\x03\x04")
    (d / "t10k-images-idx3-ubyte").write_bytes(imgs)
    (d / "t10k-labels-idx1-ubyte").write_bytes(labs)
    trust(monkeypatch, "fmnist", "t10k-images-idx3-ubyte", imgs)
    trust(monkeypatch, "fmnist", "t10k-labels-idx1-ubyte", labs)
    a = load("fmnist", "test", root=d)
    assert load("fmnist", "test", root=d) is a
    (d / "t10k-labels-idx1-ubyte").write_bytes(_idx((2,), b"\x03\x05"))
    os.utime(d / "t10k-labels-idx1-ubyte", ns=(1, 1))
    with pytest.raises(DatasetError, match="checksum mismatch"):
        load("fmnist", "test", root=d)


# ---------------------------------------------------------------------------------------------
# CIFAR-10 (generated files in the real python-batch format)


class _Py2Pickler(pickle._Pickler):  # type: ignore[name-defined]
    """Writes bytes the way Python 2's cPickle wrote str (SHORT_BINSTRING/BINSTRING), like the
    published CIFAR batches, which are read with encoding='latin1'."""

    dispatch = pickle._Pickler.dispatch.copy()  # type: ignore[attr-defined]

    def _save_py2_str(self, obj):
        n = len(obj)
        if n < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([n]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", n) + obj)
        self.memoize(obj)

    dispatch[bytes] = _save_py2_str


def cifar_batch_bytes(data: np.ndarray, labels: list[int], style: str = "py3") -> bytes:
    obj = {"batch_label": "testing batch 1 of 1", "labels": labels, "data": data,
           "filenames": [f"img_{i}.png" for i in range(len(labels))]}
    if style == "py3":
        return pickle.dumps(obj)  # protocol 5: numpy._core.numeric._frombuffer
    if style == "py2":
        buf = io.BytesIO()
        _Py2Pickler(buf, protocol=2).dump(obj)
        # spell the numpy 1.x module name, as in the published files
        return buf.getvalue().replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")
    raise AssertionError(style)


def make_cifar(root: Path, monkeypatch, n: int = 7, style: str = "py3", seed: int = 0):
    """Write cifar-10-batches-py/ under root; return the expected train/test arrays."""
    rng = np.random.default_rng(seed)
    bdir = root / "cifar-10-batches-py"
    bdir.mkdir(parents=True, exist_ok=True)
    expect = {"train": ([], []), "test": ([], [])}
    for fname in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, n)]
        blob = cifar_batch_bytes(data, labels, style)
        (bdir / fname).write_bytes(blob)
        trust(monkeypatch, "cifar10", fname, blob)
        split = "test" if fname == "test_batch" else "train"
        expect[split][0].append(data.reshape(n, 3, 32, 32))
        expect[split][1].extend(labels)
    return {s: (np.concatenate(x), np.array(y)) for s, (x, y) in expect.items()}


def test_py2_style_pickle_uses_the_real_globals():
    import pickletools

    blob = cifar_batch_bytes(np.zeros((1, 3072), np.uint8), [0], "py2")
    globals_ = {arg for op, arg, _ in pickletools.genops(blob) if op.name == "GLOBAL"}
    assert globals_ == {"numpy.core.multiarray _reconstruct", "numpy ndarray", "numpy dtype"}


@pytest.mark.parametrize("style", ["py3", "py2"])
def test_cifar_generated_batches(tmp_path, monkeypatch, style):
    expect = make_cifar(tmp_path / "c", monkeypatch, n=7, style=style)
    for split, n in (("train", 35), ("test", 7)):
        ds = load("cifar10", split, root=tmp_path / "c")
        assert ds.images.shape == (n, 3, 32, 32) and ds.images.dtype == torch.uint8
        assert ds.images.is_contiguous() and ds.labels.dtype == torch.int64
        np.testing.assert_array_equal(ds.images.numpy(), expect[split][0])
        np.testing.assert_array_equal(ds.labels.numpy(), expect[split][1])
        assert ds.source == str(tmp_path / "c" / "cifar-10-batches-py")
    # the pixel layout: row-major 3 planes of 32x32 (R, G, B)
    ds = load("cifar10", "test", root=tmp_path / "c")
    raw0 = expect["test"][0][0].reshape(3072)
    assert ds.images[0, 1, 2, 3].item() == raw0[1 * 1024 + 2 * 32 + 3]


def _tar_dir(src_dir: Path, arc: Path, arcname: str) -> bytes:
    with tarfile.open(arc, "w:gz") as tf:
        tf.add(src_dir, arcname=arcname)
    return arc.read_bytes()


def test_cifar_from_archive_equals_extracted(tmp_path, monkeypatch):
    make_cifar(tmp_path / "ex", monkeypatch, n=4)
    arc_dir = tmp_path / "arc"
    arc_dir.mkdir()
    blob = _tar_dir(tmp_path / "ex" / "cifar-10-batches-py", arc_dir / "cifar-10-python.tar.gz",
                    "cifar-10-batches-py")
    trust(monkeypatch, "cifar10", "cifar-10-python.tar.gz", blob)
    a = load("cifar10", "train", root=arc_dir)
    b = load("cifar10", "train", root=tmp_path / "ex")
    assert a.source == str(arc_dir / "cifar-10-python.tar.gz")
    assert a.sha256 == b.sha256
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert sorted(p.name for p in arc_dir.iterdir()) == ["cifar-10-python.tar.gz"]  # nothing written


def test_cifar_bad_hash_is_refused_before_parsing(tmp_path, monkeypatch):
    make_cifar(tmp_path / "c", monkeypatch)
    monkeypatch.setitem(sources.CHECKSUMS["cifar10"], "data_batch_3",
                        ("md5", "54ebc095f3ab1f0389bbae665268c751"))  # the published one
    with pytest.raises(DatasetError) as e:
        load("cifar10", "train", root=tmp_path / "c")
    msg = str(e.value)
    assert "data_batch_3" in msg and "md5" in msg and "54ebc095f3ab1f0389bbae665268c751" in msg
    assert "cifar-10-python.tar.gz" in msg and "--data-root" in msg


def test_cifar_truncated(tmp_path, monkeypatch):
    make_cifar(tmp_path / "c", monkeypatch)
    f = tmp_path / "c" / "cifar-10-batches-py" / "test_batch"
    f.write_bytes(f.read_bytes()[:5000])
    with pytest.raises(DatasetError, match="test_batch.*checksum mismatch"):  # digest of the full file
        load("cifar10", "test", root=tmp_path / "c")
    trust(monkeypatch, "cifar10", "test_batch", f)  # even if the digest matched the truncated bytes
    with pytest.raises(DatasetError, match="test_batch.*truncated or corrupted"):
        load("cifar10", "test", root=tmp_path / "c")


@pytest.mark.parametrize("data,labels,expect", [
    (np.zeros((4, 3000), np.uint8), [0, 1, 2, 3], "uint8 \\[N, 3072\\]"),
    (np.zeros((4, 3072), np.float32), [0, 1, 2, 3], "uint8 \\[N, 3072\\]"),
    (np.zeros((4, 3072), np.uint8), [0, 1, 2], "3 labels for 4 images"),
    (np.zeros((4, 3072), np.uint8), [0, 1, 2, 10], "expected \\[0, 9\\]"),
])
def test_cifar_wrong_layout(tmp_path, monkeypatch, data, labels, expect):
    make_cifar(tmp_path / "c", monkeypatch)
    blob = pickle.dumps({"data": data, "labels": labels})
    (tmp_path / "c" / "cifar-10-batches-py" / "test_batch").write_bytes(blob)
    trust(monkeypatch, "cifar10", "test_batch", blob)
    with pytest.raises(DatasetError, match=f"test_batch.*{expect}"):
        load("cifar10", "test", root=tmp_path / "c")


class _Evil:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("registered", [False, True])
def test_cifar_malicious_pickle_never_runs(tmp_path, monkeypatch, registered):
    make_cifar(tmp_path / "c", monkeypatch)
    marker = tmp_path / "pwned"
    blob = pickle.dumps({"data": _Evil(marker), "labels": [0]})
    (tmp_path / "c" / "cifar-10-batches-py" / "test_batch").write_bytes(blob)
    if registered:  # even a file whose digest is trusted is not allowed to run code
        trust(monkeypatch, "cifar10", "test_batch", blob)
        match = "refused to load global (posix|os|nt)\\.system"
    else:
        monkeypatch.setitem(sources.CHECKSUMS["cifar10"], "test_batch", ("md5", "40351d587109b95175f43aff81a1287e"))
        match = "checksum mismatch"
    with pytest.raises(DatasetError, match=match):
        load("cifar10", "test", root=tmp_path / "c")
    assert not marker.exists()


def test_cifar_archive_with_evil_member_refused(tmp_path, monkeypatch):
    make_cifar(tmp_path / "ex", monkeypatch, n=2)
    arc_dir = tmp_path / "arc"
    arc_dir.mkdir()
    arc = arc_dir / "cifar-10-python.tar.gz"
    with tarfile.open(arc, "w:gz") as tf:
        tf.add(tmp_path / "ex" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
        link = tarfile.TarInfo("cifar-10-batches-py/passwd")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tf.addfile(link)
    trust(monkeypatch, "cifar10", "cifar-10-python.tar.gz", arc)
    with pytest.raises(DatasetError, match="symbolic link"):
        load("cifar10", "test", root=arc_dir)


# ---------------------------------------------------------------------------------------------
# SVHN (generated .mat files)


def make_svhn(root: Path, monkeypatch, split: str = "train", n: int = 11, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8)
    y = rng.integers(1, 11, (n, 1)).astype(np.uint8)
    y[0, 0] = 10
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{split}_32x32.mat"
    scipy.io.savemat(path, {"X": x, "y": y})
    trust(monkeypatch, "svhn", path.name, path)
    return x, y


@pytest.mark.parametrize("split", ["train", "test"])
def test_svhn_generated(tmp_path, monkeypatch, split):
    x, y = make_svhn(tmp_path / "data" / "svhn", monkeypatch, split)
    ds = load("svhn", split, root=tmp_path / "data")
    n = x.shape[3]
    assert ds.images.shape == (n, 3, 32, 32) and ds.images.dtype == torch.uint8
    assert ds.images.is_contiguous()
    assert ds.labels.dtype == torch.int64 and ds.labels.min() >= 0 and ds.labels.max() <= 9
    np.testing.assert_array_equal(ds.labels.numpy(), np.where(y[:, 0] == 10, 0, y[:, 0]))
    assert ds.labels[0] == 0  # label 10 means digit 0
    # [H, W, C, N] -> [N, C, H, W]
    assert ds.images[5, 2, 7, 9].item() == x[7, 9, 2, 5]
    np.testing.assert_array_equal(ds.images.numpy(), x.transpose(3, 2, 0, 1))
    assert ds.source == str(tmp_path / "data" / "svhn" / f"{split}_32x32.mat")


def test_svhn_bad_hash(tmp_path, monkeypatch):
    make_svhn(tmp_path, monkeypatch, "test")
    monkeypatch.setitem(sources.CHECKSUMS["svhn"], "test_32x32.mat", ("md5", "eb5a983be6a315427106f1b164d9cef3"))
    with pytest.raises(DatasetError) as e:
        load("svhn", "test", root=tmp_path)
    msg = str(e.value)
    assert "test_32x32.mat" in msg and "eb5a983be6a315427106f1b164d9cef3" in msg
    assert "ufldl.stanford.edu" in msg


def test_svhn_truncated(tmp_path, monkeypatch):
    make_svhn(tmp_path, monkeypatch, "test")
    p = tmp_path / "test_32x32.mat"
    p.write_bytes(p.read_bytes()[:3000])
    trust(monkeypatch, "svhn", p.name, p)
    with pytest.raises(DatasetError, match="test_32x32.mat.*cannot read as a MATLAB"):
        load("svhn", "test", root=tmp_path)


@pytest.mark.parametrize("x,y,expect", [
    (np.zeros((32, 32, 1, 4), np.uint8), np.ones((4, 1), np.uint8), r"uint8 \[32, 32, 3, N\]"),
    (np.zeros((32, 32, 3, 4), np.float64), np.ones((4, 1), np.uint8), r"uint8 \[32, 32, 3, N\]"),
    (np.zeros((32, 32, 3, 4), np.uint8), np.ones((3, 1), np.uint8), "expected \\[4, 1\\]"),
    (np.zeros((32, 32, 3, 4), np.uint8), np.full((4, 1), 11, np.uint8), "expected \\[0, 10\\]"),
])
def test_svhn_wrong_layout(tmp_path, monkeypatch, x, y, expect):
    p = tmp_path / "test_32x32.mat"
    scipy.io.savemat(p, {"X": x, "y": y})
    trust(monkeypatch, "svhn", p.name, p)
    with pytest.raises(DatasetError, match=f"test_32x32.mat.*{expect}"):
        load("svhn", "test", root=tmp_path)


def test_svhn_missing_variables(tmp_path, monkeypatch):
    p = tmp_path / "train_32x32.mat"
    scipy.io.savemat(p, {"images": np.zeros((2, 2), np.uint8)})
    trust(monkeypatch, "svhn", p.name, p)
    with pytest.raises(DatasetError, match="missing variable"):
        load("svhn", "train", root=tmp_path)


def test_svhn_not_found_mentions_source(tmp_path):
    with pytest.raises(DatasetError, match="train_32x32.mat.*ufldl.stanford.edu"):
        load("svhn", "train", root=tmp_path)


# ---------------------------------------------------------------------------------------------
# download: files served over real HTTP on 127.0.0.1 through $DFBENCH_MIRROR (no network here)


def test_download_into_cache(tmp_path, monkeypatch):
    src = tmp_path / "upstream"
    make_svhn(src, monkeypatch, "test")
    with pytest.raises(DatasetError, match="download=True"):
        load("svhn", "test")
    assert download_files("svhn", ("test",)) == [  # the official address; the digest registered above
        ("http://ufldl.stanford.edu/housenumbers/test_32x32.mat", "test_32x32.mat", "sha256",
         sources.CHECKSUMS["svhn"]["test_32x32.mat"][1])]
    with serve({"test_32x32.mat": (src / "test_32x32.mat").read_bytes()}) as server:
        monkeypatch.setenv("DFBENCH_MIRROR", server.url)
        ds = load("svhn", "test", download=True)
        cache = tmp_path / "cache" / "data" / "svhn"
        assert server.requests == ["test_32x32.mat"]
        assert ds.source == str(cache / "test_32x32.mat")
        sources.clear_cache()
        assert load("svhn", "test").source == ds.source  # found in the cache without downloading
        assert server.requests == ["test_32x32.mat"]


def test_published_download_checksums():
    files = {f: (algo, d) for _, f, algo, d in download_files("fmnist")}
    assert files["t10k-labels-idx1-ubyte.gz"] == ("md5", "bb300cfdad3c16e7a12a480ee83cd310")
    assert download_files("cifar10") == [("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
                                          "cifar-10-python.tar.gz", "md5", "c58f30108f718f92721af3b95e74349a")]
    assert [f for _, f, _, _ in download_files("svhn")] == ["train_32x32.mat", "test_32x32.mat"]


def test_download_completes_an_interrupted_download(tmp_path, monkeypatch):
    d = tmp_path / "dl"
    d.mkdir()
    imgs = _idx((2, 28, 28), bytes(2 * 784))
    labs = _idx((2,), b"\x01\x02")
    (d / "t10k-images-idx3-ubyte").write_bytes(imgs)  # the labels never arrived
    trust(monkeypatch, "fmnist", "t10k-images-idx3-ubyte", imgs)
    trust(monkeypatch, "fmnist", "t10k-labels-idx1-ubyte", labs)
    gz_images, gz_labels = gzip.compress(imgs), gzip.compress(labs)
    for name, blob in (("t10k-images-idx3-ubyte.gz", gz_images), ("t10k-labels-idx1-ubyte.gz", gz_labels)):
        monkeypatch.setitem(sources.DOWNLOAD_CHECKSUMS["fmnist"], name, ("sha256", sha256(blob)))
    with pytest.raises(DatasetError, match="t10k-labels-idx1-ubyte.*missing"):
        load("fmnist", "test", root=d)
    with serve({"t10k-images-idx3-ubyte.gz": gz_images, "t10k-labels-idx1-ubyte.gz": gz_labels}) as server:
        monkeypatch.setenv("DFBENCH_MIRROR", server.url)
        ds = load("fmnist", "test", root=d, download=True)
    assert "t10k-labels-idx1-ubyte.gz" in server.requests and ds.labels.tolist() == [1, 2]


def test_download_cifar_archive_extracted_safely(tmp_path, monkeypatch):
    make_cifar(tmp_path / "ex", monkeypatch, n=3)
    up = tmp_path / "upstream"
    up.mkdir()
    blob = _tar_dir(tmp_path / "ex" / "cifar-10-batches-py", up / "cifar-10-python.tar.gz",
                    "cifar-10-batches-py")
    trust(monkeypatch, "cifar10", "cifar-10-python.tar.gz", blob)
    with serve({"cifar-10-python.tar.gz": blob}) as server:
        monkeypatch.setenv("DFBENCH_MIRROR", server.url)
        ds = load("cifar10", "test", root=tmp_path / "mine", download=True)
    assert ds.source == str(tmp_path / "mine" / "cifar-10-batches-py")
    assert ds.images.shape == (3, 3, 32, 32)
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["cifar-10-batches-py", "cifar-10-python.tar.gz"]


def test_download_failure_is_a_dataset_error(tmp_path, monkeypatch):
    with serve({}) as server:  # the mirror answers 404
        monkeypatch.setenv("DFBENCH_MIRROR", server.url)
        with pytest.raises(DatasetError, match="(?s)HTTP 404.*ufldl"):
            load("svhn", "train", download=True)
    assert not any((tmp_path / "cache" / "data" / "svhn").iterdir())  # no partial file left
