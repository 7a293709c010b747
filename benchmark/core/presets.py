"""The model presets `train.model` names, and what a config check needs to know of each.

Two families:
- `builtin`: the benchmark's own time-conditioned UNet (benchmark/engine/model.py, `PRESETS` there);
- `diffusers`: Hugging Face diffusers' `UNet2DModel` (benchmark/engine/diffusers_models.py), an
  optional extra (`pip install 'dfbench[diffusers]'`, pinned to `DIFFUSERS_VERSION`: the flat
  parameter layout is the module's parameter names and order, so another release could train
  another network under the same run id).

This module is core (no torch, no diffusers import): the facts here are what config validation
checks before any work -- the preset's family, what it needs installed, which image sides its
down-sampling takes, whether the network can be rebuilt at another width -- and, for the diffusers
presets, the `UNet2DModel` arguments themselves (one source: the engine builds from them).
"""

from __future__ import annotations

import types
from typing import Any, Literal, Mapping

Family = Literal["builtin", "diffusers"]

#: the built-in UNet's presets, small to large (their specs: benchmark/engine/model.py PRESETS)
BUILTIN: tuple[str, ...] = ("tiny", "small28", "small32", "base28", "base32")

#: the one diffusers release the diffusers presets are defined (and their run ids valid) for
DIFFUSERS_VERSION = "0.42.1"
DIFFUSERS_EXTRA = "pip install 'dfbench[diffusers]'"

# UNet2DModel keyword arguments (in_channels / out_channels come from the dataset). Every preset has
# dropout 0: nn.Dropout draws from torch's global generator, which is neither seeded per client and
# round nor checkpointed, so dropout would break "same seed, same result" (a resumed run and a run on
# N ranks would draw other masks); the built-in presets have dropout 0 for the same reason.
_DIFFUSERS: dict[str, dict[str, Any]] = {  # small to large
    # for tests and quick CPU runs: two levels (widths 8-16), one residual block each, attention at
    # the lower level and in the middle (so the attention path is exercised); any even image side
    "diffusers-tiny": {
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
    },
    # DDPM's CIFAR-10 network (Ho et al. 2020, Appendix B: 35.7M parameters): widths 128-256-256-256,
    # two residual blocks per level, self-attention at 16x16 and in the middle, GroupNorm(32), the
    # sinusoidal embedding of the original code (sin first, shift 1). As google/ddpm-cifar10-32's
    # config, except dropout (the paper trains with 0.1; see above).
    "diffusers-ddpm-cifar10": {
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
    },
}
#: diffusers preset -> its UNet2DModel arguments (read-only)
DIFFUSERS: Mapping[str, Mapping[str, Any]] = types.MappingProxyType(
    {name: types.MappingProxyType(kw) for name, kw in _DIFFUSERS.items()})

#: every preset name train.model takes besides "auto" (benchmark/core/config.py's Preset lists them too)
ALL: tuple[str, ...] = (*BUILTIN, *DIFFUSERS)


def family(name: str) -> Family:
    """"builtin" or "diffusers" (KeyError for an unknown preset; "auto" resolves to a built-in one)."""
    if name == "auto" or name in BUILTIN:
        return "builtin"
    if name in DIFFUSERS:
        return "diffusers"
    raise KeyError(f"unknown model preset {name!r}; allowed: auto, {', '.join(ALL)}")


def width_aware(name: str) -> bool:
    """Can the network be rebuilt at another base width with its parameters as leading channel blocks
    of the full one (what HeteroFL's width sub-models slice)? The built-in UNet can; a diffusers
    UNet2DModel has no such builder (its widths are a config tuple, its norms fixed group counts)."""
    return family(name) == "builtin"


def side_multiple(name: str) -> int:
    """The image side must be a multiple of this: 2^(levels - 1) for a diffusers UNet2DModel (its
    up-sampling doubles, so an odd side at a lower level leaves the skip connections a pixel apart);
    1 for the built-in UNet, which resizes to its skip connections."""
    if family(name) == "diffusers":
        return 2 ** (len(DIFFUSERS[name]["block_out_channels"]) - 1)
    return 1


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
