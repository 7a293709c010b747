"""Compare two roots of run folders made from the same configs (e.g. by the code before and after a refactor).

    python scripts/compare_runs.py OLD_ROOT NEW_ROOT

For every run folder under OLD_ROOT: the same run id exists under NEW_ROOT; every checkpoint
holds bitwise-equal tensors and the same totals (wall time aside); samples.npz, grid.png,
config.json and partition.json are equal; rounds.jsonl and metrics.json are equal once the
timing and environment fields are set aside. Prints one line per run and exits 1 if any differ.
Checkpoint files are also compared byte for byte (reported, not required: torch.save is not
promised to be byte-stable across versions).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dfbench.benchmark.api import iter_runs, runfolder

TIMING = {*runfolder.WALL_CLOCK, "train_wall_seconds", "eval_wall_seconds", "environment"}  # measured, never equal


def run_folders(root: Path) -> dict[str, Path]:
    """Relative path -> run folder, for every run folder under `root` (none when `root` is not a folder)."""
    if not root.is_dir():
        return {}
    return {run.path.relative_to(root).as_posix(): run.path for run in iter_runs(root)}


def same(a: Any, b: Any) -> bool:
    """Deep equality with tensors compared bitwise (dtype, shape, values)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def untimed(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: untimed(v) for k, v in d.items() if k not in TIMING}
    if isinstance(d, list):
        return [untimed(x) for x in d]
    return d


def compare(a: Path, b: Path) -> tuple[list[str], int, int]:
    """(problems, checkpoints compared, of them byte-identical files)."""
    problems: list[str] = []
    names_a = sorted(p.name for p in (a / "checkpoints").glob("*.pt"))
    names_b = sorted(p.name for p in (b / "checkpoints").glob("*.pt"))
    if names_a != names_b:
        problems.append(f"checkpoints {names_a} vs {names_b}")
    identical = 0
    for name in sorted(set(names_a) & set(names_b)):
        x = torch.load(a / "checkpoints" / name, weights_only=True)
        y = torch.load(b / "checkpoints" / name, weights_only=True)
        tx, ty = untimed(x.pop("totals")), untimed(y.pop("totals"))
        if not same(x, y):
            problems.append(f"{name}: tensors differ")
        if tx != ty:
            problems.append(f"{name}: totals {tx} vs {ty}")
        identical += (a / "checkpoints" / name).read_bytes() == (b / "checkpoints" / name).read_bytes()
    if (a / "samples.npz").exists() or (b / "samples.npz").exists():
        with np.load(a / "samples.npz") as za, np.load(b / "samples.npz") as zb:
            if not np.array_equal(za["images"], zb["images"]):
                problems.append("samples.npz differs")
    for f in ("grid.png", "config.json", "partition.json"):
        if (a / f).exists() != (b / f).exists() or ((a / f).exists() and (a / f).read_bytes() != (b / f).read_bytes()):
            problems.append(f"{f} differs")
    rows = [[untimed(json.loads(line)) for line in (d / "rounds.jsonl").read_text().splitlines()]
            if (d / "rounds.jsonl").exists() else None for d in (a, b)]  # (none for an untrained run)
    if rows[0] != rows[1]:
        problems.append("rounds.jsonl differs")
    ma, mb = (untimed(json.loads((d / "metrics.json").read_text())) for d in (a, b))
    if ma != mb:
        problems.append(f"metrics.json differs in {sorted(k for k in set(ma) | set(mb) if ma.get(k) != mb.get(k))}")
    return problems, len(names_a), identical


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old", type=Path)
    p.add_argument("new", type=Path)
    a = p.parse_args(argv)
    old, new = run_folders(a.old), run_folders(a.new)
    print(f"run folders: {len(old)} under {a.old}, {len(new)} under {a.new}; same run ids: {old.keys() == new.keys()}")
    bad = int(old.keys() != new.keys())
    for rid in sorted(old):
        if rid not in new:
            print(f"MISSING {rid}")
            continue
        problems, n, identical = compare(old[rid], new[rid])
        print(f"{'OK ' if not problems else 'BAD'} {rid}  ({n} checkpoints, {identical} byte-identical files)"
              + ("" if not problems else ": " + "; ".join(problems)))
        bad += bool(problems)
    print("all runs equal" if not bad else f"{bad} difference(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
