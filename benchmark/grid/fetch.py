"""`dfbench fetch`, `--download` and a grid's input check: the files a benchmark needs.

Fetchable names (:data:`FETCH_NAMES`; ``all`` is every one):

- ``fmnist``, ``svhn``, ``cifar10``: the published dataset files, into the dataset cache
  ``$DFBENCH_CACHE/data/<name>`` (or ``--data-root DIR``), the last place the loaders search
  (see ``dfbench.datasets.sources``). CIFAR-10's archive is extracted there as well.
- ``inception`` (pytorch-fid's TF-Inception port) and ``clean-inception`` (clean-fid's TorchScript
  file): into ``$DFBENCH_CACHE/weights``, which the FID loaders search (``benchmark/metrics/weight_files.py``).

Every file is checked against its pinned checksum before it is renamed into place, and a file
already there with the right checksum is not downloaded again (``dfbench.datasets.download``,
which also reads ``$DFBENCH_MIRROR``). A dataset or weights file that the loaders already find
elsewhere (system path, ``$DFBENCH_DATA``, an env var, torch hub) is left alone.

Before a grid runs its first cell, :func:`preflight` lists what its cells need
(:func:`required_inputs`), finds what is missing (:func:`missing_inputs`), and stops with ONE
message naming the fetch command (a missing dataset would fail every cell of it), or fetches the
inputs with ``download=True``. Missing Inception weights only warn: those cells train and leave
their evaluation pending, to be scored later with ``dfbench eval``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from dfbench.datasets import sources
from dfbench.datasets.download import DownloadError, download_file, file_digest

from dfbench.benchmark.core.config import RunConfig
from dfbench.benchmark.metrics.table import FETCHED_EXTRACTORS, auto_metrics, extractor_of
from dfbench.benchmark.metrics.weight_files import MissingWeightsError, find_weights, known_weights, weights_dir

__all__ = [
    "FETCH_NAMES",
    "FetchError",
    "Input",
    "MissingInputsError",
    "describe_inputs",
    "expand_names",
    "fetch",
    "fetch_for_configs",
    "missing_inputs",
    "preflight",
    "required_inputs",
]

DATASET_NAMES: tuple[str, ...] = sources.DATASETS
# fetch name -> the weights key of benchmark/metrics/weight_files.py
WEIGHTS_NAMES: dict[str, str] = {"inception": "inception", "clean-inception": "clean"}
FETCH_NAMES: tuple[str, ...] = (*DATASET_NAMES, *WEIGHTS_NAMES)


class FetchError(RuntimeError):
    """One or more files could not be fetched; the message says which, why, and the way by hand."""


class MissingInputsError(RuntimeError):
    """A grid's data is not on this machine; raised before any cell runs."""


def expand_names(names: Iterable[str]) -> list[str]:
    """Fetch names in the order given, ``all`` expanded, duplicates dropped; unknown names raise."""
    out: list[str] = []
    for name in names:
        key = name.strip().lower()
        wanted = FETCH_NAMES if key == "all" else (key,)
        for k in wanted:
            if k not in FETCH_NAMES:
                import difflib

                close = difflib.get_close_matches(key, [*FETCH_NAMES, "all"], n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"cannot fetch {name!r}{hint}: choose from {', '.join(FETCH_NAMES)} or all")
            if k not in out:
                out.append(k)
    return out


# -- fetching -------------------------------------------------------------------------------------

def _where_found(name: str, root: str | Path | None) -> Path | None:
    """Where the loader finds every split of a dataset, or None if some split is missing."""
    if any(sources.missing(name, split, root) for split in sources.SPLITS):
        return None
    return sources.locate(name, "train", root)


def _fetch_dataset(name: str, root: str | Path | None, progress: bool) -> str:
    cache = Path(root).expanduser() if root is not None else sources.cache_dir(name)
    found = _where_found(name, root)
    fetched_before = all((cache / f).is_file() for _, f, _, _ in sources.download_files(name))
    if found is not None and not fetched_before:
        # the loaders find it (system package, $DFBENCH_DATA, files placed by hand): leave it
        return f"{name}: already available at {found} (verified when loaded); nothing downloaded"
    try:
        folder = sources.download_dataset(name, cache, progress=progress)
    except sources.DatasetError as err:  # DownloadError, or an unsafe/corrupt archive
        raise FetchError(f"{name}: {err}") from err
    return f"{name}: verified in {folder}"


def _fetch_weights(name: str, progress: bool) -> str:
    spec = known_weights(WEIGHTS_NAMES[name])
    dest = weights_dir() / spec.file_name
    placement = MissingWeightsError(spec, [(dest, f"dfbench fetch {name}")])
    try:
        found = find_weights(WEIGHTS_NAMES[name])  # type: ignore[arg-type]
    except MissingWeightsError as err:
        found, placement = None, err  # its message lists every place searched
    if found is not None and found != dest:
        actual = file_digest(found, "sha256")
        if actual == spec.sha256:
            return f"{name}: already available at {found} (sha256 checked); nothing downloaded"
        env_value = os.environ.get(spec.env_var)
        if env_value and Path(env_value).expanduser() == found:
            # the env var is searched before the fetch folder: a download would not be used
            raise FetchError(
                f"{name}: {found} (${spec.env_var}) is not the pinned file:\n  expected sha256 {spec.sha256}\n"
                f"  actual   sha256 {actual}\nReplace it or unset {spec.env_var}; nothing was downloaded."
            )
        # a wrong file searched after the fetch folder (torch hub, /tmp): the download takes precedence
    try:
        downloaded = download_file(spec.url, dest, "sha256", spec.sha256, progress=progress)
    except DownloadError as err:
        raise FetchError(f"{name}: {err}\n{placement}") from err
    return f"{name}: {'downloaded and verified' if downloaded else 'verified'} {dest}"


def fetch(names: Iterable[str], *, root: str | Path | None = None, progress: bool = True,
          echo: Callable[[str], None] = print) -> None:
    """Fetch each name (see :data:`FETCH_NAMES`), echoing one line per name. Every name is tried;
    then :class:`FetchError` lists the ones that failed. ``root``: put datasets there, not in the cache."""
    failures: list[str] = []
    for name in expand_names(names):
        try:
            echo(_fetch_weights(name, progress) if name in WEIGHTS_NAMES else _fetch_dataset(name, root, progress))
        except FetchError as err:
            failures.append(str(err))
    if failures:
        raise FetchError("\n\n".join(failures))


# -- what runs need -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Input:
    """A dataset (with its splits and data root) or a weights file that some runs need."""

    kind: Literal["dataset", "weights"]
    name: str  # a fetch name
    splits: tuple[str, ...] = ()
    root: str | None = None
    runs: int = 1  # how many of the given configs need it
    why: tuple[str, ...] = ()  # weights: the metrics that need them

    @property
    def command(self) -> str:
        return f"dfbench fetch {self.name}" + (f" --data-root {self.root}" if self.root else "")


def _weights_for(cfg: RunConfig) -> dict[str, list[str]]:
    """fetch name -> metrics of this run that need it (only metrics the run is sure to compute)."""
    metrics = cfg.eval.metrics
    if metrics == "none":
        return {}
    if metrics == "auto":
        # the table's auto rule without Inception: what the run is sure to compute (fmnist: its
        # committed classifier only, fid/kid being added just when the weights happen to be there)
        chosen = auto_metrics(cfg.data.dataset, inception_available=False)
    else:
        chosen = [m.strip() for m in metrics.split(",") if m.strip()]
    out: dict[str, list[str]] = {}
    for metric in chosen:
        extractor = extractor_of(metric)
        if extractor in FETCHED_EXTRACTORS:
            out.setdefault(known_weights(extractor).fetch_name, []).append(metric)
    return out


def required_inputs(configs: Sequence[RunConfig]) -> list[Input]:
    """The datasets (training split, and the reference split when scored) and the weights files
    the configs need, each once, in first-seen order."""
    found: dict[tuple[str, str, str | None], Input] = {}

    def add(item: Input) -> None:
        key = (item.kind, item.name, item.root)
        old = found.get(key)
        if old is None:
            found[key] = item
            return
        splits = tuple(s for s in sources.SPLITS if s in old.splits or s in item.splits)
        why = tuple(dict.fromkeys(old.why + item.why))
        found[key] = Input(old.kind, old.name, splits, old.root, old.runs + 1, why)

    for cfg in configs:
        splits = {"train"} | ({cfg.eval.reference_split} if cfg.eval.metrics != "none" else set())
        add(Input("dataset", cfg.data.dataset, tuple(s for s in sources.SPLITS if s in splits), cfg.data.root))
        for name, metrics in _weights_for(cfg).items():
            add(Input("weights", name, why=tuple(metrics)))
    return list(found.values())


def missing_inputs(inputs: Sequence[Input]) -> list[tuple[Input, str]]:
    """The inputs the loaders would not find, each with the loader's own message."""
    out: list[tuple[Input, str]] = []
    for item in inputs:
        if item.kind == "dataset":
            problems = [m for m in (sources.missing(item.name, s, item.root) for s in item.splits) if m]
            if problems:
                out.append((item, problems[0]))
        else:
            try:
                find_weights(WEIGHTS_NAMES[item.name])  # type: ignore[arg-type]
            except MissingWeightsError as err:
                out.append((item, str(err)))
    return out


def _fetch_inputs(inputs: Sequence[Input], progress: bool, echo: Callable[[str], None]) -> None:
    """Fetch every input (datasets into their run's data root), then report all failures at once."""
    batches: dict[str | None, list[str]] = {}
    for item in inputs:
        batches.setdefault(item.root if item.kind == "dataset" else None, []).append(item.name)
    failures: list[str] = []
    for root, names in batches.items():
        try:
            fetch(names, root=root, progress=progress, echo=echo)
        except FetchError as err:
            failures.append(str(err))
    if failures:
        raise FetchError("\n\n".join(failures))


def fetch_for_configs(configs: Sequence[RunConfig], *, progress: bool = True,
                      echo: Callable[[str], None] | None = None) -> None:
    """Fetch whatever the configs need and the loaders do not find (``--download``)."""
    say = echo or _stderr
    missing = [item for item, _ in missing_inputs(required_inputs(configs))]
    _fetch_inputs(missing, progress, say)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def preflight(configs: Sequence[RunConfig], *, download: bool = False, check_data: bool = True,
              progress: bool = True, echo: Callable[[str], None] | None = None) -> None:
    """Check (or with ``download``, fetch) the inputs of the runs about to start, before the first.

    A missing dataset raises :class:`MissingInputsError` with one message naming the command
    that gets it; missing weights are announced (those runs train, evaluation stays pending).
    ``check_data=False`` skips the datasets (a caller that supplies the data itself).
    """
    say = echo or _stderr
    inputs = [i for i in required_inputs(configs) if check_data or i.kind != "dataset"]
    missing = missing_inputs(inputs)
    if missing and download:
        _fetch_inputs([item for item, _ in missing], progress, say)
        missing = missing_inputs(inputs)
    weights = [item for item, _ in missing if item.kind == "weights"]
    pending = [f"{item.runs} run(s) will train but leave their evaluation pending ({', '.join(item.why)}): "
               f"{item.name} weights not found" for item in weights]
    data = [(item, msg) for item, msg in missing if item.kind == "dataset"]
    if not data:
        for item, line in zip(weights, pending):
            say(f"note: {line}. Get them with `{item.command}` (or rerun with --download), then score "
                f"the runs with `dfbench eval RUN_DIR`.")
        return
    lines = [f"{len(data)} dataset(s) missing; nothing was run:"]
    lines += [f"- {item.name} ({', '.join(item.splits)}), needed by {item.runs} run(s): {msg}" for item, msg in data]
    lines += [f"- also: {line}" for line in pending]
    raise MissingInputsError("\n".join(lines) + f"\nGet them with: {_commands([i for i, _ in data] + weights)} "
                             "(or rerun with --download).")


def _commands(inputs: Sequence[Input]) -> str:
    """The fewest `dfbench fetch` commands for the inputs: one per data root."""
    by_root: dict[str | None, list[str]] = {}
    for item in inputs:
        by_root.setdefault(item.root, []).append(item.name)
    return "; ".join(f"`dfbench fetch {' '.join(dict.fromkeys(names))}" + (f" --data-root {root}`" if root else "`")
                     for root, names in by_root.items())


def describe_inputs(configs: Sequence[RunConfig]) -> str:
    """One line per input of the configs: found, or missing with the command that gets it."""
    inputs = required_inputs(configs)
    missing = {(i.kind, i.name, i.root) for i, _ in missing_inputs(inputs)}
    lines = ["inputs:"]
    for item in inputs:
        what = f"{item.name} data ({', '.join(item.splits)})" if item.kind == "dataset" else \
            f"{item.name} weights ({', '.join(item.why)})"
        state = f"MISSING: `{item.command}` or --download" if (item.kind, item.name, item.root) in missing else "found"
        lines.append(f"  {what}, {item.runs} run(s): {state}")
    return "\n".join(lines)
