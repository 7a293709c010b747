"""FedDM-quant (Vora et al., 2024): clients send their update quantised to b bits per element.

Client k trains from the global model w (plan.start) to w_k and sends Q(delta_k), with
delta_k = w_k - w quantised per parameter tensor on a uniform min-max grid (see
`methods.quantization`). The server decodes w + Q(delta_k) and aggregates as FedAvg.
The downlink (the global model) stays float32.

Error feedback (Seide et al., 2014; Karimireddy et al., 2019, EF-SGD): client k keeps the
part of its update the grid lost and adds it to its next update,
    m_k   = delta_k + e_k           (e_k = 0 the first time)
    send    Q(m_k)
    e_k  <- m_k - dequant(Q(m_k))
so what reaches the server sums to the true updates up to the last residual.
With m = delta + e, D = max|delta| over rounds and step = range(m) / (2^b - 1) <= 2 max|m| / (2^b - 1):
deterministic rounding errs by at most step / 2, so max|e| <= D / (2^b - 2); stochastic
rounding errs by less than one step, so max|e| <= 2 D / (2^b - 3). For b = 1 neither map is
a contraction and the residual can grow without bound, so error feedback needs b >= 2. The residuals
are client memory; they live in `state.extra["ef_residual"]` (client -> float32 [P]) so a
checkpoint carries them and a resumed run continues exactly.

A non-finite update (a diverged client) cannot be put on the grid: its message carries a
non-finite scale, the server cannot decode it, and the loop drops it and counts it in
`dropped_updates`; that client's residual is left as it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

import torch

from .base import ClientPlan, Method, ServerState, Upload
from .minmax_codec import MAX_BITS, MIN_BITS, ROUNDINGS, dequantize, message_bits, quantize, segment_ids
from .registry import register_method

if TYPE_CHECKING:
    from dfbench.benchmark.core.config import RunConfig

    from .context import MethodContext

RESIDUAL_KEY = "ef_residual"


@register_method("quantized")
class Quantized(Method):
    """FedAvg with b-bit uniform min-max quantised uplink updates (per tensor)."""

    family: ClassVar[str | None] = "compression"  # with topk_update, signsgd, qsgd, powersgd
    headline_params = ("bits",)

    @dataclass(frozen=True)
    class Config:
        bits: int = 8
        rounding: Literal["deterministic", "stochastic"] = "stochastic"
        error_feedback: bool = False

        def validate(self) -> None:
            if not (MIN_BITS <= self.bits <= MAX_BITS):
                raise ValueError(f"invalid value for 'method.bits' of 'quantized': {self.bits!r}; allowed: an integer in {MIN_BITS}..{MAX_BITS}")
            if self.rounding not in ROUNDINGS:
                raise ValueError(f"invalid value for 'method.rounding' of 'quantized': {self.rounding!r}; allowed: {', '.join(ROUNDINGS)}")
            if self.error_feedback and self.bits < 2:
                # 1-bit min-max is no contraction (|x - Q(x)| can reach the whole range), so the
                # residual can grow every round; b >= 2 keeps it bounded (see the module docstring).
                raise ValueError(f"invalid value for 'method.bits' of 'quantized': {self.bits!r} with method.error_feedback=true; "
                                 "allowed: an integer in 2..16 (1-bit error feedback diverges)")

    def __init__(self, config: "Quantized.Config") -> None:
        super().__init__(config)
        self._seg: torch.Tensor | None = None  # segment ids per flat entry, built once per run

    @classmethod
    def check(cls, config: "Quantized.Config", run: "RunConfig", world: int = 1) -> None:
        super().check(config, run, world)
        if config.error_feedback and world > 1:
            # Clients move between ranks from round to round, so a residual kept on one rank
            # would be missing (or stale) on the next; refuse rather than silently drop it.
            raise ValueError("method.error_feedback=true of 'quantized' needs a single process (world size 1); "
                             "run without torchrun or set method.error_feedback=false")

    def _segments(self, ctx: "MethodContext", device: torch.device) -> torch.Tensor:
        if self._seg is None or self._seg.device != device or self._seg.numel() != ctx.layout.total:
            self._seg = segment_ids(ctx.layout.numels, device)
        return self._seg

    def upload(self, local: torch.Tensor, plan: ClientPlan, client: int, state: ServerState, ctx: "MethodContext") -> Upload:
        """Quantise (local - start) [+ residual], return start + decoded update and the exact bit count."""
        cfg = self.config
        bits = message_bits(ctx.layout.numels, cfg.bits)
        weight = float(ctx.client_sizes[client])
        update = local - plan.start
        residuals: dict[int, torch.Tensor] = state.extra.setdefault(RESIDUAL_KEY, {}) if cfg.error_feedback else {}
        if client in residuals:
            update = update + residuals[client]
        if not bool(torch.isfinite(update).all()):
            # Undecodable message (see module docstring): the loop drops non-finite params.
            return Upload(params=torch.full_like(local, float("nan")), weight=weight, uplink_bits=bits, mask=plan.step.mask, group=plan.group)
        seg = self._segments(ctx, update.device)
        gen = ctx.gen("quant", ctx.round, client) if cfg.rounding == "stochastic" else None
        decoded = dequantize(quantize(update, seg, cfg.bits, cfg.rounding, gen), seg)
        # A range too wide for a float32 scale decodes to non-finite (dropped by the loop);
        # keep the old residual then, so one bad round cannot poison the client for good.
        if cfg.error_feedback and bool(torch.isfinite(decoded).all()):
            residuals[client] = update - decoded
        return Upload(params=plan.start + decoded, weight=weight, uplink_bits=bits, mask=plan.step.mask, group=plan.group)
