"""The library and its studies apart (issue 61, item 1): a committed study's code lives in its folder,
results/<study>/*.py (what several studies share: scripts/*.py), outside the installed package, and reaches
dfbench through its public API.

- The wheel holds no study module: built from a copy of the package folders, its file list has no
  `dfbench/benchmark/studies/` and no file of results/ or scripts/; pyproject.toml lists no such package.
- No script edits `sys.path` or walks run folders itself (`rglob`, `os.walk`, a `**` glob): the one reader of a
  tree of run folders is `runfolder.iter_runs` (`dfbench.benchmark.api.iter_runs`). Comments and docstrings
  do not spell them either, so `grep -rn "rglob\\|sys.path" results scripts` finds nothing.
- A script imports dfbench through `dfbench`, `dfbench.benchmark.api`, `dfbench.datasets` and `dfbench.methods`
  only; `INTERNAL` lists, file by file, the scripts that still reach further (each rebuilds a run's model, times
  the engine or trains a shipped asset) with the reason. A script that no longer needs its entry fails too, so
  the list only shrinks.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted([*(ROOT / "results").rglob("*.py"), *(ROOT / "scripts").rglob("*.py")])
PUBLIC = ("dfbench", "dfbench.benchmark.api", "dfbench.datasets", "dfbench.methods")

# script -> why it imports more of dfbench than the public API
INTERNAL: dict[str, str] = {
    "results/cifar10-gpu/gpu_plan.py": "the GPU study's preflight and throughput: it checks weight files, builds the "
                                       "grid's network and times its training step and feature passes",
    "results/cpu-bf16/run_speed.py": "names the CPU it timed on (core.numerics.cpu_record)",
    "results/cpu-recipe/cpu_recipe.py": "times the plain training step (perf.PlainTrainer) under candidate recipes",
    "results/cpu-submodels/fjord_adam.py": "reruns FjORD's runs with another optimizer state rule (engine)",
    "results/cpu-submodels/fjord_widths.py": "rebuilds FjORD runs' final models from their checkpoints (engine)",
    "results/cpu-submodels/submodel_study.py": "replays a run's seeded capacity and speed tiers (core.seeds, engine.clock)",
    "results/gt-demo/scatter.py": "reads the runs' records and float samples (report.run_records)",
    "results/gt-demo/speed.py": "trains one cell per preset and times it (engine.lifecycle)",
    "results/gt-demo/width_scan.py": "trains the width scan's cells (engine.lifecycle)",
    "results/start-points/ddim_terminal.py": "samples a pretrained DDPM network with DDIM from two first steps and "
                                             "through the velocity conversion (engine.diffusion, engine.model)",
    "results/proxy-validity/kid_norm.py": "recomputes KID from the classifier's features at equalised norms (metrics.features, "
                                          "metrics.fid)",
    "results/metric-calibration/eval_cost.py": "times each part of a run's evaluation (engine)",
    "results/paper-fmnist/pruning_masks.py": "rebuilds pruning runs' final models and masks from their checkpoints (engine)",
    "results/paper-fmnist/rescore_inference.py": "rebuilds a pruning run's final model and samples it under other "
                                                 "inference rules (engine)",
    "results/perf/submodel_speed.py": "times one client's local training through each method's own plan (engine, perf)",
    "scripts/eval_precision.py": "scores a run's samples at several subset sizes (metrics' extractor and distance)",
    "scripts/gpu_check.py": "the GPU check drives the engine's step and model directly",
    "scripts/report_meta_from_markdown.py": "a one-off migration that writes report.json (report.layout)",
    "scripts/train_fmnist_classifier.py": "trains the classifier the package ships (metrics.features' network and file)",
    "scripts/train_fmnist_encoder.py": "trains the autoencoder the package ships (metrics.features' network and file)",
}


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def forbidden(path: Path) -> list[str]:
    """`line: what` for each sys.path edit or hand-made walk over run folders in `path`, and each mention of
    `rglob` or `sys.path` in its text (comments and docstrings too: the acceptance is a grep)."""
    text = path.read_text(encoding="utf-8")
    found = [f"{n}: mentions {word}" for n, line in enumerate(text.splitlines(), 1)
             for word in ("rglob", "sys.path") if word in line]
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if (node.value.id, node.attr) in {("sys", "path"), ("os", "walk")}:
                found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("rglob", "glob"):
            pattern = node.args[0] if node.args else None
            if node.func.attr == "rglob" or (isinstance(pattern, ast.Constant) and "**" in str(pattern.value)):
                found.append(f"{node.lineno}: .{node.func.attr}(...)")
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(a.name in ("os.walk", "walk") for a in node.names) \
                and (isinstance(node, ast.Import) or node.module == "os"):
            found.append(f"{node.lineno}: imports os.walk")
    return sorted(set(found))


def dfbench_imports(path: Path) -> set[str]:
    """The dfbench modules `path` imports (``from dfbench import datasets`` counts as dfbench.datasets)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"dfbench.{a.name}" for a in node.names] if node.module == "dfbench" else [node.module]
        else:
            continue
        out |= {n for n in names if n == "dfbench" or n.startswith("dfbench.")}
    return out


def test_the_rules_see_what_they_refuse(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('import os, sys\nfrom pathlib import Path\nsys.path.insert(0, "scripts")\n'
                       'runs = sorted(Path("r").rglob("config.json"))\nfor d, _, f in os.walk("r"):\n    pass\n'
                       'more = Path("r").glob("**/metrics.json")\nfew = Path("r").glob("*.json")\n'
                       'from dfbench.benchmark.api import iter_runs\nfrom dfbench import methods\n'
                       'from dfbench.benchmark.engine import evaluate\n')
    assert forbidden(planted) == ["3: mentions sys.path", "3: sys.path", "4: .rglob(...)", "4: mentions rglob",
                                  "5: os.walk", "7: .glob(...)"]
    assert dfbench_imports(planted) == {"dfbench.benchmark.api", "dfbench.methods", "dfbench.benchmark.engine"}


def test_no_script_edits_sys_path_or_walks_run_folders_itself():
    assert len(SCRIPTS) > 20 and ROOT / "results" / "paper-fmnist" / "paper_figures.py" in SCRIPTS  # the walk saw them
    found = [f"{_rel(p)}:{hit}" for p in SCRIPTS for hit in forbidden(p)]
    assert not found, ("read run folders through dfbench.benchmark.api.iter_runs (the one reader), and import a "
                       "script's neighbour as Python runs it (its folder is on the path), never by editing sys.path:\n"
                       + "\n".join(found))


def test_scripts_import_dfbench_through_its_public_api():
    reaching = {_rel(p): sorted(m for m in dfbench_imports(p) if m not in PUBLIC) for p in SCRIPTS}
    reaching = {name: mods for name, mods in reaching.items() if mods}
    unlisted = {name: mods for name, mods in reaching.items() if name not in INTERNAL}
    assert not unlisted, ("import these through dfbench.benchmark.api (add what a study needs there), or list the "
                          f"script in INTERNAL with its reason: {unlisted}")
    stale = sorted(set(INTERNAL) - set(reaching))
    assert not stale, f"these scripts need no entry in INTERNAL any more (remove it): {stale}"


def test_pyproject_ships_no_study_package():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert not [p for p in setup["packages"] if "studies" in p.split(".")]
    assert set(setup["package-dir"].values()) == {"dfbench", "benchmark", "methods", "datasets"}
    assert not (ROOT / "benchmark" / "studies").exists()
    import importlib.util

    assert importlib.util.find_spec("dfbench.benchmark.studies") is None


@pytest.mark.slow  # builds the wheel (pip, a few seconds)
def test_the_built_wheel_holds_no_study_module(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for folder in ("dfbench", "benchmark", "methods", "datasets"):  # the package folders (pyproject's package-dir)
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path / "wheel"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "--quiet", "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "dfbench/benchmark/api.py" in names and "dfbench/benchmark/report/paired.py" in names  # the real package
    studies = [n for n in names if "/studies/" in n or n.startswith(("results/", "scripts/"))]
    assert not studies, f"study code in the wheel: {studies}"
    moved = {"paper_figures.py", "gpu_plan.py", "calibration.py", "frontier.py", "time_to_quality.py", "budget_width.py",
             "share_runs.py", "reproduce.py", "submodel_speed.py", "rescore_inference.py", "eval_cost.py"}  # issue 61
    assert not [n for n in names if Path(n).name in moved]
