"""Starting weights (train.init): the global model, or each expert, starts from a trained network.

Three sources, told apart by what the path holds (`source_kind`):

- a finished run's folder (its `config.json` names a run id): its final model, the newest checkpoint's EMA
  weights when the run kept them (what its evaluation sampled), else its parameters;
- a diffusers model folder saved with `save_pretrained` (its `config.json` names a diffusers class): the
  weights file beside it, for a diffusers preset whose `UNet2DModel` arguments it must match;
- a checkpoint file: a state_dict (name -> tensor) saved with `torch.save` or as `.safetensors`, named as
  the run's network names its parameters (`unet.` may be left out before a diffusers network's names).

Every source becomes the flat parameter vector of the run's network (`load_init`), in the order its flat
buffer has (benchmark/engine/model.py `flatten_`), float32, after every check: the file is there, each of the
network's parameters is in it under its name with its shape and nothing else is, a diffusers folder's config
matches the preset. A failure is a ConfigError of one line naming the file and what differs, raised by
`benchmark/engine/resolve.py` before any work. Nothing is downloaded: the path is local.

The weights' identity is `init_sha256`: the sha256 of that vector's bytes (float32, little-endian), the same
digest metrics.json's pairing records of the seeded initial parameters (`evaluate.tensor_sha256`), so it does
not depend on the file's format or on where it is (train.init is an execution field; train.init_sha256 is in
the run id). `init_record` is what the run folder says of its starting point (metrics.json "init").
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dfbench.benchmark.core import presets, runfolder
from dfbench.benchmark.core.config import ConfigError, RunConfig

#: what a diffusers model folder holds its weights in, in the order they are looked for (save_pretrained's names)
DIFFUSERS_WEIGHTS = ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin")
#: UNet2DModel arguments a diffusers folder may set otherwise than the preset: neither changes the weights or what
#: the network computes in evaluation (sample_size is a note in the config; dropout trains only where it is > 0,
#: and the run trains with the preset's, 0, see benchmark/core/presets.py)
DIFFUSERS_FREE = ("sample_size", "dropout")
#: the prefix of a diffusers network's parameter names in the run's network (diffusers_models.DiffusersUNet.unet)
DIFFUSERS_PREFIX = "unet."


@dataclass(frozen=True)
class InitWeights:
    """The starting weights of a run: the flat vector of its network and where it came from."""

    flat: torch.Tensor  # float32 [P], the run's network's parameter order
    kind: str  # "run" | "diffusers" | "file"
    path: Path  # train.init, absolute
    file: Path  # the file the weights were read from
    source_run: str | None = None  # the run id of a run folder

    @property
    def sha256(self) -> str:
        return weights_sha256(self.flat)


def weights_sha256(flat: torch.Tensor) -> str:
    """sha256 of a flat parameter vector's values (float32, C order, little-endian): `evaluate.tensor_sha256`."""
    return hashlib.sha256(flat.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4").tobytes()).hexdigest()


def init_path(value: str) -> Path:
    """train.init as an absolute path (~ expanded): what config.json records."""
    return Path(os.path.abspath(os.path.expanduser(value)))


def _refuse(problem: str) -> ConfigError:
    """The one refusal of train.init: `problem` names the file and what differs."""
    return ConfigError(f"invalid value for 'train.init': {problem}")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise _refuse(f"{path} cannot be read as JSON ({type(err).__name__}: {err})") from None


def source_kind(path: Path) -> str:
    """"run" (a run folder), "diffusers" (a save_pretrained folder) or "file" (a state_dict); ConfigError otherwise."""
    if not path.exists():
        raise _refuse(f"{path} does not exist (a finished run's folder, a checkpoint file or a diffusers model "
                            "folder saved with save_pretrained; nothing is downloaded)")
    if path.is_file():
        return "file"
    config = path / runfolder.CONFIG
    if not config.is_file():
        raise _refuse(f"{path} is a folder without {runfolder.CONFIG}: neither a run's folder nor a diffusers "
                            "model folder (save_pretrained writes config.json beside the weights)")
    record = _read_json(config)
    if isinstance(record, Mapping) and "run_id" in record:
        return "run"
    if isinstance(record, Mapping) and "_class_name" in record:
        return "diffusers"
    raise _refuse(f"{config} names neither a run (run_id) nor a diffusers model (_class_name)")


# -- the run's network: names and shapes, without memory ---------------------------------------------

def _network_shapes(preset: str, image_shape: tuple[int, ...]) -> tuple[dict[str, tuple[int, ...]], Any]:
    """name -> shape of the parameters of `preset`'s network for `image_shape` samples, in flat order, and the
    network itself (on the meta device: structure only)."""
    from dfbench.benchmark.engine.model import build_model

    with torch.device("meta"):
        net = build_model(preset, image_shape)
    return {n: tuple(p.shape) for n, p in net.named_parameters()}, net


def _matched(file: Path, state: Mapping[str, torch.Tensor], shapes: Mapping[str, tuple[int, ...]], preset: str) -> torch.Tensor:
    """The state_dict as the flat vector of the network whose parameters are `shapes`; ConfigError naming the file
    and the first difference (a parameter missing, one the network lacks, another shape)."""
    fits = f"{file} does not fit train.model={preset}"
    missing = [n for n in shapes if n not in state]
    for name, shape in shapes.items():  # the first difference in the network's order
        if name not in state:
            raise _refuse(f"{fits}: {len(missing)} of the network's {len(shapes)} parameters are missing from it, the "
                          f"first {name!r} (shape {list(shape)})")
        if tuple(state[name].shape) != shape:
            raise _refuse(f"{fits}: parameter {name!r} has shape {list(state[name].shape)} there, {list(shape)} in the network")
        if not state[name].is_floating_point():
            raise _refuse(f"{fits}: parameter {name!r} holds {state[name].dtype} values, not floating point")
    extra = [n for n in state if n not in shapes]
    if extra:
        raise _refuse(f"{fits}: it holds {len(extra)} parameter(s) the network does not have, the first "
                      f"{extra[0]!r} (shape {list(state[extra[0]].shape)})")
    return torch.cat([state[n].detach().to("cpu", torch.float32).reshape(-1) for n in shapes])


def _state_dict(file: Path) -> dict[str, torch.Tensor]:
    """A file's name -> tensor mapping (safetensors, or torch.save with weights_only: no code runs)."""
    try:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file

            obj: Any = load_file(str(file))
        else:
            obj = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file is the same refusal, with torch's reason
        said = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise _refuse(f"{file} cannot be read as a state_dict ({type(err).__name__}: {said})") from None
    if isinstance(obj, Mapping) and "params" in obj and "round" in obj:
        raise _refuse(f"{file} is a run's checkpoint (a flat vector without parameter names); name the run's "
                            "folder instead, whose config says the network")
    if not isinstance(obj, Mapping) or not all(isinstance(k, str) and torch.is_tensor(v) for k, v in obj.items()):
        raise _refuse(f"{file} is not a state_dict (a mapping of parameter names to tensors)")
    return dict(obj)


def _from_run(path: Path, preset: str, shapes: Mapping[str, tuple[int, ...]]) -> tuple[torch.Tensor, Path, str]:
    """A finished run's final model as the flat vector of the network `shapes`, its checkpoint file, its run id."""
    from dfbench import datasets
    from dfbench.benchmark.engine.model import resolve_preset

    record = _read_json(path / runfolder.CONFIG)
    status = runfolder.read_status(path) or {}
    if status.get("state") != runfolder.DONE:
        raise _refuse(f"{path} is not a finished run (its {runfolder.STATUS} says {status.get('state', 'nothing')}); "
                            "finish it (rerun its dfbench run) or name another run")
    checkpoints = sorted((path / runfolder.CHECKPOINTS).glob("ckpt-*.pt"))
    if not checkpoints:
        raise _refuse(f"{path / runfolder.CHECKPOINTS} holds no checkpoint: the run's final model is not there")
    file = checkpoints[-1]
    try:
        ck = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001
        raise _refuse(f"{file} cannot be read ({type(err).__name__}: {err})") from None
    params = ck.get("ema") if ck.get("ema") is not None else ck.get("params")
    if not torch.is_tensor(params) or params.dim() != 1:
        shape = list(params.shape) if torch.is_tensor(params) else None
        raise _refuse(f"{file} holds {shape[0] if shape else 'no'} networks (shape {shape}), an expert mixture's; "
                            "start from a run that trains one network")
    data, train = record.get("data") or {}, record.get("train") or {}
    dataset = str(data.get("dataset", "fmnist"))
    source = resolve_preset(str(train.get("model", "auto")), dataset)
    own, _ = _network_shapes(source, tuple(int(v) for v in datasets.data_info(dataset)["image_shape"]))
    total = sum(torch.Size(s).numel() for s in own.values())
    if params.numel() != total:
        raise _refuse(f"{file} holds {params.numel()} parameters, not the {total} of its run's network "
                            f"(train.model={source} on {dataset})")
    state, offset = {}, 0
    for name, shape in own.items():
        n = torch.Size(shape).numel()
        state[name] = params[offset:offset + n].view(shape)
        offset += n
    return _matched(file, state, shapes, preset), file, str(record["run_id"])


def _diffusers_config_problem(config: Mapping[str, Any], net: Any) -> str | None:
    """The first UNet2DModel argument where a save_pretrained config differs from the preset's network, said as
    "KEY is X there, Y in the preset"; None when they match (a key the file lacks has UNet2DModel's default)."""
    from diffusers.models.unets.unet_2d import UNet2DModel

    defaults = {k: p.default for k, p in inspect.signature(UNet2DModel.__init__).parameters.items()
                if p.default is not inspect.Parameter.empty}

    def norm(v: Any) -> Any:
        return tuple(norm(x) for x in v) if isinstance(v, (list, tuple)) else v

    if config.get("_class_name") != "UNet2DModel":
        return f"_class_name is {config.get('_class_name')!r} there, 'UNet2DModel' in the preset"
    for key, want in net.unet.config.items():
        if key.startswith("_") or key in DIFFUSERS_FREE:
            continue
        have = config.get(key, defaults.get(key))
        if norm(have) != norm(want):
            return f"{key} is {norm(have)!r} there, {norm(want)!r} in the preset"
    return None


def _from_diffusers(path: Path, preset: str, shapes: Mapping[str, tuple[int, ...]], net: Any) -> tuple[torch.Tensor, Path]:
    config = path / runfolder.CONFIG
    if presets.family(preset) != "diffusers":
        raise _refuse(f"{config} is a diffusers model's; train.model={preset} is not a diffusers preset (those: "
                              f"{', '.join(presets.DIFFUSERS)}): set train.model to the preset the folder was saved from")
    problem = _diffusers_config_problem(_read_json(config), net)
    if problem is not None:
        raise _refuse(f"{config} does not match train.model={preset}: {problem}")
    file = next((path / name for name in DIFFUSERS_WEIGHTS if (path / name).is_file()), None)
    if file is None:
        raise _refuse(f"{path} holds no weights file ({' or '.join(DIFFUSERS_WEIGHTS)}) beside its config.json")
    state = {DIFFUSERS_PREFIX + k: v for k, v in _state_dict(file).items()}
    return _matched(file, state, shapes, preset), file


def _from_file(file: Path, preset: str, shapes: Mapping[str, tuple[int, ...]]) -> torch.Tensor:
    state = _state_dict(file)
    if presets.family(preset) == "diffusers" and not any(k.startswith(DIFFUSERS_PREFIX) for k in state):
        state = {DIFFUSERS_PREFIX + k: v for k, v in state.items()}  # UNet2DModel.state_dict()'s own names
    return _matched(file, state, shapes, preset)


def load_init(value: str, preset: str, image_shape: tuple[int, ...]) -> InitWeights:
    """The starting weights at train.init=`value` for the resolved `preset` (not "auto") on `image_shape` samples:
    checked against that network and flattened in its order (ConfigError naming the file and the difference)."""
    path = init_path(value)
    kind = source_kind(path)
    shapes, net = _network_shapes(preset, tuple(image_shape))
    if kind == "run":
        flat, file, run_id = _from_run(path, preset, shapes)
        return InitWeights(flat, kind, path, file, run_id)
    if kind == "diffusers":
        flat, file = _from_diffusers(path, preset, shapes, net)
        return InitWeights(flat, kind, path, file)
    return InitWeights(_from_file(path, preset, shapes), kind, path, path)


def _fingerprint(path: Path) -> tuple[Any, ...]:
    """What changes when the weights at `path` may have: size and mtime of it and, for a folder, of what it holds."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and p.name != runfolder.LOCK)
    out = []
    for p in files:
        try:
            st = p.stat()
        except OSError:
            continue
        out.append((str(p), st.st_size, st.st_mtime_ns))
    return tuple(out)


@functools.lru_cache(maxsize=16)
def _digest(path: str, preset: str, image_shape: tuple[int, ...], fingerprint: tuple[Any, ...]) -> str:
    return load_init(path, preset, image_shape).sha256


def init_digest(value: str, preset: str, image_shape: tuple[int, ...]) -> str:
    """`load_init(...).sha256`, read once per state of the files (config validation asks it for every config)."""
    path = init_path(value)
    source_kind(path)  # a missing path: its own refusal, before any listing
    return _digest(str(path), preset, tuple(image_shape), _fingerprint(path))


def init_record(cfg: RunConfig) -> dict[str, Any] | None:
    """What the run folder says of its starting point (metrics.json "init"): the path, what it is, the file read,
    the weights' sha256, what they were trained as and, for a run's folder, its run id; None without train.init."""
    t = cfg.train
    if not t.init:
        return None
    path = init_path(t.init)
    try:  # read when the run ends: weights moved away since it started (and were checked) leave their kind unsaid
        kind = source_kind(path)
    except ConfigError:
        kind = None
    record: dict[str, Any] = {"path": str(path), "kind": kind, "sha256": t.init_sha256,
                              "objective": t.init_objective or t.objective}
    if kind == "run":
        record["run_id"] = str(_read_json(path / runfolder.CONFIG).get("run_id"))
    return record
