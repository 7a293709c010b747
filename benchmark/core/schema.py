"""The experiment schema: what each config field means for a run's identity, declared at the field.

Every field of `RunConfig` and of its sections is declared with `declare(default, ...)` (a
`dataclasses.field` whose metadata holds a `FieldSpec`), saying once:

- its role: ``result`` (it can change what a run produces: part of the run id) or ``execution``
  (where or how fast a run is made: never in the id, never separating settings);
- what it separates: result fields separate settings, except the seed, which separates the seeds of
  one setting (`seed=True`);
- the schema version it entered with (`since`) and, for a result field added after ids were first
  published, its neutral value: the value every run made before it ran with. At that value the
  field is left out of the id (so older ids stay valid), a stored config without it reads it back,
  and the report groups a run without it with one at that value;
- its short label (the name a setting's human name uses; default: the field's name);
- when it is active (`active`: a predicate on the config; an inactive field changes nothing, e.g.
  the asynchronous driver's knobs in synchronous rounds, so it is left out of the id);
- how it is hashed where two spellings are one run (`canonical`: train.time_sampling=auto and its
  resolution);
- the name it is hashed under (`hash_name`: the leaf name in the run id's hashed dict). A field
  renamed after run ids were published keeps its old name there, so no run id moves: the
  `hash_name`s are the run-id rename map (the methods' hyperparameters have theirs in config.py,
  `METHOD_PARAM_HASH_NAMES`). Its old name is not read anywhere else.

Predicates and canonical forms take a getter, ``get("train.driver")``, so the same declaration
applies to a `RunConfig` (building ids) and to a stored config.json (the report's grouping).

Everything else is derived here or by the callers: the run id's hashed dict (`identity`), the
execution keys, the later fields with their neutral values, and the keys the report groups by.
This module knows nothing of `RunConfig`: config.py declares the fields and hands its classes in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

#: the schema version of a config written today (config.json records it as "schema", outside the id).
#: Bump it when a field is added, and give the new field `since=` the new version and its `neutral`.
#: v1 the published ids; v2 train.lr_decay; v3 train.time_sampling; v4 the simulated clock, the
#: quality curve and the asynchronous driver; v5 DP, Poisson sampling and the leakage metrics;
#: v6 data.client_images (now data.images_per_client); v7 data.sha256 (data users bring); v8 system.edges and
#: system.edge_rounds (the two-level topology); v9 train.plateau and train.plateau_start (trained to the plateau);
#: v10 train.init, train.init_sha256 and train.init_objective (starting from trained weights).
#: A rename is no new version: the field keeps its hashed name (`hash_name`).
SCHEMA_VERSION = 10

#: keys config.json holds beside the config: bookkeeping, never part of an experiment
BOOKKEEPING = ("run_id", "version", "schema")

Getter = Callable[[str], Any]
Role = Literal["result", "execution"]


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


_UNSET: Any = _Unset()  # "not given" (dataclasses.MISSING cannot be a dataclass field's default)


@dataclass(frozen=True)
class FieldSpec:
    role: Role = "result"
    since: int = 1
    neutral: Any = _UNSET  # the value runs made before `since` ran with (result fields with since > 1)
    seed: bool = False  # separates the seeds of a setting, not settings
    label: str | None = None  # the name in a setting's human name (default: the field's name)
    active: Callable[[Getter], bool] | None = None  # None: always active
    canonical: Callable[[Getter], Any] | None = None  # the value as hashed (None: the value itself)
    hash_name: str | None = None  # the leaf name in the run id's hashed dict (None: the field's name)

    @property
    def later(self) -> bool:
        return self.neutral is not _UNSET


def declare(default: Any = _UNSET, *, default_factory: Any = _UNSET, role: Role = "result", since: int = 1,
            neutral: Any = _UNSET, seed: bool = False, label: str | None = None,
            active: Callable[[Getter], bool] | None = None, canonical: Callable[[Getter], Any] | None = None,
            hash_name: str | None = None) -> Any:
    """A dataclass field with its schema declaration (see the module doc)."""
    if role == "result" and since > 1 and neutral is _UNSET:
        raise ValueError(f"a result field added in schema version {since} needs its neutral value (what older runs ran with)")
    spec = FieldSpec(role=role, since=since, neutral=neutral, seed=seed, label=label, active=active, canonical=canonical,
                     hash_name=hash_name)
    if default_factory is not _UNSET:
        return dataclasses.field(default_factory=default_factory, metadata={"dfbench": spec})
    if default is _UNSET:
        return dataclasses.field(metadata={"dfbench": spec})
    return dataclasses.field(default=default, metadata={"dfbench": spec})


@dataclass(frozen=True)
class Entry:
    key: str  # dotted: "train.lr", "seed"
    spec: FieldSpec
    default: Any = None  # the dataclass field's default (a factory's product)

    @property
    def section(self) -> str:
        return self.key.partition(".")[0] if "." in self.key else ""

    @property
    def name(self) -> str:
        return self.key.rpartition(".")[2]

    @property
    def label(self) -> str:
        return self.spec.label or self.name

    @property
    def hash_name(self) -> str:
        """The leaf name in the run id's hashed dict: the name the field had when ids were published."""
        return self.spec.hash_name or self.name

    @property
    def separates_settings(self) -> bool:
        return self.spec.role == "result" and not self.spec.seed


def spec_of(f: dataclasses.Field) -> FieldSpec:
    spec = f.metadata.get("dfbench")
    if spec is None:
        raise TypeError(f"config field '{f.name}' has no schema declaration: declare it with schema.declare(...)")
    return spec


def entries(root: type, sections: Mapping[str, type]) -> list[Entry]:
    """Every declared field: the root's own fields (sections aside) and each section's, dotted."""
    out: list[Entry] = []
    for f in dataclasses.fields(root):
        if f.name in sections:
            out += [Entry(f"{f.name}.{g.name}", spec_of(g), _default(g)) for g in dataclasses.fields(sections[f.name])]
        else:
            out.append(Entry(f.name, spec_of(f), _default(f)))
    return out


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


def getter(obj: Any) -> Getter:
    """``get("train.lr")`` on a config object (attributes) or a nested dict (config.json)."""
    def get(key: str) -> Any:
        v = obj
        for part in key.split("."):
            v = v.get(part) if isinstance(v, Mapping) else getattr(v, part)
        return v
    return get


def stored(schema: list[Entry], config: Mapping[str, Any]) -> Getter:
    """A getter over a stored config.json (nested sections): a field the file lacks ran with its neutral
    value (a field added after the file was written) or its declared default."""
    fallback = {e.key: e.spec.neutral if e.spec.later else e.default for e in schema}

    def read(key: str) -> Any:
        head, _, leaf = key.rpartition(".")
        section = config.get(head) if head else config
        if isinstance(section, Mapping) and leaf in section:
            return section[leaf]
        return fallback.get(key)
    return read


def _items(schema: list[Entry], get: Getter, *, seeds: bool) -> Iterator[tuple[Entry, Any]]:
    """(entry, hashed value) of the result fields that are active and not at a later field's neutral value."""
    for e in schema:
        s = e.spec
        if s.role != "result" or (s.seed and not seeds):
            continue
        if s.active is not None and not s.active(get):
            continue
        value = s.canonical(get) if s.canonical is not None else get(e.key)
        if s.later and value == s.neutral:
            continue
        yield e, value


def identity(schema: list[Entry], cfg: Any, *, seeds: bool = True) -> dict[str, Any]:
    """The nested dict a run id hashes: result fields only, active, canonical, later fields at their
    neutral value left out, a section with nothing left left out. `cfg`: a config object, or a Getter
    (`stored` reads a config.json). `seeds=False`: the setting's identity (what its seeds share)."""
    get = cfg if callable(cfg) else getter(cfg)
    out: dict[str, Any] = {}
    for e, value in _items(schema, get, seeds=seeds):
        if isinstance(value, Mapping):
            value = dict(value)
        if e.section:
            out.setdefault(e.section, {})[e.hash_name] = value
        else:
            out[e.hash_name] = value
    return out


def execution_keys(schema: list[Entry]) -> tuple[str, ...]:
    return tuple(e.key for e in schema if e.spec.role == "execution")


def later_fields(schema: list[Entry]) -> dict[str, Any]:
    """Dotted key -> neutral value of every field added after ids were first published, oldest first."""
    return {e.key: e.spec.neutral for e in sorted(schema, key=lambda e: e.spec.since) if e.spec.later}


def labels(schema: list[Entry]) -> dict[str, str]:
    """Dotted key -> short label."""
    return {e.key: e.label for e in schema}
