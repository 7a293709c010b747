"""QSGD updates (Alistarh et al., "QSGD: Communication-Efficient SGD via Gradient Quantization
and Encoding", NeurIPS 2017): s-level stochastic quantisation with the L2 norm, per tensor.

Client k forms v = delta + e (delta = w_k - w; e the error-feedback residual, 0 without
`error_feedback`, the default: QSGD is unbiased) and sends, per parameter tensor t,

    ||v_t||                                       float32 (the sum of squares in float64)
    r_i  = s |v_i| / ||v_t||  in [0, s]           (computed in float64 from the float32 norm sent)
    xi_i = l + 1 with probability r_i - l, else l,   l = floor(r_i)        xi_i in {0, ..., s}
    Q(v)_i = ||v_t|| sign(v_i) xi_i / s

so E[xi_i] = r_i and E[Q(v)_i] = v_i (unbiased), with Var Q(v)_i = (||v_t|| / s)^2 f (1 - f),
f = r_i - l, and |Q(v)_i - v_i| < ||v_t|| / s always. A zero tensor decodes to exactly 0.
The uniform draws come from the run's seeded generator ctx.gen("qsgd", round, client), so
runs are bitwise reproducible. (Error feedback, memory, upload: methods/compression.py.)

Wire format (exact, fixed length; no Elias coding): per tensor of n entries, the float32 norm
and per entry 1 sign bit + ceil(log2(s + 1)) bits for xi_i:
    bits = sum_t (32 + n_t (1 + ceil(log2(s + 1))))  =  32 T + P (1 + ceil(log2(s + 1))).
The sign bit is sent for every entry, xi_i = 0 included (fixed length).

Enough levels is FedAvg to a stated tolerance: each decoded entry is within ||v_t|| / s of the
true one, so one round's global model is within max_k ||delta_{k,t}|| / s of FedAvg's per
tensor (plus float32 rounding); s = 65535 (17 bits per entry) is the largest level count.

Memory: none without error feedback (the default); with it, the residual of P entries per
client (3.58 GB in float32 for base32 x 100 clients, 1.79 GB with memory_dtype = bfloat16).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Sequence

import torch

from .base import FLOAT_BITS, ServerState
from .compression import CompressedUpdate, check_common, fail
from .registry import register_method

if TYPE_CHECKING:
    from .context import MethodContext

MIN_LEVELS, MAX_LEVELS = 1, 65535


def level_bits(levels: int) -> int:
    """ceil(log2(s + 1)): the fixed-length code of xi in {0, ..., s}."""
    return int(levels).bit_length()  # = ceil(log2(s + 1)) for s >= 1


def qsgd_bits(numels: Sequence[int], levels: int) -> int:
    """Exact bits of one QSGD message (module docstring)."""
    return FLOAT_BITS * len(numels) + sum(numels) * (1 + level_bits(levels))


def qsgd_encode(v: torch.Tensor, seg: torch.Tensor, levels: int, gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(norms float32 [T], signed levels sign(v_i) xi_i as int32 [P]) of flat finite `v`."""
    nseg = int(seg.max()) + 1
    norms = torch.zeros(nseg, dtype=torch.float64, device=v.device).index_add_(0, seg, v.double().square()).sqrt().float()
    safe = torch.where(norms > 0, norms, torch.ones_like(norms)).double()  # a zero tensor: r = 0, decodes to 0
    r = levels * v.double().abs() / safe[seg]
    low = torch.floor(r)
    u = torch.rand(r.shape, generator=gen, dtype=torch.float64, device=r.device)
    xi = (low + (u < r - low).double()).clamp_(max=levels)  # rounding can put r a hair above s
    return norms, (torch.sign(v).double() * xi).to(torch.int32)


def qsgd_decode(norms: torch.Tensor, signed_levels: torch.Tensor, seg: torch.Tensor, levels: int) -> torch.Tensor:
    """Q(v)_i = ||v_t|| sign(v_i) xi_i / s (float32 [P])."""
    return (norms.double()[seg] * signed_levels.double() / levels).float()


@register_method("qsgd")
class QSGD(CompressedUpdate):
    """FedAvg with QSGD-quantised uplink updates (s levels per tensor, L2 norm), unbiased."""

    headline_params = ("levels",)

    @dataclass(frozen=True)
    class Config:
        levels: int = 15  # s: 4 bits for xi + 1 sign bit per entry
        error_feedback: bool = False
        memory_dtype: Literal["float32", "bfloat16"] = "float32"

        def validate(self) -> None:
            if isinstance(self.levels, bool) or not isinstance(self.levels, int) or not (MIN_LEVELS <= self.levels <= MAX_LEVELS):
                fail("qsgd", "levels", self.levels, f"an integer in {MIN_LEVELS}..{MAX_LEVELS}")
            check_common("qsgd", self)

    def message_bits(self, ctx: "MethodContext") -> int:
        return qsgd_bits(ctx.layout.numels, self.config.levels)

    def encode(self, m: torch.Tensor, client: int, state: ServerState, ctx: "MethodContext") -> tuple[torch.Tensor, bool, dict[str, Any]]:
        seg, s = self.segments(ctx, m.device), self.config.levels
        norms, signed = qsgd_encode(m, seg, s, ctx.gen("qsgd", ctx.round, client))
        return qsgd_decode(norms, signed, seg, s), False, {}
