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

Each client must end up with at least ``min_size`` samples; otherwise the draw is repeated
with a derived seed, at most :data:`MAX_TRIES` times (:data:`MAX_TRIES_CLUSTERS` for
``clusters``), after which a :class:`ValueError` says what to change. Nothing loops forever.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "KINDS",
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
    "'clusters:K' (K >= 1 k-means clusters of the images, e.g. clusters:4)"
)


def _fmt(x: float) -> str:
    r = repr(float(x))
    return r[:-2] if r.endswith(".0") else r


@dataclass(frozen=True)
class PartitionSpec:
    """A parsed spec. ``param`` is ALPHA/SIGMA (float) or K (int); None for iid."""

    kind: str
    param: float | int | None = None

    def __str__(self) -> str:
        if self.kind == "iid":
            return "iid"
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
    if kind == "iid":
        if sep:
            raise bad("'iid' takes no parameter")
        return PartitionSpec("iid")
    if kind not in KINDS:
        raise bad(f"unknown kind {kind!r}")
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


_DRAWS = {
    "iid": _draw_iid,
    "dirichlet": _draw_dirichlet,
    "shards": _draw_shards,
    "quantity": _draw_quantity,
    "clusters": _draw_clusters,
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
    ctx: dict[str, Any] = {"min_size": min_size}
    tries = MAX_TRIES
    if ps.kind == "shards":
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
    raise ValueError(
        f"partition {name!r}: no draw in {tries} tries (seed {seed} and derived seeds) gave each of "
        f"{C} clients at least min_size={min_size} samples out of {n} (best draw: smallest client "
        f"had {best}); {_advice(ps)}"
    )
