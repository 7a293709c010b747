"""Data users bring: an image folder (torchvision's ImageFolder layout) or a Hugging Face dataset
saved with ``save_to_disk``, named where a built-in dataset's name goes (``data.dataset``,
:func:`datasets.load`, :func:`datasets.data_info`)::

    folder:PATH[?test=FRACTION]
    hf:PATH[?image=COLUMN&label=COLUMN&test=FRACTION]

Splits. An image folder with ``train/`` and ``test/`` sub-folders takes each as a split, each in
ImageFolder layout (``PATH/train/<class>/<image>``); the test split's classes must be among the
training split's. Otherwise ``PATH`` itself is in ImageFolder layout (``PATH/<class>/<image>``) and
a deterministic held-out split is made: in every class, a seeded choice of ``round(test * n)``
images (at least one, never all of the class; ``test`` defaults to 0.1) is the test split, the rest
(in its order) the training split. A Hugging Face ``DatasetDict`` needs a ``train`` split and uses
its ``test`` split when there is one (else the held-out rule above); a single ``Dataset`` is split
by that rule. As for the built-in datasets, the FID reference statistics come from
``eval.reference_split`` of these splits.

Classes and labels. In a folder, the classes are the class folders' names in sorted order (label
= position; hidden entries, names starting with ``.``, are skipped), the images every file below a
class folder whose name ends in one of :data:`IMG_EXTENSIONS` (case-insensitive), in sorted
order of their path; other files are ignored. In a Hugging Face dataset the image column is
``image=`` or the one column of type ``Image``; the label column is ``label=``, or the one
``ClassLabel`` column, or the column named ``label``: a ``ClassLabel`` keeps its names and
numbers, other values (integers or strings) become classes in sorted order.

Checked before any training starts (the config is built from them: ``RunConfig`` reads the data),
each a :class:`DatasetError` that names the file (or the dataset row) and the fix: an image that
cannot be decoded, a mode other than 8-bit grey (``L``) or ``RGB``, an image whose mode or size
differs from the first image's, an image that is not square, an empty class (a class folder
without images; a ``ClassLabel`` class without training images), a missing label.

Identity. Each split's ``sha256`` (:attr:`ImageSet.sha256`) is a hash of its decoded content: the
image shape, the class names, every pixel and every label, in order; file names, paths and
encodings are not in it. Two copies of the same images give the same digest, one changed pixel or
label another. The dataset's digest (:func:`user_digest`; ``data_info(name)["digest"]``) hashes
both splits' digests; the config records it as ``data.sha256`` and the run id hashes it (the path
is where the data is, not what it is, so it is left out of the id). Reference statistics are
cached under the split's digest, like the built-in datasets'.

Decoded data is cached in-process, keyed by the resolved path, the options and every file's size,
mtime and inode (a changed file is decoded again); the tensors are shared between callers: do not
modify them in place.
"""
from __future__ import annotations

import functools
import hashlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import numpy as np

from .errors import DatasetError

__all__ = [
    "IMG_EXTENSIONS",
    "USER_KINDS",
    "UserSpec",
    "clear_user_cache",
    "is_user_data",
    "UserSplit",
    "parse_user_spec",
    "short_name",
    "user_data_info",
    "user_digest",
    "user_missing",
    "user_split",
]

#: the prefixes of a user data spec
USER_KINDS: tuple[str, ...] = ("folder", "hf")
#: the image file endings an image folder reads (torchvision's ImageFolder list)
IMG_EXTENSIONS: tuple[str, ...] = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
MODES = {"L": 1, "RGB": 3}  # PIL mode -> channels
DEFAULT_TEST_FRACTION = 0.1
_OPTIONS = {"folder": ("test",), "hf": ("image", "label", "test")}
_SPLITS = ("train", "test")
_HELD_OUT_SEED = 0


@dataclass(frozen=True)
class UserSpec:
    """A parsed ``folder:PATH?...`` / ``hf:PATH?...`` spec."""

    kind: str
    path: str
    options: tuple[tuple[str, str], ...] = ()

    def option(self, key: str) -> str | None:
        return dict(self.options).get(key)

    @property
    def test_fraction(self) -> float | None:
        """The held-out fraction given as ``test=`` (None: not given)."""
        value = self.option("test")
        return None if value is None else float(value)

    @property
    def text(self) -> str:
        query = "&".join(f"{k}={v}" for k, v in self.options)
        return f"{self.kind}:{self.path}" + (f"?{query}" if query else "")


def is_user_data(name: Any) -> bool:
    """Whether ``name`` is a user data spec (``folder:...`` or ``hf:...``), whatever its path."""
    if not isinstance(name, str):
        return False
    kind, sep, _ = name.partition(":")
    return bool(sep) and kind.strip().lower() in USER_KINDS


def short_name(name: str) -> str:
    """A file-name-safe short name: a user spec's kind ("folder", "hf"); any other name unchanged."""
    return name.partition(":")[0].strip().lower() if is_user_data(name) else name


def _syntax() -> str:
    return ("folder:PATH[?test=FRACTION] (an ImageFolder-layout folder) or "
            "hf:PATH[?image=COLUMN&label=COLUMN&test=FRACTION] (a Hugging Face dataset saved with save_to_disk)")


def parse_user_spec(name: str) -> UserSpec:
    """The kind, path and options of a user data spec; :class:`DatasetError` for a malformed one."""
    if not is_user_data(name):
        raise DatasetError(f"{name!r} is not a user data spec; expected {_syntax()}")
    kind, _, rest = name.partition(":")
    kind = kind.strip().lower()
    path, _, query = rest.partition("?")
    if not path.strip():
        raise DatasetError(f"{name!r}: no path; expected {_syntax()}")
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise DatasetError(f"{name!r}: cannot read the options {query!r}; expected key=value pairs joined by '&'") from None
    options: dict[str, str] = {}
    for key, value in pairs:
        if key not in _OPTIONS[kind]:
            raise DatasetError(f"{name!r}: unknown option {key!r} for {kind}:; valid: {', '.join(_OPTIONS[kind])}")
        if key in options:
            raise DatasetError(f"{name!r}: option {key!r} given twice")
        if not value:
            raise DatasetError(f"{name!r}: option {key!r} has no value")
        options[key] = value
    if "test" in options:
        try:
            frac = float(options["test"])
        except ValueError:
            frac = float("nan")
        if not 0.0 < frac < 1.0:
            raise DatasetError(f"{name!r}: test={options['test']!r}; allowed: a fraction in (0, 1) of each class "
                               "held out as the test split")
    return UserSpec(kind, path.strip(), tuple(sorted(options.items())))


# ---------------------------------------------------------------------------------------------
# decoding


@dataclass(frozen=True)
class _Split:
    images: np.ndarray  # uint8 [N, C, H, W]
    labels: np.ndarray  # int64 [N]
    sha256: str


@dataclass(frozen=True)
class _Decoded:
    spec: UserSpec
    root: Path
    title: str
    classes: tuple[str, ...]
    splits: dict[str, _Split]
    held_out: float | None  # the held-out fraction, or None when the data has its own test split
    digest: str


class _Shape:
    """The first image's mode and size; every later image must match it."""

    def __init__(self) -> None:
        self.first: tuple[str, str, tuple[int, int]] | None = None  # (where, mode, (W, H))

    def check(self, where: str, mode: str, size: tuple[int, int]) -> None:
        if mode not in MODES:
            raise DatasetError(
                f"{where}: image mode {mode}; dfbench reads 8-bit grey (L) or RGB images. Convert it, e.g. "
                f"`Image.open(f).convert('RGB').save(f)` (or 'L' for grey), and every other image to the same mode")
        if self.first is None:
            w, h = size
            if w != h:
                raise DatasetError(f"{where}: {w}x{h} pixels; the images must be square (H = W). Crop or resize "
                                   f"every image to one square size, e.g. `Image.open(f).resize(({min(w, h)}, {min(w, h)}))`")
            self.first = (where, mode, size)
            return
        first, fmode, fsize = self.first
        if mode != fmode:
            raise DatasetError(
                f"{where}: image mode {mode}, but {first} is {fmode}: every image must have the same mode. Convert "
                f"them to one, e.g. `Image.open(f).convert('{fmode}').save(f)`")
        if size != fsize:
            raise DatasetError(
                f"{where}: {size[0]}x{size[1]} pixels, but {first} is {fsize[0]}x{fsize[1]}: every image must have "
                f"the same size. Resize them to one, e.g. `Image.open(f).resize(({fsize[0]}, {fsize[1]})).save(f)`")


def _decode_image(opener: Any, where: str, shape: _Shape) -> np.ndarray:
    """[C, H, W] uint8 of one image; :class:`DatasetError` naming `where` if it cannot be read."""
    from PIL import Image

    try:
        with opener() as im:
            mode, size = im.mode, im.size
            shape.check(where, mode, size)  # before decoding: a wrong mode or size is named as such
            im.load()
            arr = np.asarray(im, dtype=np.uint8)
    except DatasetError:
        raise
    except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError) as e:
        raise DatasetError(f"{where}: cannot read the image ({type(e).__name__}: {e}); it is corrupted, truncated "
                           "or not an image. Replace or remove it") from None
    if arr.ndim == 2:
        arr = arr[None]
    else:
        arr = arr.transpose(2, 0, 1)
    return np.ascontiguousarray(arr)


def _split_digest(images: np.ndarray, labels: np.ndarray, classes: tuple[str, ...]) -> str:
    """sha256 of a split's decoded content: shape, class names, pixels, labels (no paths, no encodings)."""
    h = hashlib.sha256(b"dfbench-user-split-v1\n")
    h.update(json.dumps({"shape": list(images.shape), "classes": list(classes)}).encode() + b"\n")
    h.update(np.ascontiguousarray(images, dtype=np.uint8).tobytes())
    h.update(np.ascontiguousarray(labels, dtype="<i8").tobytes())
    return h.hexdigest()


def _dataset_digest(splits: dict[str, _Split]) -> str:
    h = hashlib.sha256(b"dfbench-user-data-v1\n")
    for s in _SPLITS:
        h.update(f"{s} {splits[s].sha256}\n".encode())
    return h.hexdigest()


def _held_out(labels: np.ndarray, fraction: float) -> np.ndarray:
    """Indices of the test split: in every class a seeded choice of round(fraction * n) images, at
    least one and never all of a class with two or more images (none of a class of one)."""
    rng = np.random.default_rng(_HELD_OUT_SEED)
    chosen: list[np.ndarray] = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        k = min(len(idx) - 1, max(1, int(round(fraction * len(idx)))))
        if k > 0:
            chosen.append(rng.permutation(idx)[:k])
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)


def _make_splits(parts: dict[str, tuple[np.ndarray, np.ndarray]], classes: tuple[str, ...],
                 fraction: float | None) -> tuple[dict[str, _Split], float | None]:
    """Splits from decoded (images, labels) per split; with only "train", a held-out test split."""
    if "test" not in parts:
        fraction = DEFAULT_TEST_FRACTION if fraction is None else fraction
        images, labels = parts["train"]
        test = _held_out(labels, fraction)
        train = np.setdiff1d(np.arange(len(labels)), test)
        if len(test) == 0 or len(train) == 0:
            raise DatasetError(f"{len(labels)} image(s) cannot be split into a training and a test split; "
                               "add images (at least two in a class)")
        parts = {"train": (images[train], labels[train]), "test": (images[test], labels[test])}
    else:
        fraction = None
    splits = {s: _Split(np.ascontiguousarray(x), np.ascontiguousarray(y, dtype=np.int64), _split_digest(x, y, classes))
              for s, (x, y) in parts.items()}
    return splits, fraction


# -- an image folder ---------------------------------------------------------------------------


def _visible(p: Path) -> bool:
    return not p.name.startswith(".")


def _class_dirs(root: Path) -> list[Path]:
    try:
        return sorted((p for p in root.iterdir() if p.is_dir() and _visible(p)), key=lambda p: p.name)
    except OSError as e:
        raise DatasetError(f"cannot list {root}: {e}") from None


def _image_files(class_dir: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(class_dir, followlinks=True):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        out += [Path(dirpath) / f for f in filenames if not f.startswith(".") and f.lower().endswith(IMG_EXTENSIONS)]
    return sorted(out, key=lambda p: p.relative_to(class_dir).as_posix())


def _folder_layout(spec: UserSpec, root: Path) -> tuple[dict[str, Path], tuple[str, ...], dict[str, list[tuple[Path, int]]]]:
    """(split -> folder, classes, split -> [(file, label)]); every structural check, nothing decoded."""
    if not root.is_dir():
        raise DatasetError(f"image folder {root} not found (data.dataset {spec.text!r}); expected a folder in "
                           "ImageFolder layout: ROOT/<class>/<image> or ROOT/train/<class>/<image> + ROOT/test/<class>/<image>")
    if (root / "train").is_dir():
        if not (root / "test").is_dir():
            raise DatasetError(f"{root} has a train/ folder but no test/ folder: add ROOT/test/<class>/<image>, or put the "
                               "class folders directly in ROOT for a held-out test split")
        if spec.test_fraction is not None:
            raise DatasetError(f"{spec.text!r}: test= holds out part of a folder without train/ and test/ sub-folders; "
                               f"{root} has its own test/ split: drop test=")
        folders = {"train": root / "train", "test": root / "test"}
    else:
        folders = {"train": root}
    classes: tuple[str, ...] = ()
    files: dict[str, list[tuple[Path, int]]] = {}
    for split, folder in folders.items():
        dirs = _class_dirs(folder)
        if not dirs:
            raise DatasetError(f"{folder}: no class folders; ImageFolder layout is {folder}/<class>/<image> "
                               f"(images ending in {', '.join(IMG_EXTENSIONS)})")
        if split == "train":
            classes = tuple(d.name for d in dirs)
        else:
            unknown = [d for d in dirs if d.name not in classes]
            if unknown:
                raise DatasetError(f"{unknown[0]}: class {unknown[0].name!r} of the test split is not a class of the "
                                   f"training split ({', '.join(classes)}); rename or remove it, or add it to "
                                   f"{folders['train']}")
        rows: list[tuple[Path, int]] = []
        for d in dirs:
            found = _image_files(d)
            if not found:
                raise DatasetError(f"{d}: class {d.name!r} is empty (no file ending in {', '.join(IMG_EXTENSIONS)}); "
                                   "put its images in it or remove the folder")
            rows += [(f, classes.index(d.name)) for f in found]
        files[split] = rows
    return folders, classes, files


def _decode_folder(spec: UserSpec, root: Path) -> _Decoded:
    from PIL import Image

    _, classes, files = _folder_layout(spec, root)
    shape = _Shape()
    parts: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for split, rows in files.items():
        arrays = [_decode_image(functools.partial(Image.open, f), str(f), shape) for f, _ in rows]
        parts[split] = (np.stack(arrays), np.array([y for _, y in rows], dtype=np.int64))
    splits, held_out = _make_splits(parts, classes, spec.test_fraction)
    return _Decoded(spec, root, f"image folder {root}", classes, splits, held_out, _dataset_digest(splits))


# -- a Hugging Face dataset saved with save_to_disk -------------------------------------------


def _hf_splits(hf: Any, spec: UserSpec, root: Path) -> dict[str, Any]:
    if not root.is_dir():
        raise DatasetError(f"Hugging Face dataset {root} not found (data.dataset {spec.text!r}); expected the folder "
                           "written by Dataset.save_to_disk or DatasetDict.save_to_disk")
    try:
        obj = hf.load_from_disk(str(root))
    except (FileNotFoundError, ValueError, OSError) as e:
        raise DatasetError(f"{root}: cannot load it with datasets.load_from_disk ({type(e).__name__}: {e}); save the "
                           "dataset with save_to_disk, or use folder:PATH for a folder of images") from None
    if isinstance(obj, hf.DatasetDict):
        if "train" not in obj:
            raise DatasetError(f"{root}: a DatasetDict without a 'train' split (it has {', '.join(obj) or 'none'}); "
                               "name the training split 'train' (and the test split 'test')")
        out = {"train": obj["train"]}
        if "test" in obj:
            if spec.test_fraction is not None:
                raise DatasetError(f"{spec.text!r}: test= holds out part of a dataset without a test split; {root} has "
                                   "its own 'test' split: drop test=")
            out["test"] = obj["test"]
        return out
    return {"train": obj}


def _hf_columns(hf: Any, spec: UserSpec, root: Path, ds: Any) -> tuple[str, str]:
    features = ds.features
    image = spec.option("image")
    if image is None:
        found = [c for c, f in features.items() if isinstance(f, hf.Image)]
        if len(found) != 1:
            raise DatasetError(f"{root}: {'no' if not found else len(found)} column(s) of type Image "
                               f"({', '.join(found) or 'columns: ' + ', '.join(features)}); name the image column: "
                               f"hf:{spec.path}?image=COLUMN")
        image = found[0]
    if image not in features:
        raise DatasetError(f"{root}: no column {image!r} (columns: {', '.join(features)})")
    if not isinstance(features[image], hf.Image):
        raise DatasetError(f"{root}: column {image!r} is {features[image]!r}, not an Image column; cast it with "
                           f"ds.cast_column({image!r}, datasets.Image()) and save the dataset again")
    label = spec.option("label")
    if label is None:
        found = [c for c, f in features.items() if isinstance(f, hf.ClassLabel)]
        if len(found) == 1:
            label = found[0]
        elif "label" in features:
            label = "label"
        else:
            raise DatasetError(f"{root}: cannot tell the label column (columns: {', '.join(features)}); name it: "
                               f"hf:{spec.path}?label=COLUMN")
    if label not in features:
        raise DatasetError(f"{root}: no label column {label!r} (columns: {', '.join(features)})")
    return image, label


def _hf_rows(hf: Any, ds: Any, image: str, label: str, where: str, shape: _Shape) -> tuple[np.ndarray, list[Any]]:
    from PIL import Image

    raw = ds.select_columns([image, label]).cast_column(image, hf.Image(decode=False))
    arrays, values = [], []
    for i, row in enumerate(raw):
        item, value = row[image], row[label]
        name = item.get("path") if isinstance(item, dict) else None
        at = f"{where} row {i}" + (f" (file {name})" if name else "")
        if value is None:
            raise DatasetError(f"{at}: no label in column {label!r}; every image needs one")
        if not isinstance(item, dict) or (item.get("bytes") is None and not item.get("path")):
            raise DatasetError(f"{at}: no image in column {image!r}")
        if item.get("bytes") is not None:
            opener = functools.partial(Image.open, io.BytesIO(item["bytes"]))
        else:
            opener = functools.partial(Image.open, item["path"])
        arrays.append(_decode_image(opener, at, shape))
        values.append(value)
    if not arrays:
        raise DatasetError(f"{where}: no rows")
    return np.stack(arrays), values


def _decode_hf(spec: UserSpec, root: Path) -> _Decoded:
    from .hf import import_hf_datasets

    hf = import_hf_datasets()
    sets = _hf_splits(hf, spec, root)
    image, label = _hf_columns(hf, spec, root, sets["train"])
    shape = _Shape()
    decoded = {s: _hf_rows(hf, ds, image, label, f"{root} split {s}", shape) for s, ds in sets.items()}
    feature = sets["train"].features[label]
    if isinstance(feature, hf.ClassLabel):
        classes = tuple(str(n) for n in feature.names)
        parts = {}
        for s, (x, values) in decoded.items():
            y = np.asarray(values, dtype=np.int64)
            bad = np.flatnonzero((y < 0) | (y >= len(classes)))
            if bad.size:
                raise DatasetError(f"{root} split {s} row {bad[0]}: label {y[bad[0]]} of column {label!r} is not one of "
                                   f"its ClassLabel's {len(classes)} classes (0..{len(classes) - 1})")
            parts[s] = (x, y)
        counts = np.bincount(parts["train"][1], minlength=len(classes))
        if (counts == 0).any():
            empty = int(np.flatnonzero(counts == 0)[0])
            raise DatasetError(f"{root}: class {classes[empty]!r} (label {empty}) has no image in the train split; "
                               "remove it from the ClassLabel or add images")
    else:
        kinds = {type(v) for _, vs in decoded.values() for v in vs}
        if not (kinds <= {int, bool} or kinds == {str}):
            raise DatasetError(f"{root}: labels of column {label!r} are {sorted(k.__name__ for k in kinds)}; expected "
                               "integers or strings (or a ClassLabel column)")
        values = sorted({v for _, vs in decoded.values() for v in vs})
        if "test" in decoded:
            train_values = set(decoded["train"][1])
            missing = [v for v in values if v not in train_values]
            if missing:
                raise DatasetError(f"{root}: label {missing[0]!r} of the test split has no image in the train split; "
                                   "every class needs training images")
        classes = tuple(str(v) for v in values)
        index = {v: i for i, v in enumerate(values)}
        parts = {s: (x, np.array([index[v] for v in vs], dtype=np.int64)) for s, (x, vs) in decoded.items()}
    splits, held_out = _make_splits(parts, classes, spec.test_fraction)
    return _Decoded(spec, root, f"Hugging Face dataset {root}", classes, splits, held_out, _dataset_digest(splits))


# ---------------------------------------------------------------------------------------------
# the cache and the public functions


def _stamps(root: Path) -> tuple:
    """Every file under `root` (hidden ones too: an HF dataset's state files) with size, mtime, inode."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames.sort()
        for f in sorted(filenames):
            p = os.path.join(dirpath, f)
            try:
                st = os.stat(p)
            except OSError:
                continue  # a dangling link: the decoder names it if it matters
            out.append((os.path.relpath(p, root), st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(out)


@functools.lru_cache(maxsize=4)
def _decode_cached(kind: str, root: str, options: tuple, stamps: tuple) -> _Decoded:
    del stamps  # part of the cache key only
    spec = UserSpec(kind, root, options)
    return _decode_folder(spec, Path(root)) if kind == "folder" else _decode_hf(spec, Path(root))


def _decoded(name: str) -> _Decoded:
    spec = parse_user_spec(name)
    root = Path(spec.path).expanduser()
    try:
        root = root.resolve()
    except OSError as e:
        raise DatasetError(f"{spec.path}: {e}") from None
    if not root.exists():
        what = "image folder" if spec.kind == "folder" else "Hugging Face dataset (save_to_disk folder)"
        raise DatasetError(f"{what} {root} not found (data.dataset {name!r})")
    return _decode_cached(spec.kind, str(root), spec.options, _stamps(root))


def clear_user_cache() -> None:
    """Forget every decoded user dataset held in memory."""
    _decode_cached.cache_clear()


@dataclass(frozen=True)
class UserSplit:
    """One decoded split (:func:`datasets.load` wraps it in an ``ImageSet``)."""

    images: np.ndarray  # uint8 [N, C, H, W], shared with the cache: do not modify
    labels: np.ndarray  # int64 [N]
    sha256: str  # the split's content digest
    source: str  # the resolved path
    num_classes: int


def user_split(name: str, split: str = "train") -> UserSplit:
    """One split of a user dataset, decoded and checked."""
    if split not in _SPLITS:
        raise DatasetError(f"unknown split {split!r}; valid: {', '.join(_SPLITS)}")
    d = _decoded(name)
    s = d.splits[split]
    return UserSplit(s.images, s.labels, s.sha256, str(d.root), len(d.classes))


def user_digest(name: str) -> str:
    """The dataset's content digest (both splits): what ``data.sha256`` records and the run id hashes."""
    return _decoded(name).digest


def user_data_info(name: str) -> dict:
    """:func:`datasets.data_info` of a user dataset (decodes it: every check runs)."""
    d = _decoded(name)
    train = d.splits["train"]
    c, h, w = (int(v) for v in train.images.shape[1:])
    return {
        "name": name,
        "kind": d.spec.kind,
        "title": d.title,
        "path": str(d.root),
        "channels": c,
        "size": h,
        "image_shape": (c, h, w),
        "num_classes": len(d.classes),
        "classes": list(d.classes),
        "num_samples": {s: int(d.splits[s].labels.shape[0]) for s in _SPLITS},
        "held_out": d.held_out,
        "digest": d.digest,
        "split_sha256": {s: d.splits[s].sha256 for s in _SPLITS},
        "files": {s: [] for s in _SPLITS},
        "checksums": {},
        "sha256": {},
        "system_paths": [],
        "env_var": None,
        "cache_dir": None,
        "urls": [],
        "how_to_get": f"your own data: {_syntax()} (docs/your-own-data.md)",
    }


def user_missing(name: str) -> str | None:
    """None when the user dataset loads, else the error :func:`user_split` would raise."""
    try:
        _decoded(name)
    except DatasetError as e:
        return str(e)
    return None
