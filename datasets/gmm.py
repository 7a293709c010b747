"""Ground-truth data: Gaussian mixtures whose score is known in closed form, named like any dataset.

    gmm:fmnist8 | gmm:fmnist16 | gmm:fmnist28   [?rank=R&n=N&test=M&seed=S&draws=J]
    gmm:dimD                                      [?k=K&rank=R&sep=X&n=N&test=M&seed=S&draws=J]   (2 <= D <= 64)

``gmm:fmnistS`` is image-shaped, [1, S, S] (d = S*S = 64, 256, 784): ten components, one per
Fashion-MNIST class, each fitted to that class's training images (resized to S x S with area
averaging, in the model's [-1, 1] scale) by probabilistic PCA (Tipping & Bishop 1999): the class
mean, and a covariance U U^T + s^2 I whose U holds the top ``rank`` principal directions
(eigenvalues minus s^2) and s^2 the mean of the remaining eigenvalues. Equal weights (the classes
are balanced). Every model preset, method and image metric runs on it unchanged; its samples look
like blurred garments under fine isotropic noise.

``gmm:dimD`` is low-dimensional, [1, 1, D]: K components (``k``, default 8) with seeded means of
typical norm ``sep`` (default 4), seeded rank-``rank`` factors (default 2, at most D) plus an
isotropic variance of 0.05, and seeded unequal weights (Dirichlet(4)), so mode collapse shows in
the component shares. For sweeps of hundreds of runs and the bound's dependence on d (the ``mlp``
model preset).

Both are a finite training set of ``n`` draws (default 60000 and 20000) and a fresh test set of
``test`` draws (default 10000), both from the mixture with generators seeded by the spec's ``seed``
(default 0, the data's seed, not the run's: runs of several seeds train on the same data, as on a
real dataset). ``draws`` (default 0) draws another training and test set from the same mixture: J > 0 gives
draws independent of J = 0's (a disjoint "public" split to pretrain on, issue 63); J = 0 is left out of the
canonical spec, so the specs written before the option name the same data. Components play the role of classes (labels are the components drawn), so label
skew is component skew and every partitioner works unchanged. The data stay float32 in the
model's space end to end: no uint8 quantization, no clamping to a pixel range (either would change
the distribution whose score is known).

The spec is canonical once parsed (:func:`canonical`: every option spelled out, in a fixed order),
and that form is the dataset's name in the run id and the run folder; the mixture itself
(:func:`mixture`) is recorded by the run folder with its digest. Layer 0: nothing of dfbench.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import parse_qsl

import numpy as np
import torch

from .errors import DatasetError
from .mixture import GaussianMixture

__all__ = ["GMM_KIND", "GmmSpec", "SYNTAX", "canonical", "gmm_data_info", "gmm_split", "is_mixture", "mixture",
           "parse_gmm", "to_model_space"]  # datasets.mixture(name) / datasets.load(name) are the entry points

GMM_KIND = "gmm"
FITTED_SIDES = (8, 16, 28)
DIM_RANGE = (2, 64)
SYNTAX = ("gmm:fmnistS[?rank=R&n=N&test=M&seed=S&draws=J] with S in 8, 16, 28 (Fashion-MNIST-fitted, image-shaped), or "
          "gmm:dimD[?k=K&rank=R&sep=X&n=N&test=M&seed=S&draws=J] with 2 <= D <= 64 (low-dimensional)")
_FITTED_DEFAULTS = {"rank": 8, "n": 60000, "test": 10000, "seed": 0, "draws": 0}
_DIM_DEFAULTS = {"k": 8, "rank": 2, "sep": 4.0, "n": 20000, "test": 10000, "seed": 0, "draws": 0}
_DIM_ISO = 0.05  # isotropic variance of the low-dimensional components
_MAX_DRAWS = 1_000_000


@dataclass(frozen=True)
class GmmSpec:
    """A parsed ``gmm:`` spec: the family ("fmnist" or "dim"), its size (side or dimension) and options."""

    family: str
    size: int
    options: tuple[tuple[str, Any], ...]

    def option(self, key: str) -> Any:
        return dict(self.options)[key]

    @property
    def shape(self) -> tuple[int, int, int]:
        """The per-sample [C, H, W]."""
        return (1, self.size, self.size) if self.family == "fmnist" else (1, 1, self.size)

    @property
    def dim(self) -> int:
        c, h, w = self.shape
        return c * h * w

    @property
    def text(self) -> str:
        """The canonical spec: every option, in a fixed order."""
        def fmt(v: Any) -> str:
            return repr(float(v)) if isinstance(v, float) else str(v)
        # draws=0 (the data's own draws) is left out: the specs written before the option stay as they were
        return f"{GMM_KIND}:{self.family}{self.size}?" + "&".join(f"{k}={fmt(v)}" for k, v in self.options
                                                                   if not (k == "draws" and v == 0))

    @property
    def short(self) -> str:
        """A file-name-safe short name (the canonical spec's options hashed)."""
        return f"{GMM_KIND}-{self.family}{self.size}-{hashlib.sha256(self.text.encode()).hexdigest()[:8]}"


def is_mixture(name: Any) -> bool:
    """Whether ``name`` is a ``gmm:`` spec (well formed or not: :func:`parse_gmm` says what is wrong)."""
    return isinstance(name, str) and name.partition(":")[0].strip().lower() == GMM_KIND and ":" in name


def _bad(name: str, problem: str) -> DatasetError:
    return DatasetError(f"{name!r}: {problem}; expected {SYNTAX}")


def parse_gmm(name: str) -> GmmSpec:
    """The family, size and options of a ``gmm:`` spec; a :class:`DatasetError` naming the allowed form for a
    malformed one (an unknown family, size or option, a value of the wrong type or out of range)."""
    if not is_mixture(name):
        raise _bad(name, "not a gmm: spec")
    body, _, query = name.partition(":")[2].partition("?")
    m = re.fullmatch(r"\s*(fmnist|dim)(\d+)\s*", body)
    if m is None:
        raise _bad(name, f"unknown mixture {body!r}")
    family, size = m.group(1), int(m.group(2))
    if family == "fmnist" and size not in FITTED_SIDES:
        raise _bad(name, f"side {size} is not one of {', '.join(map(str, FITTED_SIDES))}")
    if family == "dim" and not DIM_RANGE[0] <= size <= DIM_RANGE[1]:
        raise _bad(name, f"dimension {size} is outside {DIM_RANGE[0]}..{DIM_RANGE[1]}")
    defaults = dict(_FITTED_DEFAULTS if family == "fmnist" else _DIM_DEFAULTS)
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise _bad(name, f"cannot read the options {query!r} (key=value pairs joined by '&')") from None
    given: dict[str, Any] = {}
    for key, raw in pairs:
        key = key.strip().lower()
        if key not in defaults:
            raise _bad(name, f"unknown option {key!r} (allowed for gmm:{family}: {', '.join(defaults)})")
        if key in given:
            raise _bad(name, f"option {key!r} given twice")
        kind = type(defaults[key])
        try:
            value = kind(raw)
        except ValueError:
            raise _bad(name, f"option {key}={raw!r} is not {'a number' if kind is float else 'an integer'}") from None
        given[key] = value
    opts = {**defaults, **given}
    dim = size * size if family == "fmnist" else size
    if "rank" not in given:
        opts["rank"] = min(opts["rank"], dim - 1)
    limits = {"rank": (0, dim - 1), "n": (2, _MAX_DRAWS), "test": (2, _MAX_DRAWS), "seed": (0, 2**31 - 1),
              "draws": (0, 2**31 - 1),
              "k": (1, 100), "sep": (0.0, 100.0)}
    for key, value in opts.items():
        lo, hi = limits[key]
        if not lo <= value <= hi or (isinstance(value, float) and not np.isfinite(value)):
            raise _bad(name, f"option {key}={value} is outside {lo}..{hi}")
    return GmmSpec(family, size, tuple((k, opts[k]) for k in defaults))


def canonical(name: str) -> str:
    """The canonical form of a ``gmm:`` spec (what the run id hashes and the run folder names)."""
    return parse_gmm(name).text


def _seed(spec: GmmSpec, *keys: object) -> int:
    text = "/".join(map(str, (spec.option("seed"), *keys)))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") & (2**63 - 1)


def to_pixels(x: torch.Tensor) -> torch.Tensor:
    """Model-space floats ([-1, 1]) as uint8 pixels [0, 255], rounding to nearest (as torchvision's save_image):
    how samples become images, and how a mixture's draws are quantized alike when an image metric compares them."""
    return ((x.clamp(-1, 1) + 1) * 127.5 + 0.5).floor().clamp(0, 255).to(torch.uint8)


def to_model_space(images: torch.Tensor) -> torch.Tensor:
    """Images as a new float32 tensor in the model's space: uint8 pixels mapped to [-1, 1] (x / 127.5 - 1);
    floating data (the ground-truth mixtures) are already there and are copied unchanged (callers may write
    into the result, as into the uint8 path's)."""
    if images.dtype == torch.uint8:
        return images.float().div_(127.5).sub_(1.0)
    return images.to(torch.float32, copy=True)


Loader = Callable[[], Any]  # () -> Fashion-MNIST's training ImageSet (sources.load: checksummed; a DatasetError says how)


def _fitted(spec: GmmSpec, fmnist: Loader) -> GaussianMixture:
    """Probabilistic PCA per Fashion-MNIST class at the spec's side (module docstring)."""
    train = fmnist()
    side, rank = spec.size, int(spec.option("rank"))
    x = train.images.double() / 127.5 - 1.0  # the model's space, in float64 for the fit
    if side != x.shape[-1]:
        x = torch.nn.functional.interpolate(x, size=(side, side), mode="area")
    x = x.flatten(1).double()
    labels = train.labels
    means, factors, iso = [], [], []
    for k in range(10):
        xk = x[labels == k]
        mu = xk.mean(0)
        # eigen-decomposition of the class covariance (float64; d <= 784)
        cov = torch.cov((xk - mu).T)
        evals, evecs = torch.linalg.eigh(cov)
        evals, evecs = evals.flip(0).clamp_min(0.0), evecs.flip(1)
        s2 = float(evals[rank:].mean())
        u = evecs[:, :rank] * (evals[:rank] - s2).clamp_min(0.0).sqrt()
        # an eigenvector's sign is arbitrary: fix it (largest entry positive), so the digest is stable
        if rank:
            pick = u.abs().argmax(0)
            u = u * torch.sign(u[pick, torch.arange(rank)])
        means.append(mu)
        factors.append(u)
        iso.append(s2)
    return GaussianMixture(weights=torch.full((10,), 0.1, dtype=torch.float64), means=torch.stack(means),
                           factors=torch.stack(factors), iso=torch.tensor(iso, dtype=torch.float64))


def _random(spec: GmmSpec) -> GaussianMixture:
    """The low-dimensional family: seeded means, factors and weights (module docstring)."""
    d, k, rank = spec.size, int(spec.option("k")), min(int(spec.option("rank")), spec.size)
    rng = np.random.default_rng(_seed(spec, "mixture"))
    means = rng.standard_normal((k, d)) * float(spec.option("sep")) / np.sqrt(d)
    factors = rng.standard_normal((k, d, rank)) * (0.5 / np.sqrt(max(rank, 1)))
    weights = rng.dirichlet(np.full(k, 4.0))
    return GaussianMixture(weights=torch.from_numpy(weights), means=torch.from_numpy(means),
                           factors=torch.from_numpy(factors), iso=torch.full((k,), _DIM_ISO, dtype=torch.float64))


_MIXTURES: dict[str, GaussianMixture] = {}


def mixture(name: str, fmnist: Loader) -> GaussianMixture:
    """The spec's mixture (float64; deterministic from the spec, and for gmm:fmnistS from Fashion-MNIST's
    checksummed training set, which `fmnist()` loads), cached in-process. `datasets.mixture(name)` passes it."""
    text = canonical(name)
    if text not in _MIXTURES:
        spec = parse_gmm(text)
        _MIXTURES[text] = _fitted(spec, fmnist) if spec.family == "fmnist" else _random(spec)
    return _MIXTURES[text]


@dataclass(frozen=True)
class GmmSplit:
    images: torch.Tensor  # float32 [N, C, H, W]
    labels: torch.Tensor  # int64 [N]: the component of each draw
    sha256: str


_SPLITS: dict[tuple[str, str], GmmSplit] = {}


def _split(text: str, split: str, fmnist: Loader) -> GmmSplit:
    if (text, split) in _SPLITS:
        return _SPLITS[(text, split)]
    spec = parse_gmm(text)
    mix = mixture(text, fmnist)
    n = int(spec.option("n" if split == "train" else "test"))
    j = int(spec.option("draws"))  # 0: the data's own draws (seeded as before the option existed)
    gen = torch.Generator().manual_seed(_seed(spec, "draws", split, *([j] if j else [])))
    x, comp = mix.sample(n, gen)
    images = x.float().reshape(n, *spec.shape).numpy()
    labels = comp.numpy().astype(np.int64)
    h = hashlib.sha256()
    for part in (text.encode(), split.encode(), images.tobytes(), labels.tobytes()):
        h.update(part)
    if len(_SPLITS) >= 8:  # a few specs at a time: each split is up to n x d floats
        _SPLITS.pop(next(iter(_SPLITS)))
    _SPLITS[(text, split)] = GmmSplit(torch.from_numpy(images), torch.from_numpy(labels), h.hexdigest())
    return _SPLITS[(text, split)]


def gmm_split(name: str, split: str, fmnist: Loader) -> GmmSplit:
    """One split's draws (float32 images, component labels, their content digest), cached in-process."""
    if split not in ("train", "test"):
        raise DatasetError(f"unknown split {split!r}; allowed: train, test")
    return _split(canonical(name), split, fmnist)


def gmm_data_info(name: str) -> dict:
    """``data_info``'s keys for a ``gmm:`` spec (no files, checksums or URLs), plus ``kind``, ``spec`` (the
    canonical form), ``dim`` and ``float`` (True: the data are float32 in the model's space, not pixels)."""
    spec = parse_gmm(name)
    c, h, w = spec.shape
    k = 10 if spec.family == "fmnist" else int(spec.option("k"))
    return {
        "name": spec.text, "title": f"Gaussian mixture {spec.family}{spec.size} (d = {spec.dim}, {k} components)",
        "channels": c, "size": h if h == w else None, "image_shape": spec.shape, "num_classes": k,
        "classes": [f"component {i}" for i in range(k)],
        "num_samples": {"train": int(spec.option("n")), "test": int(spec.option("test"))},
        "files": {}, "checksums": {}, "sha256": {}, "system_paths": [], "env_var": None, "cache_dir": None,
        "urls": [], "how_to_get": "generated from the spec (Fashion-MNIST-fitted mixtures need Fashion-MNIST)",
        "kind": GMM_KIND, "spec": spec.text, "dim": spec.dim, "float": True,
    }
