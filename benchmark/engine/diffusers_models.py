"""Hugging Face diffusers' `UNet2DModel` as a train.model preset, behind the built-in UNet's call.

The optional extra `pip install 'dfbench[diffusers]'` (pinned: benchmark/core/presets.py holds the
release and each preset's UNet2DModel arguments). diffusers is imported when a network is built,
never at import time, so the package works without it; config validation refuses a diffusers
preset where it is missing, before any work.

The wrapper gives the network the benchmark's interface: `net(x, t) -> output`, t a float tensor
[B] in [0, 1] (DDPM step t_i / T, or the flow-matching time). As the built-in UNet's sinusoidal
embedding (benchmark/engine/model.py `timestep_embedding`), the time reaches UNet2DModel as
1000 t: DDPM's integer steps for T = 1000, which the DDPM configuration's embedding was made for.

Everything else the engine does to a network holds as for the built-in UNet: its parameters are
flattened into one buffer (`model.flatten_`; the layout names are "unet.<diffusers name>"), its
initialization draws from torch's global generator, which `build_context` seeds from the run's seed,
and under vmap (batched clients) the attention runs the classic processor (`explicit_attention`),
whose matmul and softmax vmap batches, instead of the fused kernel.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from dfbench.benchmark.core import presets

# time in [0, 1] -> the step UNet2DModel embeds (as model.timestep_embedding scales it)
TIME_SCALE = 1000.0


def _unet2d(preset: str, in_ch: int) -> nn.Module:
    problem = presets.diffusers_problem()
    if problem is not None:
        raise ImportError(f"train.model={preset} needs diffusers: {problem}")
    from diffusers.models.unets.unet_2d import UNet2DModel

    return UNet2DModel(in_channels=in_ch, out_channels=in_ch, **dict(presets.DIFFUSERS[preset]))


class DiffusersUNet(nn.Module):
    """A diffusers UNet2DModel called as the benchmark's networks are: forward(x, t), t in [0, 1]."""

    def __init__(self, preset: str, in_ch: int) -> None:
        super().__init__()
        self.preset = preset
        self.unet = _unet2d(preset, in_ch)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.unet(x, t.float() * TIME_SCALE, return_dict=False)[0]

    @contextlib.contextmanager
    def explicit_attention(self) -> Iterator[None]:
        """Every attention computes softmax(QK^T / sqrt d) V in plain matmuls (diffusers' AttnProcessor)
        inside, for `model.product_attention_in` (vmapped clients); the fused processor afterwards."""
        from diffusers.models.attention_processor import Attention, AttnProcessor

        blocks = [m for m in self.unet.modules() if isinstance(m, Attention)]
        before = [m.processor for m in blocks]
        for m in blocks:
            m.set_processor(AttnProcessor())
        try:
            yield
        finally:
            for m, processor in zip(blocks, before):
                m.set_processor(processor)


def build_diffusers(preset: str, in_ch: int) -> DiffusersUNet:
    """The diffusers preset's network for `in_ch` image channels (initialized from torch's global generator)."""
    if presets.family(preset) != "diffusers":
        raise ValueError(f"{preset!r} is not a diffusers preset; diffusers presets: {', '.join(presets.DIFFUSERS)}")
    return DiffusersUNet(preset, in_ch)
