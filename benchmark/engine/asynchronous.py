"""FedBuff (Nguyen et al., AISTATS 2022): asynchronous buffered aggregation, on the simulated clock.

`train.driver=fedbuff` replaces the synchronous round (training.py) with this event loop; every
method hook is the same (`client_view`, `upload`, `accumulate`, `apply`: methods/base.py (b)).

Events come from the clock (benchmark/engine/clock.py), so a run is deterministic:
  - C clients train at once (`train.concurrency`; 0 = every client). A client starts at the
    simulated time it is picked, from the newest server version, and reports at
    start + seconds (downlink + local work + uplink).
  - Reports are taken in time order (ties: the earlier start, then the lower client index) into
    a buffer, each with its staleness tau = server versions applied since it started.
  - With K reports in the buffer (`train.buffer`; 0 = C) the server applies them: one server
    step is one "round" of rounds.jsonl (`train.rounds` of them), with the reports' staleness.
  - Every free slot is filled at once by a client drawn uniformly from those neither training
    nor waiting in the buffer (generator: run seed, "fedbuff", pick number); it downloads the
    newest version, i.e. after the server step a report may have triggered.

Aggregation through the method's hooks: each buffered upload is rebased onto the current model,
theta_i' = x_now + s(tau_i) (theta_i - start_i), and then accumulated and applied as in a
synchronous round (FedAvg: x_new = x_now + sum_i n_i s(tau_i) Delta_i / sum_i n_i), in client
order. A fresh report (tau = 0, s = 1) is used as it is, so with equal speeds and K = C = every
client a server step is bitwise a synchronous FedAvg round (tested). Staleness weights
(`train.staleness`): `constant` (s = 1) or `poly:A`, s = (1 + tau)^-A. The default is poly:0.5,
the weighting of Nguyen et al. (their section 5 uses 1/sqrt(1 + tau)): an update computed on an
older model points from a place the model has left, and the further it is the less it is
trusted, without discarding it (FedAsync's hinge and exponential forms drop old updates faster).

A client's generator is (run seed, "client", start version + 1, client), the synchronous round's
key, with a job counter appended when the same client starts again from the same version; the
method sees the context at round start version + 1 (`ctx.at_round`) while it plans and encodes
that job, with the lr of that round (its weight, known only at the server step, is 1 there), and
at round r with the buffered clients' weight while the r-th server step accumulates and applies. Training happens when the client starts (its result depends on nothing later); the
upload waits in the driver's state until its report time. That state (time, version, jobs in
flight with their starts and uploads, the buffer, the pick count) is checkpointed with the
model, so a run killed mid-flight resumes bitwise.

Not supported (refused before any work): several ranks, train.clients_mode=batched, partial
participation and dropout (C picks who trains), a round deadline (nothing waits for a round),
and methods that declare `Capabilities(asynchronous=False)` (SCAFFOLD: its control variates are one
synchronous round's; experts: per-expert routers trained after the last round).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from dfbench import methods
from dfbench.benchmark.core import rounds as R
from dfbench.benchmark.core.parsing import parse_staleness
from dfbench.benchmark.core.seeds import np_rng
from dfbench.benchmark.engine.context import RunContext
from dfbench.benchmark.engine.local_step import StepSettings, local_train
from dfbench.benchmark.engine.training import ClientStats, RoundSums, _diag_accumulator, add_upload, close_round


def staleness_weight(tau: int, exponent: float) -> float:
    return float((1.0 + tau) ** -exponent)


@dataclass
class Job:
    """A client's training from one server version: what the server will decode when it reports."""

    client: int
    version: int  # the server version it started from
    start_time: float
    arrival: float  # simulated time of its report
    steps: int
    loss: float
    sigma1_sq: float | None
    upload: methods.Upload
    start: torch.Tensor  # the plan's start (for the rebase and the diagnostics)
    mask: torch.Tensor | None  # the plan's step mask
    downlink_bits: int
    trained_params: int
    flop_fraction: float
    seconds: float


def _job_dict(job: Job) -> dict[str, Any]:
    return {**vars(job), "upload": dict(vars(job.upload))}


def _job(d: dict[str, Any]) -> Job:
    return Job(**{**d, "upload": methods.Upload(**d["upload"])})


@dataclass
class FedBuff:
    method: methods.Method
    ctx: RunContext
    concurrency: int
    buffer_size: int
    exponent: float
    time: float = 0.0
    version: int = 0
    last_step_time: float = 0.0
    picks: int = 0
    in_flight: list[Job] = field(default_factory=list)
    buffer: list[tuple[Job, int]] = field(default_factory=list)  # (job, staleness)
    started: dict[tuple[int, int], int] = field(default_factory=dict)  # (client, version) -> jobs started

    # -- checkpoint -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain containers of tensors and numbers (checkpoints load with weights_only=True)."""
        return {"time": self.time, "version": self.version, "last_step_time": self.last_step_time, "picks": self.picks,
                "in_flight": [_job_dict(j) for j in self.in_flight],
                "buffer": [[_job_dict(j), tau] for j, tau in self.buffer],
                "started": [[k, v, n] for (k, v), n in self.started.items()]}

    def load(self, sd: dict[str, Any] | None) -> None:
        if sd is None:
            return
        self.time, self.version, self.last_step_time, self.picks = sd["time"], sd["version"], sd["last_step_time"], sd["picks"]
        self.in_flight = [_job(j) for j in sd["in_flight"]]
        self.buffer = [(_job(j), int(tau)) for j, tau in sd["buffer"]]
        self.started = {(int(k), int(v)): int(n) for k, v, n in sd["started"]}

    # -- events -----------------------------------------------------------------------------
    def _start(self, client: int, state: methods.ServerState) -> None:
        r = self.version + 1  # the synchronous round this version would train
        cfg, ctx = self.ctx.cfg, self.ctx.at_round(r)
        n = self.started.get((client, self.version), 0)
        self.started[(client, self.version)] = n + 1
        plan = self.method.client_view(state, client, ctx)
        plan.version = self.version
        steps = int(ctx.local_steps[client])
        gen = ctx.gen("client", r, client) if n == 0 else ctx.gen("client", r, client, "job", n)
        res = local_train(ctx.model, ctx.flat, plan.start, ctx.images, ctx.client_indices[client],
                          ctx.get_objective(plan.step.objective), plan.step, StepSettings.of(cfg.train, ctx.client_lr()),
                          steps=steps, gen=gen)
        up = self.method.upload(res.params, plan, client, state, ctx)
        if type(up) is not methods.Upload:  # its extra fields would not survive the checkpoint
            raise TypeError(f"method {self.method.name!r} uploads a {type(up).__name__}, which the asynchronous driver "
                            "cannot checkpoint; the method should declare capabilities = Capabilities(asynchronous=False)")
        clock = ctx.clock
        seconds = clock.with_upload(clock.before_upload(client, steps, cfg.train.batch_size, float(plan.flop_fraction), plan.downlink_bits),
                                    up.uplink_bits)
        self.in_flight.append(Job(client=client, version=self.version, start_time=self.time, arrival=self.time + seconds,
                                  steps=steps, loss=res.loss, sigma1_sq=res.sigma1_sq, upload=up, start=plan.start,
                                  mask=plan.step.mask, downlink_bits=int(plan.downlink_bits),
                                  trained_params=int(plan.trained_params if plan.trained_params is not None else ctx.layout.total),
                                  flop_fraction=float(plan.flop_fraction), seconds=seconds))

    def _fill(self, state: methods.ServerState) -> None:
        """Start clients until C train: each drawn uniformly from those neither training nor buffered."""
        while len(self.in_flight) < self.concurrency:
            busy = {j.client for j in self.in_flight} | {j.client for j, _ in self.buffer}
            free = [k for k in range(self.ctx.num_clients) if k not in busy]
            if not free:
                return
            k = free[int(np_rng(self.ctx.cfg.seed, "fedbuff", self.picks).integers(len(free)))]
            self.picks += 1
            self._start(k, state)

    def step(self, state: methods.ServerState, r: int) -> tuple[methods.ServerState, dict[str, Any]]:
        """Advance the clock to the next server step (the r-th); returns the new state and its row."""
        t0 = time.perf_counter()
        self._fill(state)
        while len(self.buffer) < self.buffer_size:
            if not self.in_flight:
                raise RuntimeError("fedbuff: no client in flight and the buffer is not full; this is a bug")
            job = min(self.in_flight, key=lambda j: (j.arrival, j.start_time, j.client))
            self.in_flight.remove(job)
            self.time = job.arrival
            self.buffer.append((job, self.version - job.version))
            if len(self.buffer) < self.buffer_size:
                self._fill(state)
        state, row = self._apply(state, r)
        self._fill(state)  # the replacements download the new version
        # after the refill: the clients it starts train now (a step's wall time had left out all but the first C jobs)
        R.fill(row, wall_seconds=round(time.perf_counter() - t0, 4))
        return state, row

    def _apply(self, state: methods.ServerState, r: int) -> tuple[methods.ServerState, dict[str, Any]]:
        method = self.method
        jobs = sorted(self.buffer, key=lambda jt: jt[0].client)  # client order, as a synchronous round adds them
        self.buffer = []
        ctx = self.ctx.at_round(r, float(sum(self.ctx.client_sizes[j.client] for j, _ in jobs)) or 1.0)
        acc = method.new_accumulator(state, ctx)
        acc.update(_diag_accumulator(state, ctx))
        S = RoundSums(acc)
        per_client: dict[int, ClientStats] = {}
        stale: dict[int, int] = {}
        for job, tau in jobs:
            up, plan = job.upload, methods.ClientPlan(start=job.start, step=methods.LocalStep(mask=job.mask))
            up.staleness = tau
            if tau:  # rebased onto the current model, weighted by its staleness
                up = methods.Upload(**{**vars(up), "params": state.params + staleness_weight(tau, self.exponent) * (up.params - job.start)})
                plan = methods.ClientPlan(start=state.params, step=plan.step)
            S.add("downlink_bits", job.downlink_bits)
            S.add("uplink_bits", up.uplink_bits)
            per_client[job.client] = ClientStats(steps=job.steps, loss=job.loss, uplink_bits=int(up.uplink_bits),
                                                 downlink_bits=job.downlink_bits, trained_params=job.trained_params,
                                                 flop_fraction=job.flop_fraction, seconds=job.seconds)
            stale[job.client] = tau
            add_upload(method, acc, S, up, plan, job.loss, job.sigma1_sq, state, ctx)
        state, row = close_round(method, state, acc, ctx, r, per_client)
        R.fill(row, round_seconds=round(self.time - self.last_step_time, 6), staleness=[stale[k] for k in sorted(stale)])
        self.last_step_time = self.time
        self.version += 1
        return state, row


def make_driver(method: methods.Method, ctx: RunContext) -> FedBuff | None:
    """The run's asynchronous driver (train.driver=fedbuff), or None for synchronous rounds."""
    t = ctx.cfg.train
    if t.driver != "fedbuff":
        return None
    c = t.concurrency or ctx.num_clients
    return FedBuff(method=method, ctx=ctx, concurrency=c, buffer_size=t.buffer or c, exponent=parse_staleness(t.staleness))


__all__ = ["FedBuff", "Job", "make_driver", "staleness_weight"]
