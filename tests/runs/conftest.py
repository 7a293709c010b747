"""Fixtures the CLI tests share (tests/runs/test_cli_behaviour.py, test_cli_new_user.py)."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from dfbench import datasets
from dfbench.benchmark.cli import main


@pytest.fixture
def dfbench(tiny_data: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    """`dfbench ARGV` in this process on the synthetic images: (exit code, stdout, stderr)."""
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
