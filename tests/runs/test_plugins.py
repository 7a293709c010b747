"""Methods from outside the package (methods/plugins.py): entry points, --plugin, DFBENCH_PLUGINS.

A temporary folder stands for an installed environment: the package ``dfb_plug_a`` with a
``dfb_plug_a-0.1.dist-info`` whose entry_points.txt declares it in the group "dfbench.methods"
(importlib.metadata finds a .dist-info on sys.path / PYTHONPATH, so no pip install is needed),
and the lone module ``dfb_plug_b`` that only --plugin or DFBENCH_PLUGINS names. Each defines a
FedAvg subclass with one hook changed, registered under a new name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dfbench.methods import plugins, registry

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parents[1]  # tests/, where helpers.py is

PLUG_A = '''"""An out-of-tree method, installed (entry point): FedAvg with a proximal term."""
from dataclasses import dataclass

from dfbench.methods.fedavg import FedAvg
from dfbench.methods.registry import register_method


@register_method("plug_prox")
class PlugProx(FedAvg):
    """FedAvg plus a proximal term (a plugin method, from an entry point)."""

    @dataclass(frozen=True)
    class Config:
        mu: float = 0.05

    def client_view(self, state, client, ctx):
        plan = super().client_view(state, client, ctx)
        plan.step.proximal_mu = self.config.mu
        return plan
'''

PLUG_B = '''"""An out-of-tree method, named by --plugin: FedAvg whose server moves part of the way."""
from dataclasses import dataclass

from dfbench.methods.base import ServerState
from dfbench.methods.fedavg import FedAvg
from dfbench.methods.registry import register_method


@register_method("plug_halfstep")
class PlugHalfStep(FedAvg):
    """FedAvg with a server step size (a plugin method, from --plugin)."""

    @dataclass(frozen=True)
    class Config:
        server_lr: float = 0.5

    def apply(self, state, acc, ctx):
        mean = super().apply(state, acc, ctx).params
        return ServerState(params=state.params + self.config.server_lr * (mean - state.params), extra=state.extra)
'''

# the cheapest run `dfbench run` makes on Fashion-MNIST (as tests/runs/test_workers.py, one round)
RUN_ARGS = ["--dataset", "fmnist", "--clients", "2", "--rounds", "1", "--local-steps", "1", "--batch-size", "8",
            "--eval-samples", "4", "--sampler-steps", "2", "--set", "train.model=tiny", "--set", "eval.metrics=none",
            "--set", "eval.grid=2", "--set", "data.min_client_size=4", "--set", "train.sigma1_probe_steps=0",
            "--no-progress"]
GRID = {"data.dataset": "fmnist", "data.clients": 2, "data.min_client_size": 4, "train.model": "tiny",
        "train.rounds": 1, "train.local_steps": 1, "train.batch_size": 8, "train.sigma1_probe_steps": 0,
        "eval.samples": 4, "eval.grid": 2, "eval.sampler_steps": 2, "eval.metrics": "none"}


def _site(root: Path) -> Path:
    """A folder that looks like site-packages: plugin A installed (entry point), plugin B a bare module."""
    site = root / "site"
    (site / "dfb_plug_a").mkdir(parents=True)
    (site / "dfb_plug_a" / "__init__.py").write_text(PLUG_A)
    info = site / "dfb_plug_a-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dfb-plug-a\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{plugins.ENTRY_POINT_GROUP}]\nplug_prox = dfb_plug_a\n")
    (site / "dfb_plug_b.py").write_text(PLUG_B)
    return site


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The plugin folder on sys.path, with the registry, the loaded plugins and sys.modules restored after."""
    site = _site(tmp_path)
    monkeypatch.syspath_prepend(str(site))  # also invalidates the import caches
    monkeypatch.delenv(plugins.ENV_VAR, raising=False)
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(plugins, "_LOADED", {})
    yield site
    for name in [m for m in sys.modules if m.startswith(("dfb_plug_", "dfb_broken"))]:
        del sys.modules[name]


# -- in this process -----------------------------------------------------------------------------

def test_each_source_loads_and_loading_again_is_a_no_op(site, monkeypatch):
    # prepare: B named by the environment and by the flag, A by its entry point
    monkeypatch.setenv(plugins.ENV_VAR, "dfb_plug_b")
    # execute: twice, B named twice each time (a second import would be "registered twice")
    first = plugins.load_plugins(["dfb_plug_b"])
    again = plugins.load_plugins(["dfb_plug_b", "dfb_plug_a"])
    # assert
    by_module = {p.module: p for p in again}
    assert set(by_module) == {"dfb_plug_a", "dfb_plug_b"} and first == again
    assert by_module["dfb_plug_a"].methods == ("plug_prox",)
    assert by_module["dfb_plug_a"].distribution == "dfb-plug-a 0.1"
    assert "entry point 'plug_prox = dfb_plug_a'" in by_module["dfb_plug_a"].source
    assert by_module["dfb_plug_b"].source == plugins.ENV_VAR  # the first source that named it
    assert {"plug_prox", "plug_halfstep"} <= set(registry.list_methods())
    # the run folder's record: built-in methods have none; a plugin's says what to load
    assert plugins.method_origin("fedavg") is None
    origin = plugins.method_origin("plug_halfstep")
    assert origin["plugin"] == "dfb_plug_b" and origin["class"] == "dfb_plug_b.PlugHalfStep"
    assert "--plugin dfb_plug_b" in origin["load_with"]
    # a grid worker gets the explicitly named module; the entry point it finds itself
    assert plugins.child_plugin_modules(["plug_prox", "plug_halfstep", "fedavg"]) == ["dfb_plug_b"]


def test_a_method_defined_in_main_is_refused_for_workers(site):
    from dataclasses import make_dataclass

    from dfbench.methods.fedavg import FedAvg

    cls = type("Scripted", (FedAvg,), {"__module__": "__main__", "Config": make_dataclass("Config", [], frozen=True)})
    registry.register_method("plug_scripted")(cls)
    with pytest.raises(plugins.ConfigError, match="'plug_scripted' is defined in __main__.*Move it into a module"):
        plugins.child_plugin_modules(["plug_scripted"])


def test_a_module_imported_by_the_caller_goes_to_the_workers(site):
    import dfb_plug_b  # noqa: F401  (a notebook's import, no --plugin)

    assert plugins.child_plugin_modules(["plug_halfstep"]) == ["dfb_plug_b"]
    assert plugins.method_origin("plug_halfstep")["source"] == "imported by the calling program"


@pytest.mark.parametrize("how", ["flag", "env", "dependency", "duplicate"])
def test_a_plugin_that_cannot_load_names_the_module_the_source_and_the_fix(site, monkeypatch, how):
    (site / "dfb_broken_dep.py").write_text("import dfb_not_installed_anywhere\n")
    (site / "dfb_broken_dup.py").write_text(PLUG_B.replace("plug_halfstep", "fedavg"))
    modules = {"flag": ["dfb_no_such_module"], "env": [], "dependency": ["dfb_broken_dep"], "duplicate": ["dfb_broken_dup"]}
    if how == "env":
        monkeypatch.setenv(plugins.ENV_VAR, "dfb_plug_b, dfb_no_such_module")
    with pytest.raises(plugins.PluginError) as err:
        plugins.load_plugins(modules[how])
    msg = str(err.value)
    if how == "flag":
        assert "'dfb_no_such_module' (named by --plugin)" in msg and "PYTHONPATH" in msg and "drop --plugin dfb_no_such_module" in msg
    elif how == "env":
        assert "(named by DFBENCH_PLUGINS)" in msg and "remove it from DFBENCH_PLUGINS" in msg
    elif how == "dependency":
        assert "the plugin imports 'dfb_not_installed_anywhere', which is not installed" in msg
    else:
        assert "method 'fedavg' is already registered" in msg and "'dfb_broken_dup'" in msg


def test_a_broken_entry_point_names_its_distribution(site):
    (site / "dfb_plug_a-0.1.dist-info" / "entry_points.txt").write_text(
        f"[{plugins.ENTRY_POINT_GROUP}]\nplug_prox = dfb_plug_gone\n")
    with pytest.raises(plugins.PluginError, match=r"entry point 'plug_prox = dfb_plug_gone' of dfb-plug-a 0\.1.*"
                                                  r"pip uninstall dfb-plug-a"):
        plugins.load_plugins()


def test_the_cli_refuses_a_bad_plugin_before_any_work(site, tmp_path, capsys):
    from dfbench.benchmark.cli import main

    code = main(["run", "--plugin", "dfb_no_such_module", "--method", "fedavg", "--out", str(tmp_path / "runs"), *RUN_ARGS])
    assert code == 2
    assert "method plugin 'dfb_no_such_module' (named by --plugin) could not be loaded" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_methods_lists_plugin_methods_with_their_hyperparameters(site, monkeypatch, capsys):
    from dfbench.benchmark.cli import main

    monkeypatch.setenv(plugins.ENV_VAR, "dfb_plug_b")
    assert main(["methods", "plug_*"]) == 0
    listing = capsys.readouterr().out
    assert "plug_halfstep: FedAvg with a server step size" in listing and "method.server_lr (float, default 0.5)" in listing
    assert "plug_prox: FedAvg plus a proximal term" in listing and "method.mu (float, default 0.05)" in listing


def test_unknown_method_says_how_to_load_a_plugin():
    with pytest.raises(KeyError, match="pass --plugin MODULE / set DFBENCH_PLUGINS"):
        registry.get_method_class("dfb_not_a_method")


def test_worker_argv_carries_the_plugins(tmp_path):
    from dfbench.benchmark.grid.spec import load_grid
    from dfbench.benchmark.grid.workers import worker_argv

    path = tmp_path / "g.toml"
    path.write_text('name = "g"\n[axes]\nseed = [0]\n')
    argv = worker_argv(load_grid(path), tmp_path, plugins=["a.b", "c"])
    assert argv[argv.index("--plugin"):argv.index("--plugin") + 4] == ["--plugin", "a.b", "--plugin", "c"]


# -- real processes: dfbench run, grid --workers 2, report, and the contract test ---------------------

def _fmnist() -> bool:
    from dfbench import datasets

    return datasets.locate("fmnist", "train") is not None


@pytest.mark.slow
@pytest.mark.skipif(not _fmnist(), reason="Fashion-MNIST files not on this machine")
def test_plugin_methods_run_through_run_grid_report_and_the_contract_test(tmp_path):
    # prepare: plugin A installed (its entry point), plugin B a module on PYTHONPATH only
    site = _site(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    env.pop(plugins.ENV_VAR, None)
    out = tmp_path / "runs"
    grid = tmp_path / "plugins.toml"
    grid.write_text('name = "plugins"\n[base]\n' + "".join(f'"{k}" = {json.dumps(v)}\n' for k, v in GRID.items())
                    + '[axes]\nmethod = ["plug_prox", "plug_halfstep?server_lr=0.25"]\nseed = [1]\n')

    def start(*args: str, module: str = "dfbench", **extra_env: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", module, *args], cwd=tmp_path, env={**env, **extra_env},
                                text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def finish(*procs: subprocess.Popen) -> list[str]:
        texts = [p.communicate(timeout=240)[0] for p in procs]
        for p, text in zip(procs, texts):
            assert p.returncode == 0, f"{' '.join(p.args[2:])}:\n{text[-3000:]}"
        return texts

    t0 = time.perf_counter()
    lap = [t0]
    # execute: the contract test (B from DFBENCH_PLUGINS, A from its entry point) beside the rest:
    # `dfbench run` of (a) the entry point's method by its name alone, (b) --plugin's method; then the
    # grid of both methods on 2 workers (this one starts the other, which must load dfb_plug_b too);
    # then the report
    contract_proc = start(str(HERE / "runs" / "test_methods_contract.py"), "-o", "addopts=", "-q", "-p", "no:cacheprovider",
                          "-k", "plug_prox or plug_halfstep", module="pytest", DFBENCH_PLUGINS="dfb_plug_b")
    runs = finish(start("run", "--method", "plug_prox", "--out", str(out), *RUN_ARGS),
                  start("run", "--plugin", "dfb_plug_b", "--method", "plug_halfstep", "--out", str(out), *RUN_ARGS))
    lap.append(time.perf_counter())
    (grid_text,) = finish(start("grid", str(grid), "--workers", "2", "--plugin", "dfb_plug_b", "--out", str(out),
                                "--no-progress"))
    lap.append(time.perf_counter())
    report, contract = finish(
        start("report", "--plugin", "dfb_plug_b", "--runs", str(out), "--out", str(tmp_path / "report")), contract_proc)
    lap.append(time.perf_counter())
    seconds = lap[-1] - t0
    print("seconds: runs %.1f, grid %.1f, report (+ contract) %.1f" % tuple(b - a for a, b in zip(lap, lap[1:])))
    # assert: four runs done (two by `dfbench run`, two by the grid's workers), each naming its plugin
    folders = sorted(p.parent for p in out.rglob("config.json"))
    assert [f.parent.name for f in folders] == ["plug_halfstep"] * 2 + ["plug_prox"] * 2, runs
    for f in folders:
        assert json.loads((f / "status.json").read_text())["state"] == "done"
        origin = json.loads((f / "plugin.json").read_text())
        assert origin["method"] == f.parent.name
        if f.parent.name == "plug_prox":
            assert origin["plugin"] == "dfb_plug_a" and origin["distribution"] == "dfb-plug-a 0.1"
        else:
            assert origin["plugin"] == "dfb_plug_b" and origin["source"] == "--plugin"
    assert "2 workers" in grid_text and "2 done" in grid_text, grid_text
    board = (tmp_path / "report" / "leaderboard.csv").read_text()
    assert "plug_prox" in board and "plug_halfstep" in board, report
    assert "6 passed" in contract, contract  # the 3 contract checks for each plugin method, none skipped
    assert seconds < 150, seconds
