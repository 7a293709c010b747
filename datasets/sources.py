"""Dataset sources: find, verify and decode Fashion-MNIST, SVHN and CIFAR-10.

Where data is looked for (first location holding any of the split's files wins)::

    1. the ``root`` argument (CLI ``--data-root DIR``) - when given, nothing else is searched
    2. $DFBENCH_DATA
    3. the dataset's system path (Fashion-MNIST: /usr/share/datasets/fashion-mnist, from the
       Debian package ``dataset-fashion-mnist``)
    4. the download cache $DFBENCH_CACHE/data/<name> (default ~/.cache/dfbench/data/<name>)
    5. only with ``download=True``: fetch the published files (:func:`download_dataset`, the same code as
       ``dfbench fetch NAME``) into the cache (or into ``root`` when given), then load as above.

Each location is searched as-is and in a few conventional sub-folders (``fashion-mnist/``,
``FashionMNIST/raw/``, ``cifar-10-batches-py/``, ``svhn/``...).

Integrity: every file is hashed BEFORE it is parsed and compared with :data:`CHECKSUMS`
(Fashion-MNIST: sha256 of the decompressed idx bytes, so ``.gz`` and raw files are equally
accepted; CIFAR-10/SVHN: the md5s published by the dataset authors, as listed in torchvision).
The bytes that were hashed are the bytes that are parsed (no re-read). Pickled CIFAR batches
are only unpickled after verification and then with :func:`datasets.safeio.safe_unpickle`.

Downloads (:func:`download_dataset`) are verified twice: the downloaded file against its published
checksum before it is renamed into place (:data:`DOWNLOAD_CHECKSUMS`, falling back to
:data:`CHECKSUMS` for files that are downloaded as they are read), then on every load as above.

There is no switch to skip verification. Tests that need small synthetic files register
their digests by monkeypatching :data:`CHECKSUMS` (e.g.
``monkeypatch.setitem(CHECKSUMS["svhn"], "test_32x32.mat", ("sha256", digest))``);
production code never writes to it.

Decoded sets are cached in-process (see :func:`clear_cache`); the cache key is the resolved
file paths plus their size/mtime and the expected checksums, so a replaced file is re-verified.
The tensors of a cached :class:`ImageSet` are shared between callers: do not modify them
in place (``.clone()`` first).

Data users bring (an image folder, a Hugging Face dataset saved with ``save_to_disk``) is named
``folder:PATH`` / ``hf:PATH`` wherever a dataset name goes; :func:`load`, :func:`data_info` and
:func:`missing` hand such a name to :mod:`datasets.user_data` (its docstring: splits, labels,
checks, identity). ``root`` does not apply to it: the spec names its own path.
"""
from __future__ import annotations

import functools
import gzip
import hashlib
import io
import os
import shutil
import struct
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .download import DownloadError, download_file
from .errors import DatasetError
from .safeio import UnsafeArchiveError, UnsafePickleError, read_tar_members, safe_extract, safe_unpickle
from .gmm import gmm_data_info, gmm_split, is_mixture
from .gmm import mixture as _gmm_mixture
from .mixture import GaussianMixture
from .user_data import clear_user_cache, is_user_data, user_data_info, user_missing, user_split

__all__ = [
    "DATASETS",
    "SPLITS",
    "ENV_VAR",
    "CACHE_ENV_VAR",
    "CHECKSUMS",
    "DOWNLOAD_CHECKSUMS",
    "DatasetError",
    "ImageSet",
    "load",
    "data_info",
    "locate",
    "cache_dir",
    "clear_cache",
    "download_dataset",
    "missing",
    "download_files",
]

DATASETS: tuple[str, ...] = ("fmnist", "svhn", "cifar10")
SPLITS: tuple[str, ...] = ("train", "test")
ENV_VAR = "DFBENCH_DATA"
CACHE_ENV_VAR = "DFBENCH_CACHE"

#: What :func:`load` verifies, per dataset: logical file name -> (algorithm, hex digest).
#: Fashion-MNIST: sha256 of the DECOMPRESSED idx files (checked against the Debian package
#: dataset-fashion-mnist 0.0~git20200523.55506a9-1, whose .gz files are recompressed - their
#: md5 differs from upstream's - while the content is identical).
#: CIFAR-10 and SVHN: the md5s published by the authors (as listed in torchvision 0.29
#: ``CIFAR10.train_list/test_list/tgz_md5`` and ``SVHN.split_list``).
CHECKSUMS: dict[str, dict[str, tuple[str, str]]] = {
    "fmnist": {
        "train-images-idx3-ubyte": ("sha256", "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888"),
        "train-labels-idx1-ubyte": ("sha256", "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9"),
        "t10k-images-idx3-ubyte": ("sha256", "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b"),
        "t10k-labels-idx1-ubyte": ("sha256", "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34"),
    },
    "cifar10": {
        "cifar-10-python.tar.gz": ("md5", "c58f30108f718f92721af3b95e74349a"),
        "data_batch_1": ("md5", "c99cafc152244af753f735de768cd75f"),
        "data_batch_2": ("md5", "d4bba439e000b95fd0a9bffe97cbabec"),
        "data_batch_3": ("md5", "54ebc095f3ab1f0389bbae665268c751"),
        "data_batch_4": ("md5", "634d18415352ddfa80567beed471001a"),
        "data_batch_5": ("md5", "482c414d41f54cd18b22e5b47cb7c3cb"),
        "test_batch": ("md5", "40351d587109b95175f43aff81a1287e"),
    },
    "svhn": {
        "train_32x32.mat": ("md5", "e26dedcc434d2e4c54c9b2d4a06d8373"),
        "test_32x32.mat": ("md5", "eb5a983be6a315427106f1b164d9cef3"),
    },
}

#: Checksums of downloaded files that are not themselves in :data:`CHECKSUMS`: the upstream
#: Fashion-MNIST ``.gz`` files (md5 as listed in torchvision 0.29 ``FashionMNIST.resources``).
#: SVHN's ``.mat`` files and the CIFAR-10 archive are downloaded as they are read, so their
#: :data:`CHECKSUMS` entries serve both purposes.
DOWNLOAD_CHECKSUMS: dict[str, dict[str, tuple[str, str]]] = {
    "fmnist": {
        "train-images-idx3-ubyte.gz": ("md5", "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
        "train-labels-idx1-ubyte.gz": ("md5", "25c81989df183df01b3e8a0aad5dffbe"),
        "t10k-images-idx3-ubyte.gz": ("md5", "bef4ecab320f06d8554ea6380940ec79"),
        "t10k-labels-idx1-ubyte.gz": ("md5", "bb300cfdad3c16e7a12a480ee83cd310"),
    },
    "cifar10": {},
    "svhn": {},
}

_DIGEST_LEN = {"sha256": 64, "md5": 32}
_MAX_GUNZIP = 256 << 20  # no Fashion-MNIST idx file is larger than 47 MB decompressed


@dataclass(frozen=True, eq=False)
class ImageSet:
    """A verified, decoded split. ``images`` uint8 [N, C, H, W] contiguous (float32 in the model's space for the
    ground-truth mixtures, ``gmm:``: see :mod:`datasets.gmm`); ``labels`` int64 [N]."""

    name: str
    split: str
    images: torch.Tensor
    labels: torch.Tensor
    sha256: str
    source: str
    num_classes: int = 10

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __repr__(self) -> str:
        return (
            f"ImageSet(name={self.name!r}, split={self.split!r}, images={tuple(self.images.shape)} "
            f"{self.images.dtype}, sha256={self.sha256[:12]}..., source={self.source!r})"
        )


# ---------------------------------------------------------------------------------------------
# per-dataset description


@dataclass(frozen=True)
class _Spec:
    name: str
    title: str
    channels: int
    size: int
    num_samples: dict[str, int]
    files: dict[str, tuple[str, ...]]  # split -> logical files
    subdirs: tuple[str, ...]
    system_paths: tuple[str, ...]
    downloads: dict[str, tuple[tuple[str, str], ...]]  # split -> (url, filename); checksums: _download_checksum
    how_to_get: str
    classes: tuple[str, ...] = field(default=())


_FMNIST_MIRROR = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
_CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
_CIFAR_ARCHIVE = "cifar-10-python.tar.gz"
_CIFAR_DIR = "cifar-10-batches-py"
_SVHN_URL = "http://ufldl.stanford.edu/housenumbers/"


def _fmnist_downloads(prefix: str) -> tuple[tuple[str, str], ...]:
    return tuple(
        (_FMNIST_MIRROR + f + ".gz", f + ".gz")
        for f in (f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte")
    )


_SPECS: dict[str, _Spec] = {
    "fmnist": _Spec(
        name="fmnist",
        title="Fashion-MNIST",
        channels=1,
        size=28,
        num_samples={"train": 60000, "test": 10000},
        files={
            "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
            "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
        },
        subdirs=("fashion-mnist", "fmnist", "FashionMNIST/raw", "fashion_mnist"),
        system_paths=("/usr/share/datasets/fashion-mnist",),
        downloads={"train": _fmnist_downloads("train"), "test": _fmnist_downloads("t10k")},
        how_to_get=(
            "install the Debian package (`apt-get install dataset-fashion-mnist`, files land in "
            "/usr/share/datasets/fashion-mnist), or put train-images-idx3-ubyte.gz, "
            "train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz "
            "(from https://github.com/zalandoresearch/fashion-mnist; .gz or uncompressed) in a "
            f"folder DIR and pass `--data-root DIR` (or set {ENV_VAR}=DIR), or run `dfbench fetch "
            "fmnist` on a machine with internet (Python: load(..., download=True))"
        ),
        classes=("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                 "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"),
    ),
    "cifar10": _Spec(
        name="cifar10",
        title="CIFAR-10",
        channels=3,
        size=32,
        num_samples={"train": 50000, "test": 10000},
        files={"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)},
        subdirs=("cifar10", "cifar-10", "CIFAR10"),
        system_paths=("/usr/share/datasets/cifar10", "/usr/share/datasets/cifar-10"),
        downloads={s: ((_CIFAR_URL, _CIFAR_ARCHIVE),) for s in SPLITS},
        how_to_get=(
            f"download {_CIFAR_ARCHIVE} (python version, md5 c58f30108f718f92721af3b95e74349a) from "
            "https://www.cs.toronto.edu/~kriz/cifar.html, put the archive or its extracted "
            f"{_CIFAR_DIR}/ folder in a folder DIR and pass `--data-root DIR` (or set {ENV_VAR}=DIR), "
            "or run `dfbench fetch cifar10` on a machine with internet (Python: load(..., download=True))"
        ),
        classes=("airplane", "automobile", "bird", "cat", "deer",
                 "dog", "frog", "horse", "ship", "truck"),
    ),
    "svhn": _Spec(
        name="svhn",
        title="SVHN (cropped digits, format 2)",
        channels=3,
        size=32,
        num_samples={"train": 73257, "test": 26032},
        files={"train": ("train_32x32.mat",), "test": ("test_32x32.mat",)},
        subdirs=("svhn", "SVHN"),
        system_paths=("/usr/share/datasets/svhn",),
        downloads={
            "train": ((_SVHN_URL + "train_32x32.mat", "train_32x32.mat"),),
            "test": ((_SVHN_URL + "test_32x32.mat", "test_32x32.mat"),),
        },
        how_to_get=(
            f"download train_32x32.mat and test_32x32.mat from {_SVHN_URL} into a folder DIR and "
            f"pass `--data-root DIR` (or set {ENV_VAR}=DIR), or run `dfbench fetch svhn` on a machine with "
            "internet (Python: load(..., download=True))"
        ),
        classes=tuple(str(i) for i in range(10)),
    ),
}

_ALIASES = {
    "fashion-mnist": "fmnist", "fashion_mnist": "fmnist", "fashionmnist": "fmnist",
    "cifar-10": "cifar10", "cifar_10": "cifar10",
}


def _canonical(name: str) -> str:
    if not isinstance(name, str):
        raise DatasetError(f"dataset name must be a string, got {name!r}; valid: {', '.join(DATASETS)}")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in _SPECS:
        import difflib

        close = difflib.get_close_matches(key, list(DATASETS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise DatasetError(f"unknown dataset {name!r}{hint}; valid: {', '.join(DATASETS)}, or your own data as "
                           "folder:PATH or hf:PATH (datasets/user_data.py)")
    return key


def _check_split(split: str) -> str:
    if split not in SPLITS:
        raise DatasetError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    return split


def cache_dir(name: str) -> Path:
    """Where ``download=True`` puts a dataset: ``$DFBENCH_CACHE/data/<name>``, by default
    ``~/.cache/dfbench/data/<name>`` (the same cache root as the evaluation statistics)."""
    base = os.environ.get(CACHE_ENV_VAR) or os.path.join(os.path.expanduser("~"), ".cache", "dfbench")
    return Path(base).expanduser() / "data" / _canonical(name)


def data_info(name: str) -> dict:
    """Static facts about a dataset, for CLI/help text.

    Keys: ``name``, ``title``, ``channels``, ``size`` (H = W), ``image_shape`` (C, H, W),
    ``num_classes``, ``classes``, ``num_samples`` {split: N}, ``files`` {split: [file, ...]},
    ``checksums`` {file: "algorithm:hexdigest"} (what :func:`load` verifies; Fashion-MNIST:
    sha256 of the decompressed idx file, ``.gz`` optional), ``sha256`` {file: hexdigest} for the
    files whose recorded checksum is a sha256, ``system_paths``, ``env_var``, ``cache_dir``,
    ``urls`` and ``how_to_get``.

    A user data spec (``folder:PATH``, ``hf:PATH``) is decoded and checked to answer; its dict has the
    same keys (no files, checksums or URLs) plus ``kind``, ``path``, ``held_out``, ``digest`` (the
    dataset's content digest) and ``split_sha256`` (see :mod:`datasets.user_data`).
    """
    if is_user_data(name):
        return user_data_info(name)
    if is_mixture(name):
        return gmm_data_info(name)
    key = _canonical(name)
    spec = _SPECS[key]
    sums = CHECKSUMS[key]
    return {
        "name": key,
        "title": spec.title,
        "channels": spec.channels,
        "size": spec.size,
        "image_shape": (spec.channels, spec.size, spec.size),
        "num_classes": 10,
        "classes": list(spec.classes),
        "num_samples": dict(spec.num_samples),
        "files": {s: list(fs) for s, fs in spec.files.items()},
        "checksums": {f: f"{a}:{d}" for f, (a, d) in sums.items()},
        "sha256": {f: d for f, (a, d) in sums.items() if a == "sha256"},
        "system_paths": list(spec.system_paths),
        "env_var": ENV_VAR,
        "cache_dir": str(cache_dir(key)),
        "urls": sorted({u for dl in spec.downloads.values() for (u, _) in dl}),
        "how_to_get": spec.how_to_get,
    }


# ---------------------------------------------------------------------------------------------
# locating files


@dataclass(frozen=True)
class _Found:
    kind: str  # "idx" | "batches" | "archive" | "mat"
    where: Path  # folder (idx/batches) or file (archive/mat)
    files: tuple[tuple[str, Path | None], ...]  # logical name -> path (None: missing)


def _search_roots(key: str, root) -> list[tuple[Path, str]]:
    if root is not None:
        return [(Path(os.fspath(root)).expanduser(), "root argument")]
    out: list[tuple[Path, str]] = []
    env = os.environ.get(ENV_VAR)
    if env:
        out.append((Path(env).expanduser(), f"${ENV_VAR}"))
    out.extend((Path(p), "system path") for p in _SPECS[key].system_paths)
    out.append((cache_dir(key), "download cache"))
    return out


def _candidate_dirs(key: str, base: Path) -> list[Path]:
    return [base] + [base / s for s in _SPECS[key].subdirs]


def _probe(key: str, split: str, d: Path) -> _Found | None:
    spec = _SPECS[key]
    logical = spec.files[split]
    if key == "fmnist":
        files = []
        for f in logical:
            raw, gz = d / f, d / (f + ".gz")
            files.append((f, raw if raw.is_file() else gz if gz.is_file() else None))
        return _Found("idx", d, tuple(files)) if any(p for _, p in files) else None
    if key == "cifar10":
        for bd in (d / _CIFAR_DIR, d):
            files = tuple((f, (bd / f) if (bd / f).is_file() else None) for f in logical)
            if any(p for _, p in files):
                return _Found("batches", bd, files)
        arc = d / _CIFAR_ARCHIVE
        if arc.is_file():
            return _Found("archive", arc, ((_CIFAR_ARCHIVE, arc),))
        return None
    if key == "svhn":
        p = d / logical[0]
        return _Found("mat", p, ((logical[0], p),)) if p.is_file() else None
    raise AssertionError(key)  # pragma: no cover


def _locate(key: str, split: str, root) -> tuple[_Found | None, list[str]]:
    searched: list[str] = []
    for base, how in _search_roots(key, root):
        for d in _candidate_dirs(key, base):
            found = _probe(key, split, d)
            if found is not None:
                return found, searched
        searched.append(f"{base} ({how})")
    return None, searched


def locate(name: str, split: str = "train", root: str | os.PathLike | None = None) -> Path | None:
    """The folder or file :func:`load` would read (without verifying it), or None."""
    if is_mixture(name):
        return None  # generated, never read from disk
    if is_user_data(name):
        from .user_data import parse_user_spec

        path = Path(parse_user_spec(name).path).expanduser()
        return path if path.exists() else None
    found, _ = _locate(_canonical(name), _check_split(split), root)
    return None if found is None else found.where


# ---------------------------------------------------------------------------------------------
# verification


def _expected(key: str, logical: str) -> tuple[str, str]:
    try:
        algo, digest = CHECKSUMS[key][logical]
    except KeyError:
        raise DatasetError(f"no checksum recorded for {key} file {logical!r}; refusing to read it") from None
    if _DIGEST_LEN.get(algo) != len(digest):
        raise DatasetError(f"bad checksum entry for {key} file {logical!r}: {algo}:{digest}")
    return algo, digest.lower()


def _read(path: Path, key: str, split: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise DatasetError(f"cannot read {path}: {e}. To get {_SPECS[key].title}: {_SPECS[key].how_to_get}") from e


def _gunzip(raw: bytes, path: Path, key: str) -> bytes:
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as g:
            data = g.read(_MAX_GUNZIP + 1)
    except (OSError, EOFError, zlib.error) as e:
        raise DatasetError(
            f"{path}: not a valid gzip file ({e}); it is corrupted or truncated. Delete it and "
            f"fetch it again: {_SPECS[key].how_to_get}"
        ) from e
    if len(data) > _MAX_GUNZIP:
        raise DatasetError(f"{path}: decompresses to more than {_MAX_GUNZIP} bytes; not a {_SPECS[key].title} file")
    return data


def _verify(key: str, logical: str, where: str, data: bytes, *, decompressed: bool = False) -> str:
    """Check ``data`` against CHECKSUMS; return its sha256 (the identity used downstream)."""
    algo, want = _expected(key, logical)
    sha = hashlib.sha256(data).hexdigest()
    got = sha if algo == "sha256" else hashlib.new(algo, data, usedforsecurity=False).hexdigest()
    if got != want:
        what = "decompressed content" if decompressed else "content"
        raise DatasetError(
            f"{where}: checksum mismatch for {logical}: {algo} of the {what} is {got} "
            f"({len(data)} bytes), expected {want} (published checksum). The file is corrupted, "
            f"truncated or not the official release; delete it and fetch it again: "
            f"{_SPECS[key].how_to_get}"
        )
    return sha


def _identity(key: str, split: str, digests: list[tuple[str, str]]) -> str:
    h = hashlib.sha256(f"dfbench-imageset-v1\n{key}\n{split}\n".encode())
    for logical, sha in digests:
        h.update(f"{logical} {sha}\n".encode())
    return h.hexdigest()


def _bad(key: str, where: str, problem: str) -> DatasetError:
    return DatasetError(
        f"{where}: {problem}. The file passed its checksum but does not have the expected layout; "
        f"fetch the official release: {_SPECS[key].how_to_get}"
    )


# ---------------------------------------------------------------------------------------------
# decoders (all take verified bytes)

_IDX_UBYTE = 0x08


def _parse_idx(raw: bytes, where: str, ndim: int, tail: tuple[int, ...]) -> np.ndarray:
    magic_want = (_IDX_UBYTE << 8) | ndim
    if len(raw) < 4 + 4 * ndim:
        raise _bad("fmnist", where, f"only {len(raw)} bytes, shorter than an idx header")
    magic = struct.unpack(">I", raw[:4])[0]
    if magic != magic_want:
        raise _bad("fmnist", where, f"magic number 0x{magic:08x}, expected 0x{magic_want:08x} "
                                    f"(idx, unsigned bytes, {ndim} dimension(s))")
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    if tuple(dims[1:]) != tail:
        raise _bad("fmnist", where, f"dimensions {dims}, expected (N, {', '.join(map(str, tail))})")
    header = 4 + 4 * ndim
    need = header + int(np.prod(dims, dtype=np.int64))
    if len(raw) != need:
        raise _bad("fmnist", where, f"{len(raw)} bytes, expected {need} for dimensions {dims} "
                                    f"({'truncated' if len(raw) < need else 'trailing data'})")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def _check_labels(key: str, where: str, labels: np.ndarray, n: int, lo: int = 0, hi: int = 9) -> np.ndarray:
    if labels.ndim != 1 or labels.shape[0] != n:
        raise _bad(key, where, f"{labels.shape[0] if labels.ndim else 'scalar'} labels for {n} images")
    if labels.dtype.kind not in "iub":
        if labels.dtype.kind == "f" and np.all(np.isfinite(labels)) and np.all(labels == np.round(labels)):
            labels = labels.astype(np.int64)
        else:
            raise _bad(key, where, f"labels of dtype {labels.dtype}, expected integers")
    labels = labels.astype(np.int64)
    if n and (labels.min() < lo or labels.max() > hi):
        raise _bad(key, where, f"labels in [{labels.min()}, {labels.max()}], expected [{lo}, {hi}]")
    return labels


def _decode_fmnist(split: str, files: tuple[tuple[str, str], ...]) -> tuple[np.ndarray, np.ndarray, list]:
    digests = []
    arrays = []
    for (logical, path_s), (ndim, tail) in zip(files, ((3, (28, 28)), (1, ()))):
        path = Path(path_s)
        raw = _read(path, "fmnist", split)
        gz = path.suffix == ".gz"
        if gz:
            raw = _gunzip(raw, path, "fmnist")
        digests.append((logical, _verify("fmnist", logical, str(path), raw, decompressed=gz)))
        arrays.append((str(path), _parse_idx(raw, str(path), ndim, tail)))
    (ipath, imgs), (lpath, labs) = arrays
    n = imgs.shape[0]
    labels = _check_labels("fmnist", lpath, labs, n)
    images = imgs.reshape(n, 1, 28, 28).copy()
    return images, labels, digests


def _cifar_batch(raw: bytes, where: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        obj = safe_unpickle(raw)
    except UnsafePickleError as e:
        raise UnsafePickleError(
            f"{where}: {e}. A CIFAR-10 batch holds only dicts, lists, strings and uint8 arrays; "
            f"this file was refused and nothing in it was run"
        ) from None
    except Exception as e:  # truncated / garbage pickle
        raise _bad("cifar10", where, f"cannot unpickle ({type(e).__name__}: {e}); truncated or corrupted")
    if not isinstance(obj, dict):
        raise _bad("cifar10", where, f"unpickled a {type(obj).__name__}, expected a dict with 'data' and 'labels'")

    def get(k: str):
        v = obj.get(k, obj.get(k.encode()))
        if v is None:
            raise _bad("cifar10", where, f"no {k!r} entry (keys: {sorted(map(str, obj))[:8]})")
        return v

    data = get("data")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        desc = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise _bad("cifar10", where, f"'data' is {desc}, expected uint8 [N, 3072] (3x32x32 planes)")
    labels = get("labels")
    if not isinstance(labels, (list, tuple, np.ndarray)) or not all(
        isinstance(v, (int, np.integer)) for v in (labels.tolist() if isinstance(labels, np.ndarray) else labels)
    ):
        raise _bad("cifar10", where, "'labels' is not a list of integers")
    labels = _check_labels("cifar10", where, np.asarray(labels, dtype=np.int64).reshape(-1), data.shape[0])
    return data.reshape(-1, 3, 32, 32), labels


def _decode_cifar(split: str, kind: str, files: tuple[tuple[str, str], ...]):
    logical = _SPECS["cifar10"].files[split]
    blobs: list[tuple[str, str, bytes]] = []  # (logical, where, bytes)
    digests = []
    if kind == "archive":
        (_, apath), = files
        raw = _read(Path(apath), "cifar10", split)
        _verify("cifar10", _CIFAR_ARCHIVE, apath, raw)
        wanted = {f"{_CIFAR_DIR}/{f}": f for f in logical}
        try:
            members = read_tar_members(raw, wanted)
        except UnsafeArchiveError as e:
            raise UnsafeArchiveError(f"{apath}: {e}; refused the archive") from None
        except DatasetError as e:
            raise _bad("cifar10", apath, str(e)) from None
        for member, f in wanted.items():
            if member not in members:
                raise _bad("cifar10", apath, f"no member {member}")
            blobs.append((f, f"{apath}:{member}", members[member]))
    else:
        for f, p in files:
            blobs.append((f, p, _read(Path(p), "cifar10", split)))
    parts_x, parts_y = [], []
    for f, where, raw in blobs:
        digests.append((f, _verify("cifar10", f, where, raw)))
        x, y = _cifar_batch(raw, where)
        parts_x.append(x)
        parts_y.append(y)
    return np.concatenate(parts_x), np.concatenate(parts_y), digests  # concatenate copies


def _decode_svhn(split: str, files: tuple[tuple[str, str], ...]):
    import scipy.io

    (logical, p), = files
    raw = _read(Path(p), "svhn", split)
    digests = [(logical, _verify("svhn", logical, p, raw))]
    try:
        mat = scipy.io.loadmat(io.BytesIO(raw), variable_names=["X", "y"])
    except Exception as e:  # NotImplementedError (v7.3/HDF5), ValueError, TypeError, ...
        raise _bad("svhn", p, f"cannot read as a MATLAB v5 file ({type(e).__name__}: {e})")
    x, y = mat.get("X"), mat.get("y")
    if not isinstance(x, np.ndarray) or not isinstance(y, np.ndarray):
        raise _bad("svhn", p, "missing variable 'X' or 'y'")
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[:3] != (32, 32, 3):
        raise _bad("svhn", p, f"'X' is {x.dtype} {x.shape}, expected uint8 [32, 32, 3, N]")
    n = x.shape[3]
    if y.size != n or (y.ndim == 2 and 1 not in y.shape) or y.ndim > 2:
        raise _bad("svhn", p, f"'y' has shape {y.shape}, expected [{n}, 1]")
    labels = _check_labels("svhn", p, y.reshape(-1), n, lo=0, hi=10)
    labels[labels == 10] = 0  # SVHN writes digit 0 as class 10
    images = np.ascontiguousarray(x.transpose(3, 2, 0, 1))  # [H, W, C, N] -> [N, C, H, W]
    return images, labels, digests


@functools.lru_cache(maxsize=8)
def _decode_cached(key: str, split: str, kind: str, where: str,
                   files: tuple[tuple[str, str], ...], stamp: tuple, checks: tuple) -> ImageSet:
    del stamp, checks  # part of the cache key only
    if key == "fmnist":
        images, labels, digests = _decode_fmnist(split, files)
    elif key == "cifar10":
        images, labels, digests = _decode_cifar(split, kind, files)
    else:
        images, labels, digests = _decode_svhn(split, files)
    spec = _SPECS[key]
    assert images.shape[1:] == (spec.channels, spec.size, spec.size) and images.dtype == np.uint8
    return ImageSet(
        name=key,
        split=split,
        images=torch.from_numpy(np.ascontiguousarray(images)),
        labels=torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64)),
        sha256=_identity(key, split, digests),
        source=where,
        num_classes=10,
    )


def clear_cache() -> None:
    """Forget every decoded set held in memory (user data too)."""
    _decode_cached.cache_clear()
    clear_user_cache()


def _not_found(key: str, split: str, searched: list[str], download: bool) -> DatasetError:
    spec = _SPECS[key]
    wanted = ", ".join(f + ("[.gz]" if key == "fmnist" else "") for f in spec.files[split])
    if key == "cifar10":
        wanted = f"{_CIFAR_DIR}/{{{', '.join(spec.files[split])}}} or {_CIFAR_ARCHIVE}"
    hint = "" if download else f"; downloads go to {cache_dir(key)}"
    return DatasetError(
        f"{spec.title} ({split}) not found: looked for {wanted} in {'; '.join(searched)}. "
        f"To get it: {spec.how_to_get}{hint}."
    )


def _download_checksum(key: str, filename: str) -> tuple[str, str]:
    algo, digest = DOWNLOAD_CHECKSUMS[key].get(filename) or _expected(key, filename)
    return algo, digest.lower()


def download_files(name: str, splits: tuple[str, ...] = SPLITS) -> list[tuple[str, str, str, str]]:
    """The published files of ``splits``: (official URL, file name, algorithm, digest), each once."""
    key = _canonical(name)
    out: dict[str, tuple[str, str, str, str]] = {}
    for split in splits:
        for url, filename in _SPECS[key].downloads[_check_split(split)]:
            out.setdefault(filename, (url, filename, *_download_checksum(key, filename)))
    return list(out.values())


def download_dataset(name: str, dest: str | os.PathLike | None = None, *, splits: tuple[str, ...] = SPLITS,
             progress: bool = True) -> Path:
    """Fetch the published files of ``splits`` into ``dest`` (default :func:`cache_dir`), each
    verified before it is renamed into place (see :mod:`datasets.download`; ``$DFBENCH_MIRROR``
    is honoured); files already there with the right checksum are not fetched again. CIFAR-10's
    archive is then extracted (safely). Returns ``dest``. Raises :class:`DownloadError` whose
    message ends with where to place the files by hand."""
    key = _canonical(name)
    folder = Path(os.fspath(dest)).expanduser() if dest is not None else cache_dir(key)
    for url, filename, algo, digest in download_files(key, splits):
        try:
            download_file(url, folder / filename, algo, digest, progress=progress)
        except DownloadError as e:
            e.args = (f"{e}\nWithout network access, get {_SPECS[key].title} by hand: {_SPECS[key].how_to_get}.",)
            raise
    if key == "cifar10":
        _extract_cifar(folder)
    return folder


def _extract_cifar(folder: Path) -> None:
    """Extract the (verified) archive's batches next to it; an existing folder only gains the
    batches it lacks (nothing is deleted), and a half-done extraction never shows up there."""
    target = folder / _CIFAR_DIR
    wanted = [f for fs in _SPECS["cifar10"].files.values() for f in fs]
    if all((target / f).is_file() for f in wanted):
        return
    tmp = Path(tempfile.mkdtemp(dir=folder, prefix=".extract-"))
    try:
        safe_extract(folder / _CIFAR_ARCHIVE, tmp)
        if not target.exists():
            os.replace(tmp / _CIFAR_DIR, target)
        else:
            for f in wanted:
                if not (target / f).is_file():
                    os.replace(tmp / _CIFAR_DIR / f, target / f)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _incomplete(key: str, split: str, found: _Found) -> DatasetError | None:
    missing_files = [f for f, p in found.files if p is None]
    if not missing_files:
        return None
    suffix = "[.gz]" if key == "fmnist" else ""
    return DatasetError(
        f"{_SPECS[key].title} ({split}): {', '.join(m + suffix for m in missing_files)} missing in "
        f"{found.where} (found {', '.join(str(p.name) for _, p in found.files if p)}). "
        f"To get it: {_SPECS[key].how_to_get}."
    )


def missing(name: str, split: str = "train", root: str | os.PathLike | None = None) -> str | None:
    """None when :func:`load` would find every file of the split (not yet verified), else the
    message :func:`load` would raise (what was looked for where, and how to get it)."""
    if is_user_data(name):
        _check_split(split)
        return user_missing(name)
    if is_mixture(name):
        _check_split(split)
        try:
            info = gmm_data_info(name)
            if info["spec"].startswith("gmm:fmnist"):
                return missing("fmnist", "train")  # the fitted mixtures need Fashion-MNIST's training set
        except DatasetError as e:
            return str(e)
        return None
    key, split = _canonical(name), _check_split(split)
    found, searched = _locate(key, split, root)
    if found is None:
        return str(_not_found(key, split, searched, False))
    err = _incomplete(key, split, found)
    return None if err is None else str(err)


def _fmnist_train() -> ImageSet:
    return load("fmnist", "train")


def mixture(name: str) -> GaussianMixture:
    """The exact Gaussian mixture of a ``gmm:`` spec (:mod:`datasets.gmm`; the Fashion-MNIST-fitted ones are fitted
    to the checksummed training set, loaded as :func:`load` does)."""
    return _gmm_mixture(name, _fmnist_train)


def load(name: str, split: str = "train", root: str | os.PathLike | None = None,
         download: bool = False) -> ImageSet:
    """Find, verify and decode one split of a dataset (see the module docstring for where it
    looks). Raises :class:`DatasetError` for every data problem; repeated calls for the same
    unchanged files return the same cached :class:`ImageSet` (do not modify its tensors).
    A user data spec (``folder:PATH``, ``hf:PATH``: :mod:`datasets.user_data`) is decoded and checked
    instead; ``root`` and ``download`` do not apply to it."""
    if is_user_data(name):
        part = user_split(name, _check_split(split))
        return ImageSet(name=name, split=split, images=torch.from_numpy(part.images), labels=torch.from_numpy(part.labels),
                        sha256=part.sha256, source=part.source, num_classes=part.num_classes)
    if is_mixture(name):
        part, info = gmm_split(name, _check_split(split), _fmnist_train), gmm_data_info(name)
        return ImageSet(name=info["spec"], split=split, images=part.images, labels=part.labels, sha256=part.sha256,
                        source="generated (gmm)", num_classes=int(info["num_classes"]))
    key = _canonical(name)
    split = _check_split(split)
    found, searched = _locate(key, split, root)
    dest = Path(os.fspath(root)).expanduser() if root is not None else cache_dir(key)
    incomplete = found is not None and any(p is None for _, p in found.files)
    if download and (found is None or (incomplete and dest in (found.where, *found.where.parents))):
        # nothing found, or an interrupted download in the download folder: (re)fetch
        download_dataset(key, dest, splits=(split,))
        found, more = _locate(key, split, dest)
        searched += more
    if found is None:
        raise _not_found(key, split, searched, download)
    err = _incomplete(key, split, found)
    if err is not None:
        raise err
    files = tuple((f, str(Path(p).resolve())) for f, p in found.files)
    stamp = []
    for _, p in files:
        try:
            st = os.stat(p)
        except OSError as e:
            raise DatasetError(f"cannot read {p}: {e}") from e
        stamp.append((st.st_size, st.st_mtime_ns, st.st_ino))
    checks = tuple(sorted(CHECKSUMS[key].items()))
    return _decode_cached(key, split, found.kind, str(found.where), files, tuple(stamp), checks)
