"""The model presets `train.model` names: ONE table (`PRESETS`), from which everything else is derived.

Three families:
- `builtin`: the benchmark's own time-conditioned UNet (benchmark/engine/model.py builds it from the
  preset's `UNetSpec` here);
- `diffusers`: Hugging Face diffusers' `UNet2DModel` (benchmark/engine/diffusers_models.py), an
  optional extra (`pip install 'dfbench[diffusers]'`, pinned to `DIFFUSERS_VERSION`: the flat
  parameter layout is the module's parameter names and order, so another release could train
  another network under the same run id);
- `mlp`: the benchmark's own time-conditioned residual MLP over the flattened sample (benchmark/engine/
  model.py `MLP`, from the preset's `MLPSpec`), for vector data such as the low-dimensional ground-truth
  mixtures (`gmm:dimD`, samples of shape [1, 1, D]) on which a UNet's convolutions have no image to run on;
  it runs on image-shaped data too.

Each preset's row says its family, the network's arguments (a `UNetSpec`, an `MLPSpec` or the `UNet2DModel`
keywords) and its planning cost on a CPU. Derived from the table: config.py's `Preset` Literal and
its check of train.model, the model factory's arguments (engine/model.py `build_model`), the grid
planner's costs (grid/plan.py), what `auto` resolves to per dataset (`AUTO`, `auto_preset`), and the facts config
validation checks before any work -- the family, what it needs installed, which image sides its
down-sampling takes (`side_multiple`, `min_side`), whether the network can be rebuilt at another width
(`width_aware`, `network_spec`). No other module lists preset names (tests/unit/test_presets.py checks it).
This module is core: no torch, no diffusers import.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, Literal, Mapping

Family = Literal["builtin", "diffusers", "mlp"]


@dataclass(frozen=True)
class UNetSpec:
    """The built-in UNet's architecture (benchmark/engine/model.py `UNet`)."""

    channels: int  # base width
    mults: tuple[int, ...]  # width multiplier per resolution level
    blocks: int  # residual blocks per level
    attn_levels: tuple[int, ...]  # levels (0 = full resolution) with self-attention
    mid_attn: bool = True  # self-attention in the middle block (lowest resolution)
    dropout: float = 0.0


@dataclass(frozen=True)
class MLPSpec:
    """The built-in residual MLP's architecture (benchmark/engine/model.py `MLP`): the flattened sample (D = C*H*W)
    in and out, `blocks` residual blocks of width `channels` in between, each told the time. The hidden width is
    named as the UNet's base width, `channels`, because it is what a width sub-model narrows (HeteroFL & co. build
    the network at `replace(spec, channels=c')` and slice every hidden layer's leading units); D never narrows."""

    channels: int  # hidden width (also the sinusoidal time features' and the time embedding's width)
    blocks: int  # residual blocks
    dropout: float = 0.0

#: the one diffusers release the diffusers presets are defined (and their run ids valid) for
DIFFUSERS_VERSION = "0.42.1"
DIFFUSERS_EXTRA = "pip install 'dfbench[diffusers]'"

# UNet2DModel keyword arguments (in_channels / out_channels come from the dataset). Every preset has
# dropout 0: nn.Dropout draws from torch's global generator, which is neither seeded per client and
# round nor checkpointed, so dropout would break "same seed, same result" (a resumed run and a run on
# N ranks would draw other masks); the built-in presets have dropout 0 for the same reason.

# For tests and quick CPU runs: two levels (widths 8-16), one residual block each, attention at
# the lower level and in the middle (so the attention path is exercised); any even image side.
_TINY_UNET2D: dict[str, Any] = {
    "block_out_channels": (8, 16),
    "layers_per_block": 1,
    "down_block_types": ("DownBlock2D", "AttnDownBlock2D"),
    "up_block_types": ("AttnUpBlock2D", "UpBlock2D"),
    "attention_head_dim": None,
    "norm_num_groups": 4,
    "norm_eps": 1e-6,
    "downsample_padding": 0,
    "flip_sin_to_cos": False,
    "freq_shift": 1,
    "dropout": 0.0,
}

# DDPM's CIFAR-10 network (Ho et al. 2020, Appendix B: 35.7M parameters): widths 128-256-256-256,
# two residual blocks per level, self-attention at 16x16 and in the middle, GroupNorm(32), the
# sinusoidal embedding of the original code (sin first, shift 1). As google/ddpm-cifar10-32's
# config, except dropout (the paper trains with 0.1; see above).
_DDPM_CIFAR10_UNET2D: dict[str, Any] = {
    "block_out_channels": (128, 256, 256, 256),
    "layers_per_block": 2,
    "down_block_types": ("DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"),
    "up_block_types": ("UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
    "attention_head_dim": None,  # one head over all channels, as DDPM's attention
    "norm_num_groups": 32,
    "norm_eps": 1e-6,
    "downsample_padding": 0,
    "flip_sin_to_cos": False,
    "freq_shift": 1,
    "dropout": 0.0,
}


@dataclass(frozen=True)
class ModelPreset:
    """One row of the preset table."""

    family: Family
    #: rough cost of one sample-gradient evaluation (forward, backward, Adam share) in ms on 2 CPU cores; one
    #: sampler network evaluation costs about a third of it (grid/plan.py): a planning aid, +-2x
    cpu_ms_per_sample_grad: float
    unet: UNetSpec | None = None  # the built-in family's architecture
    diffusers: Mapping[str, Any] | None = None  # the diffusers family's UNet2DModel keywords (read-only)
    mlp: MLPSpec | None = None  # the mlp family's architecture


# Sizes: "tiny" for tests; "small*" fit a CPU budget (~0.2 s per batch-64 step on 2 cores for small28);
# "base*" are the GPU presets of the paper-scale grids. CPU costs are scaled from the small28 figure by
# relative timings; the diffusers presets' ratios to small28 were timed beside it (one thread, 2-core AMD
# EPYC Zen 4): diffusers-tiny 0.88x, diffusers-ddpm-cifar10 98x (568 ms against 5.8 ms a sample-gradient).
# ddpm32 is DDPM's CIFAR-10 network (the shape of diffusers-ddpm-cifar10: widths 128-256-256-256, 2 blocks per
# level, attention at 16x16 = level 1 and in the middle, time embedding 512) built from the built-in UNet, so the
# width sub-models (HeteroFL, FedRolex, FjORD) can slice it; its norms are the built-in GroupNorm(gcd(8, C)), not
# GroupNorm(32). Its parameter count equals diffusers-ddpm-cifar10's exactly (35,746,307 with 3 channels,
# 35,741,697 with 1; the paper's 35.7M), and so do its FLOPs. Its cost is small28's scaled by the FLOPs of one
# sample-gradient (forward + backward, torch.utils.flop_counter at 32x32 against small28's at 28x28):
# 37.32 GFLOP / 0.281 GFLOP = 132.8x, i.e. 398.5 ms; the same ratio gives the diffusers twin 398.5 against its
# timed 290 (larger convolutions run more FLOPs a second on a CPU), so read it as an upper estimate.
# The MLP presets' ratios to small28 were timed beside it (one thread, batch 64, Adam; 2-core AMD EPYC, shared):
# mlp 0.032x at D = 64 (0.041x at D = 784, 28x28 images flattened), mlp-tiny 0.010x (per-op overhead dominates).
PRESETS: Mapping[str, ModelPreset] = types.MappingProxyType({  # each family small to large
    "tiny": ModelPreset("builtin", 1.0, UNetSpec(channels=8, mults=(1, 2), blocks=1, attn_levels=(), mid_attn=False)),
    "small28": ModelPreset("builtin", 3.0, UNetSpec(channels=16, mults=(1, 2, 2), blocks=1, attn_levels=())),  # 28 -> 14 -> 7
    "small32": ModelPreset("builtin", 11.0, UNetSpec(channels=32, mults=(1, 2, 2), blocks=1, attn_levels=())),  # 32 -> 16 -> 8
    "base28": ModelPreset("builtin", 36.0, UNetSpec(channels=64, mults=(1, 2, 2), blocks=2, attn_levels=(2,))),  # 28 -> 14 -> 7
    "base32": ModelPreset("builtin", 67.0, UNetSpec(channels=64, mults=(1, 2, 2, 2), blocks=2, attn_levels=(2,))),  # 32 -> 16 -> 8 -> 4
    "ddpm32": ModelPreset("builtin", 398.5, UNetSpec(channels=128, mults=(1, 2, 2, 2), blocks=2, attn_levels=(1,))),  # 32 -> 16 -> 8 -> 4
    "diffusers-tiny": ModelPreset("diffusers", 2.6, diffusers=types.MappingProxyType(_TINY_UNET2D)),
    "diffusers-ddpm-cifar10": ModelPreset("diffusers", 290.0, diffusers=types.MappingProxyType(_DDPM_CIFAR10_UNET2D)),
    "mlp-tiny": ModelPreset("mlp", 0.03, mlp=MLPSpec(channels=32, blocks=2)),  # tests
    # the low-dimensional mixtures (auto for vectors). Width 128: on gmm:dim8 (seed 99, FedAvg 10 clients x 10 steps
    # x batch 64, 256 rounds, EMA 0.9) score_kl 3.83 at width 32 (lr 1e-2), 2.64 at 64 (3e-3), 1.99 / 1.53 at 128
    # (3e-3 / 1e-2); width 256 trained 4k samples/s against 15k at 128 in lockstep (results/gt-demo/width_scan.md;
    # measured while the read-out was zero-initialised, which model.py no longer does)
    "mlp": ModelPreset("mlp", 0.1, mlp=MLPSpec(channels=128, blocks=3)),
})

#: every preset name train.model takes besides "auto", each family small to large
ALL: tuple[str, ...] = tuple(PRESETS)
#: the built-in UNet's presets, small to large
BUILTIN: tuple[str, ...] = tuple(n for n, p in PRESETS.items() if p.family == "builtin")
#: the built-in MLP's presets, small to large
MLP: tuple[str, ...] = tuple(n for n, p in PRESETS.items() if p.family == "mlp")
#: the presets whose network can be rebuilt at another width (`width_aware`): the built-in UNet's and MLP's
WIDTH_AWARE: tuple[str, ...] = BUILTIN + MLP
#: diffusers preset -> its UNet2DModel arguments (read-only)
DIFFUSERS: Mapping[str, Mapping[str, Any]] = types.MappingProxyType(
    {n: p.diffusers for n, p in PRESETS.items() if p.diffusers is not None})
#: what train.model=auto trains on a built-in dataset; other data: `auto_preset`
AUTO: Mapping[str, str] = types.MappingProxyType({"fmnist": "small28", "svhn": "small32", "cifar10": "small32"})
#: what train.model=auto trains on vector data (a sample side of 1, e.g. the low-dimensional mixtures gmm:dimD)
AUTO_VECTOR = "mlp"


def auto_by_name(dataset: str) -> str | None:
    """What train.model=auto trains on `dataset`, when its name alone says it (no data read): a built-in dataset's
    `AUTO`; a ground-truth mixture (datasets/gmm.py): the MLP for the low-dimensional family (gmm:dimD, samples
    [1, 1, D]), Fashion-MNIST's preset for the image-shaped one fitted to it (gmm:fmnistS, grey [1, S, S]).
    None: decided by the data's shape (`auto_preset`)."""
    if dataset in AUTO:
        return AUTO[dataset]
    if dataset.startswith("gmm:dim"):
        return AUTO_VECTOR
    if dataset.startswith("gmm:"):
        return AUTO["fmnist"]
    return None


def resolve_name(name: str, dataset: str) -> str:
    """train.model with "auto" resolved: by the dataset's name where it says (`auto_by_name`: no data read), else
    by its samples' shape (`auto_preset`; data users bring is read to answer)."""
    if name != "auto":
        return name
    named = auto_by_name(dataset)
    if named is not None:
        return named
    from dfbench.datasets import data_info  # layer 0: read only for data whose name does not say

    info = data_info(dataset)
    return auto_preset(dataset, int(info["channels"]), tuple(int(v) for v in info["image_shape"]))


def auto_preset(dataset: str, channels: int, image_shape: tuple[int, ...] | None = None) -> str:
    """The preset train.model=auto resolves to: by the dataset's name where it says (`auto_by_name`); else by its
    samples (data users bring): vectors (a side of 1 in `image_shape` (C, H, W)) -> the MLP, grey images ->
    small28 (as Fashion-MNIST), RGB -> small32 (as CIFAR-10)."""
    named = auto_by_name(dataset)
    if named is not None:
        return named
    if image_shape is not None and min(image_shape[1:]) == 1:
        return AUTO_VECTOR
    return "small28" if channels == 1 else "small32"


def unet_spec(name: str) -> UNetSpec:
    """The built-in UNet's architecture of preset `name` (KeyError for another family's or an unknown one)."""
    spec = PRESETS[name].unet
    if spec is None:
        raise KeyError(f"{name!r} is not a built-in UNet preset; those are: {', '.join(BUILTIN)}")
    return spec


def mlp_spec(name: str) -> MLPSpec:
    """The built-in MLP's architecture of preset `name` (KeyError for another family's or an unknown one)."""
    spec = PRESETS[name].mlp
    if spec is None:
        raise KeyError(f"{name!r} is not an MLP preset; those are: {', '.join(MLP)}")
    return spec


def network_spec(name: str) -> UNetSpec | MLPSpec:
    """The architecture of a width-aware preset (`WIDTH_AWARE`), the spec a width sub-model rebuilds at another
    `channels` (`dataclasses.replace(spec, channels=c)`; engine/model.py `build_network`). KeyError for a
    diffusers preset or an unknown one."""
    row = PRESETS[name]
    spec = row.unet or row.mlp
    if spec is None:
        raise KeyError(f"{name!r} cannot be rebuilt at another width; those that can are: {', '.join(WIDTH_AWARE)}")
    return spec


def family(name: str) -> Family:
    """"builtin", "diffusers" or "mlp" (KeyError for an unknown preset; "auto" counts as "builtin": it resolves to
    a built-in UNet, or to the MLP on vector data, both the benchmark's own, width-aware, with nothing to install)."""
    if name == "auto" or name in BUILTIN:
        return "builtin"
    if name in DIFFUSERS:
        return "diffusers"
    if name in MLP:
        return "mlp"
    raise KeyError(f"unknown model preset {name!r}; allowed: auto, {', '.join(ALL)}")


def width_aware(name: str) -> bool:
    """Can the network be rebuilt at another base width with its parameters as leading channel blocks
    of the full one (what HeteroFL's width sub-models slice)? The built-in UNet and MLP can (the MLP's
    hidden units are its channels); a diffusers UNet2DModel has no such builder (its widths are a config
    tuple, its norms fixed group counts)."""
    return family(name) in ("builtin", "mlp")


def side_multiple(name: str) -> int:
    """The image side must be a multiple of this: 2^(levels - 1) for a diffusers UNet2DModel (its
    up-sampling doubles, so an odd side at a lower level leaves the skip connections a pixel apart);
    1 for the built-in UNet, which resizes to its skip connections, and for the MLP, which flattens."""
    if family(name) == "diffusers":
        return 2 ** (len(DIFFUSERS[name]["block_out_channels"]) - 1)
    return 1


def min_side(name: str) -> int:
    """The smallest image side the preset takes: 2 for a UNet (either family: a side of 1 is no image but a
    vector, on which 3x3 convolutions see padding and the down-sampling has nothing to halve; use the MLP),
    1 for the MLP, which takes any [C, H, W] sample flattened."""
    return 1 if family(name) == "mlp" else 2


def diffusers_problem() -> str | None:
    """Why the diffusers presets cannot run here (not installed, another release), or None."""
    from importlib import metadata
    from importlib.util import find_spec

    if find_spec("diffusers") is None:
        return f"Hugging Face diffusers is not installed: {DIFFUSERS_EXTRA}"
    try:
        found = metadata.version("diffusers")
    except metadata.PackageNotFoundError:  # importable without metadata (a source checkout): trust it
        return None
    if found != DIFFUSERS_VERSION:
        return (f"the diffusers presets are defined for diffusers=={DIFFUSERS_VERSION} (their parameter layout is "
                f"the release's), found {found}: {DIFFUSERS_EXTRA}")
    return None
