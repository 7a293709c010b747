"""A two-level topology: clients -> edge servers -> cloud (hierarchical FL, e.g. HierFAVG, Liu et al.,
ICC 2020; FedPhD, Long et al. 2025), as a system setting any method runs under.

`system.edges = E > 0` replaces the flat round (training.py) with this driver; `system.edge_rounds = H`
edge aggregations make one cloud round, and `train.rounds` counts cloud rounds. Cloud round r:

    every edge e starts from the cloud model (its state: the cloud's, the parameters shared, state.extra
    the same dict: per-client memory stays the client's own)
    for h = 1..H, edge round t = (r - 1) H + h:
        sample the round's clients as a flat round t would (participation, sampling, dropout: seeded by t)
        method.assign_edges(clients, loads, ctx) -> each client's edge (default: fixed contiguous blocks
            of client ids; FedPhD: its homogeneity-aware selection)
        every edge with clients runs training.train_clients on them from its own model: the method's own
            client_view / upload / accumulate / apply, the local step, the clock, parallel or batched clients
            alike (an edge round IS an ordinary round of that edge's clients), with the cloud round's lr
    the cloud: theta = sum_e w_e c_e theta_e / sum_e w_e c_e per parameter, with w_e = method.cloud_weights
        (default n_e: the samples of the distinct clients edge e aggregated this cloud round) and c_e = 1
        where edge e's clients trained the parameter this cloud round, else 0 (a parameter no edge trained
        keeps the cloud's value: the "covered" rule of masked updates, one level up)

Seeds: edge round t draws its clients and its client generators as flat round t would, so with one
edge and H = 1 a cloud round IS the flat round (bitwise, tested); the clients' lr is round r's. Under
edges `ctx.round` counts edge rounds for every hook: t in an edge round, r H (the cloud round's last
edge round) in `cloud_weights` and `model_bits`.

Bits (rounds.jsonl): `uplink_bits` / `downlink_bits` and the per-client lists stay the client <-> edge
links (what clients send and receive, summed over the edge rounds); `edge_uplink_bits` is what the edges
send the cloud (method.model_bits of each edge model that aggregated anything) and `edge_downlink_bits`
what the cloud sends the E edges at the start of the round (E x method.model_bits). metrics.json sums
both over the run.

Row of a cloud round: the per-client lists hold one entry per aggregated update, edge round by edge
round and edge by edge (a client trained in two edge rounds appears twice), with `client_edges` and
`client_edge_rounds` beside them; loss, w2, sigma1 are means over those updates; gamma and the
uncovered fraction count, per deployed parameter, the updates that trained it in the whole cloud round;
sigma2 pools each aggregation's spread around its own mean. `edge_weights` are the cloud's w_e.

Clock: the edges run side by side and their rounds one after another, so a cloud round lasts the
longest edge's sum of edge-round seconds (each edge round: its slowest client, or the deadline);
the edge <-> cloud links are instantaneous (not simulated).

Not supported (refused before any work, benchmark/core/config.py and resolve.py): train.driver=fedbuff,
differential privacy (its accountant composes flat rounds), several ranks, and methods whose server
state is more than the parameters (`Capabilities(hierarchical=False)`: server optimizers, SCAFFOLD,
PowerSGD's broadcast, experts' router).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dfbench import methods
from dfbench.benchmark.core import rounds as R
from dfbench.benchmark.core.config import round_lr
from dfbench.benchmark.engine.context import RunContext, sample_round_clients
from dfbench.benchmark.engine.training import ClientsDone, RoundSums, _num, coverage, train_clients


#: the rounds.jsonl fields of the edge <-> cloud links; the run's totals (metrics.json) sum them
EDGE_BITS = ("edge_uplink_bits", "edge_downlink_bits")


def cloud_average(cloud: torch.Tensor, edges: list[torch.Tensor], weights: list[float],
                  covered: list[torch.Tensor]) -> torch.Tensor:
    """The cloud's model: per parameter, sum_e w_e c_e theta_e / sum_e w_e c_e over the edges that trained it
    (c_e: 0/1, shaped like the parameters), the cloud's own value where none did. One edge with weight > 0
    that trained everything gives its model back exactly (no rounding)."""
    live = [e for e, w in enumerate(weights) if w > 0]
    if not live:
        return cloud.clone()
    if len(live) == 1 and bool(covered[live[0]].all()):
        return edges[live[0]].clone()
    wsum = torch.zeros_like(cloud, dtype=torch.float64)
    wcov = torch.zeros_like(cloud, dtype=torch.float64)
    for e in live:  # float64 sums, as the methods' own aggregation
        c = covered[e].double() * weights[e]
        wsum += c * edges[e].double()
        wcov += c
    return torch.where(wcov > 0, wsum / wcov.clamp_min(1e-300), cloud.double()).to(cloud.dtype)


@dataclass
class Hierarchical:
    """The driver of `system.edges > 0` (see the module doc): no state between cloud rounds (every edge
    restarts from the cloud model), so its checkpoint is empty and a resumed run continues bitwise."""

    method: methods.Method
    ctx: RunContext

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load(self, sd: dict[str, Any] | None) -> None:
        pass

    def step(self, state: methods.ServerState, r: int) -> tuple[methods.ServerState, dict[str, Any]]:
        """Cloud round r: H edge rounds at every edge, then the cloud's weighted mean; returns its state and row."""
        t0 = time.perf_counter()
        method, ctx, cfg = self.method, self.ctx, self.ctx.cfg
        E, H, lr = cfg.system.edges, cfg.system.edge_rounds, round_lr(cfg.train, r)
        # under edges ctx.round counts edge rounds (the seeds' and the hooks' one clock): the cloud's hooks
        # (weights, bits) see the cloud round's last edge round
        at_cloud = ctx.at_round(r * H, lr=lr)
        edge_states = [methods.ServerState(params=state.params, extra=state.extra) for _ in range(E)]
        rounds: list[list[tuple[int, ...]]] = [[] for _ in range(E)]  # per edge, the clients of each edge round
        covered = [torch.zeros_like(state.params, dtype=torch.bool) for _ in range(E)]
        done: list[tuple[int, int, ClientsDone]] = []  # (edge round h, edge, what it aggregated)
        dropped: list[int] = []
        edge_seconds = [0.0] * E
        for h in range(1, H + 1):
            t = (r - 1) * H + h
            clients, out = sample_round_clients(ctx.num_clients, cfg.system.participation, cfg.system.dropout, cfg.seed, t,
                                                cfg.system.sampling)
            dropped += out
            loads = [methods.EdgeLoad(rounds=tuple(ks)) for ks in rounds]
            where = method.assign_edges(list(clients), loads, ctx.at_round(t, lr=lr))
            bad = [e for e in where if not 0 <= int(e) < E]
            if len(where) != len(clients) or bad:
                raise ValueError(f"method {method.name!r}: assign_edges gave {list(where)} for clients {list(clients)}; "
                                 f"it must give one edge in 0..{E - 1} per client")
            for e in range(E):
                mine = [k for k, w in zip(clients, where) if int(w) == e]
                if not mine:
                    continue
                d = train_clients(method, edge_states[e], ctx, t, mine, lr=lr)
                edge_states[e] = d.state
                if d.row["clients"]:  # (all of them late: nothing aggregated)
                    rounds[e].append(tuple(d.row["clients"]))
                covered[e] |= (d.acc["d_count"] > 0).reshape(state.params.shape)
                edge_seconds[e] += d.row["round_seconds"]
                done.append((h, e, d))
        loads = [methods.EdgeLoad(rounds=tuple(ks)) for ks in rounds]
        weights = [float(w) for w in method.cloud_weights(loads, at_cloud)]
        if len(weights) != E or not all(np.isfinite(w) and w >= 0 for w in weights):
            raise ValueError(f"method {method.name!r}: cloud_weights gave {weights}; it must give one finite weight >= 0 per edge")
        weights = [w if load.clients else 0.0 for w, load in zip(weights, loads)]  # an edge that aggregated nothing
        # the model the cloud sent every edge at the round's start, in the form its edges trained it this round
        # (asked after the edge rounds: a method that shrinks the model once, FedPhD's pruning, has done so)
        down_bits = E * int(method.model_bits(state, at_cloud))
        new = methods.ServerState(params=cloud_average(state.params, [s.params for s in edge_states], weights, covered),
                                  extra=state.extra)
        up_bits = sum(int(method.model_bits(edge_states[e], at_cloud)) for e in range(E) if loads[e].clients)
        row = cloud_row(r, done, dropped, edge_seconds, weights)
        R.fill(row, edge_uplink_bits=up_bits, edge_downlink_bits=down_bits, wall_seconds=round(time.perf_counter() - t0, 4))
        return new, row


def cloud_row(r: int, done: list[tuple[int, int, ClientsDone]], dropped: list[int], edge_seconds: list[float],
              weights: list[float]) -> dict[str, Any]:
    """The rounds.jsonl row of a cloud round from its edge aggregations (see the module doc): a
    `rounds.RoundRow` (the flat round's keys, in its order), then the hierarchy's own (`rounds.ADDED`)."""
    rows = [d.row for _, _, d in done]
    sums = [RoundSums(d.acc) for _, _, d in done]

    def joined(key: str) -> list[Any]:
        return [v for row in rows for v in row[key]]

    def total(name: str) -> float:
        return float(sum(float(S[name]) for S in sums))

    n_ok = sum(float(d.acc["d_n"].sum()) for _, _, d in done)
    count = sum(d.acc["d_trained"] for _, _, d in done) if done else None
    active = sum(d.acc["d_n"] for _, _, d in done) > 0 if done else None
    # over the entries the method deploys (the last aggregation's: a model pruned this round is counted pruned)
    gamma, uncovered = coverage(count, active, done[-1][2].live) if n_ok and count is not None else (0, 1.0)
    # sigma_2^2 pooled over the aggregations, each around its own mean (their starts differ)
    spread, pooled_n = 0.0, 0.0
    for _, _, d in done:
        a = d.acc["d_n"] > 0
        usum, usq, nn_ = d.acc["d_usum"][a], d.acc["d_usq"][a], d.acc["d_n"][a]
        if float(nn_.sum()) >= 1:
            spread += float((usq - usum.double().square().sum(1) / nn_).sum())
            pooled_n += float(nn_.sum())
    row = R.RoundRow(
        round=r,
        **{name: joined(name) for name in R.PER_CLIENT},
        dropped_clients=dropped,
        late_clients=joined("late_clients"),
        round_seconds=round(max(edge_seconds, default=0.0), 6),
        client_images=round(sum(row["client_images"] for row in rows), 3),
        loss=total("loss") / n_ok if n_ok else None,
        uplink_bits=int(total("uplink_bits")),
        downlink_bits=int(total("downlink_bits")),
        dropped_updates=int(total("nonfinite")),
        gamma=gamma,
        uncovered_fraction=uncovered,
        w2=total("w2") / n_ok if n_ok else 0.0,
        sigma1_sq=total("sigma1_sq") / total("sigma1_n") if total("sigma1_n") else None,
        sigma2_sq=spread / pooled_n if n_ok >= 2 and pooled_n else None,
    ).as_dict()
    R.fill(row, client_edges=[e for _, e, d in done for _ in d.row["clients"]],
           client_edge_rounds=[h for h, _, d in done for _ in d.row["clients"]], edge_weights=[_num(w) for w in weights])
    for key in rows[0] if rows else ():  # a mechanism's per-client list (rounds.RoundRow.as_dict): joined like the others
        if key not in row and isinstance(rows[0][key], list):
            row[key] = joined(key)
    return row


def make_driver(method: methods.Method, ctx: RunContext) -> Hierarchical | None:
    """The run's hierarchical driver (system.edges > 0), or None for flat rounds."""
    return Hierarchical(method=method, ctx=ctx) if ctx.cfg.system.edges else None


__all__ = ["EDGE_BITS", "Hierarchical", "cloud_average", "cloud_row", "make_driver"]
