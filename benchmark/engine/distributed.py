"""torch.distributed glue: which clients a rank trains, and the few collectives of a run.

One run on W ranks (torchrun sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT):

    start-up   rank 0 alone reads the run folder; it broadcasts "already done?" and the
               initial or resumed server state (other ranks may not share its filesystem)
    round r    each rank trains its round-robin share of the round's clients (the client
               list is seeded, rank-free), then one all_reduce per accumulator tensor sums
               the (weighted, masked) aggregation and diagnostic sums, and a small
               all_gather collects the per-client rows; every rank then applies the same
               server step to the same sums, so all ranks hold the same state
    the end    no collective after the last round: rank 0 finalizes, evaluates and writes,
               the other ranks return at once; `shutdown` then meets every rank at a final
               barrier before destroy_process_group, so no rank tears its group down while
               another still uses it (that race killed rank 0 with SIGABRT, "terminate called
               without an active exception", after all its work had returned)

Every random stream depends on (seed, round, client) only (benchmark.core.seeds), so W ranks
compute the single-process run; only the order in which the sums are added differs
(last-bit float differences, see tests/runs/test_distributed.py).

With world size 1 (no process group) every function is a no-op, so the single-process
path is the same code. Backends: NCCL when the run's device is CUDA (each rank on
cuda:LOCAL_RANK), gloo on CPU.

Failure: every collective is bounded by the process group's timeout (DFBENCH_DIST_TIMEOUT
seconds, default 600), except the final barrier: the other ranks wait there while rank 0
evaluates, which may take longer, so it runs on a gloo side group with its own timeout
(DFBENCH_DIST_EXIT_TIMEOUT seconds, default 86400); a rank 0 that dies still ends it at
once (its sockets close), and torchrun stops the other ranks when one fails. A rank that dies or hangs makes the others raise `DistributedError`
naming the collective, instead of hanging the job. For NCCL, TORCH_NCCL_BLOCKING_WAIT=1
is set (unless the user set it) so that a timeout raises in the calling thread (with the
default asynchronous handling the watchdog would kill the process with no clear message);
the cost is nil here, since the loop needs each collective's result at once anyway.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass
from typing import Any, Iterator, Sequence, TypeVar

import torch
import torch.distributed as dist

from dfbench.benchmark.core.parsing import seconds_from_env

T = TypeVar("T")

TIMEOUT_ENV = "DFBENCH_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0
EXIT_TIMEOUT_ENV = "DFBENCH_DIST_EXIT_TIMEOUT"
DEFAULT_EXIT_TIMEOUT_S = 86400.0

# The timeout the process group was created with, for error messages (None: no group).
_timeout_s: float | None = None
# The gloo group of the final barrier (its own, longer timeout; None: no group).
_exit_group: Any = None


class DistributedError(RuntimeError):
    """A collective failed or timed out: some rank died, hung or raised."""


def rank_world() -> tuple[int, int]:
    """(rank, world size) of this process; (0, 1) without a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def my_share(clients: Sequence[T], rank: int, world: int) -> list[T]:
    """Round-robin split of this round's clients over ranks (the client list is seeded, rank-free)."""
    return list(clients[rank::world])


def timeout_from_env(default: float = DEFAULT_TIMEOUT_S, name: str = TIMEOUT_ENV) -> float:
    """Seconds every collective may wait, from $DFBENCH_DIST_TIMEOUT (a clear error if malformed)."""
    return seconds_from_env(name, default)


def env_world_size() -> int:
    """WORLD_SIZE as set by torchrun (1 when not launched by it)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def local_device(device: str) -> str:
    """The device this rank computes on: "cuda" means cuda:LOCAL_RANK when several ranks run.

    An explicit cuda:N with several ranks would put every rank of a node on one GPU, so it
    is refused; restrict the visible GPUs with CUDA_VISIBLE_DEVICES instead.
    """
    if env_world_size() <= 1 or not device.startswith("cuda"):
        return device
    if device != "cuda":
        raise ValueError(
            f"device {device!r} with {env_world_size()} ranks: pass --device cuda (each rank then uses "
            "cuda:LOCAL_RANK); choose the GPUs with CUDA_VISIBLE_DEVICES"
        )
    return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"


def init_from_env(device: str = "cpu", timeout_s: float | None = None) -> None:
    """Join the process group torchrun describes (WORLD_SIZE > 1): NCCL on GPUs, gloo on CPU.

    `timeout_s` (default: $DFBENCH_DIST_TIMEOUT, else 600 s) bounds start-up and every
    collective, so a killed or hung rank fails the run instead of hanging it.
    """
    global _timeout_s, _exit_group
    if env_world_size() <= 1 or not dist.is_available() or dist.is_initialized():
        return
    timeout = timeout_from_env() if timeout_s is None else float(timeout_s)
    exit_timeout = timeout_from_env(DEFAULT_EXIT_TIMEOUT_S, EXIT_TIMEOUT_ENV)
    dev = local_device(device)
    kwargs: dict[str, Any] = {}
    if dev.startswith("cuda"):
        backend = "nccl"
        # Raise on timeout in this thread (a clear DistributedError) rather than let the watchdog
        # tear the process down; the user's explicit setting wins.
        os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
        torch.cuda.set_device(torch.device(dev))
        kwargs["device_id"] = torch.device(dev)  # eager NCCL init: a bad GPU fails here, not mid-run
    else:
        backend = "gloo"
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout), **kwargs)
    _timeout_s = timeout
    # every rank creates it now (new_group is collective); used once, by `shutdown`
    _exit_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=max(timeout, exit_timeout)))


def shutdown() -> None:
    """Leave the process group together (after a clean run; after a failure the process just exits).

    The final barrier makes every rank wait until all are done (rank 0 evaluates after the
    last round) before any destroys its group: a rank that tears its connections down while
    another still holds the group can make that one abort.
    """
    global _timeout_s, _exit_group
    if dist.is_available() and dist.is_initialized():
        if rank_world()[1] > 1:
            with guard("the final barrier (every rank leaves the process group together)"):
                dist.barrier(group=_exit_group)
        dist.destroy_process_group()
    _timeout_s = _exit_group = None


@contextlib.contextmanager
def guard(what: str) -> Iterator[None]:
    """Turn a failed or timed-out collective into a DistributedError that says what and why.

    A killed peer shows up at once (connection reset); a hung one after the timeout.
    """
    try:
        yield
    except RuntimeError as err:  # gloo raises RuntimeError, NCCL DistBackendError (a subclass)
        rank, world = rank_world()
        limit = f"{_timeout_s:g} s" if _timeout_s is not None else "the timeout"
        raise DistributedError(
            f"rank {rank} of {world}: {what} did not complete within {limit}: another rank died, hung or "
            f"raised; see its log (the timeout is ${TIMEOUT_ENV}, in seconds). Cause: {type(err).__name__}: {err}"
        ) from err


def _comm_device() -> torch.device:
    """Where collective buffers must live: the current GPU for NCCL, the CPU for gloo."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_(acc: dict[str, torch.Tensor], what: str = "an all_reduce") -> None:
    """Sum every accumulator tensor across ranks, in place.

    Every rank must hold the same keys, shapes and dtypes (a method's accumulator may
    depend on the state, never on the rank); keys go in sorted order so the collectives match.
    """
    if rank_world()[1] == 1:
        return
    with guard(what):
        for key in sorted(acc):
            dist.all_reduce(acc[key], op=dist.ReduceOp.SUM)


def broadcast_object(obj: T, what: str = "a broadcast") -> T:
    """Rank 0's small picklable object, on every rank (other ranks' `obj` is ignored)."""
    if rank_world()[1] == 1:
        return obj
    box: list[Any] = [obj]
    with guard(what):
        dist.broadcast_object_list(box, src=0, device=_comm_device())
    return box[0]


@dataclass(frozen=True)
class _Slot:
    """Placeholder for the i-th tensor of a broadcast tree."""

    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype


def _strip(obj: Any, out: list[torch.Tensor]) -> Any:
    """Replace every tensor in nested dicts/lists/tuples by a _Slot; collect the tensors."""
    if isinstance(obj, torch.Tensor):
        out.append(obj)
        return _Slot(len(out) - 1, tuple(obj.shape), obj.dtype)
    if isinstance(obj, dict):
        return {k: _strip(v, out) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [_strip(v, out) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    return obj


def _fill(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, _Slot):
        return tensors[obj.index]
    if isinstance(obj, dict):
        return {k: _fill(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [_fill(v, tensors) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    return obj


def broadcast_tree(obj: T, device: torch.device | str, what: str = "a broadcast") -> T:
    """Rank 0's nested dict/list of tensors and plain values, on every rank (tensors on `device`).

    The structure travels pickled (small); each tensor travels as a tensor broadcast, so a
    large model costs no pickling. Rank 0 gets its own object back unchanged.
    """
    if rank_world()[1] == 1:
        return obj
    rank = rank_world()[0]
    tensors: list[torch.Tensor] = []
    skeleton = _strip(obj, tensors) if rank == 0 else None
    skeleton = broadcast_object(skeleton, what)
    comm = _comm_device()
    slots: list[_Slot] = []
    _strip_slots(skeleton, slots)
    received: list[torch.Tensor] = []
    for slot in sorted(slots, key=lambda s: s.index):
        if rank == 0:
            buf = tensors[slot.index].detach().to(comm).contiguous()
        else:
            buf = torch.empty(slot.shape, dtype=slot.dtype, device=comm)
        with guard(what):  # only the collective: a local error (e.g. out of memory) keeps its own message
            dist.broadcast(buf, src=0)
        received.append(buf.to(device))
    return obj if rank == 0 else _fill(skeleton, received)


def _strip_slots(obj: Any, out: list[_Slot]) -> None:
    """Collect the _Slots of a skeleton (in any order; the caller sorts them by index)."""
    if isinstance(obj, _Slot):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _strip_slots(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _strip_slots(v, out)


def gather_dict(d: dict[Any, Any], what: str = "an all_gather") -> dict[Any, Any]:
    """Union of small per-rank dicts on every rank (the round's per-client rows).

    all_gather_object pickles and runs two small collectives (sizes, then bytes); for a
    few numbers per client that is negligible next to one client's local training.
    """
    world = rank_world()[1]
    if world == 1:
        return d
    parts: list[Any] = [None] * world
    with guard(what):
        dist.all_gather_object(parts, d)
    out: dict[Any, Any] = {}
    for p in parts:
        out.update(p)
    return out
