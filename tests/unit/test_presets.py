"""Model presets are declared once, in benchmark/core/presets.py's table, and everything else reads them there:
the config's Literal and check of train.model, the model factory's arguments, the grid planner's costs."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

from dfbench.benchmark.core import presets
from dfbench.benchmark.core.config import Preset

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / "benchmark" / "core" / "presets.py"
SOURCES = ("benchmark", "methods", "datasets", "dfbench", "scripts")


def preset_lists(path: Path, root: Path = ROOT) -> list[str]:
    """Every literal in `path` (tuple, list, set, dict keys, a Literal[...]'s arguments) naming two presets or more."""
    names = set(presets.ALL)
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [k for k in node.keys if k is not None]
        else:
            continue
        named = {e.value for e in items if isinstance(e, ast.Constant) and e.value in names}
        if len(named) >= 2:
            found.append(f"{path.relative_to(root)}:{node.lineno}: {sorted(named)}")
    return found


def test_no_module_but_the_preset_table_lists_preset_names():
    study_scripts = sorted((ROOT / "results").glob("*/*.py"))  # a study's own scripts sit in its results folder
    assert study_scripts, "no results/<study>/*.py found"
    found = [hit for path in [p for folder in SOURCES for p in sorted((ROOT / folder).rglob("*.py"))] + study_scripts
             if path != HOME for hit in preset_lists(path)]
    assert not found, "preset names listed outside benchmark/core/presets.py (derive them from presets.PRESETS):\n" + "\n".join(found)
    assert preset_lists(HOME)  # the scan sees the table itself


def test_the_scan_finds_a_list_of_preset_names(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('COST = {"tiny": 1.0, "small28": 3.0}\nPreset = Literal["auto", "base28", "base32"]\nONE = "tiny"\n')
    assert [hit.split(": ", 1)[1] for hit in preset_lists(planted, tmp_path)] == ["['small28', 'tiny']", "['base28', 'base32']"]


def test_everything_is_derived_from_the_table():
    assert typing.get_args(Preset) == ("auto", *presets.PRESETS)
    assert presets.ALL == tuple(presets.PRESETS)
    families = (presets.BUILTIN, tuple(presets.DIFFUSERS), presets.MLP)
    assert sorted(n for names in families for n in names) == sorted(presets.ALL)  # each preset in one family
    for name, row in presets.PRESETS.items():
        specs = {"builtin": row.unet, "diffusers": row.diffusers, "mlp": row.mlp}
        assert [family for family, spec in specs.items() if spec is not None] == [row.family], name  # its family's spec only
        assert presets.family(name) == row.family and row.cpu_ms_per_sample_grad > 0
        assert presets.width_aware(name) == (name in presets.WIDTH_AWARE) == (row.family != "diffusers"), name
    assert set(presets.AUTO.values()) <= set(presets.BUILTIN)


def test_the_planner_and_the_factory_read_the_row():
    import torch

    from dfbench.benchmark.core.config import RunConfig
    from dfbench.benchmark.engine.model import MLP, UNet, build_model
    from dfbench.benchmark.engine.resolve import apply_overrides
    from dfbench.benchmark.grid import plan

    costs = {name: plan.estimate_cost(apply_overrides(RunConfig(), {"train.model": name})) for name in ("tiny", "small28")}
    for name, cost in costs.items():
        work = cost.sample_grads + plan.FORWARD_FRACTION * cost.eval_forwards
        assert cost.cpu_seconds == pytest.approx(work * presets.PRESETS[name].cpu_ms_per_sample_grad / 1000)
    with torch.device("meta"):  # architecture only
        for name in presets.BUILTIN:
            built, spec = build_model(name, 1), UNet(1, presets.unet_spec(name))
            assert [p.shape for p in built.parameters()] == [p.shape for p in spec.parameters()], name
        for name in presets.MLP:
            built, spec = build_model(name, (1, 1, 8)), MLP((1, 1, 8), presets.mlp_spec(name))
            assert [p.shape for p in built.parameters()] == [p.shape for p in spec.parameters()], name
