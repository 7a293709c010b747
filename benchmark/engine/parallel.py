"""A round's clients trained side by side on the CPU: one forked process per core, one thread each.

Why: a small diffusion UNet at batch 16 uses two cores badly from one process (measured on the
2-core Xeon of results/cpu-bf16: 229 images/s with two threads, 2 x 151 = 302 with two one-thread
processes; bf16 autocast 244 against 385). `train.client_workers` (0 = auto: one worker per torch
thread the run has) says how many clients train at once.

How, and why it is bitwise the sequential round:
- The round's plans are made first, in the server process (`method.client_view`, in client order),
  as for batched clients; then the round forks W workers. A forked worker holds the server's whole
  memory as it stands at the fork: the plans, the method, the run context, its network buffer. So
  no plan is pickled, and a plan's network (a HeteroFL sub-model, a view of the context's flat
  buffer) is the worker's own copy of it.
- A worker sets one torch thread and takes clients from a shared counter until none is left; each
  client runs `local_step.local_train` with its own seeded generator `ctx.gen("client", r, k)`,
  exactly as the sequential loop runs it. Which worker trains which client changes nothing.
- The server reads the results back and uploads and accumulates them in client order (the same
  summation order as the sequential loop). With one thread per client on both sides, the global
  model is bit for bit the sequential one (tests/runs/test_parallel_clients.py).
- Forking per round costs a few milliseconds and always starts from the current state; nothing
  about the method's or the server's state has to be sent to a long-lived worker.

Where it does not apply (the round trains its clients one after another, in the server process,
with the run's threads): CUDA (a CUDA context does not survive a fork), several torch.distributed
ranks (each rank is a process already), train.clients_mode=batched, a platform without fork, a run
with one thread (a grid's cells) or train.client_workers=1. Where it applies, every client trains
with one thread, also a round's only client (trained in the server process): a client's result
never depends on how many others trained beside it.

Ctrl-C: the workers ignore SIGINT; the server, interrupted while it waits, terminates them.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import signal
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch

from dfbench.benchmark.engine.local_step import LocalResult, make_optimizer

__all__ = ["workers_for", "train_clients"]


def workers_for(requested: int, device: torch.device, world: int, batched: bool) -> int:
    """How many processes may train a round's clients at once: 1 (the sequential loop, in this process,
    with the run's threads) where forking does not apply (see the module docstring), else `requested`
    (0 = one per torch thread of the run). Above 1, every client trains with one thread."""
    if device.type != "cpu" or world > 1 or batched or "fork" not in mp.get_all_start_methods():
        return 1
    return max(1, requested if requested > 0 else torch.get_num_threads())


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch with one thread inside (a client trained here runs as in a worker), the count restored after."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


@functools.cache
def _warm_parent() -> None:
    """What a process does once, before its first client, done in the server before the first fork: the first
    torch.optim.Adam imports torch._dynamo (1.6 s here), which every forked worker would otherwise repeat
    every round (measured: 3.1 s a round against 0.8 for 2 clients x 1 step of small28)."""
    p = torch.zeros(1, requires_grad=True)
    p.grad = torch.zeros(1)
    make_optimizer([p], 1e-3).step()


def _worker(train: Callable[[int], LocalResult], order: list[int], counter: Any, conn: Any) -> None:
    """In the forked process: one thread, clients from the shared counter until none is left."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's to handle (it terminates us)
    torch.set_num_threads(1)
    try:
        while True:
            with counter.get_lock():
                i = counter.value
                counter.value += 1
            if i >= len(order):
                break
            k = order[i]
            res = train(k)
            conn.send(("ok", k, res.params.numpy(), res.loss, res.sigma1_sq, res.seconds))
        conn.send(("done",))
    except BaseException:  # noqa: BLE001 -- every failure goes back to the server, named
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def train_clients(train: Callable[[int], LocalResult], order: list[int], workers: int) -> dict[int, LocalResult]:
    """`train(k)` for every client k of `order`, in up to `workers` forked one-thread processes (one
    client: here, with one thread); {k: result}.

    `train` runs in the children (a closure over the round's plans: inherited by the fork, not pickled).
    A child that fails raises here with its traceback; one that dies (killed, out of memory) raises
    naming its exit code. The children are gone when this returns or raises."""
    _warm_parent()
    if min(workers, len(order)) < 2:  # nothing to share: here, with the one thread a worker would have
        with one_thread():
            return {k: train(k) for k in order}
    workers = min(workers, len(order))
    ctx = mp.get_context("fork")
    counter = ctx.Value("l", 0)
    procs, conns = [], []
    for _ in range(workers):
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_worker, args=(train, order, counter, send), daemon=True)
        p.start()
        send.close()  # the child holds its end; EOF here means the child is gone
        procs.append(p)
        conns.append(recv)
    out: dict[int, LocalResult] = {}
    active = dict(zip(conns, procs))
    finished = False
    try:
        while active:
            for conn in mp_connection.wait(list(active)):  # whichever child has sent: none waits on a full pipe
                p = active[conn]
                try:
                    msg = conn.recv()
                except EOFError:
                    p.join()
                    raise RuntimeError(f"a client worker process (pid {p.pid}) ended without its results, exit code "
                                       f"{p.exitcode} (killed, or out of memory?); run with --set train.client_workers=1 "
                                       "to train the clients one after another in this process") from None
                if msg[0] == "ok":
                    _, k, params, loss, sigma1, seconds = msg
                    out[k] = LocalResult(params=torch.from_numpy(params), loss=loss, sigma1_sq=sigma1, seconds=seconds)
                elif msg[0] == "error":
                    raise RuntimeError(f"a client failed in its worker process:\n{msg[1]}")
                else:  # "done"
                    del active[conn]
        finished = True
    finally:
        for p in procs:
            if not finished and p.is_alive():
                p.terminate()
            p.join()
        for conn in conns:
            conn.close()
    missing = set(order) - out.keys()
    if missing:
        raise RuntimeError(f"client worker processes returned no result for clients {sorted(missing)}")
    return out
