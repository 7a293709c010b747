"""Same-noise drift: how far a run's samples moved from the dense reference's, sample by sample.

Every run of a dataset samples from the same fixed noises (sample i's noise has its own seed),
so "closer to the full model" (Qiao et al., ICML 2025, Figures 4-6) can be a number: for run A
and its dense reference B (same dataset, partition, seed, budget and evaluation noise),

    pixel drift    = mean_i sqrt(mean_pixels (a_i - b_i)^2)      a, b in [0, 1] (uint8 / 255)
    feature drift  = mean_i || f(a_i) - f(b_i) ||_2              f: the extractor of the run's metric
                                                                  ("fmnist" classifier, "inception", ...)

over the first min(N_A, N_B) samples. The dense reference of a run is the keep-ratio-1.0 run
of the same method family when one exists (bitwise FedAvg), else the FedAvg run; a FedAvg run
is its own reference (drift 0). Both must be finished, with samples.npz.

The result goes into metrics.json under "drift" when the run is evaluated and its reference is
already there (`attach_drift`). A run evaluated before its reference finished (grid workers run
cells side by side) gets the same record later from `record_missing_drift`, in a file of its own,
drift.json (`runfolder.DRIFT`): nothing rewrites metrics.json after the evaluation. The grid's
last worker calls it once its cells are done, and `dfbench eval` for the runs it is given.
Readers take metrics.json's record, else drift.json's (`later_drift`; report/run_records.py
merges it as it merges rescored.json). The reporter only reads (`recorded_drift`, `missing_drift`
to name what is still to record); it never computes one and never writes into a run folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from dfbench.benchmark.core import runfolder
from dfbench.benchmark.core import schema
from dfbench.benchmark.core.config import experiment_schema
from dfbench.benchmark.metrics import table

# Dotted config keys that may differ between a run and its reference: what is compared (the method,
# its capacity tiers, how much it evaluated: the first min(N) samples pair up). Beside them, config.json's
# bookkeeping and every field the schema declares execution-only never count (`_budget` keeps the result
# fields only, as the run id does: core/schema.py).
_COMPARED = ("method", "method_params", "system.capacity", "eval.samples", "eval.grid", "eval.metrics")


def free_keys() -> frozenset[str]:
    """Every dotted key that may differ between a run and its reference (derived from the schema)."""
    return frozenset((*_COMPARED, *schema.BOOKKEEPING, *schema.execution_keys(experiment_schema())))


def pixel_drift(a: np.ndarray, b: np.ndarray) -> float:
    """Mean over samples of the per-image RMS pixel difference, uint8 [N, C, H, W] in [0, 1] units."""
    a, b = _paired(a, b)
    diff = (a.astype(np.float64) - b.astype(np.float64)) / 255.0
    return float(np.sqrt(np.square(diff).reshape(len(diff), -1).mean(axis=1)).mean())


def feature_drift(fa: np.ndarray, fb: np.ndarray) -> float:
    """Mean over samples of the Euclidean distance between paired feature rows [N, D]."""
    fa, fb = _paired(fa, fb)
    return float(np.linalg.norm(fa.astype(np.float64) - fb.astype(np.float64), axis=1).mean())


def _paired(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first min(N_a, N_b) rows of each; the per-sample shapes must agree."""
    if a.shape[1:] != b.shape[1:]:
        raise ValueError(f"drift compares samples of one shape; got {a.shape[1:]} and {b.shape[1:]}")
    n = min(len(a), len(b))
    if n == 0:
        raise ValueError("drift needs at least one sample in both runs")
    return a[:n], b[:n]


# -- finding the reference ----------------------------------------------------------------------

def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _budget(cfg: dict[str, Any]) -> dict[str, Any]:
    """What a run and its reference must share: the run id's identity of the stored config (result fields
    only, active, canonical, a later field missing or at its neutral value left out: `schema.identity`)
    without what is compared (`_COMPARED`)."""
    entries = [e for e in experiment_schema() if e.key not in _COMPARED]
    return schema.identity(entries, schema.stored(entries, cfg))


def _is_reference(cfg: dict[str, Any]) -> bool:
    """A run of the reference method (`Method.reference`: FedAvg), the dense model itself."""
    from dfbench.methods.registry import reference_method

    return cfg.get("method") == reference_method()


def _is_dense(cfg: dict[str, Any], method: str) -> bool:
    """A run of `method` at its dense setting (`Method.dense_param` at 1.0) without capacity tiers,
    i.e. bitwise FedAvg. False for a method that declares no dense setting or is not registered here."""
    from dfbench.methods.registry import get_method_class

    try:
        param = get_method_class(method).dense_param
    except KeyError:  # a plugin's method not loaded in this process: no dense setting known
        return False
    params = cfg.get("method_params") or {}
    tiers = (cfg.get("system") or {}).get("capacity") or ""
    return param is not None and cfg.get("method") == method and float(params.get(param, 0.0)) >= 1.0 and not tiers


def _done_with_samples(d: Path) -> bool:
    try:
        status = _read(d / runfolder.STATUS)
    except (OSError, ValueError):
        return False
    return status.get("state") == runfolder.DONE and (d / runfolder.SAMPLES).is_file()


def find_reference(run: str | Path, root: str | Path | None = None) -> Path | None:
    """The dense reference folder of `run` under `root` (default: the run's own runs root).

    Candidates are finished runs under <root>/<dataset>/<partition>/ with the same budget
    (`_budget`); the keep-1.0 run of the run's own method wins over FedAvg; among equals the
    lexically first folder, so the choice is deterministic.
    """
    run = Path(run)
    cfg = _read(run / runfolder.CONFIG)
    if _is_reference(cfg):
        return run if (run / runfolder.SAMPLES).is_file() else None  # its own reference (drift 0), even mid-evaluation
    if root is None:
        parents = run.resolve().parents  # <root>/<dataset>/<partition>/<method>/<seed-hash>
        if len(parents) < 4:
            return None  # not inside a runs root: nothing to compare with
        root = parents[3]
    want = _budget(cfg)
    same_family, fedavg = [], []  # fedavg: runs of the reference method
    block = Path(root) / run.parent.parent.parent.name / run.parent.parent.name  # <dataset>/<partition>
    for cand in runfolder.iter_runs(block) if block.is_dir() else ():
        d = cand.path
        try:
            other = cand.config()
        except (OSError, ValueError):
            continue
        if _budget(other) != want or not _done_with_samples(d):
            continue
        if _is_reference(other):
            fedavg.append(d)
        elif _is_dense(other, str(cfg.get("method"))):
            same_family.append(d)
    found = same_family or fedavg
    return found[0] if found else None


# -- computing it -------------------------------------------------------------------------------

def load_samples(d: Path) -> np.ndarray:
    with np.load(d / runfolder.SAMPLES, allow_pickle=False) as z:
        return z["images"]


def run_extractors(metrics: dict[str, Any]) -> list[str]:
    """Extractor names of the run's evaluation rows, in order, those of `table.EXTRACTORS` only."""
    names = [str(r.get("extractor")) for r in metrics.get("evaluations", []) if isinstance(r, dict)]
    return [n for n in dict.fromkeys(names) if n in table.EXTRACTORS]


def compute_drift(run: str | Path, reference: str | Path, extractors: Iterable[str] = (), device: str = "cpu") -> dict[str, Any]:
    """The drift record of `run` against `reference`: pixels plus each named extractor's features."""
    run, reference = Path(run), Path(reference)
    a, b = load_samples(run), load_samples(reference)
    n = min(len(a), len(b))
    out: dict[str, Any] = {"reference": _relative(reference, run), "num_samples": int(n), "pixel": pixel_drift(a, b), "features": {}}
    if run.resolve() == reference.resolve():
        out["features"] = {name: 0.0 for name in extractors}
        return out
    if extractors:
        import torch

        from dfbench.benchmark.metrics.features import get_extractor

        for name in extractors:
            ext = get_extractor(name, device=device)  # type: ignore[arg-type]
            fa = ext.features(torch.from_numpy(np.ascontiguousarray(a[:n])))
            fb = ext.features(torch.from_numpy(np.ascontiguousarray(b[:n])))
            out["features"][name] = feature_drift(fa, fb)
    return out


def _relative(reference: Path, run: Path) -> str:
    """The reference as a path relative to the runs root (portable in metrics.json)."""
    try:
        return str(reference.resolve().relative_to(run.resolve().parents[3]))
    except ValueError:
        return str(reference)


def attach_drift(run: str | Path, metrics: dict[str, Any], device: str = "cpu") -> None:
    """Put the run's drift into `metrics` (in place) when its dense reference is already done."""
    run = Path(run)
    ref = find_reference(run)
    if ref is not None:
        metrics["drift"] = compute_drift(run, ref, run_extractors(metrics), device=device)


def record_missing_drift(runs: Iterable[str | Path], device: str = "cpu") -> list[Path]:
    """Write drift.json (`runfolder.DRIFT`) for every finished run among `runs` that has no drift
    record and whose dense reference is done now; return the runs written.

    For runs evaluated before their reference finished (`attach_drift` found none then): the
    record is the one evaluation would have written, in a file of its own, so metrics.json stays
    what the evaluation wrote. Each run's lock (core/lock.py) is held while it is looked at again
    and drift.json is written (atomically); a run another process holds is skipped, to be caught
    by a later call. Meant for whoever finishes a set of runs (the grid runner after its cells,
    `dfbench eval`), never for the reporter, which only reads.
    """
    from dfbench.benchmark.core.lock import RunLock

    written: list[Path] = []
    for run in missing_drift(runs):
        lock = RunLock(run)
        if not lock.try_acquire():
            continue
        try:
            if not _lacks_drift(run):  # changed between the look and the lock
                continue
            metrics = _read(run / runfolder.METRICS)
            attach_drift(run, metrics, device=device)
            if isinstance(metrics.get("drift"), dict):
                runfolder.write_json(run / runfolder.DRIFT, metrics["drift"])
                written.append(run)
        finally:
            lock.release()
    return written


def missing_drift(runs: Iterable[str | Path]) -> list[Path]:
    """The finished runs among `runs` without a drift record whose dense reference is done now: what
    `record_missing_drift` would write. Reads only (the reporter names them, and the command that fills them)."""
    return [run for run in map(Path, runs) if _lacks_drift(run) and find_reference(run) is not None]


def _lacks_drift(run: Path) -> bool:
    """A finished run with samples and a readable metrics.json, without a drift record in it or in drift.json."""
    if not _done_with_samples(run):
        return False
    try:
        metrics = _read(run / runfolder.METRICS)
    except (OSError, ValueError):
        return False
    return isinstance(metrics, dict) and not isinstance(metrics.get("drift"), dict) and later_drift(run) is None


def later_drift(run: str | Path) -> dict[str, Any] | None:
    """drift.json's record (written after the evaluation by `record_missing_drift`), or None."""
    try:
        rec = _read(Path(run) / runfolder.DRIFT)
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def run_drift(run: str | Path) -> dict[str, Any] | None:
    """A run folder's drift record: metrics.json's (written at evaluation), else drift.json's, else None."""
    try:
        metrics = _read(Path(run) / runfolder.METRICS)
    except (OSError, ValueError):
        metrics = {}
    return (recorded_drift(metrics) if isinstance(metrics, dict) else None) or later_drift(run)


def recorded_drift(metrics: dict[str, Any]) -> dict[str, Any] | None:
    """The drift record of a run's metrics, or None when it has none (the reporter computes nothing).

    `metrics` as report/run_records.py reads it (drift.json merged in), or metrics.json alone."""
    rec = metrics.get("drift")
    return rec if isinstance(rec, dict) else None
