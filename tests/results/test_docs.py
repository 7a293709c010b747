"""The documentation where a test can tell whether it is true and complete.

- README.md is an entry point: at most 200 lines, the two commands and the way into the venv on its
  first screen, no issue numbers or dated measurements there;
- mkdocs.yml's nav lists every page under docs/ once, and (slow) `mkdocs build --strict` builds the site,
  API pages included; without MkDocs installed that test skips, except under CI, where it fails;
- the usage page's table of config keys names every field of the config;
- numbers some docs pages quote are computed here again from the code: the compression methods' message
  sizes (docs/methods.md), the label skew of Dirichlet partitions (docs/heterogeneity.md) and the GPU
  study's plan (docs/scale-out.md). Those pages name this file as a source of their numbers, so
  tests/results/test_readme_numbers.py checks each number they quote against what is asserted here.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
FIRST_SCREEN = 50  # lines: what a reader sees of the README before scrolling


def _on_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


def _skip_unless_ci(reason: str) -> None:
    """Skip on a developer's machine that lacks something optional; fail under CI, which must have it."""
    if _on_ci():
        pytest.fail(f"CI is set: {reason}")
    pytest.skip(reason)


# -- README.md: the entry point ----------------------------------------------------------------

def test_the_readme_is_an_entry_point() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move the detail to a page under docs/ (at most 200)"
    first = "\n".join(lines[:FIRST_SCREEN])
    for words in ("make demo", "make test", "source .venv/bin/activate", "dfbench methods", "make docs"):
        assert words in "\n".join(lines), f"README.md does not say `{words}`"
    for words in ("make demo", "make test", "source .venv/bin/activate"):
        assert words in first, f"README.md's first screen does not say `{words}`"
    assert not re.search(r"\b[Ii]ssues? \d+|#\d+\b", first), "issue numbers on the README's first screen"
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", first), "dated measurement history on the README's first screen"


def test_the_readme_reaches_the_installed_command_as_a_new_shell_would() -> None:
    """Activate the venv, then the first usage command: exactly these two lines, in this order, in one block."""
    text = README.read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    commands = [[line.split("#")[0].strip() for line in b.splitlines() if line.split("#")[0].strip()] for b in blocks]
    assert ["source .venv/bin/activate", "dfbench methods"] in [c[:2] for c in commands], commands


# -- the site ----------------------------------------------------------------------------------

def docs_pages() -> list[str]:
    """Every page of the site, relative to docs/ (the hook's folder holds code, not pages)."""
    return sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)


def nav_pages(mkdocs_yml: str) -> list[str]:
    """The pages mkdocs.yml's nav names, in order (a plain reading of its `nav:` block; no YAML parser needed)."""
    m = re.search(r"^nav:\n((?:[ \t]+.*\n?)*)", mkdocs_yml, flags=re.M)
    assert m, "mkdocs.yml has no nav"
    return re.findall(r"([\w./-]+\.md)\s*$", m.group(1), flags=re.M)


def test_the_nav_lists_every_page_once() -> None:
    nav = nav_pages((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert len(nav) == len(set(nav)), f"pages named twice in the nav: {sorted({p for p in nav if nav.count(p) > 1})}"
    assert sorted(nav) == docs_pages(), (f"not in mkdocs.yml's nav: {sorted(set(docs_pages()) - set(nav))}; "
                                         f"in the nav but no file: {sorted(set(nav) - set(docs_pages()))}")


def test_the_nav_reader_sees_a_missing_page() -> None:
    yml = "site_name: x\nnav:\n  - Home: index.md\n  - Part:\n      - a/b.md\n      - C: c.md\nplugins: []\n"
    assert nav_pages(yml) == ["index.md", "a/b.md", "c.md"]


def test_the_site_is_built_into_an_ignored_folder() -> None:
    yml = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^site_dir: site/?$", yml, flags=re.M) and re.search(r"^strict: true$", yml, flags=re.M)
    assert "site/" in (ROOT / ".gitignore").read_text(encoding="utf-8").split()


@pytest.mark.slow
def test_the_site_builds_with_strict(tmp_path: Path) -> None:
    needed = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")
    absent = [m for m in needed if importlib.util.find_spec(m.split(".")[0]) is None
              or importlib.util.find_spec(m) is None]
    if absent:
        _skip_unless_ci(f"MkDocs is not installed ({', '.join(absent)}): pip install -e '.[docs]'")
    site = tmp_path / "site"
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    for page in docs_pages():
        out = site / ("index.html" if page == "index.md" else page.removesuffix(".md").removesuffix("index") + "/index.html")
        assert out.resolve().is_file(), f"{page} was not built ({out})"
    api = (site / "api" / "methods" / "index.html").read_text(encoding="utf-8")
    assert "client_view" in api and "Capabilities" in api, "the API page does not show methods/base.py's docstrings"


# -- the usage page ----------------------------------------------------------------------------

def test_the_usage_page_names_every_config_field() -> None:
    from dfbench.benchmark.core.config import RunConfig

    text = (DOCS / "usage.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    config = RunConfig(method="fedavg")
    top = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            row = rows.get(f"`{f.name}.*`", "")
            missing = [g.name for g in dataclasses.fields(value) if f"`{g.name}`" not in row]
            assert row and not missing, f"docs/usage.md's config table, `{f.name}.*`: missing {missing}"
        elif f.name not in ("method", "method_params"):
            top.append(f.name)
    missing = [n for n in top if f"`{n}`" not in rows.get("top level", "")]
    assert not missing, f"docs/usage.md's config table, top level: missing {missing}"
    assert "`method.*`" in rows


# -- numbers the pages quote, computed again ------------------------------------------------------

def test_the_message_sizes_the_methods_page_quotes() -> None:
    """docs/methods.md: per-client messages of the base32 preset (3 channels), from each method's own bit count."""
    from dfbench.benchmark.engine.model import build_model
    from dfbench.methods.powersgd import blocks, powersgd_bits
    from dfbench.methods.qsgd import qsgd_bits
    from dfbench.methods.signsgd import sign_bits
    from dfbench.methods.topk_update import topk_bits

    with torch.device("meta"):  # shapes only
        shapes = [tuple(p.shape) for p in build_model("base32", 3).parameters()]
    numels = [math.prod(s) for s in shapes]
    P = sum(numels)
    assert P == 8_952_067
    assert round(100 * 4 * P / 1e9, 2) == 3.58  # a float32 residual per client, 100 clients (GB)
    fedavg = 32 * P
    assert topk_bits(numels, 0.01, "layer") == 4_445_833 and round(fedavg / 4_445_833) == 64
    assert topk_bits(numels, 0.01, "global") == 5_013_176 and round(fedavg / 5_013_176) == 57
    assert sign_bits(numels) == 8_961_795 and round(fedavg / 8_961_795) == 32
    assert qsgd_bits(numels, 15) == 44_770_063 and round(fedavg / 44_770_063, 1) == 6.4
    assert powersgd_bits(shapes, 4) == 11_990_496 and round(fedavg / 11_990_496) == 24
    q_floats = sum(b.cols for b in blocks(shapes, 4)) * 4  # PowerSGD's warm start Q: m x r per matrix
    assert round(100 * 4 * q_floats / 1e6) == 117  # MB for 100 clients


def test_the_label_skew_the_heterogeneity_page_quotes() -> None:
    """docs/heterogeneity.md: mean total-variation distance of Dirichlet partitions of Fashion-MNIST's training
    labels over 100 clients, partition seed 0: 0.80 at alpha 0.05, 0.46 at 0.5, 0.04 at 100."""
    from dfbench import datasets
    from dfbench.datasets.partitioners import partition
    from dfbench.datasets.sources import missing

    if missing("fmnist", "train"):
        _skip_unless_ci("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
    y = datasets.load("fmnist", "train").labels.numpy()
    got = {alpha: round(partition(y, f"dirichlet:{alpha}", 100, 0).heterogeneity(y), 2) for alpha in ("0.05", "0.5", "100")}
    assert got == {"0.05": 0.80, "0.5": 0.46, "100": 0.04}


def test_the_gpu_study_plan_the_scale_out_page_quotes() -> None:
    """docs/scale-out.md: the cifar10-gpu grid and its GPU-hours from the stated per-image costs."""
    from helpers import load_script

    gpu_plan = load_script("results/cifar10-gpu/gpu_plan.py")

    grid, model, _, _ = gpu_plan.load_study_grid(str(ROOT / "results" / "cifar10-gpu" / "cifar10-gpu.toml"))
    cells = grid.cells
    trained = [c for c in cells if c.cfg.train.rounds > 0]
    assert model == "diffusers-ddpm-cifar10" and len(cells) == 84 and len(trained) == 74
    pruning = [c for c in cells if c.cfg.train.model == model]
    block = [c for c in cells if c.cfg.train.model == "ddpm32"]  # issue 53's sub-models
    assert len(pruning) == 60 and len([c for c in pruning if c.cfg.train.rounds > 0]) == 50 and len(block) == 24
    assert sorted({dict(c.cfg.method_params).get("keep_ratio") for c in pruning if c.cfg.train.rounds > 0} - {None}) == [0.25, 0.5, 0.75]
    assert {c.cfg.data.partition for c in cells} == {"dirichlet:0.5"} and {c.cfg.data.clients for c in cells} == {10}
    assert {(c.cfg.eval.samples, c.cfg.eval.sampler_steps) for c in cells} == {(10_000, 50)}
    assert {c.cfg.train.lr for c in trained} == {2e-4}
    assert {c.cfg.system.capacity for c in block} == {"", "1.0:0.5,0.4:0.5"} and {c.cfg.seed for c in block} == {0, 1, 2}
    # FedPhD and hierarchical FedAvg: 2 edges x 5 edge rounds x 20 cloud rounds = the block's 100 rounds of clients;
    # FedPhD keeps base width 96 of 128 (prune ratio 0.25)
    edged = [c for c in block if c.cfg.system.edges]
    assert {(c.cfg.method, c.cfg.system.edges, c.cfg.system.edge_rounds, c.cfg.train.rounds) for c in edged} == {
        ("fedphd", 2, 5, 20), ("fedavg", 2, 5, 20)} and len(edged) == 6
    assert {dict(c.cfg.method_params)["prune_ratio"] for c in edged if c.cfg.method == "fedphd"} == {0.25}
    scales = {"ddpm32": 1.0}  # model_scales: the ratio of their forward FLOPs (tests/runs/test_diffusers_models.py: equal)
    for gpu, hours, dinov2_hours, block_hours in (("h200", 37, 1.7, 10.8), ("a100", 121, 5.9, 35.5)):
        throughput = gpu_plan.stated_throughput(gpu)
        plan = gpu_plan.plan_study(grid, throughput, dinov2_available=False, model_scale=scales)
        with_dinov2 = gpu_plan.plan_study(grid, throughput, dinov2_available=True, model_scale=scales)
        assert round(plan.hours) == hours
        assert round((with_dinov2.seconds - plan.seconds) / 3600, 1) == dinov2_hours
        assert round(sum(c.seconds for c in plan.cells if c.model == "ddpm32") / 3600, 1) == block_hours
    t = gpu_plan.stated_throughput("h200")
    plan = gpu_plan.plan_study(grid, t, dinov2_available=False, model_scale=scales)
    grads = {c.sample_grads for c in plan.cells if c.sample_grads}
    assert grads == {1_280_000} and round(1_280_000 / 1e6, 2) == 1.28
    passes = sum(c.passes for c in plan.cells)
    assert passes == 176 and {c.nfe / c.passes for c in plan.cells} == {500_000}
    assert round(sum(c.sample_grads for c in plan.cells) * t.train_ms / 1000 / 3600, 1) == 26.3
    assert round(sum(c.nfe for c in plan.cells) * t.forward_ms / 1000 / 3600, 1) == 8.1
    assert round(passes * t.score_s / 3600, 1) == 2.9
    features = sum(n * t.inception_ms / 1000 for c in plan.cells for n in c.feature_images.values())
    assert round(features / 3600, 2) == 0.07


# -- the methods page ------------------------------------------------------------------------------

def test_the_methods_page_has_a_row_for_every_method() -> None:
    from dfbench import methods

    text = (DOCS / "methods.md").read_text(encoding="utf-8")
    table = text[text.index("| method |"):].split("\n\n")[0]
    named = {n for line in table.splitlines()[2:] for n in re.findall(r"`(\w+)`", line.split("|")[1])}
    assert named == set(methods.list_methods()), f"docs/methods.md's table: {sorted(named ^ set(methods.list_methods()))}"


def test_the_methods_page_states_the_inference_defaults_the_code_has() -> None:
    from dfbench import methods

    defaults = {name: methods.create_method(name).config.inference for name in ("random_prune", "topk_prune")}
    text = (DOCS / "methods.md").read_text(encoding="utf-8")
    stated = "**" + ", ".join(f"`{name}` → `{rule}`" for name, rule in defaults.items()) + "**"
    assert stated in text, f"docs/methods.md does not state the inference defaults {defaults}"
