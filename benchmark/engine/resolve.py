"""Resolving a RunConfig: the checks that need the method registry and the datasets, and the config they return.

A `RunConfig` (core/config.py) checks its own fields when it is built. What it cannot check from
core -- the method's hyperparameters (its Config's defaults filled in, each value converted to its
declared type, the method's own checks and declared capabilities), the dataset's name and size, the
partition spec, the model preset against the dataset's images, the content digest of data users
bring, the starting weights of train.init against the network -- is checked here, before any data is
loaded, and the config comes back *resolved*: its method_params a `MethodParams` of its method,
data.sha256 and train.init_sha256 filled in. Only a resolved config has a
run id, so every run folder is named after one. `apply_overrides` and `config_from_dict` build
configs through here; the run's life cycle resolves again with the real number of ranks.

Why this module is in the engine layer: core sits below the methods (a method reads the RunConfig, so
the config cannot import the registry back), and the engine is the lowest layer above the methods
and the datasets; every front that builds configs (the grid, the API and the CLI's flags, `dfbench
eval`) already stands on it. A layer of its own for this one module would name one more layer in
every list of them for nothing.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import fields, replace
from typing import Any, Mapping

from dfbench import datasets, methods
from dfbench.benchmark.core import numerics, presets
from dfbench.benchmark.core.config import SECTIONS, ConfigError, MethodParams, RunConfig, data_kind, field_type
from dfbench.benchmark.core.parsing import coerce_value, require


def resolve(cfg: RunConfig, world: int = 1) -> RunConfig:
    """`cfg` checked against the method registry and the data, with its method's hyperparameters filled in
    (`MethodParams`) and the digest of data users bring (data.sha256): a resolved config, which has a run id.
    `world`: the number of torch.distributed ranks the run will have (the life cycle passes the real one).
    Idempotent: a resolved config comes back equal, with the same run id."""
    data = _check_data(cfg.data)
    _check_dataset_size(data)
    _check_model(cfg)
    try:
        datasets.parse_partition(data.partition)
    except ValueError as err:
        raise ConfigError(f"invalid value for 'data.partition': {err}") from None
    require(not (cfg.train.driver == "fedbuff" and world > 1), "train.driver", cfg.train.driver,
            f"sync under torchrun (here {world} ranks): the asynchronous driver runs in one process")
    require(not (cfg.system.edges and world > 1), "system.edges", cfg.system.edges,
            f"0 under torchrun (here {world} ranks): the hierarchical driver runs in one process")
    try:
        config = methods.method_config(cfg.method, dict(cfg.method_params))
        config = methods.get_method_class(cfg.method).resolve_config(config, cfg)  # values that follow the run
        resolved = replace(cfg, data=data, method_params=MethodParams(cfg.method, dataclasses.asdict(config)))
        # what the method cannot run (declared capabilities, its own check), refused here so `dfbench run`, the
        # API and every cell of `dfbench grid --dry-run` say it before any data is loaded
        methods.get_method_class(cfg.method).check(config, resolved, world)
    except (KeyError, TypeError, ValueError) as err:  # the method's own errors, as one config error
        raise ConfigError(err.args[0] if err.args else str(err)) from None
    resolved = replace(resolved, train=_check_init(resolved))
    if resolved.train.amp == "auto":  # the choice, not the wish, is what ran: config.json and the run id say which
        resolved = replace(resolved, train=replace(resolved.train, amp=numerics.auto_amp(resolved.device)))
    return resolved


def with_clients_mode(cfg: RunConfig, world: int = 1) -> RunConfig:
    """`cfg` with train.clients_mode=auto replaced by what will run (the life cycle calls it on the final config, so
    config.json says which; an execution field: not in the run id): "batched" (the round's clients in lockstep) for
    the MLP presets, where it measured 1.8-4.8x faster for mlp-tiny and level for mlp (results/gt-demo/speed.md, 10
    and 100 clients), whenever the method, the driver and the options allow it; "sequential" for the UNets (0.58x
    batched on a CPU, docs/performance.md) and wherever lockstep is refused. Not in `resolve`: a config is resolved
    again when a later override switches its method, and a choice made for the first method must not stick."""
    from dfbench.benchmark.engine.model import resolve_preset

    t = cfg.train
    if t.clients_mode != "auto":
        return cfg

    def mode() -> str:
        if world > 1 or t.driver != "sync" or t.compile or t.channels_last:
            return "sequential"
        preset = presets.PRESETS.get(resolve_preset(t.model, cfg.data.dataset))
        if preset is None or preset.family != "mlp":
            return "sequential"
        trial = replace(cfg, train=replace(t, clients_mode="batched"))
        try:  # the method's own refusal of lockstep (declared capabilities, its hyperparameters)
            config = methods.method_config(cfg.method, dict(cfg.method_params))
            methods.get_method_class(cfg.method).check(config, trial, world)
        except (KeyError, TypeError, ValueError):
            return "sequential"
        return "batched"

    return replace(cfg, train=replace(t, clients_mode=mode()))


def apply_overrides(cfg: RunConfig, items: Mapping[str, Any]) -> RunConfig:
    """Apply dotted overrides {'train.lr': 1e-3, 'method.mu': 0.01, 'seed': 1}; return the config resolved.

    The method's checks run once, on the result: a combination that only the overrides together make
    valid (a method, its hyperparameters and the partition it needs) is never refused half-way.
    A new 'method' starts from its own default hyperparameters (the old method's do not carry over).
    """
    top: dict[str, Any] = {}
    secs: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    switching = "method" in items and str(items["method"]) != cfg.method
    mparams = {} if switching else dict(cfg.method_params)
    top_names = {f.name for f in fields(RunConfig)} - set(SECTIONS) - {"method_params"}
    for key, value in items.items():
        head, _, rest = key.partition(".")
        if head == "method" and rest:
            mparams[rest] = value
        elif head in SECTIONS and rest:
            sec_cls = type(getattr(cfg, head))
            names = [f.name for f in fields(sec_cls)]
            if rest not in names:
                close = difflib.get_close_matches(key, [f"{head}.{n}" for n in names], n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"unknown key '{key}'; valid keys in '{head}': {', '.join(f'{head}.{n}' for n in names)}{hint}")
            secs[head][rest] = coerce_value(key, field_type(sec_cls, rest), value)
        elif head in top_names and not rest:
            top[head] = coerce_value(key, field_type(RunConfig, head), value)
        else:
            valid = sorted(top_names) + [f"{s}.<field>" for s in SECTIONS] + ["method.<hyperparameter>"]
            raise ConfigError(f"unknown key '{key}'; valid keys: {', '.join(valid)}")
    if "dataset" in secs["data"] and "sha256" not in secs["data"]:
        secs["data"]["sha256"] = ""  # another dataset: its digest is taken anew (user data), none recorded (built-in)
    if "init" in secs["train"] and "init_sha256" not in secs["train"]:
        secs["train"]["init_sha256"] = ""  # other starting weights: their digest is taken anew
    new_secs = {s: replace(getattr(cfg, s), **v) for s, v in secs.items() if v}
    return resolve(replace(cfg, **top, **new_secs, method_params=mparams))


def config_from_dict(d: Mapping[str, Any]) -> RunConfig:
    """A run's config.json (or any dict of `RunConfig.to_dict`'s shape) as a resolved config."""
    return resolve(RunConfig.from_dict(d))


def _check_data(d: Any) -> Any:
    """data.dataset names a built-in dataset or data users bring; the latter is read now (datasets/user_data.py:
    every check of its files runs, a DatasetError names the file) and its digest filled in or, when recorded,
    checked. A built-in dataset records none (its files are pinned by checksum). Returns the data section."""
    if datasets.is_mixture(d.dataset):  # ground truth: the spec is checked (and made canonical) before any work
        try:
            spec = datasets.gmm_canonical(d.dataset)
        except datasets.DatasetError as e:
            raise ConfigError(f"invalid value for 'data.dataset': {e}") from None
        require(d.sha256 == "", "data.sha256", d.sha256, "'' for a gmm: mixture (generated from its spec)")
        return replace(d, dataset=spec)
    close = difflib.get_close_matches(str(d.dataset).lower(), datasets.DATASETS, n=1)
    require(d.dataset in datasets.DATASETS or datasets.is_user_data(d.dataset), "data.dataset", d.dataset,
            f"{', '.join(datasets.DATASETS)}, your own data: {', '.join(f'{k}:PATH' for k in datasets.USER_KINDS)} "
            "(docs/your-own-data.md), or a ground-truth mixture: " + datasets.gmm.SYNTAX
            + (f"; did you mean {close[0]!r}?" if close else ""))
    if data_kind(d.dataset) is None:
        require(d.sha256 == "", "data.sha256", d.sha256, "'' for the built-in datasets (their files are pinned by checksum)")
        return d
    digest = datasets.user_digest(d.dataset)
    require(d.sha256 in ("", digest), "data.sha256", d.sha256,
            f"'' (filled in from the data) or {digest}, the digest of the data now at {d.dataset!r}: the data changed "
            "since this config was written; restore it, or drop data.sha256 to start a new run on the data as it is")
    return d if d.sha256 else replace(d, sha256=digest)


def _check_init(cfg: RunConfig) -> Any:
    """train.init read and checked against the run's network (benchmark/engine/init_weights.py: the path is there,
    every parameter under its name with its shape, a diffusers folder's config the preset's; a ConfigError names
    the file and what differs), its digest filled in or, when recorded, checked. Returns the train section, with
    train.init as an absolute path."""
    t = cfg.train
    if not t.init:
        return t
    from dfbench.benchmark.engine.init_weights import init_digest, init_path
    from dfbench.benchmark.engine.model import resolve_preset

    shape = tuple(int(v) for v in datasets.data_info(cfg.data.dataset)["image_shape"])
    digest = init_digest(t.init, resolve_preset(t.model, cfg.data.dataset), shape)
    require(t.init_sha256 in ("", digest), "train.init_sha256", t.init_sha256,
            f"'' (filled in from the weights) or {digest}, the digest of the weights now at {t.init!r}: they changed "
            "since this config was written; restore them, or drop train.init_sha256 to start a new run from them as they are")
    return replace(t, init=str(init_path(t.init)), init_sha256=digest)


def _check_dataset_size(d: Any) -> None:
    """The dataset's size is known without loading it, so "more clients than samples" fails here, before any
    data is loaded (build_context checks again against the data actually loaded)."""
    n_train = int(datasets.data_info(d.dataset)["num_samples"]["train"])
    require(d.clients * d.min_client_size <= n_train, "data.clients", d.clients,
            f"at most {n_train // d.min_client_size} for {d.dataset} ({n_train} training samples, "
            f"data.min_client_size={d.min_client_size} each)")


def _check_model(cfg: RunConfig) -> None:
    """train.model beyond its name (benchmark/core/presets.py): a diffusers preset needs diffusers at the
    pinned release, and a preset's down-sampling must take the dataset's image side (a UNet no side of 1)."""
    name = cfg.train.model
    if name == "auto":
        return
    if presets.family(name) == "diffusers":
        problem = presets.diffusers_problem()
        require(problem is None, "train.model", name, f"auto or a built-in preset ({', '.join(presets.BUILTIN)}) "
                f"until diffusers is usable; {problem}")
    multiple, least = presets.side_multiple(name), presets.min_side(name)
    if multiple == 1 and least == 1:  # the MLP takes any sample shape
        return
    _, h, w = (int(v) for v in datasets.data_info(cfg.data.dataset)["image_shape"])
    require(min(h, w) >= least, "train.model", name,
            f"a preset that takes {cfg.data.dataset}'s {h}x{w} samples, e.g. {presets.AUTO_VECTOR} (an MLP over the "
            f"flattened sample; what auto picks): a side of 1 is a vector, not an image, and {name} is a UNet, whose "
            "convolutions and down-sampling need images")
    require(h % multiple == 0 and w % multiple == 0, "train.model", name,
            f"a preset whose down-sampling takes {cfg.data.dataset}'s {h}x{w} images ({name} halves each side "
            f"until it is {multiple} times smaller, so it needs multiples of {multiple}), e.g. diffusers-tiny or auto")
