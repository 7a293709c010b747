"""scripts/gpu_check.sh and gpu_check.py: the checkout runs (never a stale dfbench), dependencies are
found or named, and the CPU dry mode of the whole check passes (the acceptance test, ~1 min)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PY_SCRIPT = ROOT / "scripts" / "gpu_check.py"
SH_SCRIPT = ROOT / "scripts" / "gpu_check.sh"
WANT = {"dfbench": ROOT / "dfbench" / "__init__.py",
        **{f"dfbench.{d}": ROOT / d / "__init__.py" for d in ("benchmark", "methods", "datasets")}}
STEPS = ("environment", "smoke", "flags", "fmnist-sequential", "fmnist-batched", "torchrun", "perf")


def _env(**extra: str) -> dict[str, str]:
    """This process's environment without what would steer the script (and PIP_NO_INDEX=1: never the network)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONSAFEPATH", "PYTHON", "DEVICE", "BUDGET", "PIP_FIND_LINKS")}
    return {**env, "PIP_NO_INDEX": "1", **extra}


def _run(cmd: list[str], timeout: float = 120, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(**env), capture_output=True, text=True, timeout=timeout)


def _where(stdout: str) -> dict[str, Path]:
    rows = dict(line.split(" ", 1) for line in stdout.strip().splitlines() if line.startswith("dfbench"))
    return {m: Path(p) for m, p in rows.items()}


def _stale_package(root: Path) -> Path:
    """A stale dfbench (an old install, another checkout): all four packages, marked as stale."""
    for sub in ("", "benchmark", "methods", "datasets"):
        d = root / "dfbench" / sub
        d.mkdir(parents=True, exist_ok=True)
        (d / "__init__.py").write_text("STALE = True\n")
    return root


# -- --missing ------------------------------------------------------------------------------------


def test_missing_is_empty_for_this_venv_and_imports_neither_torch_nor_dfbench() -> None:
    res = _run([sys.executable, PY_SCRIPT, "--missing"])
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == ""
    # the same mode in-process: what it loaded
    code = ("import runpy, sys; sys.argv = [sys.argv[1], '--missing']\n"
            "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('loaded', 'torch' in sys.modules, 'dfbench' in sys.modules)")
    res = _run([sys.executable, "-c", code, PY_SCRIPT])
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "loaded False False"


def test_missing_names_the_absent_distribution_of_a_pyproject(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\nversion = "0"\n'
        'dependencies = ["numpy>=1.24", "Pillow>=9", "pytorch-fid>=0.3", "clean-fid", "torch [opt] >=2",\n'
        '                "dfbench-no-such-package>=1.0", "scipy"]\n'
        '[project.optional-dependencies]\ntest = ["another-absent-package"]\n')
    res = _run([sys.executable, PY_SCRIPT, "--missing", "--pyproject", tmp_path / "pyproject.toml"])
    assert res.returncode == 0, res.stderr
    # Pillow -> PIL, pytorch-fid -> pytorch_fid, clean-fid -> cleanfid are found; extras are not needed
    assert res.stdout.strip() == "dfbench-no-such-package"


# -- the shim: the checkout's code, whatever else is installed ------------------------------------


def test_shim_imports_the_checkout_over_a_stale_dfbench_on_pythonpath(tmp_path: Path) -> None:
    stale = _stale_package(tmp_path / "stale")
    # without the shim the stale package wins (so the next check can fail)
    bare = _run([sys.executable, PY_SCRIPT, "--where"], cwd=tmp_path, PYTHONPATH=str(stale))
    assert bare.returncode == 0, bare.stderr
    assert _where(bare.stdout)["dfbench.benchmark"] == (stale / "dfbench" / "benchmark" / "__init__.py").resolve()
    # through gpu_check.sh (cwd = the checkout, whose bare dfbench/ folder is no package of its own)
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    res = _run([SH_SCRIPT, "--where"], PYTHON=sys.executable, PYTHONPATH=str(stale), TMPDIR=str(tmpdir))
    assert res.returncode == 0, res.stderr
    assert _where(res.stdout) == WANT
    assert f"dfbench code: {ROOT}" in res.stderr
    # the shim was a temporary folder under TMPDIR, removed at exit
    shim = Path(re.search(r"shim: (\S+),", res.stderr).group(1))
    assert shim.parent == tmpdir and shim.name.startswith("dfbench-gpu-check.")
    assert list(tmpdir.iterdir()) == []


def test_a_stale_dfbench_imported_first_is_refused_naming_both_paths(tmp_path: Path) -> None:
    stale = _stale_package(tmp_path / "stale")
    hook = tmp_path / "hook"
    hook.mkdir()
    # something that puts a stale copy before everything at startup (a .pth file, a sitecustomize)
    (hook / "sitecustomize.py").write_text(f"import sys\nsys.path.insert(0, {str(stale)!r})\n")
    res = _run([SH_SCRIPT, "--where"], PYTHON=sys.executable, PYTHONPATH=str(hook))
    assert res.returncode == 1
    assert str((stale / "dfbench" / "__init__.py").resolve()) in res.stderr
    assert str(WANT["dfbench"]) in res.stderr
    assert "stale dfbench" in res.stderr


def test_interpreter_without_the_dependencies_offline_says_what_to_provide(tmp_path: Path) -> None:
    """A bare interpreter (no dfbench installed, no torch, no pip), offline: the shim still imports the
    checkout, then the script names the missing packages and the offline ways to provide them."""
    venv = tmp_path / "bare"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)],
                   check=True, timeout=60)
    py = venv / "bin" / "python"
    missing = _run([py, PY_SCRIPT, "--missing"]).stdout.split()
    assert "torch" in missing and "pytorch-fid" in missing  # the bare interpreter lacks them
    res = _run([SH_SCRIPT, "--where"], PYTHON=str(py))
    assert res.returncode == 1
    assert f"dfbench code: {ROOT}" in res.stderr  # the checkout imports without any install
    assert f"missing for {py}: {' '.join(missing)}" in res.stderr
    assert "PIP_NO_INDEX=1 PIP_FIND_LINKS=" in res.stderr and "PYTHON=" in res.stderr


# -- the flags step: a failing flag is reported and the others still are --------------------------


def _gpu_check_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check_under_test", PY_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _fake_probe(tmp_path: Path, lines: list[str], rc: int = 0) -> Path:
    """A stand-in interpreter for `--probe flags`: prints `lines`, exits with `rc`."""
    (tmp_path / "out.txt").write_text("".join(ln + "\n" for ln in lines))
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!/bin/sh\ncat {tmp_path / 'out.txt'}\nexit {rc}\n")
    fake.chmod(0o755)
    return fake


def test_flags_step_reports_a_failing_flag_with_its_error_and_the_rest(tmp_path: Path) -> None:
    gc = _gpu_check_module()
    names = ["determinism (train.deterministic=true, run twice)", *(f[0] for f in gc.FLAG_RUNS), "fused Adam (flat buffer)"]
    items = [{"flag": n, "status": "pass", "seconds": 0.5, "detail": "", "figures": {}} for n in names]
    items[1] = {**items[1], "status": "fail", "detail": "RuntimeError: no bf16 kernel for this op"}
    items[-1]["figures"] = {"fused": "yes"}
    lines = ["some log line", *(gc.FLAG_MARK + json.dumps(it) for it in items), '{"items": 7}']
    step = gc.step_flags(str(_fake_probe(tmp_path, lines)), "cpu", gc.Clock(600))
    assert step.status == "fail"
    assert step.figures[names[1]] == "fail"
    assert step.figures[names[-1]] == "pass (fused: yes)"
    assert all(step.figures[n] == "pass" for n in names[2:-1])
    assert f"{names[1]}: fail in 0.5 s -- RuntimeError: no bf16 kernel for this op" in step.detail
    # every item passed or was skipped: the step passes
    ok = [{**it, "status": "skipped" if i == 3 else "pass", "detail": "CUDA only" if i == 3 else ""}
          for i, it in enumerate(items)]
    step = gc.step_flags(str(_fake_probe(tmp_path, [gc.FLAG_MARK + json.dumps(it) for it in ok])), "cpu", gc.Clock(600))
    assert step.status == "pass", step.detail


def test_flags_step_keeps_the_items_of_a_probe_that_died(tmp_path: Path) -> None:
    gc = _gpu_check_module()
    item = {"flag": "determinism (train.deterministic=true, run twice)", "status": "pass", "seconds": 1.0,
            "detail": "", "figures": {"bitwise equal": "yes"}}
    # a crash (e.g. a CUDA fault, exit 139) after the first item, mid-way through writing the second
    fake = _fake_probe(tmp_path, [gc.FLAG_MARK + json.dumps(item), gc.FLAG_MARK + '{"flag": "train.amp'], rc=139)
    step = gc.step_flags(str(fake), "cpu", gc.Clock(600))
    assert step.status == "fail"
    assert step.figures == {item["flag"]: "pass (bitwise equal: yes)"}
    assert f"exit code 139, 1/{2 + len(gc.FLAG_RUNS)} items reported" in step.detail


# -- the acceptance test: the whole CPU dry mode --------------------------------------------------


@pytest.mark.slow
def test_cpu_dry_mode_passes_offline_and_reports_the_flags(tmp_path: Path) -> None:
    report = tmp_path / "gpu-check-cpu.md"
    t0 = time.monotonic()
    res = _run([SH_SCRIPT, "--work", tmp_path / "work", "--out", report], timeout=400,
               PYTHON=sys.executable, DEVICE="cpu", BUDGET="300")
    seconds = time.monotonic() - t0
    print(f"CPU dry mode of scripts/gpu_check.sh: {seconds:.0f} s")
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stderr[-4000:]}"
    text = report.read_text()
    rows = dict(re.findall(r"^\| ([\w-]+) \| \*\*(\w+)\*\* \|", text, flags=re.M))
    assert rows == {s: "pass" for s in STEPS}
    assert f"| dfbench code | {ROOT} |" in text
    flags = next(ln for ln in text.splitlines() if ln.startswith("| flags |"))
    for item in ("train.amp=bf16: pass", "train.channels_last=true: pass", "fused Adam (flat buffer): pass (fused: ",
                 "determinism (train.deterministic=true, run twice): pass (bitwise equal: yes",
                 "train.compile=true: skipped", "compiled sampling, random_prune: skipped",
                 "train.deterministic=false: skipped"):
        assert item in flags
    # a skipped CUDA-only flag says why: the config's refusal on the CPU
    assert "train.compile=true: skipped in 0.0 s -- CUDA only, refused on cpu: invalid value for 'train.compile'" in text
    assert "train.deterministic=false: skipped in 0.0 s -- CUDA only, refused on cpu" in text
    assert (tmp_path / "work" / "perf.md").is_file()
