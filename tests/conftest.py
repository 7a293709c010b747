"""Shared fixtures: a small synthetic image set so loop tests don't need real data or weights."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dfbench.datasets import ImageSet

# tests/unit, tests/runs and tests/results import what they share from tests/helpers.py
sys.path.insert(0, str(Path(__file__).resolve().parent))

# train.amp=auto resolves to float32 in the suite and in the processes it starts (see _float32_auto_amp)
os.environ["DFBENCH_AUTO_AMP"] = "off"


def make_imageset(n: int = 256, channels: int = 1, size: int = 28, seed: int = 0) -> ImageSet:
    """Class-dependent blobs (label k brightens a band) plus noise: learnable, cheap."""
    g = np.random.default_rng(seed)
    labels = np.arange(n) % 10
    x = g.integers(0, 60, size=(n, channels, size, size))
    for k in range(10):
        rows = slice(2 * k, 2 * k + 6)
        x[labels == k, :, rows, :] += 150
    images = torch.from_numpy(np.clip(x, 0, 255).astype(np.uint8))
    return ImageSet(name="fmnist" if channels == 1 else "cifar10", split="train", images=images,
                    labels=torch.from_numpy(labels.astype(np.int64)), sha256="synthetic", source="tests")


@pytest.fixture(scope="session")
def tiny_data() -> ImageSet:
    return make_imageset()


@pytest.fixture(autouse=True, scope="session")
def _one_thread() -> None:
    """One intra-op thread before any fixture runs: module- and session-scoped fixtures are set up
    before function-scoped autouse ones, and float results (compared bitwise) depend on the thread
    count, so without this a module fixture that trains would depend on which tests ran first."""
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _float32_auto_amp(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """train.amp=auto resolves as on a CPU without native bfloat16 (float32) in the suite and in every
    process it starts (DFBENCH_AUTO_AMP=off, set when this file is imported, so configs built at
    collection see it too): run ids and bits are the same on every CI machine, bf16 or not. A test
    marked `native_amp` sees the device's own choice (tests/runs/test_amp_auto.py mocks the CPU)."""
    if request.node.get_closest_marker("native_amp") is not None:
        monkeypatch.delenv("DFBENCH_AUTO_AMP", raising=False)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reference statistics and downloads go to a temporary cache, never the user's."""
    monkeypatch.setenv("DFBENCH_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
    torch.set_num_threads(1)


# -- the tiers: tests/unit, tests/runs, tests/results (docs/testing.md); `make test` runs all three,
# `make test-fast` (-m "not slow") the tests not marked slow in every tier; both on TEST_WORKERS processes. A new test is fast unless
# marked `slow`; a fast run names the unmarked tests that took long enough to be marked, so
# `make test-fast` stays under its 2 minutes.

SLOW_HINT_S = 5.0
_unmarked_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "slow" not in report.keywords:
        _unmarked_seconds[report.nodeid] = _unmarked_seconds.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    if "not slow" not in (config.getoption("markexpr", "") or ""):
        return
    slow = sorted(((s, n) for n, s in _unmarked_seconds.items() if s >= SLOW_HINT_S), reverse=True)
    if slow:
        terminalreporter.write_sep("=", f"tests not marked slow that took {SLOW_HINT_S:.0f} s or more")
        for seconds, nodeid in slow:
            terminalreporter.write_line(f"{seconds:6.1f}s {nodeid}  (mark it @pytest.mark.slow?)")


@pytest.fixture
def dfbench(tiny_data: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    """`dfbench ARGV` in this process on the synthetic images: (exit code, stdout, stderr); the CLI tests' one
    fixture (tests/runs/test_cli_behaviour.py, test_cli_new_user.py)."""
    import signal

    from dfbench import datasets
    from dfbench.benchmark.cli import main

    monkeypatch.setattr(datasets, "load", lambda name, split="train", root=None, **kw: tiny_data)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def call(argv: list[str]) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = main(argv)
        except SystemExit as err:  # argparse's own exits (--version, --help, a bad choice)
            code = int(err.code or 0)
        said = capsys.readouterr()
        return code, said.out, said.err

    yield call
    left = [signal.Signals(s).name for s, h in handlers.items() if signal.getsignal(s) != h]
    for s, h in handlers.items():
        signal.signal(s, h)
    assert not left, f"dfbench left its {', '.join(left)} handler(s) installed"
