"""The wheel installs beside a package named ``datasets`` and leaves it alone.

The test builds the wheel from a copy of the source tree, creates a fresh venv
that already holds a stand-in ``datasets`` package (what Hugging Face
``datasets`` would be), installs the wheel with ``pip install --no-deps`` and
checks: the stand-in still imports with its marker, nothing named ``benchmark``
or ``methods`` is importable, ``dfbench --help`` and ``python -m dfbench
methods`` run, and the grids and the Fashion-MNIST classifier ship in the wheel.

No download: the fresh venv reaches torch & co. through a ``.pth`` line pointing
at this interpreter's site-packages, written only *after* pip has installed the
wheel (so pip never sees, let alone uninstalls, the editable dfbench there). A
``.pth`` line only adds a path; the editable install's own ``.pth`` hook is not
run, so ``dfbench`` inside the venv must come from the venv -- which is checked.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds a wheel and installs it in a fresh venv

ROOT = Path(__file__).resolve().parents[2]
MARKER = "hf-stand-in"
TOP_LEVEL_NAMES = ("datasets", "benchmark", "methods")


def _run(cmd: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    # No PYTHONPATH or user site: only what the venv itself sees may be importable.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PYTHONNOUSERSITE="1", MPLBACKEND="Agg", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INDEX="1")
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _check(result: subprocess.CompletedProcess[str], what: str) -> str:
    assert result.returncode == 0, f"{what} failed ({result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def _tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Build the wheel, make the venv with the stand-in, install; return the paths."""
    tmp = tmp_path_factory.mktemp("install")
    # prepare: a copy of what the build reads (the build writes build/ and *.egg-info beside its
    # input; a copy keeps the shared checkout clean and concurrent test runs apart)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    folders = sorted(set(project["tool"]["setuptools"]["package-dir"].values()))
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for folder in folders:
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp / "dist"
    _check(_run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                 str(src)], cwd=tmp), "pip wheel")
    (wheel,) = dist.glob("dfbench-*.whl")

    venv = tmp / "venv"
    _check(_run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp), "python -m venv")
    python = venv / "bin" / "python"
    site = Path(_check(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=tmp),
                       "venv site-packages").strip())
    stand_in = site / "datasets"
    stand_in.mkdir()
    (stand_in / "__init__.py").write_text(f'"""Stand-in for Hugging Face datasets."""\nMARKER = "{MARKER}"\n')
    before = _tree_digest(stand_in)

    # execute: pip (this interpreter's) installs into the venv
    _check(_run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
                cwd=tmp), "pip install --no-deps")
    # Dependencies (torch, pandas, ...) from this interpreter, added only now.
    (site / "_dfbench_test_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return {"tmp": tmp, "wheel": wheel, "venv": venv, "python": python, "site": site, "stand_in": stand_in,
            "before": before}  # type: ignore[dict-item]


def test_wheel_ships_only_dfbench_with_grids_and_classifier(installed: dict[str, Path]) -> None:
    with zipfile.ZipFile(installed["wheel"]) as whl:
        names = whl.namelist()
        record = whl.read(next(n for n in names if n.endswith(".dist-info/RECORD"))).decode()
        top_level = whl.read(next(n for n in names if n.endswith(".dist-info/top_level.txt"))).decode().split()
    recorded = [line.split(",")[0] for line in record.splitlines() if line.strip()]
    assert sorted(recorded) == sorted(names)
    # nothing outside dfbench/ and its dist-info: pip has no file to write into site-packages/datasets/
    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert {n.split("/")[0] for n in names} == {"dfbench", f"dfbench-{version}.dist-info"}
    assert top_level == ["dfbench"]
    for name in ("dfbench/benchmark/grid/builtin/demo.toml", "dfbench/benchmark/grid/builtin/paper.toml",
                 "dfbench/benchmark/metrics/assets/fmnist_classifier.pt", "dfbench/benchmark/metrics/assets/fmnist_classifier.json",
                 "dfbench/datasets/__init__.py", "dfbench/methods/registry.py", "dfbench/__main__.py"):
        assert name in names, f"{name} missing from the wheel"
    assert sorted(n for n in names if n.startswith("dfbench/benchmark/grid/builtin/") and n.endswith(".toml")) == sorted(
        f"dfbench/benchmark/grid/builtin/{p.name}" for p in (ROOT / "benchmark" / "grid" / "builtin").glob("*.toml"))


def test_install_leaves_the_stand_in_datasets_untouched(installed: dict[str, Path]) -> None:
    assert _tree_digest(installed["stand_in"]) == installed["before"]
    (record,) = installed["site"].glob("dfbench-*.dist-info/RECORD")
    written = [line.split(",")[0] for line in record.read_text().splitlines() if line.strip()]
    assert written and not [w for w in written if w.split("/")[0] in TOP_LEVEL_NAMES]


def test_imports_in_the_fresh_venv(installed: dict[str, Path]) -> None:
    script = (
        "import importlib.util, pathlib, sys\n"
        "import datasets, dfbench, dfbench.benchmark.cli, dfbench.datasets, dfbench.methods\n"
        f"assert datasets.MARKER == {MARKER!r}, datasets.__file__\n"
        "site = pathlib.Path(sys.argv[1]).resolve()\n"
        "for mod in (dfbench, dfbench.benchmark.cli, dfbench.datasets, dfbench.methods):\n"
        "    assert site in pathlib.Path(mod.__file__).resolve().parents, (mod.__name__, mod.__file__)\n"
        f"for name in {TOP_LEVEL_NAMES[1:]!r}:\n"
        "    assert importlib.util.find_spec(name) is None, (name, importlib.util.find_spec(name))\n"
        "from dfbench.benchmark.grid.spec import load_grid\n"
        "load_grid('demo')  # the built-in grid is found inside the installed package\n"
        "print('ok', len(dfbench.methods.list_methods()), dfbench.__version__)\n"
    )
    out = _check(_run([str(installed["python"]), "-c", script, str(installed["site"])], cwd=installed["tmp"]),
                 "imports in the venv")
    assert out.startswith("ok ")


def test_console_script_and_module_run(installed: dict[str, Path]) -> None:
    help_text = _check(_run([str(installed["venv"] / "bin" / "dfbench"), "--help"], cwd=installed["tmp"]),
                       "dfbench --help")
    assert "run" in help_text and "report" in help_text
    methods = _check(_run([str(installed["python"]), "-m", "dfbench", "methods"], cwd=installed["tmp"]),
                     "python -m dfbench methods")
    for name in ("fedavg", "fedprox", "random_prune", "topk_prune", "quantized", "experts"):
        assert name in methods
