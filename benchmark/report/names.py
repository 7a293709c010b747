"""A setting's human name: the one function every page, plot and study table names settings with.

`setting_names(frame)` works on any frame with one row per run or per setting (the run table,
the aggregated table, a leaderboard.csv read back): per dataset/partition block, a setting is
named by its method ("untrained (method)" for a baseline), the hyperparameters worth reading
(those off the method's defaults, those that vary between the block's settings of the method or
between methods that share the name, and the ones the method declares a headline, e.g. pruning's
keep_ratio) and the config keys where it differs from the block's usual value, each under the short
label its field declares (core/schema.py), e.g. "fedavg", "fedavg (clip=2, noise=0.1)",
"random_prune (keep_ratio=0.25, capacity=1.0:0.5,0.5:0.5)". The block's usual setting reads as
just its method.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import pandas as pd

from dfbench.benchmark.core.config import SECTIONS, experiment_schema
from dfbench.benchmark.report.run_records import normalize_config, to_float

# Config keys named after the other varying ones (the budget), in a name and in a block's main table.
ALWAYS_SHOWN_CONFIG: tuple[str, ...] = ("rounds",)

#: leaf name (as normalize_config names a run's keys) -> default of the config sections
CONFIG_DEFAULTS: dict[str, Any] = normalize_config({name: dataclasses.asdict(cls()) for name, cls in SECTIONS.items()})


def _method_defaults(method: str) -> dict[str, Any] | None:
    from dfbench.methods.registry import method_help

    try:
        return {name: default for name, _, default in method_help(method)}
    except KeyError:  # a method no longer (or not yet) registered here: show every hyperparameter
        return None


def headline_params(method: str) -> tuple[str, ...]:
    """The hyperparameters a method declares worth naming in every row (`Method.headline_params`),
    () for a method not registered here."""
    from dfbench.methods.registry import get_method_class

    try:
        return tuple(get_method_class(method).headline_params)
    except KeyError:
        return ()


def reference_method() -> str:
    """The registered method that declares itself the default reference (`Method.reference`: FedAvg),
    what a report compares every setting with when told no other: the registry's answer (imported
    late, so that reading a leaderboard CSV imports no method)."""
    from dfbench.methods.registry import reference_method as registered

    return registered()


def same(a: Any, b: Any) -> bool:
    """Equal as config values, whichever way the CSV read them back (0.5 vs "0.5", True vs "True")."""
    if isinstance(a, bool) or isinstance(b, bool) or isinstance(a, str) or isinstance(b, str):
        return str(a).strip().lower() == str(b).strip().lower()
    fa, fb = to_float(a), to_float(b)
    if not (math.isnan(fa) or math.isnan(fb)):
        return fa == fb
    return str(a) == str(b)


def shown(value: Any) -> str:
    """A config value as a page prints it; a missing one (NaN as leaderboard.csv reads back "") is ""."""
    if isinstance(value, float) and math.isnan(value):
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value)) and str(value) != ""


def is_baseline(row: pd.Series) -> bool:
    return str(row.get("baseline", False)).lower() == "true"


def hyperparameters(block: pd.DataFrame) -> dict[Hashable, str]:
    """Row index -> the hyperparameters worth reading: every one that tells two rows apart or sets the
    method's operating point. A value is named when it differs from the method's default, varies between
    the block's settings of the method, differs between methods that share the name (pruning's
    `inference`), or is one the method declares a headline (`Method.headline_params`, e.g. keep_ratio:
    a method's knob that the reference lacks is named even at its default). In the columns' order."""
    cols = [c for c in block.columns if c.startswith("param.")]
    if "method" not in block:
        return {idx: "" for idx in block.index}
    trained = block[~block.apply(is_baseline, axis=1)] if len(block) else block
    # a name several methods share, at different values among the trained settings
    across = {c for c in cols
              if trained.loc[trained[c].map(_present), "method"].nunique() > 1
              and trained.loc[trained[c].map(_present), c].map(shown).nunique() > 1}
    out: dict[Hashable, str] = {}
    for method, rows in block.groupby("method", sort=False):
        defaults = _method_defaults(str(method))
        headline = [f"param.{n}" for n in headline_params(str(method))]
        used = [c for c in cols if rows[c].map(_present).any()]
        varying = {c for c in used if rows[c].astype(str).nunique(dropna=False) > 1}
        for idx, row in rows.iterrows():
            parts = []
            for c in used:
                name, value = c[len("param."):], row[c]
                if not _present(value):
                    continue
                default = None if defaults is None else defaults.get(name, dataclasses.MISSING)
                if (c in varying or c in across or c in headline or defaults is None
                        or default is dataclasses.MISSING or not same(value, default)):
                    parts.append(f"{name}={shown(value)}")
            out[idx] = ", ".join(parts)
    return out


def varying_config(block: pd.DataFrame) -> list[str]:
    """The block's cfg.* columns that tell its trained settings apart (all rows where none is trained),
    with ALWAYS_SHOWN_CONFIG (the budget, e.g. rounds) after the others."""
    cfg_cols = [c for c in block.columns if c.startswith("cfg.") and c != "cfg.seed"]
    trained = block[~block.apply(is_baseline, axis=1)] if len(block) else block
    if trained.empty:
        trained = block
    varying = [c for c in cfg_cols if trained[c].astype(str).nunique(dropna=False) > 1]
    return [c for c in varying if c[4:] not in ALWAYS_SHOWN_CONFIG] + \
        [f"cfg.{c}" for c in ALWAYS_SHOWN_CONFIG if f"cfg.{c}" in varying]


def usual(block: pd.DataFrame, col: str) -> str:
    """The block's most common value of a config column (a tie goes to the config default, else to the
    smallest value, numbers by value: never to the row order, which the ranking changes)."""
    counts: dict[str, int] = {}
    for v in block[col].map(shown):
        counts[v] = counts.get(v, 0) + 1
    top = max(counts.values())
    tied = [v for v, n in counts.items() if n == top]
    default = CONFIG_DEFAULTS.get(col[4:])
    if default is not None and shown(default) in tied:
        return shown(default)
    return min(tied, key=_order)


def _order(value: str) -> tuple[int, float, str]:
    number = to_float(value)
    return (0, number, value) if not math.isnan(number) else (1, 0.0, value)


def config_label(column: str) -> str:
    """A cfg.* column's short label, as its field declares it (core/schema.py; default: its name)."""
    key = column[4:] if column.startswith("cfg.") else column
    for e in experiment_schema():
        if key in (e.key, e.name):
            return e.label
    return key


def anchor_role(method: str) -> str:
    """The role of an anchor method (`Method.anchor`, e.g. "floor"), "" for a training method or an unknown one."""
    from dfbench.methods.registry import get_method_class

    try:
        return str(get_method_class(method).anchor or "")
    except KeyError:
        return ""


def baseline_name(method: str) -> str:
    """How an unranked row is named: "untrained (method)", or an anchor's "ROLE (method)"."""
    return f"{anchor_role(method) or 'untrained'} ({method})"


def is_unranked_name(name: str) -> bool:
    """Whether a page name is an unranked row's (`baseline_name`)."""
    from dfbench.methods.base import ANCHOR_ROLES

    return name.startswith("untrained (") or any(name.startswith(f"{role} (") for role in ANCHOR_ROLES)


def _base(row: pd.Series) -> str:
    method = str(row["method"]) if "method" in row else str(row.get("setting", ""))
    return baseline_name(method) if is_baseline(row) and "method" in row else method


def setting_parts(frame: pd.DataFrame, params: Mapping[Hashable, str] | None = None,
                  shown_cfg: Sequence[str] | None = None) -> dict[Hashable, tuple[str, list[str]]]:
    """Row index -> (the setting's base name, what tells it apart): the method ("untrained (method)" for a
    baseline) and, as `name=value` texts, its hyperparameters worth reading, then the config keys where it
    differs from its block's usual value. `setting_names` joins them; the main table shows them in two
    columns. `params` (row -> hyperparameter text) and `shown_cfg` (the cfg.* columns that may be named)
    override what `hyperparameters` and `varying_config` would find: a caller that already computed them
    for one block passes them in."""
    out: dict[Hashable, tuple[str, list[str]]] = {}
    if frame.empty:
        return out
    keys = [k for k in ("dataset", "partition") if k in frame]
    for _, block in (frame.groupby(keys, sort=False) if keys else [(None, frame)]):
        text = hyperparameters(block) if params is None else params
        cols = varying_config(block) if shown_cfg is None else list(shown_cfg)
        common = {c: usual(block, c) for c in cols}
        label = {c: config_label(c) for c in cols}
        for idx, row in block.iterrows():
            extra = [text[idx]] if text.get(idx) else []
            extra += [f"{label[c]}={shown(row[c]) or 'none'}" for c in cols if shown(row[c]) != common[c]]
            out[idx] = (_base(row), extra)
    return out


def usual_config(block: pd.DataFrame, shown_cfg: Sequence[str]) -> dict[str, str]:
    """The block's usual value of each config key that tells its settings apart (label -> value): what a
    setting whose name does not mention the key ran with."""
    return {config_label(c): usual(block, c) or "none" for c in shown_cfg}


def setting_names(frame: pd.DataFrame, params: Mapping[Hashable, str] | None = None,
                  shown_cfg: Sequence[str] | None = None) -> dict[Hashable, str]:
    """Row index -> the setting's human name (see the module doc and `setting_parts`), each named within
    its dataset/partition block."""
    return {idx: base + (f" ({', '.join(extra)})" if extra else "")
            for idx, (base, extra) in setting_parts(frame, params, shown_cfg).items()}


def run_names(runs: pd.DataFrame) -> dict[str, str]:
    """run_id -> its setting's human name (`setting_names` over the run table)."""
    names = setting_names(runs)
    return {str(runs.at[idx, "run_id"]): name for idx, name in names.items()}
