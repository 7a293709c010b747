"""PowerSGD updates (Vogels et al., "PowerSGD: Practical Low-Rank Gradient Compression for
Distributed Optimization", NeurIPS 2019): rank-r factors from one warm-started power iteration.

Client k forms m = delta + e (delta = w_k - w; e its error-feedback residual, 0 without
`error_feedback`). Each weight tensor with >= 2 dims is read as a matrix M of n = shape[0] rows
and mm = prod(shape[1:]) columns (a conv kernel: out x (in kh kw), the flat layout's row-major
order) and, when r (n + mm) < n mm, sent in rank r = `rank` (Algorithm 1, one power iteration):

    P     = M Q                      Q [mm x r]: the client's Q from the last round it took part in
    P_hat = orthonormalise(P)        (torch.linalg.qr, reduced)
    Q'    = M^T P_hat                send P_hat and Q' (float32)
    M_hat = P_hat Q'^T  ( = P_hat P_hat^T M, the projection of M on the span of M Q )

and the client keeps Q' as next round's Q (the warm start that makes one iteration per round a
power method across rounds). A column of Q' that is exactly 0 (M = 0) keeps the old column, so
a tensor that did not move does not lose its warm start. Everything else -- 1-D tensors (biases,
norms) and matrices with r (n + mm) >= n mm, e.g. every matrix once r >= min(n, mm) -- is sent
uncompressed in float32. With error feedback, e <- m - C(m) = M - M_hat on compressed tensors
(0 elsewhere). The shared error feedback, memory and upload: methods/compression.py.

Q lives per client (`ServerState.set_client_state`, key "powersgd_q": one flat float32 vector
of the r mm entries of every compressed tensor, in layout order), checkpointed with the model;
a client's first Q is standard normal from the run's generator ctx.gen("powersgd_q0", client).
(Vogels et al. share one Q among workers that all-reduce P and Q; here every client encodes its
own update independently, as a federated client must.)

Uplink (exact): bits = sum over compressed tensors of 32 r (n + mm) + 32 x (every other entry).
A full rank (r >= min(n, mm) for every matrix) sends everything uncompressed: 32 P bits and,
with nothing lost, bitwise FedAvg.

Downlink (`downlink`):
    full     the float32 model to every client, 32 P bits (as every method).
    factors  the aggregate of K rank-r updates has rank up to K r, so it is not sent in rank r.
             Instead the server broadcasts the round's messages, from which a client that holds
             the previous global model w_{r-1} rebuilds the new one bitwise (the same float
             operations as the server's): the K clients' factors (P_hat, Q') and weights n_k,
             and the new float32 values of every uncompressed entry:
                 B = 32 (K) + K (32 + F) + U,   F = sum_compressed 32 r (n + mm),   U = 32 x (uncompressed entries).
             A client is charged min(B, 32 P) when it took part in the previous round (it
             received w_{r-1}'s predecessor then, so w_{r-1} follows from that round's
             broadcast); any other client (its first round, or it missed the last one) gets
             the full float32 model, 32 P. The server records each client's last round in
             state.extra["powersgd_last_round"] and the last broadcast in
             state.extra["powersgd_broadcast"] (checkpointed). Only synchronous rounds: a FedBuff
             step applies rebased updates of older models, which this broadcast does not describe.

Memory: the residual (P entries) per client with error feedback, and Q (r sum mm entries per
client). At base32 (cifar10 shape, P = 8,952,067) with 100 clients and r = 4: residuals 3.58 GB
in float32 (1.79 GB with memory_dtype = bfloat16), Q (292,204 entries: 100 of its 304 tensors
are compressed) 100 x 1.17 MB = 117 MB (always float32). The uplink is then 11,990,496 bits,
23.9x fewer than FedAvg's 32 P.
Both keep clients on one process: several ranks are refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Sequence

import torch

from .base import FLOAT_BITS, Capabilities, ClientPlan, ServerState, Upload
from .compression import CompressedUpdate, check_common, fail
from .registry import register_method

if TYPE_CHECKING:
    from dfbench.benchmark.core.config import RunConfig

    from .context import MethodContext

Q_KEY = "powersgd_q"  # client -> flat float32 Q of every compressed tensor
LAST_KEY = "powersgd_last_round"  # client -> the last round it received a global model (downlink=factors)
BROADCAST_KEY = "powersgd_broadcast"  # {"round": r, "bits": B} of the last applied round (downlink=factors)
DOWNLINKS: tuple[str, ...] = ("full", "factors")


@dataclass(frozen=True)
class Block:
    """One compressed tensor: its place in the flat vector, its matrix shape, its Q's place."""

    offset: int
    rows: int  # n = shape[0]
    cols: int  # mm = prod(shape[1:])
    q_offset: int


def compressed(shape: Sequence[int], rank: int) -> bool:
    """Is a tensor of this shape sent as rank-r factors? (>= 2 dims and r (n + mm) < n mm)"""
    if len(shape) < 2:
        return False
    n, mm = int(shape[0]), math.prod(shape[1:])
    return rank * (n + mm) < n * mm


def blocks(shapes: Sequence[Sequence[int]], rank: int) -> list[Block]:
    """The compressed tensors of a layout, in order, with where each one's Q lives."""
    out, offset, q = [], 0, 0
    for shape in shapes:
        if compressed(shape, rank):
            n, mm = int(shape[0]), math.prod(shape[1:])
            out.append(Block(offset=offset, rows=n, cols=mm, q_offset=q))
            q += mm * rank
        offset += math.prod(shape)
    return out


def factor_bits(shapes: Sequence[Sequence[int]], rank: int) -> tuple[int, int]:
    """(F, U): bits of one client's factors, and of its uncompressed entries (float32 each)."""
    f = sum(FLOAT_BITS * rank * (b.rows + b.cols) for b in blocks(shapes, rank))
    dense = sum(math.prod(s) for s in shapes) - sum(b.rows * b.cols for b in blocks(shapes, rank))
    return f, FLOAT_BITS * dense


def powersgd_bits(shapes: Sequence[Sequence[int]], rank: int) -> int:
    """Exact uplink bits of one PowerSGD message: F + U."""
    return sum(factor_bits(shapes, rank))


def broadcast_bits(shapes: Sequence[Sequence[int]], rank: int, uploads: int) -> int:
    """Downlink `factors`: bits of one round's broadcast with `uploads` (K) clients aggregated."""
    f, u = factor_bits(shapes, rank)
    return FLOAT_BITS + uploads * (FLOAT_BITS + f) + u


def power_step(M: torch.Tensor, Q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One power iteration: P_hat = orth(M Q), Q' = M^T P_hat; M_hat = P_hat Q'^T."""
    P_hat = torch.linalg.qr(M @ Q, mode="reduced").Q
    return P_hat, M.T @ P_hat


@register_method("powersgd")
class PowerSGD(CompressedUpdate):
    """FedAvg with rank-r PowerSGD uplink updates (warm-started Q per client), error feedback on by default."""

    headline_params = ("rank",)

    capabilities = Capabilities(several_ranks=False,  # Q is per-client memory (always), clients move between ranks
                                needs="it keeps each client's warm-start Q across rounds")

    @dataclass(frozen=True)
    class Config:
        rank: int = 4
        error_feedback: bool = True
        downlink: Literal["full", "factors"] = "full"
        memory_dtype: Literal["float32", "bfloat16"] = "float32"

        def validate(self) -> None:
            if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
                fail("powersgd", "rank", self.rank, "an integer >= 1")
            if self.downlink not in DOWNLINKS:
                fail("powersgd", "downlink", self.downlink, ", ".join(DOWNLINKS))
            check_common("powersgd", self)

    def __init__(self, config: "PowerSGD.Config") -> None:
        super().__init__(config)
        self._blocks: tuple[tuple, list[Block]] | None = None  # (layout shapes, its compressed tensors)
        self._q_total = 0

    @classmethod
    def client_memory(cls, config: "PowerSGD.Config") -> tuple[str, str]:
        ef = " and its error-feedback residual" if config.error_feedback else ""
        return f"each client's warm-start Q{ef}", ""

    @classmethod
    def check(cls, config: "PowerSGD.Config", run: "RunConfig", world: int = 1) -> None:
        super().check(config, run, world)
        if config.downlink == "factors" and run.train.driver != "sync":
            raise ValueError(f"method.downlink=factors of 'powersgd' cannot run with train.driver={run.train.driver}: its "
                             "broadcast describes one synchronous round's aggregate, not rebased stale updates; use "
                             "--set train.driver=sync or method.downlink=full")
        if config.downlink == "factors" and run.privacy.clip > 0:
            raise ValueError("method.downlink=factors of 'powersgd' cannot run with differential privacy (privacy.clip="
                             f"{run.privacy.clip:g}): it broadcasts every client's own factors, which the noise on the "
                             "aggregate does not cover; use --set method.downlink=full")
        if config.downlink == "factors" and run.system.edges:
            raise ValueError(f"method.downlink=factors of 'powersgd' cannot run under edge servers (system.edges="
                             f"{run.system.edges}): its broadcast describes one server's aggregate; use --set "
                             "method.downlink=full or system.edges=0")

    def _plan(self, ctx: "MethodContext") -> list[Block]:
        if self._blocks is None or self._blocks[0] != ctx.layout.shapes:
            self._blocks = (ctx.layout.shapes, blocks(ctx.layout.shapes, self.config.rank))
            self._q_total = sum(b.cols * self.config.rank for b in self._blocks[1])
        return self._blocks[1]

    def message_bits(self, ctx: "MethodContext") -> int:
        return powersgd_bits(ctx.layout.shapes, self.config.rank)

    def encode(self, m: torch.Tensor, client: int, state: ServerState, ctx: "MethodContext") -> tuple[torch.Tensor, bool, dict[str, Any]]:
        plan, r = self._plan(ctx), self.config.rank
        if not plan:  # every tensor uncompressed: the message is m itself
            return m, True, {}
        q = state.client_state(Q_KEY, client)
        if q is None:
            q = torch.randn(self._q_total, generator=ctx.gen("powersgd_q0", client), device=m.device, dtype=torch.float32)
        decoded, new_q = m.clone(), q.clone()
        for b in plan:
            M = m[b.offset:b.offset + b.rows * b.cols].view(b.rows, b.cols)
            Q = q[b.q_offset:b.q_offset + b.cols * r].view(b.cols, r)
            if not bool(torch.isfinite(M @ Q).all()):  # overflow: undecodable, memory untouched
                return torch.full_like(m, float("nan")), False, {}
            P_hat, Q_new = power_step(M, Q)
            decoded[b.offset:b.offset + b.rows * b.cols] = (P_hat @ Q_new.T).reshape(-1)
            Q_new = torch.where(Q_new.abs().amax(0) > 0, Q_new, Q)  # a zero column keeps its warm start
            new_q[b.q_offset:b.q_offset + b.cols * r] = Q_new.reshape(-1)
        return decoded, False, {Q_KEY: new_q}

    # -- downlink=factors: who holds the previous model, and what the last broadcast cost ----------
    def client_view(self, state: ServerState, client: int, ctx: "MethodContext") -> ClientPlan:
        plan = super().client_view(state, client, ctx)
        if self.config.downlink == "factors":
            last, sent = state.client_state(LAST_KEY, client), state.extra.get(BROADCAST_KEY)
            if last == ctx.round - 1 and sent is not None and sent["round"] == ctx.round - 1:
                plan.downlink_bits = min(plan.downlink_bits, int(sent["bits"]))
            state.set_client_state(LAST_KEY, client, int(ctx.round))
        return plan

    def new_accumulator(self, state: ServerState, ctx: "MethodContext") -> dict[str, torch.Tensor]:
        acc = super().new_accumulator(state, ctx)
        if self.config.downlink == "factors":
            acc["uploads"] = torch.zeros(1, dtype=torch.float64, device=state.params.device)  # K of the broadcast
        return acc

    def accumulate(self, acc: dict[str, torch.Tensor], up: Upload, ctx: "MethodContext") -> None:
        super().accumulate(acc, up, ctx)
        if self.config.downlink == "factors":
            acc["uploads"] += 1

    def apply(self, state: ServerState, acc: dict[str, torch.Tensor], ctx: "MethodContext") -> ServerState:
        new = super().apply(state, acc, ctx)
        if self.config.downlink == "factors":
            k = int(acc["uploads"][0])
            new.extra[BROADCAST_KEY] = {"round": int(ctx.round), "bits": broadcast_bits(ctx.layout.shapes, self.config.rank, k)}
        return new
