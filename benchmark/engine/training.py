"""One communication round: the shared round of every method. It knows nothing about any particular method.

round r:
    sample clients (seeded by (seed, r))  ->  for each: plan = method.client_view
    the clock: a client the deadline rules out before it trains is left out (clock.py)
    local training (the ONE shared step)  ->  local parameters from plan.start
        (train.clients_mode=batched: every plan first, then all clients in lockstep, benchmark/engine/batched.py;
         on a CPU with several threads: every plan first, then the clients side by side, benchmark/engine/parallel.py)
    upload = method.upload(local)         ->  late (past the deadline)? dropped; else method.accumulate(acc, upload)
    all_reduce(acc) across ranks          ->  state = method.apply(state, acc)
    diagnostics -> the rounds.jsonl row (the run's life cycle, lifecycle.py, writes it and checkpoints)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dfbench import methods
from dfbench.benchmark.core import rounds as R
from dfbench.benchmark.engine import batched, distributed, parallel
from dfbench.benchmark.engine.context import RunContext, sample_round_clients
from dfbench.benchmark.engine.local_step import LocalResult, StepSettings, local_train


ROUND_SUMS = ("loss", "w2", "sigma1_sq", "sigma1_n", "uplink_bits", "downlink_bits", "nonfinite")


class RoundSums:
    """The round's scalar sums by name, in ONE float64 tensor (one all_reduce sums them all)."""

    KEY = "d_scalars"  # its entry in the round's accumulator dict

    def __init__(self, acc: dict[str, torch.Tensor]) -> None:
        self.tensor = acc[self.KEY]

    @classmethod
    def zeros(cls, device: torch.device) -> torch.Tensor:
        return torch.zeros(len(ROUND_SUMS), dtype=torch.float64, device=device)

    def add(self, name: str, value: float) -> None:
        self.tensor[ROUND_SUMS.index(name)] += value

    def __getitem__(self, name: str) -> torch.Tensor:
        """The 0-d float64 sum `name` (a tensor element: divide it, or float() it)."""
        return self.tensor[ROUND_SUMS.index(name)]


@dataclass
class ClientStats:
    """One participating client's numbers in a round (the per-client lists of rounds.jsonl)."""

    steps: int
    loss: float
    uplink_bits: int
    downlink_bits: int
    trained_params: int  # its sub-model's size (the full model by default)
    flop_fraction: float
    seconds: float  # simulated: downlink + local work + uplink (benchmark/engine/clock.py)
    train_seconds: float | None = None  # measured: its local training's wall time (None in lockstep)


def _diag_accumulator(state: methods.ServerState, ctx: RunContext) -> dict[str, torch.Tensor]:
    """Loop-owned sums for the diagnostics (Qiao et al. bound terms), all_reduce-able."""
    p = state.params.reshape(-1, ctx.layout.total)
    f64 = dict(dtype=torch.float64, device=p.device)
    return {
        "d_count": torch.zeros_like(p),  # clients whose upload's mask holds each parameter (what is aggregated)
        "d_trained": torch.zeros_like(p),  # clients that trained each parameter (ClientPlan.trained_mask): Γ, uncovered
        "d_usum": torch.zeros_like(p),  # sum of updates (unweighted), for sigma_2^2
        "d_usq": torch.zeros(p.shape[0], **f64),  # sum of ||update||^2
        "d_n": torch.zeros(p.shape[0], **f64),  # updates per group
        RoundSums.KEY: RoundSums.zeros(p.device),  # named scalars (ROUND_SUMS)
    }


def live_row(live: torch.Tensor | None, g: int, total: int) -> torch.Tensor | None:
    """Group `g`'s row of a method's deployed mask (`Method.deployed_mask`: [P] or [G, P]; None = every entry)."""
    if live is None:
        return None
    rows = live.reshape(-1, total)
    return rows[g] if rows.shape[0] > 1 else rows[0]


def pruning_extent(theta: torch.Tensor, mask: torch.Tensor, live: torch.Tensor | None) -> float:
    """w² of one client: ||theta - theta*m||^2 / ||theta||^2 over the deployed entries `live` (None: all)."""
    if live is None:
        return float((theta * (1 - mask)).double().square().sum() / theta.double().square().sum().clamp_min(1e-30))
    sq = theta.double().square() * live.double()
    return float((sq * (1 - mask.double())).sum() / sq.sum().clamp_min(1e-30))


def coverage(count: torch.Tensor, active: torch.Tensor, live: torch.Tensor | None) -> tuple[int, float]:
    """Γ_r (the fewest clients that trained one deployed parameter) and the uncovered fraction (the share of
    deployed parameters no client trained), over the groups that received updates (`active`, [G]);
    `count` [G, P] counts the clients that trained each entry, `live` is `Method.deployed_mask` (None: all)."""
    c = count[active]
    if live is not None:
        c = c[live.bool().expand_as(count)[active]]
    if c.numel() == 0:
        return 0, 1.0
    return int(c.min()), float((c == 0).double().mean())


def _num(x: float) -> float | None:
    """A finite float for rounds.jsonl, else None (keeps the file strict JSON)."""
    return round(x, 6) if np.isfinite(x) else None


def train_round(method: methods.Method, state: methods.ServerState, ctx: RunContext, r: int,
                mechanisms: Sequence[methods.Mechanism] | None = None) -> tuple[methods.ServerState, dict[str, Any]]:
    """One communication round; returns the new state and the rounds.jsonl row.

    `ctx` is the run's context; the hooks see `ctx.at_round(r, weight)`, a copy that carries this
    round's RoundState (`ctx` itself is never written). `mechanisms` (methods.base.Mechanism;
    default: the run's, `ctx.mechanisms`) wrap the accumulation for every method: each sees every
    decoded upload before `method.accumulate`, and the all-reduced sums before `apply`.
    """
    t0 = time.perf_counter()
    cfg = ctx.cfg
    clients, dropped = sample_round_clients(ctx.num_clients, cfg.system.participation, cfg.system.dropout, cfg.seed, r,
                                            cfg.system.sampling)
    done = train_clients(method, state, ctx, r, clients, mechanisms)
    R.fill(done.row, dropped_clients=dropped, wall_seconds=round(time.perf_counter() - t0, 4))
    return done.state, done.row


@dataclass
class ClientsDone:
    """What one aggregation of given clients gives (`train_clients`): the server's new state, the
    rounds.jsonl row of its diagnostics, the all-reduced sums it was applied from, and the entries the
    method deploys (`Method.deployed_mask`, over which the row's Γ and uncovered fraction are taken)."""

    state: methods.ServerState
    row: dict[str, Any]
    acc: dict[str, torch.Tensor]
    live: torch.Tensor | None = None  # the method's deployed mask in this aggregation (Method.deployed_mask)


def train_clients(method: methods.Method, state: methods.ServerState, ctx: RunContext, r: int, clients: Sequence[int],
                  mechanisms: Sequence[methods.Mechanism] | None = None, lr: float | None = None) -> ClientsDone:
    """The body of a round with its clients given: plan, train, upload and aggregate `clients` (sorted)
    from `state` in round `r` (its seeds: the client generators `ctx.gen("client", r, k)`), then apply.
    The synchronous round is this after drawing its clients; an edge server of the hierarchical driver
    (hierarchical.py) runs it on its own clients, from its own model, with its cloud round's `lr`."""
    mechanisms = ctx.mechanisms if mechanisms is None else mechanisms
    t0 = time.perf_counter()
    cfg = ctx.cfg
    # p_k = n_k / sum_j n_j over the round's clients (known to every rank: the client list is seeded)
    ctx = ctx.at_round(r, float(sum(ctx.client_sizes[k] for k in clients)) or 1.0, lr)
    acc = method.new_accumulator(state, ctx)
    acc.update(_diag_accumulator(state, ctx))
    for mech in mechanisms:
        acc.update(mech.new_sums(state, ctx))
    S = RoundSums(acc)
    per_client: dict[int, ClientStats] = {}
    settings = StepSettings.of(cfg.train, ctx.client_lr())
    mine = distributed.my_share(clients, ctx.rank, ctx.world)
    clock = ctx.clock
    late: dict[int, float] = {}  # client -> its simulated seconds, past the deadline (its update is dropped)

    def seconds_before_upload(k: int, plan: methods.ClientPlan) -> float:
        return clock.before_upload(k, int(ctx.local_steps[k]), cfg.train.batch_size, float(plan.flop_fraction), plan.downlink_bits)

    def late_before_training(k: int, plan: methods.ClientPlan) -> bool:
        """The deadline rules the client out before it trains: it is not trained at all (same result)."""
        if not clock.late(t := seconds_before_upload(k, plan)):
            return False
        late[k] = t
        S.add("downlink_bits", plan.downlink_bits)  # the model was sent
        return True

    def train(k: int, plan: methods.ClientPlan) -> LocalResult:
        return local_train(ctx.model, ctx.flat, plan.start, ctx.images, ctx.client_indices[k],
                           ctx.get_objective(plan.step.objective), plan.step, settings, steps=int(ctx.local_steps[k]),
                           gen=ctx.gen("client", r, k))

    # Ahead of the uploads: every plan first, then the clients trained together, in lockstep
    # (train.clients_mode=batched, benchmark/engine/batched.py) or side by side in forked one-thread
    # processes (train.client_workers, benchmark/engine/parallel.py); then uploaded in client order.
    ahead_plans: dict[int, methods.ClientPlan] | None = None
    ahead_results: dict[int, LocalResult] | None = None
    batched_mode = cfg.train.clients_mode == "batched"
    workers = parallel.workers_for(cfg.train.client_workers, ctx.device, ctx.world, batched_mode)
    if batched_mode or workers > 1:
        ahead_plans = {k: plan for k in mine if not late_before_training(k, plan := method.client_view(state, k, ctx))}
        if batched_mode:
            ahead_results = batched.train_clients(ctx, ahead_plans, r, settings)
        else:
            for plan in ahead_plans.values():
                ctx.get_objective(plan.step.objective)  # filled before the fork: the workers share the cache
            ahead_results = parallel.train_clients(lambda k, plans=ahead_plans: train(k, plans[k]), list(ahead_plans), workers)
    for k in mine:
        steps = int(ctx.local_steps[k])
        if ahead_plans is not None and ahead_results is not None:
            if k in late:
                continue
            plan, res = ahead_plans.pop(k), ahead_results.pop(k)  # pop: each client's tensors freed once accumulated
        else:
            plan = method.client_view(state, k, ctx)
            if late_before_training(k, plan):
                continue
            res = train(k, plan)
        up = method.upload(res.params, plan, k, state, ctx)
        S.add("downlink_bits", plan.downlink_bits)
        seconds = clock.with_upload(seconds_before_upload(k, plan), up.uplink_bits)
        if clock.late(seconds):  # late after its upload: trained, dropped
            late[k] = seconds
            continue
        S.add("uplink_bits", up.uplink_bits)
        per_client[k] = ClientStats(steps=steps, loss=res.loss, uplink_bits=int(up.uplink_bits), downlink_bits=int(plan.downlink_bits),
                                    trained_params=int(plan.trained_params if plan.trained_params is not None else ctx.layout.total),
                                    flop_fraction=float(plan.flop_fraction), seconds=seconds, train_seconds=res.seconds)
        add_upload(method, acc, S, up, plan, res.loss, res.sigma1_sq, state, ctx, mechanisms)
    distributed.all_reduce_(acc, what=f"round {r}'s all_reduce")
    per_client = distributed.gather_dict(per_client, what=f"round {r}'s per-client gather")  # small; pickled
    late = distributed.gather_dict(late, what=f"round {r}'s late-client gather")
    round_seconds = clock.round_seconds([c.seconds for c in per_client.values()], bool(late))
    live = method.deployed_mask(state, ctx)  # after the plans (a method may have pruned in client_view)
    state, row = close_round(method, state, acc, ctx, r, per_client, mechanisms)
    R.fill(row, late_clients=sorted(late), round_seconds=round(round_seconds, 6), wall_seconds=round(time.perf_counter() - t0, 4))
    return ClientsDone(state=state, row=row, acc=acc, live=live)


def add_upload(method: methods.Method, acc: dict[str, torch.Tensor], S: RoundSums, up: methods.Upload,
               plan: methods.ClientPlan, loss: float, sigma1_sq: float | None, state: methods.ServerState,
               ctx: RunContext, mechanisms: Sequence[methods.Mechanism] = ()) -> None:
    """One decoded upload into the round's sums: the mechanisms, `method.accumulate`, and the loop's
    diagnostics (a non-finite upload is dropped and counted). Shared by every driver."""
    if not torch.isfinite(up.params).all():
        S.add("nonfinite", 1)  # dropped from aggregation, counted (a diverging client must not poison the model)
        return
    for mech in mechanisms:
        up = mech.on_upload(up, plan, acc, ctx)
    method.accumulate(acc, up, ctx)
    g = up.group
    update = up.params - plan.start if up.mask is None else (up.params - plan.start) * up.mask
    acc["d_count"][g].add_(up.mask if up.mask is not None else 1.0)
    # the bound's terms count what the client trained (its plan's trained_mask, else its upload's mask) over
    # what the method deploys (Method.deployed_mask): docs/diagnostics.md
    trained = plan.trained_mask if plan.trained_mask is not None else up.mask
    acc["d_trained"][g].add_(trained if trained is not None else 1.0)
    acc["d_usum"][g].add_(update)
    acc["d_usq"][g] += update.double().square().sum()
    acc["d_n"][g] += 1
    mask = plan.trained_mask if plan.trained_mask is not None else plan.step.mask
    if mask is not None:  # w^2 = ||theta - theta*m||^2 / ||theta||^2 for this client, over the deployed entries
        theta = state.params.reshape(-1, ctx.layout.total)[g]
        S.add("w2", pruning_extent(theta, mask, live_row(method.deployed_mask(state, ctx), g, ctx.layout.total)))
    S.add("loss", loss)
    if sigma1_sq is not None:
        S.add("sigma1_sq", sigma1_sq)
        S.add("sigma1_n", 1)


def close_round(method: methods.Method, state: methods.ServerState, acc: dict[str, torch.Tensor], ctx: RunContext, r: int,
                per_client: dict[int, ClientStats], mechanisms: Sequence[methods.Mechanism] = ()) -> tuple[methods.ServerState, dict[str, Any]]:
    """The server step on the (all-reduced) sums and the rounds.jsonl row of its diagnostics; the
    driver adds what it knows (dropped and late clients, round and wall seconds)."""
    S = RoundSums(acc)
    mechanism_fields: dict[str, Any] = {}
    for mech in mechanisms:
        mechanism_fields.update(mech.on_aggregate(acc, state, ctx))
    live = method.deployed_mask(state, ctx)  # the entries the bound's terms are taken over (None: all)
    state = method.apply(state, acc, ctx)
    n_ok = float(acc["d_n"].sum())
    active = acc["d_n"] > 0  # groups that received updates this round
    gamma, uncovered = coverage(acc["d_trained"], active, live) if n_ok else (0, 1.0)
    usum, usq, nn_ = acc["d_usum"][active], acc["d_usq"][active], acc["d_n"][active]
    # sigma_2^2: mean over clients of ||delta_k - mean(delta)||^2 = E||delta||^2 - ||E delta||^2 (per group, pooled)
    sigma2 = float(((usq - usum.double().square().sum(1) / nn_).sum() / nn_.sum())) if n_ok >= 2 else None
    ks = sorted(per_client)
    row = R.RoundRow(  # dropped and late clients, round and wall seconds: the driver fills them (rounds.fill)
        round=r,
        clients=ks,
        steps=[per_client[k].steps for k in ks],
        client_loss=[_num(per_client[k].loss) for k in ks],
        client_uplink_bits=[per_client[k].uplink_bits for k in ks],
        client_downlink_bits=[per_client[k].downlink_bits for k in ks],
        trained_params=[per_client[k].trained_params for k in ks],
        flop_fraction=[round(per_client[k].flop_fraction, 6) for k in ks],
        client_seconds=[round(per_client[k].seconds, 6) for k in ks],
        client_train_seconds=[None if per_client[k].train_seconds is None else round(per_client[k].train_seconds, 4) for k in ks],
        client_images=round(sum(c.steps * ctx.cfg.train.batch_size * c.flop_fraction for c in per_client.values()), 3),
        loss=float(S["loss"] / n_ok) if n_ok else None,
        uplink_bits=int(S["uplink_bits"]),
        downlink_bits=int(S["downlink_bits"]),
        dropped_updates=int(S["nonfinite"]),
        gamma=gamma,
        uncovered_fraction=uncovered,
        w2=float(S["w2"] / n_ok) if n_ok else 0.0,
        sigma1_sq=float(S["sigma1_sq"] / S["sigma1_n"]) if float(S["sigma1_n"]) else None,
        sigma2_sq=sigma2,
    ).as_dict(**mechanism_fields)
    return state, row
