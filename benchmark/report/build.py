"""Reporter: turn finished run folders into a leaderboard, plots and grid mosaics.

The reporter only reads run folders; it never trains, computes no metric and writes
nothing into a run folder (a run's same-noise drift is what its metrics.json records, or
drift.json when it was recorded after the evaluation). Every run it finds ends up
either in the leaderboard or in the "Failed and diverged runs" list with a
reason -- nothing is dropped silently.

Entry point: :func:`build_report`. :func:`collect` gives the same tables as
pandas frames for notebooks and tests. The work is split by concern:

- ``run_records``   reading run folders (``RunRecord`` / ``RunFailure``)
- ``frames``        per-run frames, seed aggregation, ranks (``collect``); which metric ranks and
                    which direction is better come from ``benchmark/metrics/table.py``
- ``formatting``    cell formatting shared by the writers
- ``layout``        what the page shows per block (headline, main and secondary tables, provenance),
                    from the aggregated table alone plus ``report.json`` (``PageMeta``)
- ``tables``        leaderboard.md / .csv, inference_rules.csv; ``page`` the self-contained HTML report
- ``mosaic``        sample-grid mosaics; ``plots`` the seaborn plots

:func:`rerender` rebuilds leaderboard.md / .html and the plots drawn from the table alone
(metric vs alpha, metric vs uplink) from a report folder's leaderboard.csv and report.json:
a new page layout reaches a committed report without its run folders.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from dfbench.benchmark.core import runfolder
from dfbench.benchmark.report.mosaic import make_mosaic
from dfbench.benchmark.report.frames import PRIMARY_METRICS, ReportData, aggregate, collect, primary_metric, runs_frame
from dfbench.benchmark.report.formatting import block_title, blocks, metric_provenance, safe_name
from dfbench.benchmark.report.layout import META_FILE, PageMeta, metrics_of
from dfbench.benchmark.report.run_records import RunFailure, RunRecord, find_run_dirs, format_params, load_runs, normalize_config, parse_alpha, read_run
from dfbench.benchmark.report.page import write_html
from dfbench.benchmark.report.tables import failure_rows, write_csv, write_inference_csv, write_markdown

__all__ = [
    "PRIMARY_METRICS", "ReportData", "RunFailure", "RunRecord", "aggregate", "build_report", "collect",
    "find_run_dirs", "format_params", "load_runs", "make_mosaic", "normalize_config", "parse_alpha",
    "primary_metric", "read_run", "rerender", "runs_frame", "write_csv", "write_html", "write_inference_csv", "write_markdown",
]

logger = logging.getLogger(__name__)


def build_report(runs_dir: str | Path, out_dir: str | Path, target: tuple[str, float] | None = None, *,
                 reference: str | None = None, margin: float | None = None, claims: str | Path | None = None) -> dict[str, Path]:
    """Read every run under ``runs_dir`` and write the leaderboard, plots and mosaics to ``out_dir``.

    Returns the written files by name: ``leaderboard_md``, ``leaderboard_csv``,
    ``leaderboard_html``, ``plot_<name>``, ``mosaic_<dataset>_<partition>``,
    ``inference_rules_csv`` when any run's evaluation names its sampling rules (pruning's
    inference rules: the result's and the others, which the leaderboard never ranks), and
    ``skipped`` (a text file listing every plot or mosaic that was skipped and why)
    when anything was skipped. `target` (metric, value): the leaderboard gives each setting's
    simulated time to first reach that quality on its curve (eval.every). `reference`, `margin`: the
    setting every other one is compared with seed-paired (None: the method that declares itself the
    reference, FedAvg), and the equivalence margin (verdicts.py).
    Also ``runs_csv`` (runs.csv: one row per run, its scores and pairing records: what the verdicts and
    claims are computed from) and, with a `claims` file, ``claims_md`` / ``claims_csv`` (claims.py),
    quoted into ``out_dir``/README.md where it has the claims block. A claims file with
    ``preregistered = true`` that was not committed before every run raises `claims.NotPreregistered`
    after everything is written (its ``written``: these files).
    """
    from dfbench.benchmark.report import verdicts
    from dfbench.benchmark.report.plots import make_plots  # matplotlib is heavy; import only when drawing

    root = Path(runs_dir)
    out = Path(out_dir)
    claim_list = None
    if claims is not None:  # a bad claims file stops the report before anything is written
        from dfbench.benchmark.report.claims import load_claims

        claim_list = load_claims(claims)
    margin = verdicts.MARGIN if margin is None else margin
    verdicts.equivalence_bounds("log", margin, 1.0)  # a bad margin stops it too
    if not find_run_dirs(root):  # (no folder at all: find_run_dirs raises FileNotFoundError too)
        raise FileNotFoundError(f"no run folders under {root} (a run folder holds a {runfolder.CONFIG}), so there is "
                                f"nothing to report and nothing was written; make runs with `dfbench run --out {root}` "
                                f"or `dfbench grid demo --out {root}`, or report the folder that holds them")
    data = collect(root, target, reference=reference, margin=margin)  # a bad --reference or duplicate runs stop here
    out.mkdir(parents=True, exist_ok=True)
    images: dict[str, Path] = {}
    notes: list[str] = []

    for (dataset, partition), block in blocks(data.table):
        name = f"mosaic_{safe_name(dataset)}_{safe_name(partition)}"
        # captioned with the page's names (names.setting_names: the config that tells a setting apart included)
        path, mosaic_notes = make_mosaic(block, f"{block_title(dataset, partition)}: fixed-noise sample grids", out / f"{name}.png")
        notes += [f"mosaic {dataset}/{partition}: {n}" for n in mosaic_notes]
        if path is not None:
            images[name] = path

    plots, plot_notes = make_plots(data.runs, data.rounds, data.table, data.metrics, out / "plots", data.curves)
    images.update({f"plot_{k}": v for k, v in plots.items()})
    notes += [f"plot {k}: {v}" for k, v in plot_notes.items()]
    for note in notes:
        logger.warning("report: %s", note)

    from dfbench.benchmark.report.agreement import report_agreement
    from dfbench.benchmark.report.layout import labels_by_key

    agreement = report_agreement(data.runs, data.table, data.metrics, block_title)
    for (dataset, partition), block in blocks(data.table):  # the page's names, kept for a re-render from the CSV
        if (agreed := agreement.get(block_title(dataset, partition))) is not None:
            agreed["labels"] = labels_by_key(block)
    meta = PageMeta(
        agreement=agreement,
        n_runs=len(data.runs), n_failed=len(data.failures), hardware=list(data.hardware),
        failures=failure_rows(data.failures, root), warnings=list(data.warnings), notes=list(notes),
        provenance={block_title(d, p): metric_provenance(data.evaluations, block["group_key"]) for (d, p), block in blocks(data.table)},
        runs_dir=_relative(root, out), target=list(data.target) if data.target else None,
    )
    written: dict[str, Path] = {
        "leaderboard_csv": write_csv(data.table, data.metrics, out / "leaderboard.csv"),
        "report_json": meta.write(out),
        "leaderboard_md": write_markdown(data.table, data.metrics, meta, out, _targets(images, out)),
        "leaderboard_html": write_html(data.table, data.metrics, meta, out, images),
    }
    runs, not_preregistered = data.runs, None
    if claim_list is not None:
        from dfbench.benchmark.report.claims import NotPreregistered, write_claims
        from dfbench.benchmark.report.preregistration import with_starts

        # the starts decide each claim's registration (and a pre-registered file's check); into runs.csv too, so
        # both are made again from a committed runs.csv
        runs = with_starts(runs)
    written["runs_csv"] = write_runs_csv(runs, data.metrics, out / "runs.csv")
    if claim_list is not None:
        try:
            written.update(write_claims(runs, claims, out, primary_metric(data.metrics)))  # type: ignore[arg-type]
        except NotPreregistered as err:  # the report is written whole, then the caller is told
            not_preregistered = err
    if not data.inference.empty:  # only then: a report over runs without rule rows is what it always was
        written["inference_rules_csv"] = write_inference_csv(data.inference, out / "inference_rules.csv")
    written.update(images)
    if notes:
        skipped = out / "skipped.txt"
        skipped.write_text("\n".join(notes) + "\n", encoding="utf-8")
        written["skipped"] = skipped
    if not_preregistered is not None:
        not_preregistered.written = written
        raise not_preregistered
    return written


# the plateau rule's outcome: the claims' budget column says "not converged" from them (report.budget). Written only
# when a run used the rule, so the runs.csv of a study that did not stays as it was
PLATEAU_COLUMNS = ("rounds_done", "plateau_reached", "plateau_gain")


RUN_COLUMNS = ["dataset", "partition", "method", "params", "setting", "baseline", "seed", "run_id", "group_key",
               "partition_sha256", "init_sha256", "eval_noise_sha256", "num_parameters", "wall_seconds", "uplink_mb",
               "client_images",  # client work: the claims' budget check (claims.decide)
               *PLATEAU_COLUMNS,  # only where a run used the plateau rule (write_runs_csv)
               "started_epoch", "started_how"]  # the last two only with a claims file (preregistration.with_starts)


def write_runs_csv(runs: pd.DataFrame, metrics: Sequence[str], path: Path) -> Path:
    """runs.csv: one row per run with its setting, seed, pairing records (partition, initial model,
    evaluation noises), hyperparameters, config and every metric (with the run's own interval), so the
    verdicts and claims of a committed study can be decided again without its run folders."""
    if runs.empty:
        pd.DataFrame(columns=[c for c in RUN_COLUMNS if c not in PLATEAU_COLUMNS]).to_csv(path, index=False)
        return path
    ruled = "plateau_reached" in runs and runs["plateau_reached"].notna().any()
    cols = [c for c in RUN_COLUMNS if c in runs and (ruled or c not in PLATEAU_COLUMNS)]
    cols += sorted(c for c in runs.columns if c.startswith("param.")) + sorted(c for c in runs.columns if c.startswith("cfg."))
    cols += [c for m in metrics for c in (m, f"{m}__lo", f"{m}__hi") if c in runs]
    runs[cols].sort_values(["dataset", "partition", "setting", "seed"], kind="stable").to_csv(path, index=False)
    return path


def _relative(path: Path, start: Path) -> str | None:
    """`path` relative to `start` (for links from the report to the run folders), None if on another drive."""
    import os

    try:
        return Path(os.path.relpath(path.resolve(), start.resolve())).as_posix()
    except ValueError:
        return None


def _targets(images: dict[str, Path], out: Path) -> dict[str, str]:
    return {k: Path(p).resolve().relative_to(out.resolve()).as_posix() for k, p in images.items()}


def rerender(out_dir: str | Path, target: tuple[str, float] | None = None) -> dict[str, Path]:
    """Rewrite a report folder's leaderboard.md and .html, and its table-drawn plots, from its
    leaderboard.csv and report.json alone (no run folders). The mosaics and the other plots stay as
    they are and are shown again. `target`: as `build_report`'s (report.json's when None)."""
    import json

    import pandas as pd

    from dfbench.benchmark.report.plots import PLOT_NAMES, table_plots

    out = Path(out_dir)
    csv, meta_path = out / "leaderboard.csv", out / META_FILE
    if not csv.is_file():
        raise FileNotFoundError(f"{csv} not found: --from-csv re-renders a report folder that `dfbench report` wrote")
    meta = PageMeta.from_json(json.loads(meta_path.read_text(encoding="utf-8"))) if meta_path.is_file() else PageMeta()
    if target is not None:
        meta.target = list(target)
    table = pd.read_csv(csv, keep_default_na=True)
    params = table["params"].fillna("")
    rebuilt = [f"{m} [{p}]" if p else str(m) for m, p in zip(table["method"], params)]  # an older CSV has no setting
    table = pd.concat([table.drop(columns=["params", "setting"], errors="ignore"), pd.DataFrame({
        "params": params,
        "setting": table["setting"].fillna("").astype(str).tolist() if "setting" in table else rebuilt,
        "alpha": table["partition"].map(parse_alpha),
    }, index=table.index)], axis=1)
    metrics = metrics_of(table)
    plots, plot_notes = table_plots(table, metrics, out / "plots")
    images: dict[str, Path] = {}
    for (dataset, partition), _ in blocks(table):
        name = f"mosaic_{safe_name(dataset)}_{safe_name(partition)}"
        if (out / f"{name}.png").is_file():
            images[name] = out / f"{name}.png"
    drawn = {**{png.stem: png for png in ((out / "plots").glob("*.png") if (out / "plots").is_dir() else [])}, **plots}
    for name in sorted(drawn, key=lambda n: (PLOT_NAMES.index(n) if n in PLOT_NAMES else len(PLOT_NAMES), n)):
        images[f"plot_{name}"] = drawn[name]  # in build_report's order
    meta.notes = [n for n in meta.notes if not any(n.startswith(f"plot {k}:") for k in plots)] + \
        [f"plot {k}: {v}" for k, v in plot_notes.items() if not any(n.startswith(f"plot {k}:") for n in meta.notes)]
    if meta.notes:  # as build_report keeps it: the skipped plots and mosaics, one per line
        (out / "skipped.txt").write_text("\n".join(meta.notes) + "\n", encoding="utf-8")
    written = {
        "report_json": meta.write(out),
        "leaderboard_md": write_markdown(table, metrics, meta, out, _targets(images, out)),
        "leaderboard_html": write_html(table, metrics, meta, out, images),
    }
    written.update({f"plot_{k}": v for k, v in plots.items()})
    return written
