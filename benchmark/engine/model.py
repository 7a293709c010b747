"""A small time-conditioned UNet (DDPM, Ho et al. 2020, scaled down), a time-conditioned residual MLP for
vector data, and the flat parameter layout.

`build_model` builds any train.model preset of benchmark/core/presets.py's table: this UNet from the
preset's `UNetSpec`, the MLP from its `MLPSpec`, or diffusers' UNet2DModel (benchmark/engine/diffusers_models.py;
the optional extra) behind the same call. `build_network` builds the UNet or the MLP from a spec (another
width of the run's network, for the width sub-models).

The same network serves both objectives: it takes a continuous time in [0, 1]
(DDPM step t_i / T, or the flow-matching time t) and predicts epsilon (DDPM) or
the velocity eps - x0 (flow matching).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn
import torch.nn.functional as F

from dfbench.benchmark.core import presets
from dfbench.benchmark.core.presets import MLPSpec, UNetSpec


def resolve_preset(name: str, dataset: str) -> str:
    """train.model with "auto" resolved (`presets.resolve_name`: by the dataset's name where it says -- a built-in
    dataset, a gmm: mixture --, else by its samples: vectors -> the MLP, grey or RGB images -> a UNet)."""
    return presets.resolve_name(name, dataset)


def _groups(ch: int) -> int:
    return math.gcd(8, ch)


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of continuous t in [0, 1] (scaled by 1000 as DDPM's integer steps)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = (t.float() * 1000.0)[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=1)


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, tdim: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(_groups(cin), cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.temb = nn.Linear(tdim, cout)
        self.norm2 = nn.GroupNorm(_groups(cout), cout)
        self.drop = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.temb(temb)[:, :, None, None]
        h = self.conv2(self.drop(F.silu(self.norm2(h))))
        return self.skip(x) + h


def product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v, written out: the maths of scaled_dot_product_attention in ops
    that torch.func.vmap batches (its fused kernels have no batching rule, so under vmap they run
    once per client in a Python loop, with a "performance drop" warning, on CPU and CUDA alike)."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    return torch.matmul(torch.softmax(scores, dim=-1), v)


class Attention(nn.Module):
    # True inside `product_attention_in` (batched clients); the fused kernel otherwise (one
    # network: the sequential clients and sampling, whose results are committed)
    explicit: bool = False

    def __init__(self, ch: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(_groups(ch), ch)
        self.qkv = nn.Conv2d(ch, 3 * ch, 1)
        self.out = nn.Conv2d(ch, ch, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, c, h * w).transpose(-1, -2).unbind(1)
        if self.explicit:
            y = product_attention(q, k, v)
        else:
            y = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]
        return x + self.out(y.transpose(-1, -2).reshape(b, c, h, w))


@contextlib.contextmanager
def product_attention_in(model: nn.Module) -> Iterator[None]:
    """Every Attention of `model` computes `product_attention` inside (for vmapped clients); a
    module of another family that offers `explicit_attention()` (a context manager: the diffusers
    presets, benchmark/engine/diffusers_models.py) switches its own attention the same way."""
    blocks = [m for m in model.modules() if isinstance(m, Attention)]
    others = [m for m in model.modules() if callable(getattr(m, "explicit_attention", None))]
    for m in blocks:
        m.explicit = True
    try:
        with contextlib.ExitStack() as stack:
            for m in others:
                stack.enter_context(m.explicit_attention())
            yield
    finally:
        for m in blocks:
            m.explicit = False


class UNet(nn.Module):
    def __init__(self, in_ch: int, spec: UNetSpec) -> None:
        super().__init__()
        ch, tdim = spec.channels, spec.channels * 4
        self.base = ch
        self.time = nn.Sequential(nn.Linear(ch, tdim), nn.SiLU(), nn.Linear(tdim, tdim))
        self.inp = nn.Conv2d(in_ch, ch, 3, padding=1)
        self.down = nn.ModuleList()
        skips, cur = [ch], ch
        for lvl, m in enumerate(spec.mults):
            for _ in range(spec.blocks):
                blk = nn.ModuleList([ResBlock(cur, ch * m, tdim, spec.dropout)])
                cur = ch * m
                if lvl in spec.attn_levels:
                    blk.append(Attention(cur))
                self.down.append(blk)
                skips.append(cur)
            if lvl < len(spec.mults) - 1:
                self.down.append(nn.ModuleList([nn.Conv2d(cur, cur, 3, stride=2, padding=1)]))
                skips.append(cur)
        mid_attn: nn.Module = Attention(cur) if spec.mid_attn else nn.Identity()
        self.mid = nn.ModuleList([ResBlock(cur, cur, tdim, spec.dropout), mid_attn, ResBlock(cur, cur, tdim, spec.dropout)])
        self.up = nn.ModuleList()
        for lvl, m in reversed(list(enumerate(spec.mults))):
            for _ in range(spec.blocks + 1):
                blk = nn.ModuleList([ResBlock(cur + skips.pop(), ch * m, tdim, spec.dropout)])
                cur = ch * m
                if lvl in spec.attn_levels:
                    blk.append(Attention(cur))
                self.up.append(blk)
            if lvl > 0:
                self.up.append(nn.ModuleList([nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(cur, cur, 3, padding=1)]))
        self.out = nn.Sequential(nn.GroupNorm(_groups(cur), cur), nn.SiLU(), nn.Conv2d(cur, in_ch, 3, padding=1))

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        temb = self.time(timestep_embedding(t, self.base))
        h = self.inp(x)
        hs = [h]
        for blk in self.down:
            if isinstance(blk[0], ResBlock):
                h = blk[0](h, temb)
                for extra in blk[1:]:
                    h = extra(h)
            else:
                h = blk[0](h)
            hs.append(h)
        h = self.mid[2](self.mid[1](self.mid[0](h, temb)), temb)
        for blk in self.up:
            if isinstance(blk[0], ResBlock):
                skip = hs.pop()
                if skip.shape[-2:] != h.shape[-2:]:  # an odd side (7 -> 4 -> 8 against 7); both sides: H != W too
                    h = F.interpolate(h, size=skip.shape[-2:], mode="nearest")
                h = blk[0](torch.cat([h, skip], dim=1), temb)
                for extra in blk[1:]:
                    h = extra(h)
            else:
                h = blk[1](blk[0](h))
        return self.out(h)


class MLPBlock(nn.Module):
    """ResBlock's pattern on vectors: x + fc2(SiLU(norm2(fc1(SiLU(norm1(x))) + temb(t)))), pre-norm, the time
    embedding added to the hidden layer (as the UNet's ResBlock adds it to its feature maps)."""

    def __init__(self, width: int, tdim: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, width)
        self.temb = nn.Linear(tdim, width)
        self.norm2 = nn.LayerNorm(width)
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.fc1(F.silu(self.norm1(x))) + self.temb(temb)
        return x + self.fc2(self.drop(F.silu(self.norm2(h))))


class MLP(nn.Module):
    """A time-conditioned residual MLP over the flattened sample: [B, C, H, W] -> the same shape, D = C*H*W in and
    out, `spec.blocks` residual blocks of width `spec.channels` between. For vector data (the low-dimensional
    ground-truth mixtures, samples [1, 1, D]), where a UNet has no image to convolve; it runs on images too.

    The time is the UNet's: the sinusoidal features of t in [0, 1] (`timestep_embedding`, `base` = channels of
    them) through a two-layer SiLU MLP, added to every block's hidden layer. Its attributes mirror the UNet's
    where the width sub-models read them (methods/heterofl.py): `base` (the sinusoidal width), `time[0]` (the
    layer that reads those features, kept whole in a narrow network); every hidden Linear's in/out features and
    every LayerNorm are the "channels" a width sub-model slices; `inp`'s inputs and `out`'s outputs are D, kept.
    """

    def __init__(self, in_shape: Sequence[int], spec: MLPSpec) -> None:
        super().__init__()
        d, ch = math.prod(in_shape), spec.channels
        self.base = ch
        self.time = nn.Sequential(nn.Linear(ch, ch), nn.SiLU(), nn.Linear(ch, ch))
        self.inp = nn.Linear(d, ch)
        self.blocks = nn.ModuleList([MLPBlock(ch, ch, spec.dropout) for _ in range(spec.blocks)])
        self.out = nn.Sequential(nn.LayerNorm(ch), nn.SiLU(), nn.Linear(ch, d))
        # PyTorch's default init everywhere, the read-out included, as the built-in UNet. Not zero-initialised
        # (DDPM's `zero_module`): magnitude-based masks (topk_prune) tie every entry of an all-zero layer, keep
        # the same half of it every round and never train the other half (make gt-demo measured exactly half of
        # the read-out still 0 after 128 rounds of top-k at keep 0.5, its score error 8x FedAvg's).

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        temb = self.time(timestep_embedding(t, self.base))
        h = self.inp(x.flatten(1))
        for blk in self.blocks:
            h = blk(h, temb)
        return self.out(h).reshape(x.shape)


def _shape(in_shape: int | Sequence[int]) -> tuple[int, ...]:
    return (int(in_shape),) if isinstance(in_shape, int) else tuple(int(v) for v in in_shape)


def build_network(spec: UNetSpec | MLPSpec, in_shape: int | Sequence[int]) -> nn.Module:
    """The built-in network of an architecture spec (`presets.network_spec`, or it at another width:
    `dataclasses.replace(spec, channels=c)`) for samples of shape `in_shape` = (C, H, W): a UNet needs only C
    (an int will do), the MLP the whole shape (its input and output layers are C*H*W wide)."""
    shape = _shape(in_shape)
    if isinstance(spec, UNetSpec):
        return UNet(shape[0], spec)
    if isinstance(spec, MLPSpec):
        if len(shape) != 3:
            raise ValueError(f"the MLP needs the samples' whole shape (C, H, W), got {shape}: its input and output "
                             "layers are C*H*W wide")
        return MLP(shape, spec)
    raise TypeError(f"no built-in network for {type(spec).__name__}")


def build_model(preset: str, in_shape: int | Sequence[int]) -> nn.Module:
    """The network of a resolved preset (not "auto") of benchmark/core/presets.py for samples of shape
    `in_shape` = (C, H, W) (the UNets need only C: an int will do): the built-in UNet from its `UNetSpec`, the
    built-in MLP from its `MLPSpec` or, for a diffusers preset, diffusers' UNet2DModel behind the same call
    (benchmark/engine/diffusers_models.py). Its initialization draws from torch's global generator."""
    if preset in presets.WIDTH_AWARE:
        return build_network(presets.network_spec(preset), in_shape)
    if preset in presets.DIFFUSERS:
        from dfbench.benchmark.engine.diffusers_models import build_diffusers

        return build_diffusers(preset, _shape(in_shape)[0])
    raise ValueError(f"unknown model preset {preset!r}; allowed: {', '.join(presets.ALL)}")


# -- the flat parameter vector --------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    """Where each named parameter lives in the flat vector."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    total: int

    @property
    def numels(self) -> tuple[int, ...]:
        return tuple(math.prod(s) for s in self.shapes)

    def slices(self) -> list[tuple[str, slice, tuple[int, ...]]]:
        return [(n, slice(o, o + math.prod(s)), s) for n, o, s in zip(self.names, self.offsets, self.shapes)]

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """name -> view of `flat` with the parameter's shape (no copy)."""
        return {n: flat[sl].view(s) for n, sl, s in self.slices()}

    def is_weight(self) -> list[bool]:
        """True for conv/linear weight matrices (ndim >= 2), False for biases and norm scales."""
        return [len(s) >= 2 for s in self.shapes]


def flatten_(model: nn.Module) -> tuple[torch.Tensor, Layout]:
    """Re-point every parameter of `model` at a slice of ONE flat buffer; return (buffer, layout).

    After this, writing the buffer (flat.copy_(x)) sets the whole model in one op, and
    the model's parameters are views of it, so the buffer is reused across clients.
    """
    names, shapes, offsets, off = [], [], [], 0
    params = list(model.named_parameters())
    for n, p in params:
        names.append(n)
        shapes.append(tuple(p.shape))
        offsets.append(off)
        off += p.numel()
    first = params[0][1]
    flat = torch.empty(off, dtype=first.dtype, device=first.device)
    for (n, p), o in zip(params, offsets):
        flat[o:o + p.numel()].copy_(p.detach().reshape(-1))
        p.data = flat[o:o + p.numel()].view(p.shape)
    return flat, Layout(tuple(names), tuple(shapes), tuple(offsets), off)
