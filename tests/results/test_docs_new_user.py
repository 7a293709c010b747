"""Docs a new user read and found untrue (issue 61, item 8): the README's list of methods, the grids the usage page
calls built-in, the files of a run folder, and the adding-a-method example (which must show `self.config`)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from dfbench import methods
from dfbench.benchmark.core import runfolder
from dfbench.benchmark.grid.spec import builtin_grids

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_the_readme_names_every_registered_method_and_no_other():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    item = text[text.index("- **Methods**:"):].split("\n- ", 1)[0].split(";")[0]
    named = set(re.findall(r"`(\w+)`", item)) - {"dfbench"}
    assert named == set(methods.list_methods()), f"README.md's methods: {sorted(named ^ set(methods.list_methods()))}"


def test_grids_the_docs_run_by_name_are_shipped_ones():
    shipped = set(builtin_grids())
    said = []
    for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        for names in re.findall(r"dfbench grid (\w[\w./-]*(?:\|[\w./-]+)*)", text):  # NAME, or NAME|NAME|...|FILE
            for name in names.split("|"):
                if name in ("FILE", "NAME", "...") or "/" in name or name.endswith(".toml"):
                    continue
                said.append(name)
                assert name in shipped, f"{page.name} runs grid {name!r} by name; shipped grids: {sorted(shipped)}"
    assert "demo" in said and "paper" in said  # the pattern does find the names


def test_the_run_folder_page_lists_every_file_of_a_run_folder():
    text = (DOCS / "run-folders.md").read_text(encoding="utf-8")
    block = text[text.index("```"):text.index("```", text.index("```") + 3)]
    names = [getattr(runfolder, k) for k in ("CONFIG", "PLUGIN", "PARTITION", "NUMERICS", "ROUNDS", "CURVE", "METRICS",
                                             "RESCORED", "DRIFT", "STATUS", "SAMPLES", "GRID", "CHECKPOINTS", "LOCK")]
    missing = [n for n in names if not re.search(rf"^\s+{re.escape(n)}/?\s", block, flags=re.M)]
    assert not missing, f"docs/run-folders.md's folder listing lacks {missing}"


def test_the_adding_a_method_example_reads_its_hyperparameters_from_self_config():
    text = (DOCS / "adding-a-method.md").read_text(encoding="utf-8")
    code = text[text.index("```python") + len("```python"):].split("```", 1)[0]
    assert "self.config." in code
    # the example runs as written (registered under a private name, so the registry stays as it is)
    code = code.replace("from dfbench.methods.registry import register_method\n", "register_method = lambda name: (lambda cls: cls)\n")
    namespace: dict = {}
    exec(compile(code, "docs/adding-a-method.md", "exec"), namespace)  # noqa: S102 (the docs' own example)
    cls = namespace["MyMethod"]
    method = cls(cls.Config(alpha=0.5))
    plan = method.client_view(methods.ServerState(params=torch.zeros(3)), 0, None)
    assert plan.step.proximal_mu == 0.5 and method.config.alpha == 0.5
