"""MkDocs hook: lets mkdocstrings read dfbench's modules under their import names.

The package's folders install under one namespace (pyproject.toml's [tool.setuptools.package-dir]:
benchmark/ -> dfbench.benchmark, methods/ -> dfbench.methods, ...), which griffe cannot follow when
it reads source files. Before the build this hook lays out that namespace as symlinks in
.cache/docs-src/ (git-ignored), the path mkdocs.yml gives mkdocstrings, so `::: dfbench.methods.base`
reads methods/base.py without importing anything.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority


def source_tree(root: Path) -> Path:
    """Build .cache/docs-src/<package>/... as symlinks into the checkout; return .cache/docs-src."""
    mapping: dict[str, str] = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))[
        "tool"]["setuptools"]["package-dir"]
    out = root / ".cache" / "docs-src"
    for name, folder in sorted(mapping.items()):  # parents first: "dfbench" before "dfbench.benchmark"
        link = out.joinpath(*name.split("."))
        target = (root / folder).resolve()
        if "." not in name:  # the top package: a real folder, so its sub-packages can be linked inside it
            link.mkdir(parents=True, exist_ok=True)
            for item in target.iterdir():
                if item.suffix == ".py":
                    _link(link / item.name, item)
        else:
            _link(link, target)
    return out


def _link(link: Path, target: Path) -> None:
    if link.is_symlink() and link.resolve() == target:
        return
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


@event_priority(100)  # before mkdocstrings' own on_config, which reads its search paths
def on_config(config: Any) -> Any:
    """Lay out the source tree before mkdocstrings looks for modules in it."""
    source_tree(Path(config.config_file_path).resolve().parent)
    return config
