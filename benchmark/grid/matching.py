"""Which runs or grid cells a method spec names: the one spec matcher of claims, sizing and study plans.

A method spec (``topk_prune?keep_ratio=0.5``, ``fedavg?train.lr=0.003``; `spec.parse_method`) names the runs of
that method whose hyperparameters include the given ones; a dotted key is a config field. Values are compared
as numbers where both are numbers, booleans without regard to case, else as text (`same`). ``untrained`` names
the rounds = 0 baseline. The report matches rows of its runs table (`report.claims.select`), a study plan the
cells of a grid (`cells_of`); both through `matches`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # grid.spec brings the engine (torch): the report reads claims without it
    from dfbench.benchmark.core.config import RunConfig
    from dfbench.benchmark.grid.spec import Cell

UNTRAINED = "untrained"  # the spec of the rounds = 0 baseline
MISSING: Any = object()  # what a value reader gives for a key the run does not record: it matches nothing
SECTIONS = ("data", "train", "system", "eval", "privacy")  # searched in this order for a bare config field name


def same(value: Any, wanted: Any) -> bool:
    """A recorded value equals a spec's: as numbers where both read as numbers (to 1e-9 relative), booleans
    without regard to case ("True" is true), else as text."""
    if isinstance(wanted, bool) or isinstance(value, bool):
        return str(value).lower() == str(wanted).lower()
    try:
        return math.isclose(float(value), float(wanted), rel_tol=1e-9, abs_tol=1e-12)
    except (TypeError, ValueError):
        return str(value) == str(wanted)


def matches(spec: str, *, method: str, untrained: bool, value: Callable[[str], Any]) -> bool:
    """Whether a run (or cell) of `method` is of the setting `spec` names: ``untrained`` names the untrained
    baseline only; any other spec a trained run of its method with every key it gives, ``value(key)`` reading the
    run's value of a key (a hyperparameter, or a config field for a dotted key; `MISSING` when not recorded)."""
    from dfbench.benchmark.grid.spec import parse_method

    if spec == UNTRAINED:
        return untrained
    name, params = parse_method(spec)
    if untrained or method != name:
        return False
    return all((got := value(key)) is not MISSING and same(got, wanted) for key, wanted in params.items())


def config_value(cfg: RunConfig, key: str) -> Any:
    """A spec's or a `where`'s key on a config: "section.field", or a bare field name of any section (as the
    report's run table names it, cfg.<field>: "partition", "model"); None where the config has no such field."""
    if "." in key:
        section, _, name = key.partition(".")
        return getattr(getattr(cfg, section, None), name, None)
    for section in SECTIONS:
        if hasattr(getattr(cfg, section, None), key):
            return getattr(getattr(cfg, section), key)
    return getattr(cfg, key, None)


def cells_of(cells: Sequence[Cell], spec: str, where: Mapping[str, Any] | None = None) -> list[Cell]:
    """The cells of the setting `spec` names (see `matches`) whose config has every value of `where`."""
    def cell_matches(c: Cell) -> bool:
        given = dict(c.cfg.method_params)

        def value(key: str) -> Any:
            return config_value(c.cfg, key) if "." in key else given.get(key, MISSING)

        return matches(spec, method=c.cfg.method, untrained=c.cfg.train.rounds == 0, value=value)

    return [c for c in cells if cell_matches(c) and all(same(config_value(c.cfg, k), v) for k, v in (where or {}).items())]
