"""The one table of metrics: every metric row name dfbench writes, with what it needs and how to read it.

    name                      extractor   better  kind      reference split  requestable  rank
    fd_fmnist                 fmnist      lower   frechet   eval.*           yes          1  (fmnist only)
    fd_fmnist_ae              fmnist_ae   lower   frechet   eval.*           yes             (fmnist only)
    kid_fmnist                fmnist      lower   kid       eval.*           yes             (fmnist only)
    kid_fmnist_ae             fmnist_ae   lower   kid       eval.*           yes             (fmnist only)
    fid                       inception   lower   frechet   eval.*           yes          0  (ranks first)
    kid                       inception   lower   kid       eval.*           yes
    fid_clean                 clean       lower   frechet   eval.*           yes
    fd_dinov2                 dinov2      lower   frechet   eval.*           yes             (optional: skipped without its weights)
    precision_<ex>, recall_<ex>,
    density_<ex>, coverage_<ex>   <ex>    higher  prdc      eval.*
    client_<fd>_mean / _worst,
    expert_<fd>_worst          <fd>'s     lower   client    train (the clients' own split)
    class_tv, low_classes      (labels)   lower   coverage  eval.*
    denoise_loss               (model)    lower   model     the test split (engine/heldout.py)
    score_kl, velocity_mse,
    frechet_exact              (mixture)  lower   exact     the known mixture (gmm: data; engine/ground_truth.py), rank -1
    component_tv, nll_gap      (mixture)  lower   exact_diff  the known mixture (gmm: data)

The independent checks of the ranking metric (``Metric.checks_ranking``: fd_fmnist_ae, a label-free space;
denoise_loss, the held-out loss, no feature network) are declared here and nowhere else: a claim on the ranking
metric or one of them is decided on all of them present, and holds only when they agree (report/claims.py).

``<ex>`` is each extractor (fmnist, fmnist_ae, inception, clean, dinov2), ``<fd>`` its Frechet metric; "eval.*" is
the run's ``eval.reference_split``. fd_dinov2 is the Frechet distance in DINOv2 ViT-L/14 space (Stein et al.,
NeurIPS 2023); its weights are a file the user supplies, so a run without them scores everything else
and says in its notes why fd_dinov2 is missing (`OPTIONAL_EXTRACTORS`); `dfbench eval` adds it later. ``expert_<fd>_worst`` is the worst group of clients (an
expert mixture's clients grouped by expert); its name is the metrics.json key and stays.

Who reads it: `scoring` (which metrics exist, "auto", which extractor computes each, the row
names and their ``better``), `client_quality` and `coverage` (row names, ``better``),
`grid.fetch` (which weights a run's metrics need), `folders` (`dfbench fid`: the metric an
extractor gives), `drift` (the extractors whose features a drift is measured in) and the
reporter (ranking metric, direction). A metric is added here and nowhere else.

Pure data: no torch, so the reporter and `dfbench fetch` import it cheaply.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from dfbench.benchmark.metrics.prdc import PRDC_METRICS

__all__ = [
    "AUTO_FALLBACK", "EXTRACTORS", "EXTRACTOR_TITLES", "ExtractorName", "FETCHED_EXTRACTORS", "INDEPENDENT_CHECKS",
    "METRICS", "Metric", "OPTIONAL_EXTRACTORS", "PRIMARY", "REQUESTABLE", "THIRD_PARTY_EXTRACTORS", "auto_metrics",
    "better", "check_requested", "client_metric_names", "extractor_of", "frechet_extractors", "frechet_metric", "get",
    "defined_on", "independent_checks",
    "prdc_metric", "reference_split_of", "scale",
]

Better = Literal["lower", "higher"]
Kind = Literal["frechet", "kid", "prdc", "client", "coverage", "leakage", "model", "exact", "exact_diff"]
# "eval": compared with the run's eval.reference_split; "train": needs the training split the clients hold;
# "own": the rows name their reference themselves (leakage: the clients' images vs the test split)
ReferenceRule = Literal["eval", "train", "own"]

# Feature extractors (benchmark.metrics.features.get_extractor names, which are also the names the
# metric rows record under "extractor"), in the order their metrics are listed: named here and nowhere else.
ExtractorName = Literal["fmnist", "fmnist_ae", "inception", "clean", "dinov2"]
EXTRACTORS: tuple[str, ...] = get_args(ExtractorName)
# Extractors whose weights are a third-party file found on the machine (metrics/weight_files.py), not a network
# committed with the package (fmnist, fmnist_ae): those of them not OPTIONAL are fetched (`dfbench fetch`)
THIRD_PARTY_EXTRACTORS: tuple[str, ...] = ("inception", "clean", "dinov2")
EXTRACTOR_TITLES: dict[str, str] = {"fmnist": "the Fashion-MNIST classifier",
                                    "fmnist_ae": "the label-free Fashion-MNIST autoencoder",
                                    "inception": "pytorch-fid's Inception", "clean": "clean-fid's Inception",
                                    "dinov2": "DINOv2 ViT-L/14"}
# Extractors whose weights file only the user supplies (no pinned checksum, nothing to fetch): when it is
# not found, scoring leaves their metrics out with a note saying why and scores the rest, instead of
# leaving the whole evaluation pending (as a missing Inception file does).
OPTIONAL_EXTRACTORS: tuple[str, ...] = ("dinov2",)
FETCHED_EXTRACTORS: tuple[str, ...] = tuple(e for e in THIRD_PARTY_EXTRACTORS if e not in OPTIONAL_EXTRACTORS)


@dataclass(frozen=True)
class Metric:
    """One metric row name of metrics.json ``evaluations``."""

    name: str
    extractor: str | None  # whose features it is computed from; None: the dataset classifier's labels (coverage.CLASSIFIERS)
    better: Better
    kind: Kind
    reference: ReferenceRule = "eval"
    requestable: bool = False  # may be named in eval.metrics (the others come with `quality`)
    datasets: tuple[str, ...] | None = None  # only defined on these datasets (None: any)
    rank: int | None = None  # the leaderboard ranks by the present metric of lowest rank
    # an independent check of the ranking metric: another view of the same quality (another feature space, or
    # none), so a ranking that holds only in the ranking metric's space is told apart from one that holds
    checks_ranking: bool = False


def _entries() -> list[Metric]:
    frechet = [
        Metric("fd_fmnist", "fmnist", "lower", "frechet", requestable=True, datasets=("fmnist",), rank=1),
        # a second Fashion-MNIST space, label-free (features.FMNISTAutoencoder): reported beside fd_fmnist, never ranked
        Metric("fd_fmnist_ae", "fmnist_ae", "lower", "frechet", requestable=True, datasets=("fmnist",), checks_ranking=True),
        Metric("kid_fmnist", "fmnist", "lower", "kid", requestable=True, datasets=("fmnist",)),
        Metric("kid_fmnist_ae", "fmnist_ae", "lower", "kid", requestable=True, datasets=("fmnist",)),
        Metric("fid", "inception", "lower", "frechet", requestable=True, rank=0),
        Metric("kid", "inception", "lower", "kid", requestable=True),
        Metric("fid_clean", "clean", "lower", "frechet", requestable=True),
        # FD_DINOv2 (Stein et al., NeurIPS 2023): beside FID, never ranked (benchmark/metrics/dinov2.py)
        Metric("fd_dinov2", "dinov2", "lower", "frechet", requestable=True),
    ]
    out = list(frechet)
    for ex in EXTRACTORS:
        out += [Metric(f"{key}_{ex}", ex, "higher", "prdc") for key in PRDC_METRICS]
    for m in frechet:
        if m.kind == "frechet":
            out += [Metric(name, m.extractor, "lower", "client", reference="train")
                    for name in (f"client_{m.name}_mean", f"client_{m.name}_worst", f"expert_{m.name}_worst")]
    out += [Metric("class_tv", None, "lower", "coverage"), Metric("low_classes", None, "lower", "coverage")]
    # the trained model's own objective on held-out test images, in velocity space (benchmark/engine/heldout.py):
    # no feature network; computed from the model, not the samples
    out += [Metric("denoise_loss", None, "lower", "model", reference="own", checks_ranking=True)]
    # the ground-truth track (gmm: data, benchmark/engine/ground_truth.py): exact errors against the known mixture,
    # no feature network. score_kl (the KL bound's score term) ranks first wherever it is present; the sample
    # metrics are positive (frechet_exact: log scale) or can be 0 / negative (component_tv, nll_gap: differences)
    out += [Metric("score_kl", None, "lower", "exact", reference="own", rank=-1),
            Metric("velocity_mse", None, "lower", "exact", reference="own"),
            Metric("frechet_exact", None, "lower", "exact", reference="own"),
            Metric("component_tv", None, "lower", "exact_diff", reference="own"),
            Metric("nll_gap", None, "lower", "exact_diff", reference="own")]
    # what a run leaks (eval.leakage_metrics; benchmark/engine/leakage.py): less is better, farther from
    # the training images is better; copy_rate_test_* is the held-out baseline (no contest, listed as lower)
    for space, ex in (("pixel", None), ("fmnist", "fmnist")):
        out += [Metric(f"{key}_{space}", ex, "lower", "leakage", reference="own")
                for key in ("copy_rate", "copy_rate_test", "copy_rate_client_max")]
        out += [Metric(f"{key}_{space}", ex, "higher", "leakage", reference="own") for key in ("nn_train", "nn_test")]
    out += [Metric(name, None, "lower", "leakage", reference="own") for name in ("mia_auc", "mia_tpr_1fpr", "mia_auc_client_max")]
    return out


METRICS: dict[str, Metric] = {m.name: m for m in _entries()}
# what eval.metrics may list, in the documented order
REQUESTABLE: tuple[str, ...] = tuple(m.name for m in METRICS.values() if m.requestable)
# ranking metrics, first choice first
PRIMARY: tuple[str, ...] = tuple(m.name for m in sorted((m for m in METRICS.values() if m.rank is not None),
                                                         key=lambda m: m.rank or 0))
# the independent checks of the ranking metric, in table order (`independent_checks`)
INDEPENDENT_CHECKS: tuple[str, ...] = tuple(m.name for m in METRICS.values() if m.checks_ranking)
# eval.metrics=auto: per dataset; "*" for every other dataset. Inception metrics on a dataset with
# its own classifier are added only when the Inception weights are there (`auto_metrics`).
_AUTO: dict[str, tuple[str, ...]] = {"fmnist": ("fd_fmnist", "fd_fmnist_ae", "kid_fmnist", "kid_fmnist_ae"),
                                     "*": ("fid", "kid")}
AUTO_FALLBACK: tuple[str, ...] = _AUTO["*"]
#: the ground-truth mixtures' dataset prefix (datasets.gmm.GMM_KIND + ":", not imported: this module stays free of
#: torch; tests/runs/test_ground_truth.py checks they agree). Their runs are scored exactly (engine/ground_truth.py),
#: so "auto" asks no feature network of them.
GROUND_TRUTH_PREFIX = "gmm:"
#: the Fashion-MNIST-fitted mixture at Fashion-MNIST's own side (d = 784): its samples, quantized to pixels as any
#: image's are, are 28x28 garments, so the Fashion-MNIST feature networks apply to it as to Fashion-MNIST, against
#: the mixture's own draws (results/proxy-validity: which image metric orders models as the exact error does)
FMNIST_SHAPED_MIXTURE = GROUND_TRUTH_PREFIX + "fmnist28"


def defined_on(name: str, dataset: str) -> bool:
    """Whether metric `name` is defined on `dataset`: everywhere, on the datasets it names, and a Fashion-MNIST
    metric also on the Fashion-MNIST-shaped mixture (`FMNIST_SHAPED_MIXTURE`, with any options)."""
    m = METRICS[name]
    if m.datasets is None or dataset in m.datasets:
        return True
    return "fmnist" in m.datasets and dataset.partition("?")[0] == FMNIST_SHAPED_MIXTURE


def get(name: str) -> Metric | None:
    """The table's entry of a metric row name, or None for a name it does not know."""
    return METRICS.get(name)


def better(name: str) -> Better | None:
    """"lower" or "higher" (which value is better), or None for a name the table does not know."""
    m = METRICS.get(name)
    return m.better if m is not None else None


# Kinds whose values are positive by construction (a Frechet distance of differing sets, a mean
# squared error): compared on the log scale, as ratios, so no interval of them reaches zero. KID is an
# unbiased estimate that can be negative; precision & co. and the class counts can be 0: differences.
_LOG_KINDS: frozenset[str] = frozenset({"frechet", "client", "model", "exact"})


def scale(name: str) -> Literal["log", "difference"]:
    """How the verdicts (benchmark/report/verdicts.py) compare two settings on metric `name`: "log"
    (ratios, intervals of a positive quantity stay positive) or "difference" (a metric that can be 0 or
    negative, or one the table does not know)."""
    m = METRICS.get(name)
    return "log" if m is not None and m.kind in _LOG_KINDS else "difference"


def independent_checks(dataset: str | None = None) -> tuple[str, ...]:
    """The metrics declared independent checks of the ranking metric (`INDEPENDENT_CHECKS`) that are defined on
    `dataset` (all of them for None): fd_fmnist_ae on fmnist only, denoise_loss everywhere."""
    return tuple(n for n in INDEPENDENT_CHECKS
                 if dataset is None or defined_on(n, dataset))


def extractor_of(name: str) -> str | None:
    """The extractor whose features metric `name` is computed from (None: unknown or label-based)."""
    m = METRICS.get(name)
    return m.extractor if m is not None else None


def frechet_metric(extractor: str) -> str:
    """The Frechet-distance metric an extractor gives (named after the network: never "FID" for fmnist)."""
    for m in METRICS.values():
        if m.kind == "frechet" and m.requestable and m.extractor == extractor:
            return m.name
    raise ValueError(f"unknown extractor {extractor!r}; choose one of {list(frechet_extractors())}")


def frechet_extractors() -> tuple[str, ...]:
    """The extractors that give a Frechet distance (`dfbench fid --extractor`), in table order."""
    return tuple(e for e in EXTRACTORS if any(m.kind == "frechet" and m.requestable and m.extractor == e
                                              for m in METRICS.values()))


def prdc_metric(key: str, extractor: str) -> str:
    """The row name of a precision / recall / density / coverage score in an extractor's space."""
    name = f"{key}_{extractor}"
    if METRICS.get(name, None) is None or METRICS[name].kind != "prdc":
        raise KeyError(f"{name!r} is not a metric of benchmark/metrics/table.py")
    return name


def client_metric_names(fd_metric: str) -> tuple[str, str, str]:
    """(mean over clients, worst client, worst group of clients) row names for a Frechet metric."""
    names = (f"client_{fd_metric}_mean", f"client_{fd_metric}_worst", f"expert_{fd_metric}_worst")
    missing = [n for n in names if n not in METRICS]
    if missing:
        raise KeyError(f"{missing} are not metrics of benchmark/metrics/table.py")
    return names  # type: ignore[return-value]


def reference_split_of(name: str, configured: str) -> str:
    """The split metric `name` must be compared against, given the run's eval.reference_split."""
    m = METRICS[name]
    return "train" if m.reference == "train" else configured


def auto_metrics(dataset: str, inception_available: bool) -> list[str]:
    """eval.metrics=auto: the dataset's own metrics, plus Inception's when its weights are there;
    Inception's alone (needed, found or not) on a dataset without its own; none on a ground-truth mixture
    (scored exactly, against the mixture)."""
    if dataset.startswith(GROUND_TRUTH_PREFIX):
        return []
    own = _AUTO.get(dataset)
    if own is None:
        return list(AUTO_FALLBACK)
    return list(own) + (list(AUTO_FALLBACK) if inception_available else [])


def check_requested(chosen: Sequence[str], dataset: str) -> None:
    """ValueError unless every name is requestable, none twice, each defined on `dataset`."""
    if not chosen:
        raise ValueError(f"metrics is empty; pass 'auto' or names from {list(REQUESTABLE)}")
    unknown = [m for m in chosen if m not in REQUESTABLE]
    if unknown:
        import difflib

        close = [c for m in unknown for c in difflib.get_close_matches(m, REQUESTABLE, n=1)]
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        raise ValueError(f"unknown metric(s) {unknown}{hint}; choose from {list(REQUESTABLE)}")
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"metric listed twice in {list(chosen)}")
    for name in chosen:
        m = METRICS[name]
        if not defined_on(name, dataset):
            where = " or ".join([repr(d) for d in (m.datasets or ())]
                                + ([repr(FMNIST_SHAPED_MIXTURE)] if "fmnist" in (m.datasets or ()) else []))
            raise ValueError(
                f"{name} uses {EXTRACTOR_TITLES.get(str(m.extractor), m.extractor)} and is only defined for dataset {where}, "
                f"not {dataset!r}; use {AUTO_FALLBACK[0]!r} for {dataset!r}"
            )

