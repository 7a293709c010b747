"""Methods from outside the package: entry points, ``--plugin MODULE`` and ``DFBENCH_PLUGINS``.

A plugin is a Python module whose import registers methods with ``@register_method``. Three
sources name plugins, all loaded by ``load_plugins`` before any work (the CLI calls it first):

    entry points   every installed distribution's group "dfbench.methods", declared in its
                   pyproject.toml as  [project.entry-points."dfbench.methods"]  mymethod = "mypkg.methods"
                   (a value "module:function" imports the module, then calls the function)
    environment    DFBENCH_PLUGINS=mypkg.methods,other.module  (comma-separated)
    command line   --plugin MODULE (repeatable) on dfbench run / grid / report / methods / eval

Each module is imported once per process (loading it again is a no-op, never a "registered
twice" error). A module that cannot be imported stops with one error naming the module, where it
was named and what to do. Processes started by dfbench load the same plugins: grid workers get
``--plugin`` for each (`child_plugin_modules`), torchrun ranks run the same command line and
environment. A run whose method came from a plugin records where it came from in its folder
(`method_origin`, written by the run's life cycle to plugin.json beside config.json; no run id changes).

Only methods have a registry: datasets (their sources and checksums), partitioners and metrics are
fixed tables in the package, so they have no plugin group.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from dfbench.benchmark.core.parsing import ConfigError

from .registry import get_method_class, list_methods

ENTRY_POINT_GROUP = "dfbench.methods"
ENV_VAR = "DFBENCH_PLUGINS"
FLAG = "--plugin"
BUILTIN_PREFIX = "dfbench."


class PluginError(ConfigError):
    """A plugin module could not be loaded; the message names the module, its source and the fix."""


@dataclass(frozen=True)
class Plugin:
    """One loaded plugin module: where it was named and the methods its import registered."""

    module: str
    source: str  # "entry point 'name = value' of distribution D V", "DFBENCH_PLUGINS", "--plugin"
    methods: tuple[str, ...]
    distribution: str | None = None  # "name version" for an entry point

    @property
    def explicit(self) -> bool:
        """Named by --plugin or DFBENCH_PLUGINS (a child process is not sure to find it otherwise)."""
        return self.distribution is None


_LOADED: dict[str, Plugin] = {}  # module (or entry-point value) -> how it was loaded; first source wins


def _split(text: str) -> list[str]:
    return [m.strip() for m in text.split(",") if m.strip()]


def _fix(module: str, source: str, dist: str | None) -> str:
    if dist is not None:
        name = dist.split()[0]
        return (f"the distribution {name!r} declares it under [project.entry-points.\"{ENTRY_POINT_GROUP}\"]: "
                f"reinstall it (pip install -e <its folder>) so the module imports, or uninstall it (pip uninstall {name})")
    where = "remove it from DFBENCH_PLUGINS" if source == ENV_VAR else f"drop {FLAG} {module}"
    return (f"make {module!r} importable (pip install the package that holds it, or add its folder to PYTHONPATH), "
            f"or {where}")


def _import(module: str, attr: str | None, source: str, dist: str | None) -> tuple[str, ...]:
    """Import `module` (and call `attr` when given); the method names it registered."""
    before = set(list_methods())
    try:
        mod = importlib.import_module(module)
        if attr:
            target: Any = mod
            for part in attr.split("."):
                target = getattr(target, part)
            if callable(target) and not isinstance(target, type):
                target()
    except Exception as err:  # noqa: BLE001 - any failure of a plugin's import is reported as one clear error
        why = f"{type(err).__name__}: {err}"
        if isinstance(err, ModuleNotFoundError) and err.name and err.name != module and not module.startswith(err.name + "."):
            why += f" (the plugin imports {err.name!r}, which is not installed)"
        raise PluginError(f"method plugin {module!r} (named by {source}) could not be loaded: {why}. "
                          f"Fix: {_fix(module, source, dist)}") from err
    new = set(list_methods()) - before
    # a module imported earlier (by the caller) registered its methods then: find them by their class
    own = {n for n in list_methods() if _defined_in(get_method_class(n).__module__, module)}
    return tuple(sorted(new | own))


def _defined_in(class_module: str, module: str) -> bool:
    return class_module == module or class_module.startswith(module + ".")


def _entry_points() -> list[tuple[str, str, str]]:
    """(value, description, distribution) of every entry point of the group, each value once."""
    seen: dict[str, tuple[str, str, str]] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "an unnamed distribution"
        seen.setdefault(ep.value, (ep.value, f"entry point '{ep.name} = {ep.value}' of {dist}", dist))
    return sorted(seen.values())


def load_plugins(modules: Iterable[str] = (), *, entry_points: bool = True, env: bool = True) -> list[Plugin]:
    """Load the plugins of every source (entry points, $DFBENCH_PLUGINS, `modules` from --plugin); idempotent.

    Returns every plugin loaded in this process so far. Raises `PluginError` (a ConfigError) for
    the first module that cannot be loaded, naming it, its source and the fix.
    """
    wanted: list[tuple[str, str, str | None]] = []  # (value, source, distribution)
    if entry_points:
        wanted += [(value, desc, dist) for value, desc, dist in _entry_points()]
    if env:
        wanted += [(m, ENV_VAR, None) for m in _split(os.environ.get(ENV_VAR, ""))]
    wanted += [(m, FLAG, None) for text in modules for m in _split(text)]
    for value, source, dist in wanted:
        if value in _LOADED:
            continue
        module, _, attr = value.partition(":")
        module, attr = module.strip(), attr.strip() or None
        _LOADED[value] = Plugin(module, source, _import(module, attr, source, dist), dist)
    return list(_LOADED.values())


def loaded_plugins() -> list[Plugin]:
    """The plugins loaded in this process, in loading order."""
    return list(_LOADED.values())


def is_builtin(name: str) -> bool:
    """The method `name` is one of dfbench's own (its class lives in the package)."""
    return get_method_class(name).__module__.startswith(BUILTIN_PREFIX)


def method_origin(name: str) -> dict[str, Any] | None:
    """Where the method `name` came from, for its run folder; None for a method of the package.

    ``plugin`` is the module to load again (``--plugin`` / DFBENCH_PLUGINS, or the entry point of
    ``distribution``), ``source`` how this process loaded it, ``class`` the class that implements it.
    """
    if is_builtin(name):
        return None
    cls = get_method_class(name)
    found = next((p for p in _LOADED.values() if name in p.methods), None)
    out: dict[str, Any] = {"method": name, "class": f"{cls.__module__}.{cls.__qualname__}"}
    if found is None:  # registered by an import of the caller's (the Python API, a notebook)
        out.update(plugin=cls.__module__, source="imported by the calling program", distribution=None)
    else:
        out.update(plugin=found.module, source=found.source, distribution=found.distribution)
    out["load_with"] = (f"installed entry point (group {ENTRY_POINT_GROUP})" if out["distribution"]
                        else f"{FLAG} {out['plugin']} or {ENV_VAR}={out['plugin']}")
    return out


def child_plugin_modules(methods_used: Sequence[str] = ()) -> list[str]:
    """The modules a child process (a grid worker) must load with --plugin to run `methods_used`.

    Every module named by --plugin or DFBENCH_PLUGINS here, and the module of each method in
    `methods_used` that came from neither an entry point (the child finds those itself) nor those.
    A method defined in ``__main__`` (a script or a notebook) cannot be imported by another
    process: that is refused with what to do.
    """
    out = [p.module for p in _LOADED.values() if p.explicit]
    covered = {n for p in _LOADED.values() for n in p.methods}
    for name in methods_used:
        if name in covered or is_builtin(name):
            continue
        module = get_method_class(name).__module__
        if module == "__main__":
            raise ConfigError(f"method {name!r} is defined in __main__ (a script or a notebook): other processes "
                              f"(grid workers, torchrun ranks) cannot import it. Move it into a module and load that "
                              f"with {FLAG} MODULE, {ENV_VAR} or an entry point, or run with one worker")
        out.append(module)
    return list(dict.fromkeys(out))
