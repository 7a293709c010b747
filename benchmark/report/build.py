"""Reporter: turn finished run folders into a leaderboard, plots and grid mosaics.

The reporter only reads run folders; it never trains and computes no metric (a
run's same-noise drift is what its metrics.json records). Every run it finds ends up
either in the leaderboard or in the "Failed and diverged runs" list with a
reason -- nothing is dropped silently.

Entry point: :func:`build_report`. :func:`collect` gives the same tables as
pandas frames for notebooks and tests. The work is split by concern:

- ``run_folders``   reading run folders (``RunRecord`` / ``RunFailure``)
- ``frames``        per-run frames, seed aggregation, ranks (``collect``); which metric ranks and
                    which direction is better come from ``benchmark/metrics/table.py``
- ``formatting``    cell formatting and block views shared by the writers
- ``tables``        leaderboard.md / .csv / .html, inference_rules.csv
- ``mosaic``        sample-grid mosaics; ``plots`` the seaborn plots
"""

from __future__ import annotations

import logging
from pathlib import Path

from dfbench.benchmark.report.mosaic import make_mosaic
from dfbench.benchmark.report.frames import PRIMARY_METRICS, ReportData, aggregate, collect, curve_labels, primary_metric, runs_frame
from dfbench.benchmark.report.formatting import block_title, blocks, safe_name
from dfbench.benchmark.report.run_folders import RunFailure, RunRecord, find_run_dirs, format_params, load_runs, normalize_config, parse_alpha, read_run
from dfbench.benchmark.report.tables import write_csv, write_html, write_inference_csv, write_markdown

__all__ = [
    "PRIMARY_METRICS", "ReportData", "RunFailure", "RunRecord", "aggregate", "build_report", "collect",
    "find_run_dirs", "format_params", "load_runs", "make_mosaic", "normalize_config", "parse_alpha",
    "primary_metric", "read_run", "runs_frame", "write_csv", "write_html", "write_inference_csv", "write_markdown",
]

logger = logging.getLogger(__name__)


def build_report(runs_dir: str | Path, out_dir: str | Path, target: tuple[str, float] | None = None) -> dict[str, Path]:
    """Read every run under ``runs_dir`` and write the leaderboard, plots and mosaics to ``out_dir``.

    Returns the written files by name: ``leaderboard_md``, ``leaderboard_csv``,
    ``leaderboard_html``, ``plot_<name>``, ``mosaic_<dataset>_<partition>``,
    ``inference_rules_csv`` when any run's evaluation names its sampling rules (pruning's
    inference rules: the result's and the others, which the leaderboard never ranks), and
    ``skipped`` (a text file listing every plot or mosaic that was skipped and why)
    when anything was skipped. `target` (metric, value): the leaderboard gives each setting's
    simulated time to first reach that quality on its curve (eval.every).
    """
    from dfbench.benchmark.report.plots import make_plots  # matplotlib is heavy; import only when drawing

    root = Path(runs_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = collect(root, target)
    images: dict[str, Path] = {}
    notes: list[str] = []

    labels = curve_labels(data.runs)  # run id -> setting plus the config that tells it apart in its block
    told = {str(key): labels.get(str(run), "")[len(str(setting)):].strip()
            for key, run, setting in zip(data.runs["group_key"], data.runs["run_id"], data.runs["setting"])} if len(data.runs) else {}
    for (dataset, partition), block in blocks(data.table):
        name = f"mosaic_{safe_name(dataset)}_{safe_name(partition)}"
        path, mosaic_notes = make_mosaic(block, f"{block_title(dataset, partition)}: fixed-noise sample grids", out / f"{name}.png",
                                         extra=told)
        notes += [f"mosaic {dataset}/{partition}: {n}" for n in mosaic_notes]
        if path is not None:
            images[name] = path

    plots, plot_notes = make_plots(data.runs, data.rounds, data.table, data.metrics, out / "plots", data.curves)
    images.update({f"plot_{k}": v for k, v in plots.items()})
    notes += [f"plot {k}: {v}" for k, v in plot_notes.items()]
    for note in notes:
        logger.warning("report: %s", note)

    written: dict[str, Path] = {
        "leaderboard_md": write_markdown(data, out, root, images, notes),
        "leaderboard_csv": write_csv(data.table, data.metrics, out / "leaderboard.csv"),
        "leaderboard_html": write_html(data, out, root, images, notes),
    }
    if not data.inference.empty:  # only then: a report over runs without rule rows is what it always was
        written["inference_rules_csv"] = write_inference_csv(data.inference, out / "inference_rules.csv")
    written.update(images)
    if notes:
        skipped = out / "skipped.txt"
        skipped.write_text("\n".join(notes) + "\n", encoding="utf-8")
        written["skipped"] = skipped
    return written
