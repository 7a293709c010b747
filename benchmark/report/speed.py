"""How fast a study's runs trained, from its committed run folders: the numbers a study README quotes.

    python scripts/speed.py results/cpu-privacy

reads ``runs.csv`` (the settings and run ids, written by `dfbench report`) and each run's
``runs/**/<run_id>/metrics.json`` (client_images, train_wall_seconds, environment.hardware and
torch_threads), and writes ``speed.csv`` / ``speed.md``: per setting, the median over its runs of the
client images per second of training wall time and of the training minutes, on the machine the runs
name. A README includes the table (``<!-- include: speed.md -->``), so no speed is typed by hand.
Client images count in full-model equivalents (a keep-0.5 pruned client's image counts half), so a
pruned setting reads about half the images/s of the same wall time.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dfbench.benchmark.core import runfolder
from dfbench.benchmark.report.names import is_baseline, setting_names

COLUMNS = ["setting", "runs", "images_per_s", "train_minutes", "hardware", "torch_threads"]


def run_speeds(runs_dir: Path) -> dict[str, dict[str, object]]:
    """run_id (its folder's name) -> images_per_s, train_seconds, hardware, torch_threads, for every run
    folder under `runs_dir` whose metrics.json records training (an untrained run has none)."""
    out: dict[str, dict[str, object]] = {}
    if not Path(runs_dir).is_dir():
        return out  # no runs: `main` names what is missing
    for run in runfolder.iter_runs(runs_dir):
        try:
            m = run.metrics()
        except (OSError, ValueError):
            continue
        if not isinstance(m, dict):
            continue
        images, seconds = m.get("client_images"), m.get("train_wall_seconds")
        if isinstance(images, (int, float)) and isinstance(seconds, (int, float)) and images > 0 and seconds > 0:
            env = m.get("environment") if isinstance(m.get("environment"), dict) else {}
            out[run.run_id] = {"images_per_s": float(images) / float(seconds), "train_seconds": float(seconds),
                               "hardware": env.get("hardware"), "torch_threads": env.get("torch_threads")}
    return out


def speeds(runs_dir: Path) -> dict[str, float]:
    """run_id -> client images per second of training wall time (`run_speeds`)."""
    return {rid: float(s["images_per_s"]) for rid, s in run_speeds(runs_dir).items()}  # type: ignore[arg-type]


def summarize(runs: pd.DataFrame, found: dict[str, dict[str, object]]) -> pd.DataFrame:
    """One row per trained setting of runs.csv (named as the leaderboard names it), in its order."""
    if "run_id" not in runs:
        raise ValueError("runs.csv has no run_id column: write it with `dfbench report --runs RUNS --out STUDY`")
    runs = runs.copy()  # runs.csv read back is a fragmented frame
    runs["label"] = pd.Series(setting_names(runs), dtype=object)
    # a setting is its group_key: a page names settings by what differs inside their block, so two blocks may
    # give different settings one name (confirmatory-2's "fedavg" at two partitions); those say their partition
    key = "group_key" if "group_key" in runs else "label"  # a runs.csv without group_key: the names decide
    keys = runs.groupby("label")[key].nunique()
    runs["label"] = [f"{r['label']} ({r['partition']})" if keys[r["label"]] > 1 else r["label"] for _, r in runs.iterrows()]
    rows = []
    for _, grp in runs[~runs.apply(is_baseline, axis=1)].groupby(key, sort=False):
        label = grp["label"].iloc[0]
        got = [found[str(r)] for r in grp["run_id"] if str(r) in found]
        if not got:
            continue
        hardware = sorted({str(g["hardware"]) for g in got if g["hardware"]})
        threads = sorted({str(g["torch_threads"]) for g in got if g["torch_threads"] is not None})
        rows.append({"setting": label, "runs": len(got),
                     "images_per_s": float(np.median([float(g["images_per_s"]) for g in got])),  # type: ignore[arg-type]
                     "train_minutes": float(np.median([float(g["train_seconds"]) for g in got])) / 60,  # type: ignore[arg-type]
                     "hardware": "; ".join(hardware), "torch_threads": "; ".join(threads)})
    return pd.DataFrame(rows, columns=COLUMNS)


def to_markdown(table: pd.DataFrame) -> str:
    lines = ["| setting | runs | images/s | training minutes |", "|---|---:|---:|---:|"]
    for _, r in table.iterrows():
        lines.append(f"| {r['setting']} | {int(r['runs'])} | {r['images_per_s']:.0f} | {r['train_minutes']:.1f} |")
    machines = sorted({h for h in table["hardware"] if isinstance(h, str) and h})
    threads = sorted({t for t in table["torch_threads"] if isinstance(t, str) and t})
    lines += ["", f"Median over each setting's runs of client images per second of training wall time and of the "
                  f"training time (metrics.json); {'; '.join(machines) or 'machine not recorded'}, "
                  f"{' or '.join(threads) or '?'} torch thread(s) per run. Client images count in full-model "
                  "equivalents: a keep-0.5 pruned client's image counts half."]
    return "\n".join(lines) + "\n"


def write(study: str | Path) -> pd.DataFrame:
    """speed.csv and speed.md in the study folder `study` (from its runs.csv and runs/); the table written.
    FileNotFoundError without runs.csv; ValueError when runs.csv has no run ids or no run records its
    client work and training time."""
    study = Path(study)
    path = study / "runs.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: `dfbench report --runs RUNS --out {study}` writes it")
    table = summarize(pd.read_csv(path), run_speeds(study / "runs"))
    if table.empty:
        raise ValueError(f"no run under {study / 'runs'} records client_images and train_wall_seconds")
    table.to_csv(study / "speed.csv", index=False)
    (study / "speed.md").write_text(to_markdown(table), encoding="utf-8")
    return table
