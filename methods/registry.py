"""Method registry (timm-style, but registering a name twice is an error)."""

from __future__ import annotations

import dataclasses
import fnmatch
import typing
from typing import Any, Callable, Mapping, TypeVar

from dfbench.benchmark.core.config import METHOD_PARAM_HASH_NAMES
from dfbench.benchmark.core.parsing import coerce_value

from .base import Method

M = TypeVar("M", bound=type[Method])
_REGISTRY: dict[str, type[Method]] = {}


def register_method(name: str) -> Callable[[M], M]:
    """Class decorator: make a Method subclass available as `name`."""

    def deco(cls: M) -> M:
        if name in _REGISTRY:
            raise ValueError(f"method {name!r} is already registered (by {_REGISTRY[name].__qualname__})")
        if not dataclasses.is_dataclass(cls.Config):
            raise TypeError(f"{cls.__qualname__}.Config must be a frozen dataclass")
        names = {f.name for f in dataclasses.fields(cls.Config)}
        for new, hashed in METHOD_PARAM_HASH_NAMES.items():  # the run id would hash both under one name
            if {new, hashed} <= names:
                raise TypeError(f"{cls.__qualname__}.Config declares both {new!r} and {hashed!r}: run ids hash {new} as "
                                f"{hashed} (core/config.py METHOD_PARAM_HASH_NAMES), so rename one of them")
        cls.name = name
        if cls.family is None:
            cls.family = name
        _REGISTRY[name] = cls
        return cls

    return deco


def list_methods(pattern: str = "*", anchors: bool = False) -> list[str]:
    """Registered method names matching a glob pattern, sorted; the anchors (`Method.anchor`: rows that train
    nothing) only with `anchors=True`."""
    return sorted(n for n in _REGISTRY if fnmatch.fnmatch(n, pattern) and (anchors or not _REGISTRY[n].anchor))


def method_families() -> dict[str, list[str]]:
    """Family -> its registered method names (a family groups methods that share one rule)."""
    out: dict[str, list[str]] = {}
    for n in list_methods():
        out.setdefault(str(_REGISTRY[n].family), []).append(n)
    return out


def _anchors_note() -> str:
    anchors = sorted(set(list_methods(anchors=True)) - set(list_methods()))
    return f" (anchors: {', '.join(anchors)})" if anchors else ""


def get_method_class(name: str) -> type[Method]:
    if name not in _REGISTRY:
        import difflib

        close = difflib.get_close_matches(str(name), list(_REGISTRY), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise KeyError(f"unknown method {name!r}{hint}; registered methods: {', '.join(list_methods())}{_anchors_note()} (a method from "
                       "outside dfbench: install its package, or pass --plugin MODULE / set DFBENCH_PLUGINS=MODULE; "
                       "docs/adding-a-method.md)")
    return _REGISTRY[name]


def method_config(name: str, params: Mapping[str, Any]) -> Any:
    """Build (and validate) the method's frozen Config from loose key/values."""
    cls = get_method_class(name)
    hints = typing.get_type_hints(cls.Config)
    names = [f.name for f in dataclasses.fields(cls.Config)]
    unknown = [k for k in params if k not in names]
    if unknown:
        valid = ", ".join(f"method.{n}" for n in names) or "(none)"
        raise KeyError(f"unknown hyperparameter(s) {', '.join(f'method.{k}' for k in unknown)} for method {name!r}; valid: {valid}")
    # the same conversion as every other config value (CLI strings, JSON values), one place
    kwargs = {k: coerce_value(f"method.{k}", hints[k], v) for k, v in params.items()}
    cfg = cls.Config(**kwargs)
    check = getattr(cfg, "validate", None)
    if check is not None:
        check()
    return cfg


def create_method(name: str, **kwargs: Any) -> Method:
    """Instantiate a registered method with its hyperparameters (unknown keyword -> clear error)."""
    return get_method_class(name)(method_config(name, kwargs))


def method_help(name: str) -> list[tuple[str, str, Any]]:
    """(hyperparameter, type, default) for `dfbench methods`."""
    cls = get_method_class(name)
    hints = typing.get_type_hints(cls.Config)
    out = []
    for f in dataclasses.fields(cls.Config):
        typ = hints[f.name]
        tname = "|".join(map(str, typing.get_args(typ))) if typing.get_origin(typ) is typing.Literal else getattr(typ, "__name__", str(typ))
        out.append((f.name, tname, f.default))
    return out


def reference_method() -> str:
    """The registered method that declares itself the reference (`Method.reference`: FedAvg): what a
    report compares every setting with when told no other, and the dense model drift falls back to."""
    found = [m for m in list_methods() if vars(_REGISTRY[m]).get("reference") is True]
    if len(found) != 1:
        raise RuntimeError(f"exactly one registered method must declare reference = True, found {found or 'none'}")
    return found[0]
