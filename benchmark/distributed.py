"""torch.distributed glue: which clients a rank trains, and the one all_reduce per round.

With world size 1 (no process group) every function is a no-op, so the single-process
path is the same code.
"""

from __future__ import annotations

from typing import Any, Sequence, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


def rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def my_share(clients: Sequence[T], rank: int, world: int) -> list[T]:
    """Round-robin split of this round's clients over ranks (the client list is seeded, rank-free)."""
    return list(clients[rank::world])


def all_reduce_(acc: dict[str, torch.Tensor]) -> None:
    """Sum every accumulator tensor across ranks, in place."""
    if rank_world()[1] == 1:
        return
    for key in sorted(acc):
        dist.all_reduce(acc[key], op=dist.ReduceOp.SUM)


def gather_dict(d: dict[Any, Any]) -> dict[Any, Any]:
    """Union of small per-rank dicts (per-client bookkeeping) on every rank."""
    if rank_world()[1] == 1:
        return d
    parts: list[Any] = [None] * rank_world()[1]
    dist.all_gather_object(parts, d)
    out: dict[Any, Any] = {}
    for p in parts:
        out.update(p)
    return out


def init_from_env(device: str = "cpu", timeout_s: float = 300.0) -> None:
    """Join the process group torchrun describes (WORLD_SIZE > 1): NCCL on GPUs, gloo on CPU.

    The timeout bounds every collective, so a killed rank fails the run instead of hanging it.
    """
    import datetime
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or not dist.is_available() or dist.is_initialized():
        return
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
