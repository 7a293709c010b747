"""Uniform min-max quantisation of a flat vector, per tensor, and its exact size on the wire.

The flat parameter vector is cut into segments (one per named parameter tensor of the
model's `Layout`). Each segment s with values x is sent as

    lo_s    = min(x)                                  float32
    scale_s = (max(x) - lo_s) / (2^b - 1)             float32
    q_i     = round((x_i - lo_s) / scale_s)  in {0, ..., 2^b - 1}     b bits each

and decoded as x_hat_i = lo_s + q_i * scale_s (FedDM-quant, Vora et al. 2024; the grid is
QSGD-style uniform, Alistarh et al. 2017). b = 1 gives two levels: min and max.

Rounding:
    deterministic  q = round-half-to-even(t): |x_hat - x| <= scale / 2 per element.
    stochastic     q = floor(t + u), u ~ U[0, 1): E[q] = t exactly, so E[x_hat] = x (unbiased),
                   with variance scale^2 * f (1 - f), f = t - floor(t).

A constant segment (all zeros, one element, ...) has scale 0 and decodes exactly to lo.

Wire format, counted by `message_bits` (the ONE place the ledger formula lives):
    per tensor: b * numel code bits + 2 * 32 bits (lo, scale as float32), no header.
No per-tensor header is counted because the tensor order, shapes and b are fixed by the
run configuration, which client and server both hold before round 1 (FedAvg counts its
32 * P raw floats the same way). The message is one bit stream, not padded to bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import torch

FLOAT_BITS = 32  # lo and scale travel as float32
SCALARS_PER_TENSOR = 2  # lo, scale
HEADER_BITS_PER_TENSOR = 0  # shapes, order and b are known to both ends (see module docstring)

Rounding = Literal["deterministic", "stochastic"]
ROUNDINGS: tuple[str, ...] = ("deterministic", "stochastic")
MIN_BITS, MAX_BITS = 1, 16


@dataclass
class Quantized:
    """One encoded message: integer codes per element and (lo, scale) per segment."""

    codes: torch.Tensor  # int32 [P], each in [0, 2^bits - 1]
    lo: torch.Tensor  # float32 [T]
    scale: torch.Tensor  # float32 [T]
    bits: int


def tensor_bits(numel: int, bits: int) -> int:
    """Bits on the wire for one tensor of `numel` values quantised to `bits` bits."""
    return bits * numel + SCALARS_PER_TENSOR * FLOAT_BITS + HEADER_BITS_PER_TENSOR


def message_bits(numels: Sequence[int], bits: int) -> int:
    """Bits on the wire for a whole quantised update (one segment per tensor)."""
    return sum(tensor_bits(n, bits) for n in numels)


def segment_ids(numels: Sequence[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """int64 [P]: the index of the tensor each flat entry belongs to."""
    counts = torch.as_tensor(list(numels), dtype=torch.long, device=device)
    if counts.numel() == 0 or bool((counts <= 0).any()):
        raise ValueError(f"every tensor must have at least one element; got sizes {list(numels)}")
    return torch.repeat_interleave(torch.arange(counts.numel(), device=device), counts)


def _check_bits(bits: int) -> None:
    if not (isinstance(bits, int) and MIN_BITS <= bits <= MAX_BITS):
        raise ValueError(f"bits must be an integer in {MIN_BITS}..{MAX_BITS}; got {bits!r}")


def quantize(
    x: torch.Tensor,
    seg: torch.Tensor,
    bits: int,
    rounding: Rounding = "deterministic",
    gen: torch.Generator | None = None,
) -> Quantized:
    """Encode flat `x` per segment on a uniform min-max grid with 2^bits levels.

    `seg` comes from `segment_ids`. Stochastic rounding draws its uniforms from `gen`
    (seed it per round and client so runs reproduce). Non-finite input is an error: the
    caller decides what a diverged client sends (see `methods.quantized`).
    """
    _check_bits(bits)
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {', '.join(ROUNDINGS)}; got {rounding!r}")
    if x.shape != seg.shape:
        raise ValueError(f"x and seg must have the same shape; got {tuple(x.shape)} and {tuple(seg.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("cannot quantise a non-finite tensor (NaN or inf in the update)")
    x = x.float()
    nseg = int(seg.max()) + 1
    lo = torch.zeros(nseg, dtype=torch.float32, device=x.device).scatter_reduce(0, seg, x, "amin", include_self=False)
    hi = torch.zeros(nseg, dtype=torch.float32, device=x.device).scatter_reduce(0, seg, x, "amax", include_self=False)
    top = 2**bits - 1
    # The range in float64 so that a huge (but finite) range does not overflow before the division;
    # a scale that still does not fit float32 becomes inf and the message decodes to non-finite.
    scale = ((hi.double() - lo.double()) / top).float()
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # constant segment: t = 0, decodes to lo
    t = (x - lo[seg]) / safe[seg]
    if rounding == "deterministic":
        q = torch.round(t)
    else:
        u = torch.rand(t.shape, generator=gen, device=t.device, dtype=t.dtype)
        q = torch.floor(t + u)
    # float rounding can put t a hair outside [0, top]; the grid ends are exact codes
    codes = q.clamp_(0, top).to(torch.int32)
    return Quantized(codes=codes, lo=lo, scale=scale, bits=bits)


def dequantize(msg: Quantized, seg: torch.Tensor) -> torch.Tensor:
    """Decode: x_hat_i = lo_s + q_i * scale_s (float32 [P])."""
    return msg.lo[seg] + msg.codes.float() * msg.scale[seg]
