"""Scaled-sign updates: EF-signSGD (Karimireddy et al., "Error Feedback Fixes SignSGD and other
Gradient Compression Schemes", ICML 2019) with the server's mean or a majority vote (Bernstein
et al., "signSGD: Compressed Optimisation for Non-Convex Problems", ICML 2018).

Client k forms m = delta + e (delta = w_k - w; e its error-feedback residual, 0 without
`error_feedback`) and sends, per parameter tensor t of d_t entries,

    s_i     = +1 if m_i >= 0 else -1          1 bit each (sign(0) := +1: one bit has no zero)
    scale_t = ||m_t||_1 / d_t                 float32 (the sum in float64)
    C(m)_i  = scale_t s_i                     e <- m - C(m)   (Karimireddy et al., Algorithm 2)

A tensor that is all zeros has scale 0 and decodes to exactly 0. (The error feedback, its
memory and the upload are shared: methods/compression.py.)

Aggregation (`aggregation`):
    mean      FedAvg on the decoded models: w <- sum_k p_k (w + C(m_k)) / sum_k p_k.
    majority  the sign of the n_k-weighted vote, times the n_k-weighted mean of the clients' scales:
                  V_i      = sum_k n_k s_{k,i}                 (integers: exact in float64)
                  bar_t    = sum_k n_k scale_{k,t} / sum_k n_k
                  w_i     <- w_i + sign(V_i) bar_t             (a tied vote, V_i = 0, moves nothing)
              Bernstein et al. vote with equal weights; with equal n_k this is their vote. The
              server needs each client's signs, so the upload carries them (a `SignUpload`) and
              `accumulate` sums V and bar's numerator (all_reduce-able). The asynchronous driver
              rebases and staleness-weights decoded *models*, which a vote does not read, so
              majority refuses train.driver=fedbuff (mean runs under it).

Wire format (exact): per tensor d_t sign bits + one float32 scale; bits = P + 32 T (T tensors).
The downlink is the float32 model, as for every method (Bernstein et al.'s server broadcasts
sign(V), 1 bit per entry; that is not modelled here).

Memory: the residual e of P entries per client with error feedback (3.58 GB in float32 for
base32 x 100 clients, 1.79 GB with memory_dtype = bfloat16; see methods/compression.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Sequence

import torch

from .base import FLOAT_BITS, ClientPlan, ServerState, Upload
from .compression import CompressedUpdate, check_common, fail
from .registry import register_method

if TYPE_CHECKING:
    from dfbench.benchmark.core.config import RunConfig

    from .context import MethodContext

AGGREGATIONS: tuple[str, ...] = ("mean", "majority")


def sign_bits(numels: Sequence[int]) -> int:
    """Exact bits of one scaled-sign message: one bit per entry plus a float32 scale per tensor."""
    return sum(numels) + FLOAT_BITS * len(numels)


def sign_encode(m: torch.Tensor, seg: torch.Tensor, numels: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(signs int8 [P] in {-1, +1}, scales float32 [T] = ||m_t||_1 / d_t) of flat finite `m`."""
    signs = torch.where(m >= 0, 1, -1).to(torch.int8)
    l1 = torch.zeros(len(numels), dtype=torch.float64, device=m.device).index_add_(0, seg, m.double().abs())
    return signs, (l1 / torch.as_tensor(list(numels), dtype=torch.float64, device=m.device)).float()


def sign_decode(signs: torch.Tensor, scales: torch.Tensor, seg: torch.Tensor) -> torch.Tensor:
    """C(m)_i = scale_t s_i (float32 [P])."""
    return scales[seg] * signs.float()


def majority_step(vote: torch.Tensor, scale_sum: torch.Tensor, weight_sum: float, seg: torch.Tensor) -> torch.Tensor:
    """The server's float64 step from the summed votes sum_k n_k s_k [P] and scales sum_k n_k scale_k [T]."""
    return torch.sign(vote) * (scale_sum / weight_sum)[seg]


@dataclass
class SignUpload(Upload):
    """A scaled-sign message as the server decodes it: the decoded model and, for the vote, the message."""

    signs: torch.Tensor | None = None  # int8 [P]
    scales: torch.Tensor | None = None  # float32 [T]


@register_method("signsgd")
class SignSGD(CompressedUpdate):
    """FedAvg with scaled-sign uplink updates per tensor (EF-signSGD); mean or majority-vote aggregation."""

    @dataclass(frozen=True)
    class Config:
        error_feedback: bool = True
        aggregation: Literal["mean", "majority"] = "mean"
        memory_dtype: Literal["float32", "bfloat16"] = "float32"

        def validate(self) -> None:
            if self.aggregation not in AGGREGATIONS:
                fail("signsgd", "aggregation", self.aggregation, ", ".join(AGGREGATIONS))
            check_common("signsgd", self)

    def __init__(self, config: "SignSGD.Config") -> None:
        super().__init__(config)
        self._message: tuple[torch.Tensor, torch.Tensor] | None = None  # the last encode's, for its upload

    @classmethod
    def check(cls, config: "SignSGD.Config", run: "RunConfig", world: int = 1) -> None:
        super().check(config, run, world)
        if config.aggregation == "majority" and run.train.driver != "sync":
            raise ValueError(f"method.aggregation=majority of 'signsgd' cannot run with train.driver={run.train.driver}: the vote "
                             "combines one synchronous round's sign messages, and the asynchronous driver rebases and "
                             "staleness-weights decoded models, which a vote does not read; use --set train.driver=sync "
                             "or method.aggregation=mean")
        if config.aggregation == "majority" and run.privacy.clip > 0:
            raise ValueError("method.aggregation=majority of 'signsgd' cannot run with differential privacy (privacy.clip="
                             f"{run.privacy.clip:g}): DP clips and noises the weighted mean of the decoded models, which "
                             "a vote does not read; use --set method.aggregation=mean")

    def message_bits(self, ctx: "MethodContext") -> int:
        return sign_bits(ctx.layout.numels)

    def encode(self, m: torch.Tensor, client: int, state: ServerState, ctx: "MethodContext") -> tuple[torch.Tensor, bool, dict[str, Any]]:
        seg = self.segments(ctx, m.device)
        signs, scales = sign_encode(m, seg, ctx.layout.numels)
        self._message = (signs, scales)
        return sign_decode(signs, scales, seg), False, {}

    def upload(self, local: torch.Tensor, plan: ClientPlan, client: int, state: ServerState, ctx: "MethodContext") -> Upload:
        self._message = None
        up = super().upload(local, plan, client, state, ctx)
        if self.config.aggregation == "mean":
            return up
        signs, scales = self._message if self._message is not None else (None, None)  # None: non-finite, dropped by the loop
        self._message = None
        return SignUpload(**vars(up), signs=signs, scales=scales)

    # -- majority vote: sums of n_k s_k and n_k scale_k (all_reduce-able) ------------------------
    def new_accumulator(self, state: ServerState, ctx: "MethodContext") -> dict[str, torch.Tensor]:
        if self.config.aggregation == "mean":
            return super().new_accumulator(state, ctx)
        f64 = dict(dtype=torch.float64, device=state.params.device)
        # no wsum: the vote does not average models (a mechanism that needs wsum fails loudly, never silently)
        return {"vote": torch.zeros(ctx.layout.total, **f64), "scale_sum": torch.zeros(len(ctx.layout.numels), **f64),
                "weight_sum": torch.zeros(1, **f64)}

    def accumulate(self, acc: dict[str, torch.Tensor], up: Upload, ctx: "MethodContext") -> None:
        if self.config.aggregation == "mean":
            return super().accumulate(acc, up, ctx)
        if not isinstance(up, SignUpload) or up.signs is None or up.scales is None:
            raise TypeError(f"signsgd majority vote needs the clients' sign messages (a SignUpload); got a {type(up).__name__}")
        acc["vote"].add_(up.signs.to(torch.float64), alpha=up.weight)  # n_k: integer sums, exact ties
        acc["scale_sum"].add_(up.scales.to(torch.float64), alpha=up.weight)
        acc["weight_sum"] += up.weight

    def apply(self, state: ServerState, acc: dict[str, torch.Tensor], ctx: "MethodContext") -> ServerState:
        if self.config.aggregation == "mean":
            return super().apply(state, acc, ctx)
        theta, wt = state.params, float(acc["weight_sum"][0])
        if wt <= 0:  # nobody reported
            return ServerState(params=theta.clone(), extra=state.extra)
        step = majority_step(acc["vote"], acc["scale_sum"], wt, self.segments(ctx, theta.device))
        return ServerState(params=(theta.double() + step).to(theta.dtype), extra=state.extra)
