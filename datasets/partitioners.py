"""Client partitioners: split a labelled dataset among federated clients.

Every partitioner is a pure function of ``(labels or images, spec, num_clients, seed,
min_size)``: its only randomness is ``numpy.random.default_rng(seed)`` (retries use the
derived seeds ``default_rng([seed, attempt])``), so the output does not depend on global RNG
state, torch, the number of processes or threads, or anything else.

Spec strings (:func:`parse_partition`):

``iid``
    uniform random split; client sizes differ by at most one. Assigns every sample.
``dirichlet:ALPHA``  (ALPHA > 0)
    label skew (Hsu et al. 2019; NIID-Bench "noniid-labeldir", without its size-balancing
    heuristic): each class's samples are shuffled and cut among the clients in proportions
    drawn from Dir(ALPHA * 1) (cut points rounded to the nearest sample). Small ALPHA: few
    classes per client; large ALPHA: close to iid.
    Assigns every sample.
``shards:K``  (K >= 1)
    pathological label skew (McMahan et al. 2017, generalised; NIID-Bench "#C=K"): each client
    holds K distinct classes, chosen at random with class usage kept balanced (a class is used
    by at most one client more than any other); each class's samples are split evenly among
    the clients holding it. A client has at most K classes (exactly K unless a class has fewer
    samples than holders). DROPS the samples of classes no client holds, which happens only
    when ``num_clients * K`` < number of classes.
``quantity:SIGMA``  (SIGMA >= 0)
    quantity skew: client c receives ``min_size`` plus a share of the remaining samples
    proportional to w_c ~ LogNormal(0, SIGMA) (largest-remainder rounding), labels iid.
    SIGMA = 0 gives equal sizes (+-1). Assigns every sample.
``clusters:K``  (K >= 1; needs ``images``)
    feature skew: k-means (k-means++ init from the seed, at most 50 Lloyd iterations) with K
    clusters on a FIXED feature map of the images - 2x2 average pooling of the pixels (scaled
    to [0, 1] for uint8), projected to 32 dimensions by a Gaussian matrix drawn from a
    constant seed (:data:`FEATURE_SEED`), identical for every partition seed. Clusters are
    numbered by their smallest sample index; client c belongs to cluster ``c % K`` (requires
    ``num_clients >= K``) and each cluster's samples are split iid (sizes +-1) among its
    clients. Assigns every sample.

Flower Datasets' partitioners, under Flower's names and parameter names (``FLWR_PARTITIONERS``):
``flwr:NAME`` or ``flwr:NAME?PARAM=VALUE&PARAM=VALUE`` (the query syntax of method options such as
``fedprox?mu=0.01``; booleans are true/false, a list is comma-separated). The canonical form
(``str(parse_partition(spec))``, recorded in the partition) names every parameter, defaults filled
in, in Flower's constructor order. ``num_partitions`` is the number of clients and ``partition_by``
the labels; ``seed`` and ``shuffle`` are not parameters (see ``_SET_BY_RUN``). Each reproduces
what ``FederatedDataset(shuffle=True, seed=S)`` with ``XPartitioner(..., seed=S)`` gives on the
same labels (both of Flower's seeds are the run's partition seed S, as both default to 42 in
Flower): the rows are first shuffled by ``default_rng(S).permutation(n)`` (Hugging Face
``Dataset.shuffle``), then partitioned with the partitioner's own ``default_rng(S)``, making the
same numpy calls in the same order, so the client index sets are identical to flwr-datasets' 0.6.1
(tests/unit/test_partitioners_flwr.py checks this against flwr-datasets itself). Only the order of the
samples inside a client (Flower's ``shuffle``) is not reproduced; dfbench's indices are sorted.

``flwr:iid``
    IidPartitioner: contiguous equal blocks (first ``n % C`` one larger) of the shuffled rows; the
    same partition as ``iid`` for the same seed.
``flwr:dirichlet?alpha=A&min_partition_size=10&self_balancing=false``
    DirichletPartitioner: per class, proportions ~ Dir(A) cut at ``floor(cumsum * n_k)`` (the last
    client gets the rounding remainder); ``self_balancing`` gives nothing more to a client already
    above ``n / C`` samples; redrawn from the same generator while a client has fewer than
    ``min_partition_size`` samples, at most :data:`FLWR_DIRICHLET_DRAWS` draws. Assigns every sample.
``flwr:pathological?num_classes_per_partition=K&class_assignment_mode=random``
    PathologicalPartitioner: K classes per client (``random``, ``deterministic``: classes
    ``i .. i+K-1 mod m``, ``first-deterministic``: class ``i mod m`` then random ones); each class
    split evenly among its holders. Drops classes no client holds.
``flwr:shard?num_shards_per_partition=S&shard_size=Z&keep_incomplete_shard=false``
    ShardPartitioner: rows sorted by label, cut into shards of Z rows (Z = ``n // (C * S)`` when not
    given), shards dealt at random, S per client (or as many as fit, the first clients one more, when
    only Z is given). Drops the shards not dealt.
``flwr:linear``, ``flwr:square``, ``flwr:exponential``
    quantity skew by client id i = 1..C: sizes ``floor(n * f(i) / sum f)`` with f(i) = i, i^2, e^i,
    the remainder to the last client; contiguous blocks of the shuffled rows. Assigns every sample.
``flwr:size?partition_sizes=N1,N2,...``
    SizePartitioner: client c gets the next N_c shuffled rows (one size per client); the rest is
    dropped.

Each client must end up with at least ``min_size`` samples; otherwise the draw is repeated
with a derived seed, at most :data:`MAX_TRIES` times (:data:`MAX_TRIES_CLUSTERS` for
``clusters``), after which a :class:`ValueError` says what to change. Nothing loops forever.
``flwr:`` partitions are never redrawn with another seed (that would no longer be Flower's
partition): one below ``min_size`` is refused with that advice.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "KINDS",
    "FLWR_KINDS",
    "FLWR_PARTITIONERS",
    "MAX_TRIES",
    "MAX_TRIES_CLUSTERS",
    "FEATURE_SEED",
    "FEATURE_DIM",
    "PartitionSpec",
    "Partition",
    "parse_partition",
    "partition",
    "cluster_features",
    "mean_tv_distance",
]

KINDS: tuple[str, ...] = ("iid", "dirichlet", "shards", "quantity", "clusters")
MAX_TRIES = 100
MAX_TRIES_CLUSTERS = 10
KMEANS_ITERS = 50
FEATURE_DIM = 32
FEATURE_SEED = 0xDFBE_2024
_CHUNK = 4096

_VALID_FORMS = (
    "valid forms: 'iid'; 'dirichlet:ALPHA' (ALPHA > 0, e.g. dirichlet:0.5); "
    "'shards:K' (K >= 1 classes per client, e.g. shards:2); "
    "'quantity:SIGMA' (SIGMA >= 0, log-normal client sizes, e.g. quantity:1.0); "
    "'clusters:K' (K >= 1 k-means clusters of the images, e.g. clusters:4); "
    "Flower Datasets' partitioners: 'flwr:NAME?PARAM=VALUE&...' with NAME one of iid, dirichlet, "
    "pathological, shard, linear, square, exponential, size (e.g. flwr:dirichlet?alpha=0.5)"
)


def _fmt(x: float) -> str:
    r = repr(float(x))
    return r[:-2] if r.endswith(".0") else r


@dataclass(frozen=True)
class PartitionSpec:
    """A parsed spec. ``param`` is ALPHA/SIGMA (float) or K (int); None for iid and the ``flwr:``
    kinds, whose Flower parameters are ``options`` ((name, value), ... in Flower's constructor order,
    defaults filled in; None = not given)."""

    kind: str
    param: float | int | None = None
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def options_dict(self) -> dict[str, Any]:
        return dict(self.options)

    def __str__(self) -> str:
        if self.kind == "iid":
            return "iid"
        if self.kind.startswith(FLWR_PREFIX):  # canonical: every parameter, Flower's order
            query = "&".join(f"{k}={_fmt_opt(v)}" for k, v in self.options if v is not None)
            return self.kind + ("?" + query if query else "")
        if self.kind in ("shards", "clusters"):
            return f"{self.kind}:{int(self.param)}"
        return f"{self.kind}:{_fmt(self.param)}"


def parse_partition(spec: str | PartitionSpec) -> PartitionSpec:
    """Parse a spec string (case and surrounding spaces ignored). Raises ValueError naming the
    bad spec and the valid forms."""
    if isinstance(spec, PartitionSpec):
        spec = str(spec)
    if not isinstance(spec, str):
        raise ValueError(f"invalid partition spec {spec!r}: not a string; {_VALID_FORMS}")

    def bad(why: str) -> ValueError:
        return ValueError(f"invalid partition spec {spec!r}: {why}; {_VALID_FORMS}")

    kind, sep, arg = spec.strip().lower().partition(":")
    kind, arg = kind.strip(), arg.strip()
    if kind + ":" == FLWR_PREFIX:
        return _parse_flwr(spec, arg)
    if kind == "iid":
        if sep:
            raise bad("'iid' takes no parameter")
        return PartitionSpec("iid")
    if kind not in KINDS:
        import difflib

        close = difflib.get_close_matches(kind, list(KINDS), n=1)
        raise bad(f"unknown kind {kind!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    if not arg:
        raise bad(f"'{kind}' needs a parameter")
    if kind in ("dirichlet", "quantity"):
        try:
            value = float(arg)
        except ValueError:
            raise bad(f"{arg!r} is not a number") from None
        if not math.isfinite(value):
            raise bad(f"{arg!r} is not finite")
        if kind == "dirichlet" and value <= 0:
            raise bad("ALPHA must be > 0")
        if kind == "quantity" and value < 0:
            raise bad("SIGMA must be >= 0")
        return PartitionSpec(kind, value)
    try:
        k = int(arg, 10)
    except ValueError:
        raise bad(f"{arg!r} is not an integer") from None
    if k < 1:
        raise bad("K must be >= 1")
    return PartitionSpec(kind, k)


# ---------------------------------------------------------------------------------------------
# result


def _tv_rows(hist: np.ndarray) -> np.ndarray:
    """Total-variation distance of each non-empty row's distribution to the pooled one."""
    hist = np.asarray(hist, dtype=np.float64)
    sizes = hist.sum(axis=1)
    total = hist.sum()
    if total == 0:
        return np.zeros(0)
    glob = hist.sum(axis=0) / total
    rows = hist[sizes > 0] / sizes[sizes > 0, None]
    return 0.5 * np.abs(rows - glob).sum(axis=1)


def mean_tv_distance(hist: np.ndarray) -> float:
    """Mean over non-empty clients of the total-variation distance between the client's label
    distribution and the pooled label distribution of all assigned samples (0 = iid; close to
    1 = clients hold disjoint rare classes). Unweighted mean over clients."""
    tv = _tv_rows(hist)
    return float(tv.mean()) if tv.size else 0.0


_HET_METRIC = ("mean_tv_to_global: mean over clients of the total-variation distance between "
               "the client's label distribution and the pooled label distribution (0 = iid)")


def _as_labels(labels: Any) -> np.ndarray:
    if hasattr(labels, "detach"):  # torch tensor, without importing torch
        labels = labels.detach().cpu().numpy()
    y = np.asarray(labels)
    if y.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {y.shape}")
    if y.size and y.dtype.kind not in "iub":
        raise ValueError(f"labels must be integers, got dtype {y.dtype}")
    y = y.astype(np.int64, copy=False)
    if y.size and y.min() < 0:
        raise ValueError("labels must be >= 0")
    return y


@dataclass(frozen=True, eq=False)
class Partition:
    """One index array per client (int64, sorted, disjoint, read-only)."""

    indices: tuple[np.ndarray, ...]
    cluster_of_client: np.ndarray | None
    spec: str

    @property
    def num_clients(self) -> int:
        return len(self.indices)

    @property
    def sizes(self) -> np.ndarray:
        return np.array([len(i) for i in self.indices], dtype=np.int64)

    def histogram(self, labels: np.ndarray, num_classes: int = 10) -> np.ndarray:
        """[clients, classes] int64 label counts."""
        y = _as_labels(labels)
        if y.size and y.max() >= num_classes:
            raise ValueError(f"label {int(y.max())} >= num_classes={num_classes}")
        out = np.zeros((self.num_clients, num_classes), dtype=np.int64)
        for c, idx in enumerate(self.indices):
            if idx.size and idx[-1] >= y.size:
                raise ValueError(f"client {c} has index {int(idx[-1])} but there are only {y.size} labels")
            out[c] = np.bincount(y[idx], minlength=num_classes)
        return out

    def _classes(self, y: np.ndarray) -> int:
        return max(10, int(y.max()) + 1) if y.size else 10

    def heterogeneity(self, labels: np.ndarray) -> float:
        """:func:`mean_tv_distance` of this partition's label histogram."""
        y = _as_labels(labels)
        return mean_tv_distance(self.histogram(y, self._classes(y)))

    def capped(self, max_size: int, seed: int) -> "Partition":
        """Each client keeps a seeded random subset of at most `max_size` of its samples (few images per
        client, e.g. to study memorization); the spec records the cap. Pure: (partition, max_size, seed)."""
        if max_size < 1:
            raise ValueError(f"max_size must be >= 1, got {max_size}")
        rng = np.random.default_rng(seed)
        kept = tuple(np.sort(rng.choice(ix, size=max_size, replace=False)) if ix.size > max_size else ix.copy()
                     for ix in self.indices)
        for ix in kept:
            ix.setflags(write=False)
        return Partition(indices=kept, cluster_of_client=self.cluster_of_client, spec=f"{self.spec}|max{max_size}")

    def digest(self) -> str:
        """sha256 over the client index arrays (identifies the partition in run records)."""
        h = hashlib.sha256(f"{self.spec}\n{self.num_clients}\n".encode())
        for idx in self.indices:
            h.update(np.int64(idx.size).tobytes())
            h.update(np.ascontiguousarray(idx, dtype="<i8").tobytes())
        return h.hexdigest()

    def to_json(self, labels) -> dict:
        """JSON-ready summary: spec, sizes, per-client label histograms, cluster_of_client,
        heterogeneity and an index digest (the indices themselves are not inlined)."""
        y = _as_labels(labels)
        hist = self.histogram(y, self._classes(y))
        return {
            "spec": self.spec,
            "num_clients": self.num_clients,
            "num_samples": int(y.size),
            "num_assigned": int(hist.sum()),
            "num_classes": int(hist.shape[1]),
            "sizes": [int(s) for s in self.sizes],
            "label_histograms": hist.tolist(),
            "cluster_of_client": None if self.cluster_of_client is None
            else [int(c) for c in self.cluster_of_client],
            "heterogeneity": {"metric": "mean_tv_to_global", "value": mean_tv_distance(hist)},
            "indices_sha256": self.digest(),
        }

    def summary(self, labels):
        """pandas.DataFrame, one row per client: size, number of classes present, total-variation
        distance of its label distribution to the pooled one (and its cluster for
        ``clusters:K``). ``df.attrs`` holds ``heterogeneity`` (the mean of ``tv_to_global``),
        ``heterogeneity_metric``, ``spec`` and ``dropped`` (samples assigned to no client)."""
        import pandas as pd

        y = _as_labels(labels)
        hist = self.histogram(y, self._classes(y))
        sizes = hist.sum(axis=1)
        tv = np.zeros(self.num_clients)
        tv[sizes > 0] = _tv_rows(hist)
        df = pd.DataFrame({
            "client": np.arange(self.num_clients),
            "size": sizes,
            "classes": (hist > 0).sum(axis=1),
            "top_class_share": np.where(sizes > 0, hist.max(axis=1) / np.maximum(sizes, 1), 0.0),
            "tv_to_global": tv,
        })
        if self.cluster_of_client is not None:
            df["cluster"] = self.cluster_of_client
        df = df.set_index("client")
        df.attrs["spec"] = self.spec
        df.attrs["heterogeneity"] = mean_tv_distance(hist)
        df.attrs["heterogeneity_metric"] = _HET_METRIC
        df.attrs["dropped"] = int(y.size - sizes.sum())
        return df


def _from_owner(owner: np.ndarray, num_clients: int) -> tuple[np.ndarray, ...]:
    assigned = np.flatnonzero(owner >= 0)
    o = owner[assigned]
    order = np.argsort(o, kind="stable")  # stable: indices stay ascending within a client
    counts = np.bincount(o, minlength=num_clients)
    parts = np.split(assigned[order].astype(np.int64, copy=False), np.cumsum(counts)[:-1])
    for p in parts:
        p.setflags(write=False)
    return tuple(parts)


# ---------------------------------------------------------------------------------------------
# draws: each returns owner[n] (client id or -1) and optionally cluster_of_client


def _even_sizes(n: int, parts: int) -> np.ndarray:
    return np.full(parts, n // parts, dtype=np.int64) + (np.arange(parts) < n % parts)


def _draw_iid(y, C, rng, _spec, _ctx):
    n = y.size
    owner = np.empty(n, dtype=np.int64)
    owner[rng.permutation(n)] = np.repeat(np.arange(C), _even_sizes(n, C))
    return owner, None


def _class_order(y: np.ndarray, rng) -> tuple[np.ndarray, np.ndarray]:
    """Indices grouped by class (ascending class), shuffled within class; counts per class."""
    classes, inv = np.unique(y, return_inverse=True)
    perm = rng.permutation(y.size)
    order = perm[np.argsort(inv[perm], kind="stable")]
    return order, np.bincount(inv, minlength=classes.size)


def _draw_dirichlet(y, C, rng, spec, _ctx):
    alpha = float(spec.param)
    order, counts = _class_order(y, rng)
    owner = np.empty(y.size, dtype=np.int64)
    start = 0
    clients = np.arange(C)
    for nk in counts:
        p = rng.dirichlet(np.full(C, alpha))
        if not np.all(np.isfinite(p)) or p.sum() <= 0:  # defensive; numpy handles tiny alpha
            p = np.zeros(C)
            p[rng.integers(C)] = 1.0
        # round the cumulative cut points: unbiased, unlike floor (which hands every
        # class's remainder to the last client)
        cuts = np.clip(np.floor(np.cumsum(p)[:-1] * nk + 0.5), 0, nk).astype(np.int64)
        sizes = np.diff(np.concatenate(([0], cuts, [nk])))
        owner[order[start:start + nk]] = np.repeat(clients, sizes)
        start += nk
    return owner, None


def _draw_shards(y, C, rng, spec, _ctx):
    k = int(spec.param)
    order, counts = _class_order(y, rng)
    m = counts.size
    usage = np.zeros(m)
    holds = np.zeros((C, m), dtype=bool)
    for c in range(C):
        chosen = np.argsort(usage + rng.random(m), kind="stable")[:k]  # least-used, random ties
        holds[c, chosen] = True
        usage[chosen] += 1
    owner = np.full(y.size, -1, dtype=np.int64)
    start = 0
    for j, nk in enumerate(counts):
        holders = np.flatnonzero(holds[:, j])
        if holders.size:
            holders = rng.permutation(holders)
            owner[order[start:start + nk]] = np.repeat(holders, _even_sizes(int(nk), holders.size))
        start += nk
    return owner, None


def _largest_remainder(x: np.ndarray, total: int) -> np.ndarray:
    base = np.floor(x).astype(np.int64)
    rest = int(total - base.sum())
    frac = x - base
    if rest > 0:
        base[np.argsort(-frac, kind="stable")[:rest]] += 1
    elif rest < 0:  # floating-point slack; never seen in practice
        base[np.argsort(-base, kind="stable")[:-rest]] -= 1
    return base


def _draw_quantity(y, C, rng, spec, ctx):
    sigma = float(spec.param)
    n = y.size
    min_size = ctx["min_size"]
    w = rng.lognormal(0.0, sigma, size=C) if sigma > 0 else np.ones(C)
    sizes = min_size + _largest_remainder(w / w.sum() * (n - C * min_size), n - C * min_size)
    owner = np.empty(n, dtype=np.int64)
    owner[rng.permutation(n)] = np.repeat(np.arange(C), sizes)
    return owner, None


def _draw_clusters(y, C, rng, spec, ctx):
    k = int(spec.param)
    assign = _kmeans(ctx["features"], k, rng)
    cluster_of_client = np.arange(C, dtype=np.int64) % k
    owner = np.empty(y.size, dtype=np.int64)
    for j in range(k):
        members = rng.permutation(np.flatnonzero(assign == j))
        clients = np.flatnonzero(cluster_of_client == j)
        owner[members] = np.repeat(clients, _even_sizes(members.size, clients.size))
    return owner, cluster_of_client


# ---------------------------------------------------------------------------------------------
# Flower Datasets partitioners: ``flwr:NAME?param=value&...`` with flwr-datasets' parameter names


FLWR_PREFIX = "flwr:"
_REQUIRED = object()
_MODES = ("random", "deterministic", "first-deterministic")
#: the flwr-datasets Dirichlet partitioner redraws at most this often (its own limit: 11 draws)
FLWR_DIRICHLET_DRAWS = 11

# name -> (Flower class, ((parameter, type, default), ...)) in Flower's constructor order; the type
# is one of "alpha" (number > 0), "int0" (integer >= 0), "int1" (integer >= 1), "bool", "mode", "sizes"
FLWR_PARTITIONERS: dict[str, tuple[str, tuple[tuple[str, str, Any], ...]]] = {
    "iid": ("IidPartitioner", ()),
    "dirichlet": ("DirichletPartitioner", (("alpha", "alpha", _REQUIRED), ("min_partition_size", "int0", 10),
                                           ("self_balancing", "bool", False))),
    "pathological": ("PathologicalPartitioner", (("num_classes_per_partition", "int1", _REQUIRED),
                                                 ("class_assignment_mode", "mode", "random"))),
    "shard": ("ShardPartitioner", (("num_shards_per_partition", "int1", None), ("shard_size", "int1", None),
                                   ("keep_incomplete_shard", "bool", False))),
    "linear": ("LinearPartitioner", ()),
    "square": ("SquarePartitioner", ()),
    "exponential": ("ExponentialPartitioner", ()),
    "size": ("SizePartitioner", (("partition_sizes", "sizes", _REQUIRED),)),
}
FLWR_KINDS: tuple[str, ...] = tuple(FLWR_PREFIX + name for name in FLWR_PARTITIONERS)

_TYPE_TEXT = {
    "alpha": "a number > 0",
    "int0": "an integer >= 0",
    "int1": "an integer >= 1",
    "bool": "true or false",
    "mode": " | ".join(_MODES),
    "sizes": "a comma list of integers >= 1, one per client (e.g. 100,200,300)",
}
_EXAMPLES = {
    "iid": "flwr:iid",
    "dirichlet": "flwr:dirichlet?alpha=0.5&min_partition_size=10&self_balancing=false",
    "pathological": "flwr:pathological?num_classes_per_partition=2&class_assignment_mode=first-deterministic",
    "shard": "flwr:shard?num_shards_per_partition=2",
    "linear": "flwr:linear",
    "square": "flwr:square",
    "exponential": "flwr:exponential",
    "size": "flwr:size?partition_sizes=100,200,300",
}
# Flower parameters that dfbench sets itself (so a spec must not)
_SET_BY_RUN = {
    "num_partitions": "the number of partitions is the run's number of clients (data.clients)",
    "partition_by": "the partitioners always split by the dataset's labels",
    "seed": "the seed is the run's partition seed (derived from the run's seed)",
    "shuffle": ("Flower's `shuffle` only orders the samples inside a partition; dfbench's client indices are "
                "sets (sorted), so it changes nothing"),
}


def _flwr_forms(name: str | None = None) -> str:
    """What flwr:NAME accepts (one name) or every Flower partitioner (None)."""
    def params(n: str) -> str:
        ps = FLWR_PARTITIONERS[n][1]
        if not ps:
            return "no parameters"
        return ", ".join(f"{p} ({_TYPE_TEXT[t]}; " + ("required" if d is _REQUIRED else
                                                      "optional" if d is None else f"default {_fmt_opt(d)}") + ")"
                         for p, t, d in ps)

    if name is not None:
        return (f"'flwr:{name}' (Flower Datasets' {FLWR_PARTITIONERS[name][0]}) takes {params(name)}; "
                f"e.g. '{_EXAMPLES[name]}'")
    return ("Flower Datasets' partitioners: 'flwr:NAME' or 'flwr:NAME?PARAM=VALUE&PARAM=VALUE' with NAME one of "
            + ", ".join(FLWR_PARTITIONERS) + " and Flower's parameter names, e.g. '" + _EXAMPLES["dirichlet"] + "'")


def _fmt_opt(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, tuple):
        return ",".join(str(int(s)) for s in v)
    if isinstance(v, float):
        return _fmt(v)
    return str(v)


def _parse_flwr(spec: str, rest: str) -> PartitionSpec:
    """``rest`` = what follows 'flwr:' (lower case, stripped)."""
    name, sep, query = rest.partition("?")
    name = name.strip()
    if name not in FLWR_PARTITIONERS:
        import difflib

        near = difflib.get_close_matches(name, list(FLWR_PARTITIONERS), n=1)
        hint = f" (did you mean 'flwr:{near[0]}'?)" if near else ""
        raise ValueError(f"invalid partition spec {spec!r}: unknown Flower partitioner {name!r}{hint}; "
                         f"{_flwr_forms()}")

    def bad(why: str) -> ValueError:
        return ValueError(f"invalid partition spec {spec!r}: {why}; {_flwr_forms(name)}")

    declared = {p: (t, d) for p, t, d in FLWR_PARTITIONERS[name][1]}
    given: dict[str, str] = {}
    if sep and not query.strip():
        raise bad("nothing after '?'")
    for item in query.split("&") if query.strip() else []:
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key or not value:
            raise bad(f"{item!r} is not PARAM=VALUE")
        if key in given:
            raise bad(f"parameter {key!r} is given twice")
        if key in _SET_BY_RUN:
            raise bad(f"drop parameter {key!r}: {_SET_BY_RUN[key]}")
        if key not in declared:
            allowed = ", ".join(declared) or "none"
            raise bad(f"unknown parameter {key!r} (allowed: {allowed})")
        given[key] = value
    options = []
    for key, (typ, default) in declared.items():
        if key not in given:
            if default is _REQUIRED:
                raise bad(f"parameter {key!r} is required ({_TYPE_TEXT[typ]})")
            options.append((key, default))
            continue
        options.append((key, _flwr_value(key, typ, given[key], bad)))
    opts = dict(options)
    if name == "shard" and opts["num_shards_per_partition"] is None and opts["shard_size"] is None:
        raise bad("give num_shards_per_partition, shard_size, or both")
    return PartitionSpec(FLWR_PREFIX + name, None, tuple(options))


def _flwr_value(key: str, typ: str, text: str, bad) -> Any:
    what = f"{key} must be {_TYPE_TEXT[typ]}, got {text!r}"
    if typ == "alpha":
        try:
            value = float(text)
        except ValueError:
            raise bad(what) from None
        if not (math.isfinite(value) and value > 0):
            raise bad(what)
        return value
    if typ in ("int0", "int1"):
        try:
            value = int(text, 10)
        except ValueError:
            raise bad(what) from None
        if value < (0 if typ == "int0" else 1):
            raise bad(what)
        return value
    if typ == "bool":
        if text not in ("true", "false"):
            raise bad(what)
        return text == "true"
    if typ == "mode":
        if text not in _MODES:
            raise bad(what)
        return text
    # sizes
    try:
        sizes = tuple(int(s.strip(), 10) for s in text.split(","))
    except ValueError:
        raise bad(what) from None
    if not sizes or min(sizes) < 1:
        raise bad(what)
    return sizes


def _flwr_check(ps: PartitionSpec, y: np.ndarray, C: int, name: str) -> dict[str, Any]:
    """Validate what depends on the labels and the number of clients, before any draw; returns
    what the draw needs (e.g. the shard layout)."""
    kind, o, n = ps.kind[len(FLWR_PREFIX):], ps.options_dict, int(y.size)
    if kind == "dirichlet" and C * o["min_partition_size"] > n:
        raise ValueError(f"partition {name!r}: {C} clients x min_partition_size={o['min_partition_size']} needs "
                         f"{C * o['min_partition_size']} samples, only {n} available; use a smaller "
                         f"min_partition_size or fewer clients")
    if kind == "pathological":
        present = int(np.unique(y).size)
        if o["num_classes_per_partition"] > present:
            raise ValueError(f"partition {name!r}: num_classes_per_partition={o['num_classes_per_partition']} but "
                             f"the labels have only {present} classes; use num_classes_per_partition <= {present}")
    if kind == "size":
        sizes = o["partition_sizes"]
        if len(sizes) != C:
            raise ValueError(f"partition {name!r}: partition_sizes has {len(sizes)} entries for {C} clients; give "
                             f"one size per client (data.clients={C})")
        if sum(sizes) > n:
            raise ValueError(f"partition {name!r}: partition_sizes sum to {sum(sizes)} but there are only {n} "
                             f"samples; use smaller sizes")
        return {"sizes": np.asarray(sizes, dtype=np.int64)}
    if kind in ("linear", "square", "exponential"):
        return {"sizes": _flwr_id_sizes(kind, n, C, name)}
    if kind == "shard":
        return {"layout": _shard_layout(n, C, o, name)}
    return {}


def _flwr_id_sizes(kind: str, n: int, C: int, name: str) -> np.ndarray:
    """Linear/Square/ExponentialPartitioner: partition i (1-based) gets units f(i) = i, i^2 or e^i;
    its size is floor(n * f(i) / sum f), and the samples left over go to the last partition."""
    ids = np.linspace(start=1, stop=C, num=C)
    with np.errstate(over="ignore"):
        units = {"linear": ids, "square": np.square(ids), "exponential": np.exp(ids)}[kind]
    total = units.sum()
    if not math.isfinite(total):
        raise ValueError(f"partition {name!r}: e^{C} overflows; use at most 709 clients")
    sizes = np.array(units / total * n, dtype=np.int64)  # truncation, as Flower
    sizes[-1] += n - sizes.sum()
    if sizes.min() < 1:
        raise ValueError(f"partition {name!r}: with {C} clients and {n} samples client "
                         f"{int(np.argmin(sizes))} would get {int(sizes.min())} samples; use fewer clients")
    return sizes


def _shard_layout(n: int, C: int, o: dict[str, Any], name: str) -> tuple[int, int, np.ndarray]:
    """ShardPartitioner's arithmetic: (shard_size, shards to permute, shards per partition)."""
    per_part, size, keep = o["num_shards_per_partition"], o["shard_size"], o["keep_incomplete_shard"]

    def refuse(why: str) -> ValueError:
        return ValueError(f"partition {name!r}: {why}")

    if per_part is not None:
        used = C * per_part
        if size is None:
            size = n // used  # Flower: int(n / used)
            if size < 1:
                raise refuse(f"{C} clients x num_shards_per_partition={per_part} = {used} shards but only {n} "
                             f"samples; use fewer shards per partition or fewer clients")
            usable = -(-n // size) if keep else n // size
        else:
            if size * per_part * C > n:
                raise refuse(f"shard_size={size} x num_shards_per_partition={per_part} x {C} clients = "
                             f"{size * per_part * C} samples but only {n}; use a smaller shard_size or fewer shards")
            usable = n // size
        counts = np.full(C, per_part, dtype=np.int64)
    else:
        used = -(-n // size) if keep else n // size
        usable = used
        counts = np.full(C, used // C, dtype=np.int64)
        counts[:used - C * (used // C)] += 1  # the left-over shards go to the first partitions
    if usable < C:
        raise refuse(f"shard_size={size} gives {usable} shards for {C} clients (some would be empty); use a "
                     f"smaller shard_size or fewer clients")
    return size, usable, counts


def _flwr_shuffled(y: np.ndarray, ctx) -> np.ndarray:
    """FederatedDataset(shuffle=True, seed=seed) shuffles the split before partitioning:
    Hugging Face ``Dataset.shuffle(seed)`` = ``default_rng(seed).permutation(n)``. Row j of the
    shuffled dataset is original sample order[j]."""
    return np.random.default_rng(ctx["seed"]).permutation(y.size)


def _owner_from_rows(order: np.ndarray, owner_rows: np.ndarray) -> np.ndarray:
    owner = np.empty(order.size, dtype=np.int64)
    owner[order] = owner_rows
    return owner


def _draw_flwr_iid(y, C, rng, _spec, ctx):
    # IidPartitioner: Dataset.shard(C, i, contiguous=True) of the shuffled rows (first n % C one larger)
    order = _flwr_shuffled(y, ctx)
    return _owner_from_rows(order, np.repeat(np.arange(C), _even_sizes(y.size, C))), None


def _draw_flwr_sizes(y, C, rng, _spec, ctx):
    # Size/Linear/Square/ExponentialPartitioner: consecutive blocks of the shuffled rows; the rest is dropped
    order = _flwr_shuffled(y, ctx)
    sizes = ctx["sizes"]
    rows = np.full(y.size, -1, dtype=np.int64)
    rows[:sizes.sum()] = np.repeat(np.arange(C), sizes)
    return _owner_from_rows(order, rows), None


def _draw_flwr_dirichlet(y, C, rng, spec, ctx):
    """DirichletPartitioner (Yurochkin et al. 2019): per class (ascending), proportions p ~ Dir(alpha);
    with self_balancing, clients already above n/C samples get p = 0 (renormalised); the class's
    rows (in shuffled order) are cut at floor(cumsum(p) * n_k). Redrawn (same generator) while a
    client has fewer than min_partition_size samples, at most FLWR_DIRICHLET_DRAWS draws."""
    o = spec.options_dict
    order = _flwr_shuffled(y, ctx)
    ys = y[order]
    n = y.size
    avg = n / C
    alpha = np.full(C, float(o["alpha"]))
    rows_of_class = [np.flatnonzero(ys == k) for k in np.unique(ys)]
    smallest = -1
    for _ in range(FLWR_DIRICHLET_DRAWS):
        rows = np.empty(n, dtype=np.int64)
        sizes = np.zeros(C, dtype=np.int64)
        for idx in rows_of_class:
            p = rng.dirichlet(alpha)
            if o["self_balancing"]:
                q = np.where(sizes > avg, 0.0, p)
                total = sum(q.tolist())  # left-to-right, as Flower's Python sum
                # every eligible share underflowed to 0 (tiny alpha): Flower's cuts become NaN and
                # the whole class lands on the last client; here the class keeps its unbalanced p
                p = q / total if total > 0 else p
            cuts = (np.cumsum(p) * idx.size).astype(np.int64)[:-1]
            for c, part in enumerate(np.split(idx, cuts)):
                rows[part] = c
                sizes[c] += part.size
        smallest = int(sizes.min())
        if smallest >= o["min_partition_size"]:
            return _owner_from_rows(order, rows), None
    raise ValueError(
        f"partition {str(spec)!r}: no Dirichlet draw in {FLWR_DIRICHLET_DRAWS} (Flower's limit) gave each of {C} "
        f"clients min_partition_size={o['min_partition_size']} samples (last draw: {smallest}); use a larger "
        f"alpha, fewer clients or a smaller min_partition_size")


def _draw_flwr_pathological(y, C, rng, spec, ctx):
    """PathologicalPartitioner (Li et al. 2022, NIID-Bench #C=k): each client gets
    num_classes_per_partition classes (random: drawn without replacement; deterministic: classes
    i..i+k-1 mod m; first-deterministic: class i mod m, then random draws until k distinct); each
    class's rows are split evenly (numpy.array_split) among its holders in client order; classes no
    client holds are dropped."""
    o = spec.options_dict
    k, mode = o["num_classes_per_partition"], o["class_assignment_mode"]
    order = _flwr_shuffled(y, ctx)
    ys = y[order]
    classes = np.unique(ys)
    m = classes.size
    held: list[list[int]] = []
    for c in range(C):
        if mode == "deterministic":
            mine = [int(classes[(c + i) % m]) for i in range(k)]
        elif mode == "random":
            mine = [int(v) for v in rng.choice(classes, size=k, replace=False)]
        else:  # first-deterministic
            mine = [int(classes[c % m])]
            while len(mine) < k:
                v = int(rng.choice(classes, size=1)[0])
                if v not in mine:
                    mine.append(v)
        held.append(mine)
    rows = np.full(y.size, -1, dtype=np.int64)
    for label in classes:
        holders = [c for c in range(C) if int(label) in held[c]]
        if not holders:
            continue
        idx = np.flatnonzero(ys == label)
        if len(holders) > idx.size:
            raise ValueError(
                f"partition {str(spec)!r}: class {int(label)} is held by {len(holders)} clients but has only "
                f"{idx.size} samples; use fewer clients, a smaller num_classes_per_partition, or "
                f"class_assignment_mode=deterministic")
        for c, part in zip(holders, np.array_split(idx, len(holders))):
            rows[part] = c
    return _owner_from_rows(order, rows), None


def _draw_flwr_shard(y, C, rng, spec, ctx):
    """ShardPartitioner (McMahan et al. 2017): the shuffled rows sorted by label (stably), cut into
    shards of shard_size consecutive rows; a random permutation of the shards hands each client its
    shard count (the rest is dropped)."""
    size, usable, counts = ctx["layout"]
    order = _flwr_shuffled(y, ctx)
    by_label = np.argsort(y[order], kind="stable")  # Dataset.sort(label): rows of the shuffled dataset
    shards = rng.permutation(usable)[:int(counts.sum())]
    rows = np.full(y.size, -1, dtype=np.int64)
    for c, mine in enumerate(np.split(shards, np.cumsum(counts))[:-1]):
        for s in mine:
            rows[by_label[s * size:min((s + 1) * size, y.size)]] = c
    return _owner_from_rows(order, rows), None


_DRAWS = {
    "iid": _draw_iid,
    "dirichlet": _draw_dirichlet,
    "shards": _draw_shards,
    "quantity": _draw_quantity,
    "clusters": _draw_clusters,
    "flwr:iid": _draw_flwr_iid,
    "flwr:dirichlet": _draw_flwr_dirichlet,
    "flwr:pathological": _draw_flwr_pathological,
    "flwr:shard": _draw_flwr_shard,
    "flwr:linear": _draw_flwr_sizes,
    "flwr:square": _draw_flwr_sizes,
    "flwr:exponential": _draw_flwr_sizes,
    "flwr:size": _draw_flwr_sizes,
}


# ---------------------------------------------------------------------------------------------
# clusters: fixed feature map + seeded k-means


def cluster_features(images) -> np.ndarray:
    """The fixed feature map used by ``clusters:K``: [N, C, H, W] (or [N, H, W]) images ->
    float64 [N, FEATURE_DIM]. 2x2 average pooling (odd trailing rows/columns dropped; uint8
    scaled to [0, 1]), flattened, times a Gaussian matrix from ``default_rng(FEATURE_SEED)``
    scaled by 1/sqrt(FEATURE_DIM). Depends on nothing but the images."""
    if hasattr(images, "detach"):
        images = images.detach().cpu().numpy()
    x = np.asarray(images)
    if x.ndim == 3:
        x = x[:, None]
    if x.ndim != 4:
        raise ValueError(f"images must be [N, C, H, W] or [N, H, W], got shape {x.shape}")
    if x.dtype.kind not in "uif" and x.dtype != np.bool_:
        raise ValueError(f"images must be numeric, got dtype {x.dtype}")
    n, c, h, w = x.shape
    h2, w2 = max(h // 2, 1), max(w // 2, 1)
    ph, pw = (2 if h >= 2 else 1), (2 if w >= 2 else 1)
    scale = 1.0 / 255.0 if x.dtype == np.uint8 else 1.0
    proj = np.random.default_rng(FEATURE_SEED).standard_normal((c * h2 * w2, FEATURE_DIM))
    proj /= math.sqrt(FEATURE_DIM)
    out = np.empty((n, FEATURE_DIM), dtype=np.float64)
    # small integer pixels: exact integer block sums; otherwise float64
    exact = x.dtype.kind in "ub" or (x.dtype.kind == "i" and x.dtype.itemsize <= 2)
    acc = np.int32 if exact else np.float64
    for s in range(0, n, _CHUNK):
        b = x[s:s + _CHUNK, :, :h2 * ph, :w2 * pw].astype(acc)
        pooled = b[:, :, 0::ph, 0::pw].copy()
        for i in range(ph):
            for j in range(pw):
                if i or j:
                    pooled += b[:, :, i::ph, j::pw]
        pooled = pooled.reshape(b.shape[0], -1).astype(np.float64) * (scale / (ph * pw))
        out[s:s + b.shape[0]] = pooled @ proj
    if not np.all(np.isfinite(out)):
        raise ValueError("images contain NaN or infinite values")
    return out


def _kmeans(x: np.ndarray, k: int, rng, iters: int = KMEANS_ITERS) -> np.ndarray:
    """k-means++ then at most ``iters`` Lloyd steps; clusters renumbered by smallest index."""
    from scipy import sparse

    n = x.shape[0]
    xx = np.einsum("ij,ij->i", x, x)
    centers = np.empty((k, x.shape[1]))
    i = int(rng.integers(n))
    centers[0] = x[i]
    d2 = np.einsum("ij,ij->i", x - x[i], x - x[i])
    for j in range(1, k):
        total = d2.sum()
        if total > 0:
            i = min(int(np.searchsorted(np.cumsum(d2), rng.random() * total, side="right")), n - 1)
        else:
            i = int(rng.integers(n))
        centers[j] = x[i]
        d2 = np.minimum(d2, np.einsum("ij,ij->i", x - x[i], x - x[i]))
    assign = None
    for _ in range(iters):
        dist = xx[:, None] - 2.0 * (x @ centers.T) + np.einsum("ij,ij->i", centers, centers)[None, :]
        new = dist.argmin(axis=1)
        if assign is not None and np.array_equal(new, assign):
            break
        assign = new
        counts = np.bincount(assign, minlength=k)
        nonempty = np.flatnonzero(counts)
        sums = sparse.csr_matrix((np.ones(n), (assign, np.arange(n))), shape=(k, n)) @ x
        centers[nonempty] = sums[nonempty] / counts[nonempty, None]
        empty = np.flatnonzero(counts == 0)
        if empty.size:  # re-seed empty clusters at the points worst served
            dmin = dist[np.arange(n), assign].copy()
            for j in empty:
                far = int(np.argmax(dmin))
                centers[j] = x[far]
                dmin[far] = -np.inf
    first = np.full(k, n, dtype=np.int64)
    np.minimum.at(first, assign, np.arange(n))
    rank = np.empty(k, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(k)
    return rank[assign]


# ---------------------------------------------------------------------------------------------


def _int(value, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")
    return int(value)


def _advice(ps: PartitionSpec) -> str:
    tips = {
        "dirichlet": "use fewer clients, a larger alpha (less label skew), or a smaller min_size",
        "shards": "use fewer clients, a larger K, or a smaller min_size",
        "clusters": "use fewer clients or clusters, or a smaller min_size",
    }
    if ps.kind.startswith(FLWR_PREFIX):
        tip = ("use a smaller min_size (data.min_client_size), fewer clients, or Flower parameters that give "
               "every client more samples")
        if ps.kind == "flwr:dirichlet":
            tip += " (min_partition_size >= min_size: Flower redraws until every client has min_partition_size)"
        return tip + ("; flwr: partitions are made as Flower makes them from the seed, so they are not redrawn "
                      "with other seeds")
    return tips.get(ps.kind, "use fewer clients or a smaller min_size")


def partition(
    labels: np.ndarray,
    spec: str,
    num_clients: int,
    seed: int,
    *,
    min_size: int = 1,
    images=None,
) -> Partition:
    """Split ``range(len(labels))`` among ``num_clients`` clients according to ``spec``.

    ``labels``: 1-D non-negative integer labels (numpy or torch). ``images`` (numpy or torch,
    [N, C, H, W] or [N, H, W]) is required by ``clusters:K`` and ignored otherwise. ``seed``:
    a non-negative integer. Raises ValueError for a bad spec or argument, for more clients than
    samples, and when no draw within the retry budget gives every client ``min_size`` samples.
    """
    ps = parse_partition(spec)
    y = _as_labels(labels)
    n = int(y.size)
    C = _int(num_clients, "num_clients", 1)
    seed = _int(seed, "seed", 0)
    min_size = _int(min_size, "min_size", 0)
    name = str(ps)
    if C > n:
        raise ValueError(f"partition {name!r}: {C} clients but only {n} samples; use at most {n} clients")
    if C * min_size > n:
        raise ValueError(
            f"partition {name!r}: {C} clients x min_size={min_size} needs {C * min_size} samples, "
            f"only {n} available; use fewer clients or a smaller min_size"
        )
    ctx: dict[str, Any] = {"min_size": min_size, "seed": seed}
    tries = MAX_TRIES
    if ps.kind.startswith(FLWR_PREFIX):
        ctx.update(_flwr_check(ps, y, C, name))
        tries = 1  # exactly Flower's partition for this seed; its own redraws (Dirichlet) happen inside
    elif ps.kind == "shards":
        num_classes = np.unique(y).size
        if ps.param > num_classes:
            raise ValueError(
                f"partition {name!r}: K={ps.param} classes per client but the labels have only "
                f"{num_classes} classes; use shards:K with K <= {num_classes}"
            )
    elif ps.kind == "clusters":
        k = int(ps.param)
        if images is None:
            raise ValueError(f"partition {name!r} clusters the images: pass images=[N, C, H, W]")
        if C < k:
            raise ValueError(
                f"partition {name!r}: {C} clients for {k} clusters; clients are assigned to clusters "
                f"round-robin, so use num_clients >= {k} or fewer clusters"
            )
        feats = cluster_features(images)
        if feats.shape[0] != n:
            raise ValueError(f"partition {name!r}: {feats.shape[0]} images but {n} labels")
        ctx["features"] = feats
        tries = MAX_TRIES_CLUSTERS
    draw = _DRAWS[ps.kind]
    best = -1
    for attempt in range(tries):
        rng = np.random.default_rng(seed if attempt == 0 else [seed, attempt])
        owner, cluster_of_client = draw(y, C, rng, ps, ctx)
        sizes = np.bincount(owner[owner >= 0], minlength=C)
        smallest = int(sizes.min())
        if smallest >= min_size:
            if cluster_of_client is not None:
                cluster_of_client.setflags(write=False)
            return Partition(indices=_from_owner(owner, C), cluster_of_client=cluster_of_client, spec=name)
        best = max(best, smallest)
    if tries == 1:
        raise ValueError(
            f"partition {name!r}: it gives a client {best} samples, fewer than min_size={min_size} "
            f"({C} clients, {n} samples, seed {seed}); {_advice(ps)}")
    raise ValueError(
        f"partition {name!r}: no draw in {tries} tries (seed {seed} and derived seeds) gave each of "
        f"{C} clients at least min_size={min_size} samples out of {n} (best draw: smallest client "
        f"had {best}); {_advice(ps)}"
    )
