"""Config values: the error type and the one conversion of CLI strings / JSON values to field types.

A leaf module (standard library only): ``benchmark/core/config.py`` and the method
registry both convert values through it, so the registry needs no import of the
config module, which validates method hyperparameters through the registry.
"""

from __future__ import annotations

import json
import math
import types
import typing
from typing import Any, Literal


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key and the allowed values."""


def require(cond: bool, key: str, value: Any, allowed: str) -> None:
    """Raise the one ConfigError of a bad value unless `cond`: "invalid value for 'KEY': VALUE; allowed: ..."."""
    if not cond:
        raise ConfigError(f"invalid value for '{key}': {value!r}; allowed: {allowed}")


def coerce_value(key: str, typ: Any, value: Any) -> Any:
    """Convert a CLI string (or JSON value) to the field's type, with a clear error."""
    origin = typing.get_origin(typ)
    args = typing.get_args(typ)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"invalid value for '{key}': {value!r}; allowed: {', '.join(map(str, args))}")
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
            if type(None) in args:
                return None
        inner = [a for a in args if a is not type(None)]
        return coerce_value(key, inner[0], value)
    try:
        if typ is bool:
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError
            return bool(value)
        if typ is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            if isinstance(value, bool):
                raise ValueError
            return int(value)
        if typ is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if typ is str:
            return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"invalid value for '{key}': {value!r}; expected {getattr(typ, '__name__', typ)}") from None
    return value


def parse_value(text: str) -> Any:
    """Parse a `--set` value: JSON if it parses (numbers, true/false), else the raw string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def seconds_from_env(name: str, default: float) -> float:
    """A positive, finite number of seconds from environment variable `name` (unset: `default`).

    One parser for every timeout knob ($DFBENCH_DIST_TIMEOUT, $DFBENCH_LOCK_STALE, ...), so a
    malformed value fails the same clear way everywhere, before any work.
    """
    import os

    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (value > 0 and value != float("inf")):
        raise ValueError(f"invalid value for ${name}: {raw!r}; allowed: a number of seconds > 0")
    return value


def parse_tiers(spec: str, key: str, example: str, upper: float = 1.0) -> list[tuple[float, float]]:
    """Tiers "VALUE:FRACTION,..." -> [(value, client_fraction)]; values in (0, upper], fractions sum to 1."""
    if not spec:
        return []
    tiers = []
    bound = "(0, 1]" if upper == 1.0 else "> 0"
    for part in spec.split(","):
        try:
            value_s, frac_s = part.split(":")
            value, frac = float(value_s), float(frac_s)
        except ValueError:
            raise ConfigError(f"invalid value for '{key}': {spec!r}; allowed: {example}") from None
        if not (0.0 < value <= upper and math.isfinite(value)):
            raise ConfigError(f"invalid value for '{key}': {spec!r}; allowed: values {bound} ({example})")
        if not 0.0 < frac <= 1.0:
            raise ConfigError(f"invalid value for '{key}': {spec!r}; allowed: client fractions in (0, 1]")
        tiers.append((value, frac))
    if not abs(sum(f for _, f in tiers) - 1.0) < 1e-6:
        raise ConfigError(f"invalid value for '{key}': {spec!r}; allowed: client fractions that sum to 1")
    return tiers


def parse_capacity(spec: str) -> list[tuple[float, float]]:
    """Capacity tiers "CAPACITY:FRACTION,..." -> [(capacity, client_fraction)]; fractions sum to 1.

    A capacity in (0, 1] is what a client can hold; each method interprets it (pruning: keep
    ratio, HeteroFL: width rate)."""
    return parse_tiers(spec, "system.capacity", "'KEEP:FRACTION,...' e.g. '1.0:0.5,0.5:0.5'")


def parse_speed(spec: str) -> tuple[str, object]:
    """system.speed -> ("none", None) | ("tiers", [(speed, fraction)]) | ("lognormal", sigma)."""
    if not spec:
        return "none", None
    if spec.startswith("lognormal:"):
        try:
            sigma = float(spec.partition(":")[2])
        except ValueError:
            sigma = float("nan")
        if not (math.isfinite(sigma) and sigma >= 0):
            raise ConfigError(f"invalid value for 'system.speed': {spec!r}; allowed: 'lognormal:SIGMA' with SIGMA >= 0")
        return "lognormal", sigma
    return "tiers", parse_tiers(spec, "system.speed", "SPEED:FRACTION,... e.g. '1.0:0.5,0.25:0.5'", upper=math.inf)


def parse_staleness(spec: str) -> float:
    """train.staleness -> the exponent A of s(tau) = (1 + tau)^-A (constant: 0)."""
    if spec == "constant":
        return 0.0
    if spec.startswith("poly:"):
        try:
            a = float(spec.partition(":")[2])
        except ValueError:
            a = math.nan
        if math.isfinite(a) and a >= 0:
            return a
    raise ConfigError(f"invalid value for 'train.staleness': {spec!r}; allowed: constant, or poly:A with A >= 0 "
                      "(weight (1 + staleness)^-A; Nguyen et al. use poly:0.5)")
