"""What the update-compression methods share: error feedback, its memory, and the upload.

Client k trains from the global model w (plan.start) to w_k; its update is delta_k = w_k - w.
A compression method sends C(m_k) instead of delta_k, and the server decodes w + C(m_k) and
aggregates as FedAvg (unless the method overrides `accumulate` / `apply`, e.g. a sign vote):

    m_k  = delta_k + e_k            (e_k = 0 the first time, or without error feedback)
    send   C(m_k)                   (`encode` of the method: top-k, signs, QSGD levels, low rank)
    e_k <- m_k - C(m_k)             (error feedback: Seide et al. 2014; Stich et al. 2018;
                                     Karimireddy et al. 2019)

so what reaches the server over rounds sums to the true updates up to the last residual.
The residuals are client memory (`ServerState.set_client_state`, key "ef_residual"): kept in
`state.extra`, checkpointed with the model, untouched while the client sits out a round, and
restored bitwise on resume. Clients move between ranks from round to round, so a method that
keeps such memory refuses several ranks (`check`) before any data is loaded.

Memory cost: one residual of P entries per client that ever took part. At model preset base32
(cifar10 shape: P = 8,952,067 parameters) with 100 clients that is 100 x 35.8 MB = 3.58 GB in
float32, on the run's device and in every checkpoint (the run keeps two). `memory_dtype =
bfloat16` stores it in half that (1.79 GB): e_k is rounded to bfloat16 (8 significant bits,
float32's range) when stored and added back in float32, so each round drops at most 2^-8 of
|e_k| per entry (relative) from the feedback.

A lossless message -- every entry of m_k in float32 (top-k keeping all, PowerSGD with every
tensor sent uncompressed) -- with no residual carried is FedAvg's message: the server takes the
client's model itself, so these settings are bitwise FedAvg. Otherwise it decodes w + C(m_k) in
float32.

A non-finite update (a diverged client) cannot be encoded: its message decodes to NaN, the
loop drops it and counts it in `dropped_updates`, and the client's memory (residual, PowerSGD's
Q) is left as it was. The same holds when a finite update encodes to something non-finite
(e.g. an L2 norm past float32's range).

Bits: each method counts its message exactly from its stated encoding (module docstrings);
tensor order, shapes and the hyperparameters are known to both ends before round 1 (as for
FedAvg's 32 x P raw floats and `minmax_codec`), so no header is counted for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch

from .base import ClientPlan, Method, ServerState, Upload
from .minmax_codec import segment_ids

if TYPE_CHECKING:
    from dfbench.benchmark.core.config import RunConfig

    from .context import MethodContext

RESIDUAL_KEY = "ef_residual"  # client -> e_k [P] in memory_dtype (the same key as quantized's)
MEMORY_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def fail(method: str, key: str, value: object, allowed: str) -> None:
    """The one shape of a bad-hyperparameter error: the key, the value, what is allowed."""
    raise ValueError(f"invalid value for 'method.{key}' of {method!r}: {value!r}; allowed: {allowed}")


def check_common(method: str, config: Any) -> None:
    """Validate the fields every compression Config has (error_feedback, memory_dtype)."""
    if not isinstance(config.error_feedback, bool):
        fail(method, "error_feedback", config.error_feedback, "true, false")
    if config.memory_dtype not in MEMORY_DTYPES:
        fail(method, "memory_dtype", config.memory_dtype, ", ".join(MEMORY_DTYPES))


class CompressedUpdate(Method):
    """FedAvg whose uplink carries C(delta + e) (see the module docstring); subclasses write `encode`."""

    family: ClassVar[str | None] = "compression"

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._seg: torch.Tensor | None = None  # segment ids per flat entry, built once per run
        self._bits: tuple[tuple, int] | None = None  # (layout shapes, bits of one message)

    # -- what a subclass provides -------------------------------------------------------------
    @classmethod
    def client_memory(cls, config: Any) -> tuple[str, str]:
        """(what the method keeps per client across rounds, "" = nothing; a fix other than one
        process, "" = none), for the refusal of several ranks."""
        return ("each client's error-feedback residual" if config.error_feedback else "", "set method.error_feedback=false")

    def message_bits(self, ctx: "MethodContext") -> int:
        """Exact bits of one client's message (a function of the layout and the config)."""
        raise NotImplementedError

    def encode(self, m: torch.Tensor, client: int, state: ServerState, ctx: "MethodContext") -> tuple[torch.Tensor, bool, dict[str, Any]]:
        """(C(m) as the server decodes it [P] float32, lossless?, client memory to keep if it is finite)."""
        raise NotImplementedError

    # -- shared ----------------------------------------------------------------------------
    @classmethod
    def check(cls, config: Any, run: "RunConfig", world: int = 1) -> None:
        super().check(config, run, world)
        memory, fix = cls.client_memory(config)
        if world > 1 and memory:
            # Clients move between ranks from round to round: memory kept on one rank would be
            # missing (or stale) on the next; refuse rather than silently drop it.
            raise ValueError(f"method {cls.name!r} needs a single process (world size 1, here {world}): it keeps {memory} "
                             f"across rounds and clients move between ranks; run it without torchrun" + (f" or {fix}" if fix else ""))

    def segments(self, ctx: "MethodContext", device: torch.device) -> torch.Tensor:
        if self._seg is None or self._seg.device != device or self._seg.numel() != ctx.layout.total:
            self._seg = segment_ids(ctx.layout.numels, device)
        return self._seg

    def bits(self, ctx: "MethodContext") -> int:
        if self._bits is None or self._bits[0] != ctx.layout.shapes:
            self._bits = (ctx.layout.shapes, int(self.message_bits(ctx)))
        return self._bits[1]

    def upload(self, local: torch.Tensor, plan: ClientPlan, client: int, state: ServerState, ctx: "MethodContext") -> Upload:
        """Encode delta (+ the residual), keep the new residual, return what the server decodes."""
        cfg = self.config
        bits, weight = self.bits(ctx), float(ctx.client_sizes[client])
        def nan() -> Upload:  # undecodable (module docstring): the loop drops non-finite params, memory untouched
            return Upload(params=torch.full_like(local, float("nan")), weight=weight, uplink_bits=bits, mask=plan.step.mask,
                          group=plan.group)

        delta = local - plan.start
        e = state.client_state(RESIDUAL_KEY, client) if cfg.error_feedback else None
        m = delta if e is None else delta + e.float()
        if not bool(torch.isfinite(m).all()):
            return nan()
        decoded, lossless, memory = self.encode(m, client, state, ctx)
        if not bool(torch.isfinite(decoded).all()):
            return nan()
        if cfg.error_feedback:
            state.set_client_state(RESIDUAL_KEY, client, (m - decoded).to(MEMORY_DTYPES[cfg.memory_dtype]))
        for key, value in memory.items():
            state.set_client_state(key, client, value)
        exact = lossless and (e is None or not bool(e.any()))  # FedAvg's message: the client's model itself
        return Upload(params=local if exact else plan.start + decoded, weight=weight, uplink_bits=bits,
                      mask=plan.step.mask, group=plan.group)
