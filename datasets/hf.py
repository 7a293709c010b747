"""Import Hugging Face ``datasets`` even where this folder shadows it.

The card's folder ``datasets/`` installs as ``dfbench.datasets``; but with the repository root on
``sys.path`` (``python -m pytest`` or ``python -c`` run from the root put the current directory
first) a plain ``import datasets`` finds this folder instead of Hugging Face's package, and every
library that imports it (``flwr_datasets``, ...) then fails with "cannot import name 'Dataset' from
'datasets'". :func:`import_hf_datasets` imports the real one: it hides the shadowing ``sys.path``
entries for the one import, drops a wrongly cached ``sys.modules['datasets']`` (and its
submodules), then restores ``sys.path``. After it, ``import datasets`` anywhere gets Hugging Face's.
"""
from __future__ import annotations

import importlib
import sys
import threading
from pathlib import Path
from types import ModuleType

__all__ = ["import_hf_datasets", "is_shadowing_entry"]

_OURS = Path(__file__).resolve().parent  # this folder: what `import datasets` must not find
_LOCK = threading.Lock()
_INSTALL = "pip install datasets"


def _is_ours(module: ModuleType) -> bool:
    file = getattr(module, "__file__", None)
    if not file:
        return False
    try:
        return Path(file).resolve().parent == _OURS or _OURS in Path(file).resolve().parents
    except OSError:
        return False


def is_shadowing_entry(entry: str) -> bool:
    """Whether ``sys.path`` entry ``entry`` ('' = the current directory) makes ``import datasets``
    find this folder."""
    if not isinstance(entry, str):
        return False
    try:
        return (Path(entry or ".") / "datasets").resolve() == _OURS
    except OSError:
        return False


def import_hf_datasets() -> ModuleType:
    """The Hugging Face ``datasets`` module, however ``sys.path`` is set up.

    Raises ImportError naming ``pip install datasets`` when it is not installed; any other error
    raised while importing it is passed on unchanged.
    """
    with _LOCK:
        cached = sys.modules.get("datasets")
        if cached is not None and not _is_ours(cached):
            return cached
        for name in [n for n in sys.modules if n == "datasets" or n.startswith("datasets.")]:
            if _is_ours(sys.modules[name]):  # this folder imported under the top-level name
                del sys.modules[name]
        saved = list(sys.path)
        sys.path[:] = [e for e in saved if not is_shadowing_entry(e)]
        try:
            module = importlib.import_module("datasets")
        except ModuleNotFoundError as err:
            if err.name != "datasets":
                raise
            raise ImportError(
                f"Hugging Face `datasets` is not installed; install it with `{_INSTALL}` "
                "(or `pip install 'dfbench[test]'` for the test dependencies)"
            ) from None
        finally:
            # restore the caller's path (entries the import itself appended, if any, are kept)
            added = [e for e in sys.path if e not in saved]
            sys.path[:] = saved + added
        if _is_ours(module):  # defensive: a path entry that reaches this folder in a way not recognised above
            raise ImportError(f"`import datasets` resolves to {module.__file__}, not Hugging Face's package; "
                              f"run from another directory or `{_INSTALL}`")
        return module
