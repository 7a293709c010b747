"""Loss-based membership inference: statistics of given attack scores.

The attack (Yeom et al. 2018, "Privacy risk in machine learning"; for diffusion
models Carlini et al. 2023, "Extracting training data from diffusion models",
and Matsumoto et al. 2023) scores each image; a higher score means "more likely
a member". The engine passes minus the diffusion loss. This module only does the
statistics:

- `auc`: P(s_member > s_nonmember) + 0.5 P(equal), the Mann-Whitney U / (n_m n_n).
- `tpr_at_fpr`: the true-positive rate at a low false-positive rate (Carlini et
  al. 2022, "Membership inference attacks from first principles": the AUC hides
  whether *some* members are exposed with confidence).
- `membership_rows`: metrics rows -- pooled AUC and TPR at the FPR, and the
  largest per-client AUC (a federation leaks as much as its leakiest client) --
  each with a percentile bootstrap interval that resamples members and
  nonmembers separately (the two samples are independent, so the resampling
  keeps both sizes fixed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy.stats import rankdata

from dfbench.benchmark.core.seeds import derive_seed
from dfbench.benchmark.metrics.uncertainty import Interval

__all__ = ["LEVEL", "MIN_BOOTSTRAP", "auc", "chance_band", "membership_rows", "tpr_at_fpr", "tpr_metric_name"]

LEVEL = 0.95  # interval level of every row
MIN_BOOTSTRAP = 2  # a set resampled with fewer scores has no spread: no interval, so no row
ATTACK = "loss"
_BATCH_ELEMENTS = 1 << 22  # scores resampled per bootstrap batch (float64 + int64 indices + ranks: ~100 MB)


def _scores(x: np.ndarray, name: str) -> np.ndarray:
    """1-D float64 scores; ValueError naming the set when empty or not finite."""
    s = np.asarray(x, dtype=np.float64)
    if s.ndim != 1:
        raise ValueError(f"{name} scores must be 1-D, got shape {s.shape}")
    if s.size == 0:
        raise ValueError(f"{name} scores are empty")
    bad = int(np.count_nonzero(~np.isfinite(s)))
    if bad:
        raise ValueError(f"{name} scores hold {bad} non-finite value(s)")
    return s


def _auc_rows(m: np.ndarray, n: np.ndarray) -> np.ndarray:
    """AUC of each row pair of m [R, n_m] and n [R, n_n] (the bootstrap scores R replicates at once)."""
    ranks = rankdata(np.concatenate([m, n], axis=1), method="average", axis=1)
    u = ranks[:, : m.shape[1]].sum(axis=1) - m.shape[1] * (m.shape[1] + 1) / 2.0
    return u / (m.shape[1] * n.shape[1])


def auc(members: np.ndarray, nonmembers: np.ndarray) -> float:
    """P(s_member > s_nonmember) + 0.5 P(equal), from ranks in O(n log n).

    With average ranks for ties, U = (sum of member ranks) - n_m (n_m + 1) / 2 counts the
    pairs a member wins plus half the tied pairs (Mann-Whitney), so AUC = U / (n_m n_n).
    """
    m, n = _scores(members, "members"), _scores(nonmembers, "nonmembers")
    return float(_auc_rows(m[None], n[None])[0])


def chance_band(members: int, nonmembers: int, level: float = LEVEL) -> float:
    """Half-width of the central `level` range of the AUC at chance (no leakage: members and non-members
    from one distribution, continuous scores): z x sqrt((m + n + 1) / (12 m n)), the null sd of the
    Mann-Whitney U over m n. 16 members against 16 non-members: +-0.20; against 1,000: +-0.14."""
    from scipy.stats import norm

    if members < 1 or nonmembers < 1:
        raise ValueError(f"chance_band needs at least one member and one non-member, got {members} and {nonmembers}")
    return float(norm.ppf((1 + level) / 2) * math.sqrt((members + nonmembers + 1) / (12.0 * members * nonmembers)))


def _allowed_false_positives(num_nonmembers: int, fpr: float) -> int:
    """The largest k with k / n_n <= fpr, compared as the definition does: floor(fpr * n_n) can be
    one off through float rounding, e.g. 0.29 * 100 = 28.999..."""
    if not 0.0 <= fpr <= 1.0:
        raise ValueError(f"fpr must be in [0, 1], got {fpr}")
    return int(np.searchsorted(np.arange(num_nonmembers + 1) / num_nonmembers, fpr, side="right")) - 1


def _tpr_rows(m: np.ndarray, n: np.ndarray, fpr: float) -> np.ndarray:
    """TPR at `fpr` of each row pair of m [R, n_m] and n [R, n_n] (see `tpr_at_fpr`)."""
    k = _allowed_false_positives(n.shape[1], fpr)
    if k >= n.shape[1]:  # every nonmember may be a false positive: take every member
        return np.ones(m.shape[0])
    cut = np.sort(n, axis=1)[:, n.shape[1] - 1 - k]  # the (k+1)-th largest nonmember score
    return np.count_nonzero(m > cut[:, None], axis=1) / m.shape[1]


def tpr_at_fpr(members: np.ndarray, nonmembers: np.ndarray, fpr: float = 0.01) -> float:
    """The largest TPR over thresholds t (member when score >= t) whose FPR is <= `fpr`.

    The FPR of t is the fraction of nonmembers with score >= t; t = +inf (TPR 0) always
    qualifies. With k the most false positives allowed (largest k with k / n_n <= fpr), the
    best t lies just above the (k+1)-th largest nonmember score, so the TPR is the fraction
    of members strictly above it. With few nonmembers (n_n * fpr < 1) k is 0: only
    thresholds above *every* nonmember qualify. That is the definition, not a bug: 10
    nonmembers cannot resolve a 1 % FPR, and the value is then the TPR at FPR 0.
    """
    m, n = _scores(members, "members"), _scores(nonmembers, "nonmembers")
    return float(_tpr_rows(m[None], n[None], fpr)[0])


def tpr_metric_name(fpr: float) -> str:
    """Row name of the TPR at `fpr`: 0.01 -> "mia_tpr_1fpr", 0.001 -> "mia_tpr_0p1fpr"."""
    percent = fpr * 100.0
    if math.isclose(percent, round(percent), abs_tol=1e-9):
        return f"mia_tpr_{int(round(percent))}fpr"
    return f"mia_tpr_{percent:g}fpr".replace(".", "p")  # no dot in a metric name


def _percentile_interval(
    statistic: Callable[[list[np.ndarray], np.ndarray], np.ndarray],
    groups: list[np.ndarray],
    nonmembers: np.ndarray,
    *,
    seed: int,
    replicates: int,
    what: str,
) -> Interval:
    """Percentile bootstrap of statistic(groups, nonmembers), each group and the nonmembers
    resampled with replacement on their own (stratified: every size stays fixed). The statistic
    takes the R resampled sets as [R, size] arrays and returns R values."""
    rng = np.random.default_rng(seed)
    # replicates per batch: bounds the [R, size] arrays; a fixed function of the sizes, so the
    # draws (and the interval) depend on the seed only
    batch = max(1, _BATCH_ELEMENTS // (sum(g.size for g in groups) + nonmembers.size))
    parts: list[np.ndarray] = []
    for start in range(0, replicates, batch):
        r = min(batch, replicates - start)
        drawn = [g[rng.integers(0, g.size, (r, g.size))] for g in groups]
        parts.append(statistic(drawn, nonmembers[rng.integers(0, nonmembers.size, (r, nonmembers.size))]))
    reps = np.concatenate(parts)
    low, high = np.quantile(reps, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return Interval(float(low), float(high), LEVEL, f"{LEVEL:.0%} percentile bootstrap {what}", replicates)


def membership_rows(
    members_by_client: Sequence[np.ndarray],
    nonmembers: np.ndarray,
    *,
    fpr: float = 0.01,
    seed: int = 0,
    replicates: int = 200,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows `mia_auc`, `mia_tpr_<fpr>fpr` (pooled) and `mia_auc_client_max`, and notes.

    A row that cannot be computed (no or non-finite scores, fewer than MIN_BOOTSTRAP of a set
    for the bootstrap) is left out and a note says why. The client max is taken over clients
    with at least MIN_BOOTSTRAP members; it is a worst-case screen, biased upwards when many
    small clients are scored (the max of noisy AUCs exceeds 0.5 even without leakage), so
    read it next to `per_client` and the pooled AUC.
    """
    if replicates < 2:
        raise ValueError(f"replicates must be >= 2 for an interval, got {replicates}")
    if not 0.0 <= fpr <= 1.0:
        raise ValueError(f"fpr must be in [0, 1], got {fpr}")
    clients = [np.asarray(c, dtype=np.float64).ravel() for c in members_by_client]
    non = np.asarray(nonmembers, dtype=np.float64).ravel()
    # one non-finite score (a diverged loss) makes every row ill-defined: report, do not drop it
    sets = [("nonmembers", non)] + [(f"client {k} members", c) for k, c in enumerate(clients)]
    bad = [f"{name}: {int(np.count_nonzero(~np.isfinite(s)))}" for name, s in sets if not np.isfinite(s).all()]
    if bad:
        return [], [f"membership inference: non-finite scores ({', '.join(bad)}); no rows"]
    pooled = np.concatenate(clients) if clients else np.empty(0)
    if non.size < MIN_BOOTSTRAP or pooled.size < MIN_BOOTSTRAP:
        return [], [f"membership inference: {pooled.size} member and {non.size} nonmember scores; "
                    f"a bootstrap needs at least {MIN_BOOTSTRAP} of each; no rows"]
    common = {"num_members": int(pooled.size), "num_nonmembers": int(non.size), "attack": ATTACK}
    rows: list[dict[str, Any]] = []
    notes: list[str] = []

    name = "mia_auc"
    ci = _percentile_interval(lambda g, n: _auc_rows(g[0], n), [pooled], non, seed=derive_seed(seed, "bootstrap", name),
                              replicates=replicates, what="over members and nonmembers (resampled separately)")
    rows.append({"metric": name, "value": auc(pooled, non), **ci.as_row(), **common})

    name = tpr_metric_name(fpr)
    ci = _percentile_interval(lambda g, n: _tpr_rows(g[0], n, fpr), [pooled], non,
                              seed=derive_seed(seed, "bootstrap", name), replicates=replicates,
                              what="over members and nonmembers (resampled separately)")
    rows.append({"metric": name, "value": tpr_at_fpr(pooled, non, fpr), **ci.as_row(), **common, "fpr": float(fpr)})

    name = "mia_auc_client_max"
    per_client = [auc(c, non) if c.size else None for c in clients]
    scored = [k for k, c in enumerate(clients) if c.size >= MIN_BOOTSTRAP]
    if not scored:
        notes.append(f"{name}: no client holds {MIN_BOOTSTRAP} member scores; row left out")
        return rows, notes
    best = max(scored, key=lambda k: per_client[k])  # first client on a tie
    ci = _percentile_interval(lambda g, n: np.max([_auc_rows(c, n) for c in g], axis=0),
                              [clients[k] for k in scored], non, seed=derive_seed(seed, "bootstrap", name), replicates=replicates,
                              what="of the max over clients (members resampled within each client, nonmembers shared)")
    rows.append({"metric": name, "value": per_client[best], **ci.as_row(), **common, "per_client": per_client,
                 "client_of_max": best, "clients_scored": len(scored), "min_client_members": MIN_BOOTSTRAP})
    return rows, notes
