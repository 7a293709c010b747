"""Decentralized Diffusion Models (McAllister et al., 2025), with heterogeneous objectives.

K experts, each trained only on its own cluster of the data, with no communication
between experts; a router p(cluster | x_t, t) trained on noised samples after training;
at sampling time the experts' velocities are mixed by the router's posterior. Each
expert may use its own objective (DDPM epsilon-prediction or flow matching); every
prediction is converted to a velocity on the flow-matching path (Heterogeneous DDM,
2026; see the velocity space of benchmark/engine/diffusion.py), so ONE velocity-space ODE
sampler serves every mix.

Clients and experts. Client c trains expert e(c): the cluster of its data when
`data.partition` is `clusters:K` (then `num_experts` must be K, or 0 to follow the
partition), otherwise e(c) = c mod K. The clients of one expert are averaged per round
(FedAvg within the cluster, the loop's per-group aggregation); experts never exchange
anything.

Communication. uplink_bits = downlink_bits = 0 in every training round: the DDM setting
has no communication between experts. Averaging the clients that share an expert is
counted as data parallelism inside one compute island (in DDM, one expert's GPUs), not
as federated traffic; the bits it would cost, 2 x 32 x P per member of a cluster with at
least two members per round, are reported separately as `intra_expert_bits`.

Compute matching. Every participating client runs the same local steps with the same
batch size as under FedAvg, whichever expert it trains, so in a grid cell with the same
clients, rounds, local steps and batch size the K experts together get exactly the same
number of diffusion-model sample-gradient evaluations (sum of steps x batch) as one
federated model. The router's training (router_steps x router_batch, a classifier three
orders of magnitude smaller) is extra and reported as `router_sample_grads`; sampling
costs up to K network evaluations per step (full mixture), one per sample for top-1.

Data assumption. The router is trained on the clients' training images with their
cluster labels (the expert of the client that holds the image) — the central view DDM
also assumes when it trains its router. Its accuracy is measured on a seeded, stratified
10% of those images held out from its training, noised at t in five buckets, next to
the chance level (always answering the most frequent expert).
"""

from __future__ import annotations

import math
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from dfbench import datasets
from .base import FLOAT_BITS, Capabilities, ClientPlan, LocalStep, Method, ServerState, Upload
from .registry import register_method
from .router import Router, RouterData, init_router_, mixing_weights, router_accuracy, train_router

if TYPE_CHECKING:
    from dfbench.benchmark.core.config import RunConfig

    from .context import MethodContext

OBJECTIVES = ("ddpm", "fm")
MIXING_HELP = "full, top1, topk:K (1 <= K <= num_experts), oracle"
HOLDOUT = 0.1  # fraction of the clients' images held out to measure the router


def parse_mixing(spec: str) -> tuple[str, int]:
    """'full' | 'top1' | 'topk:K' | 'oracle' -> (mode, k). Raises ValueError naming method.mixing."""
    head, sep, arg = spec.partition(":")
    if head in ("full", "top1", "oracle") and not sep:
        return head, 1
    if head == "topk" and sep:
        try:
            k = int(arg)
        except ValueError:
            k = 0
        if k >= 1:
            return "topk", k
    raise ValueError(f"invalid value for 'method.mixing' of 'experts': {spec!r}; allowed: {MIXING_HELP}")


def parse_objectives(spec: str, num_experts: int, objective: str = "fm") -> list[str]:
    """'fm' | 'ddpm' | 'alternate' (ddpm, fm, ddpm, ...) | a comma list of length num_experts | 'auto': `objective`
    (train.objective; a resolved config holds it already: `Experts.resolve_config`)."""
    items = [s.strip() for s in (objective if spec.strip() == "auto" else spec).split(",")]
    allowed = f"ddpm, fm, alternate, or a comma list of ddpm/fm with one entry per expert ({num_experts})"
    if items == ["alternate"]:
        return [OBJECTIVES[e % 2] for e in range(num_experts)]
    if any(s not in OBJECTIVES for s in items) or len(items) not in (1, num_experts):
        raise ValueError(f"invalid value for 'method.objectives' of 'experts': {spec!r}; allowed: {allowed}")
    return items * num_experts if len(items) == 1 else items


def assign_experts(num_experts: int, partition_spec: str, cluster_of_client: np.ndarray | None,
                   num_clients: int) -> tuple[int, np.ndarray]:
    """(K, expert index of every client): its cluster under clusters:K, else c mod K (num_experts = 0: follow clusters:K)."""
    if cluster_of_client is not None:
        clusters = int(datasets.parse_partition(partition_spec).param)
        if num_experts not in (0, clusters):
            raise ValueError(
                f"invalid value for 'method.num_experts' of 'experts': {num_experts}; data.partition={partition_spec} "
                f"trains one expert per cluster, so allowed: {clusters} or 0 (follow the partition)")
        out = np.asarray(cluster_of_client, dtype=np.int64).copy()
        k = clusters
    else:
        if num_experts == 0:
            raise ValueError(
                f"invalid value for 'method.num_experts' of 'experts': 0 (follow the partition) needs "
                f"data.partition=clusters:K, got {partition_spec!r}; allowed: an integer >= 1 here")
        k = num_experts
        out = np.arange(num_clients, dtype=np.int64) % k
    if k > num_clients:
        raise ValueError(f"invalid value for 'method.num_experts' of 'experts': {k}; allowed: at most data.clients={num_clients} "
                         "(every expert needs a client)")
    return k, out


@register_method("experts")
class Experts(Method):
    """K isolated experts (one per data cluster), a router trained after training, mixing in velocity space."""

    headline_params = ("num_experts", "mixing")

    capabilities = Capabilities(
        midway_sampling=False,  # the mixture samples through the router, which finalize() trains after the last round
        mean_aggregation=False,  # its router is trained on the clients' data after the last round, outside any sum
        asynchronous=False,  # not built: per-expert groups under stale updates
        hierarchical=False,  # not built: per-expert groups and the router under edge servers
        needs="trains isolated experts per cluster and samples through a router trained after the last round")

    @dataclass(frozen=True)
    class Config:
        num_experts: int = 2  # 0 = one per cluster of a clusters:K partition
        # auto (train.objective for every expert, as every other method trains it) | fm | ddpm | alternate | a comma
        # list, one per expert ("ddpm,fm,fm,fm"); auto is resolved with the config, so run ids hold fm or ddpm
        objectives: str = "auto"
        mixing: str = "top1"  # full | top1 | topk:K | oracle
        router_steps: int = 300
        router_batch: int = 64
        router_lr: float = 2e-3

        def validate(self) -> None:
            def bad(key: str, value: Any, allowed: str) -> ValueError:
                return ValueError(f"invalid value for 'method.{key}' of 'experts': {value!r}; allowed: {allowed}")

            if self.num_experts < 0:
                raise bad("num_experts", self.num_experts, "an integer >= 1, or 0 to follow a clusters:K partition")
            mode, k = parse_mixing(self.mixing)
            if mode == "topk" and self.num_experts and k > self.num_experts:
                raise bad("mixing", self.mixing, MIXING_HELP.replace("num_experts", str(self.num_experts)))
            items = [s.strip() for s in self.objectives.split(",")]
            if items not in (["alternate"], ["auto"]):
                if any(s not in OBJECTIVES for s in items):
                    raise bad("objectives", self.objectives, "auto (train.objective), ddpm, fm, alternate, or a comma list of "
                              "ddpm/fm, one per expert")
                if self.num_experts and len(items) not in (1, self.num_experts):
                    raise bad("objectives", self.objectives, f"one value, or exactly num_experts={self.num_experts} values")
            if self.router_steps < 1:
                raise bad("router_steps", self.router_steps, "an integer >= 1")
            if self.router_batch < 1:
                raise bad("router_batch", self.router_batch, "an integer >= 1")
            if not (math.isfinite(self.router_lr) and self.router_lr > 0):
                raise bad("router_lr", self.router_lr, "a finite number > 0")

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.mode, self.topk = parse_mixing(config.mixing)
        self.expert_of_client: np.ndarray | None = None
        self.objectives: list[str] = []
        self.router: Router | None = None

    @property
    def num_experts(self) -> int:
        return len(self.objectives)

    # -- server ------------------------------------------------------------------------------
    @classmethod
    def check(cls, config: "Experts.Config", run: "RunConfig", world: int = 1) -> None:
        """What the partition and the sampler allow, before any data is loaded."""
        super().check(config, run, world)
        if run.eval.sampler == "ddim":
            raise ValueError("invalid value for 'eval.sampler' with method 'experts': 'ddim'; the experts are sampled in "
                             "velocity space, allowed: auto (heun), euler, heun")
        spec = datasets.parse_partition(run.data.partition)
        # the number of experts from the spec alone (clusters:K gives K; the cluster ids themselves need the data)
        k, _ = assign_experts(config.num_experts, run.data.partition, np.zeros(run.data.clients, dtype=np.int64)
                              if spec.kind == "clusters" else None, run.data.clients)
        if run.train.init_objective == "ddpm" and "ddpm" in parse_objectives(config.objectives, k, run.train.objective):
            raise ValueError(f"invalid value for 'method.objectives' of 'experts' with train.init_objective=ddpm: "
                             f"{config.objectives!r}; allowed: fm (every expert starts from the DDPM weights converted "
                             "to a velocity network; a DDPM expert would start from them as they are: train.init_objective='')")
        mode, topk = parse_mixing(config.mixing)
        if mode == "topk" and topk > k:
            raise ValueError(f"invalid value for 'method.mixing' of 'experts': {config.mixing!r}; allowed: {MIXING_HELP.replace('num_experts', str(k))}")

    @classmethod
    def resolve_config(cls, config: Any, run: "RunConfig") -> Any:
        """objectives=auto: every expert trains train.objective, as every other method does."""
        return dataclasses.replace(config, objectives=run.train.objective) if config.objectives == "auto" else config

    def client_groups(self, run: "RunConfig", cluster_of_client: np.ndarray | None) -> np.ndarray:
        """Each client's expert (its cluster under clusters:K, else client mod K)."""
        return assign_experts(self.config.num_experts, run.data.partition, cluster_of_client, run.data.clients)[1]

    def sampler_label(self, run: "RunConfig") -> str:
        return "euler" if run.eval.sampler == "euler" else "heun"

    def init_state(self, params: torch.Tensor, ctx: "MethodContext") -> ServerState:
        """All experts start from the run's initial parameters (seeded, or train.init's weights): state.params is [K, P]."""
        cfg = self.config
        k, self.expert_of_client = assign_experts(cfg.num_experts, ctx.cfg.data.partition, ctx.partition.cluster_of_client,
                                                  ctx.num_clients)
        self.objectives = parse_objectives(cfg.objectives, k, ctx.cfg.train.objective)
        return ServerState(params=params.detach().unsqueeze(0).repeat(k, 1), extra={"intra_expert_bits": 0})

    def client_view(self, state: ServerState, client: int, ctx: "MethodContext") -> ClientPlan:
        e = int(self.expert_of_client[client])
        # no downlink: the client keeps training its own cluster's expert (DDM: no communication)
        return ClientPlan(start=state.params[e], step=LocalStep(objective=self.objectives[e]), group=e, downlink_bits=0)

    def upload(self, local: torch.Tensor, plan: ClientPlan, client: int, state: ServerState, ctx: "MethodContext") -> Upload:
        return Upload(params=local, weight=float(ctx.client_sizes[client]), uplink_bits=0, mask=None, group=plan.group)

    def new_accumulator(self, state: ServerState, ctx: "MethodContext") -> dict[str, torch.Tensor]:
        acc = super().new_accumulator(state, ctx)
        acc["members"] = torch.zeros(state.params.shape[0], dtype=torch.float64, device=state.params.device)
        return acc

    def accumulate(self, acc: dict[str, torch.Tensor], up: Upload, ctx: "MethodContext") -> None:
        super().accumulate(acc, up, ctx)
        acc["members"][up.group] += 1

    def apply(self, state: ServerState, acc: dict[str, torch.Tensor], ctx: "MethodContext") -> ServerState:
        """Per-expert FedAvg (the base class's per-group mean); tally the intra-expert sync bits."""
        new = super().apply(state, acc, ctx)
        m = acc["members"]
        bits = int(2 * FLOAT_BITS * ctx.layout.total * float(m[m >= 2].sum()))
        new.extra = {**state.extra, "intra_expert_bits": int(state.extra.get("intra_expert_bits", 0)) + bits}
        return new

    # -- router ---------------------------------------------------------------------------------
    def _router_data(self, ctx: "MethodContext") -> RouterData:
        """Every client-held image labelled with its client's expert; a seeded HOLDOUT fraction of
        each expert's images (stratified, so the held-out mix matches training) is held out."""
        idx = np.concatenate([ctx.partition.indices[c] for c in range(ctx.num_clients)])
        y = np.concatenate([np.full(len(ctx.partition.indices[c]), self.expert_of_client[c]) for c in range(ctx.num_clients)])
        rng = ctx.rng("experts", "router", "split")
        held_parts, train_parts = [], []
        for e in range(self.num_experts):
            rows = rng.permutation(np.flatnonzero(y == e))
            n_held = min(len(rows) - 1, max(1, int(round(HOLDOUT * len(rows)))))
            held_parts.append(rows[:n_held])
            train_parts.append(rows[n_held:])
        held, train = np.concatenate(held_parts), np.concatenate(train_parts)
        as_t = lambda a: torch.as_tensor(a, dtype=torch.long, device=ctx.device)  # noqa: E731
        return RouterData(ctx.images, as_t(idx[train]), as_t(y[train]), as_t(idx[held]), as_t(y[held]))

    def finalize(self, state: ServerState, ctx: "MethodContext") -> dict[str, Any]:
        """Train the router (or restore it from a checkpoint that already has it); report its accuracy."""
        cfg = self.config
        k = self.num_experts
        info: dict[str, Any] = {
            "experts": {"num_experts": k, "objectives": self.objectives, "mixing": cfg.mixing,
                        "clients_per_expert": np.bincount(self.expert_of_client, minlength=k).tolist()},
            "intra_expert_bits": int(state.extra.get("intra_expert_bits", 0)),
            "mixture_sampler": self.sampler_label(ctx.cfg),
        }
        if k == 1:  # a single expert needs no router: every weight is 1
            self.router = None
            return {**info, "router_accuracy": None, "router_sample_grads": 0}
        router = Router(ctx.image_shape[0], k).to(ctx.device)
        saved = state.extra.get("router")
        if saved is not None:
            router.load_state_dict(saved)
            acc = dict(state.extra["router_accuracy"])
        else:
            data = self._router_data(ctx)
            init_router_(router, ctx.gen("experts", "router", "init"))
            train_router(router, data, steps=cfg.router_steps, batch_size=cfg.router_batch, lr=cfg.router_lr,
                         gen=ctx.gen("experts", "router", "train"))
            acc = router_accuracy(router, data, ctx.gen("experts", "router", "eval"))
            # chance level: always answering the most frequent expert of the held-out images
            acc["chance"] = float(np.bincount(data.held_y.cpu().numpy(), minlength=k).max() / data.held_y.numel())
            # in state.extra, so the loop's checkpoint keeps the router with the experts
            state.extra["router"] = {n: p.detach().clone() for n, p in router.state_dict().items()}
            state.extra["router_accuracy"] = acc
        router.eval()
        self.router = router
        return {**info, "router_accuracy": acc, "router_sample_grads": cfg.router_steps * cfg.router_batch}

    # -- sampling ------------------------------------------------------------------------------
    def _expert_velocity(self, e: int, x: torch.Tensor, tb: torch.Tensor, ctx: "MethodContext") -> torch.Tensor:
        """Velocity of expert e at (x, t): FM predicts it; DDPM's epsilon is converted (ctx.velocity)."""
        return ctx.velocity(ctx.model, x, tb, self.objectives[e])

    def expert_weights(self, x: torch.Tensor, tb: torch.Tensor) -> torch.Tensor:
        """Router posterior p(expert | x_t, t), [B, K]; exactly 1 for a single expert."""
        if self.router is None:
            if self.num_experts != 1:
                raise RuntimeError("experts: the router is not trained; sample() needs finalize() to run first")
            return torch.ones((x.shape[0], 1), device=x.device, dtype=x.dtype)
        return F.softmax(self.router(x, tb).double(), dim=1).to(x.dtype)

    def mixture_velocity(self, params: torch.Tensor, x: torch.Tensor, t: float, ctx: "MethodContext",
                         fixed: torch.Tensor | None = None, record: list[torch.Tensor] | None = None) -> torch.Tensor:
        """sum_k w_k(x, t) v_k(x, t); experts with zero weight for a sample are not evaluated on it."""
        tb = torch.full((x.shape[0],), t, device=x.device)
        if fixed is not None:
            w = fixed
        else:
            probs = self.expert_weights(x, tb)
            if record is not None:
                record.append(probs)
            w = probs if self.num_experts == 1 else mixing_weights(probs, "full" if self.mode == "oracle" else self.mode, self.topk)
        v = torch.zeros_like(x)
        for e in range(self.num_experts):
            rows = (w[:, e] > 0).nonzero().squeeze(1)
            if rows.numel() == 0:
                continue
            ctx.flat.copy_(params[e])  # the one shared model buffer holds expert e now
            if rows.numel() == x.shape[0]:
                v += w[:, e].view(-1, *[1] * (x.dim() - 1)) * self._expert_velocity(e, x, tb, ctx)
            else:
                ve = self._expert_velocity(e, x[rows], tb[rows], ctx)
                v.index_add_(0, rows, w[rows, e].view(-1, *[1] * (x.dim() - 1)) * ve)
        return v

    def velocity(self, params: torch.Tensor, ctx: "MethodContext") -> Callable[[torch.Tensor, float], torch.Tensor]:
        """The mixture as it samples: the router's weights (mixing mode; oracle: the full mixture,
        since its second pass needs a whole trajectory) times each expert's velocity."""
        ctx.model.eval()
        flat = params.reshape(self.num_experts, -1)
        return lambda x, t: self.mixture_velocity(flat, x, t, ctx)

    @torch.no_grad()
    def sample(self, params: torch.Tensor, noise: torch.Tensor, ctx: "MethodContext", batch: int | None = None) -> torch.Tensor:
        """One velocity-space ODE (eval.sampler: heun, or euler) for every mixing mode.

        oracle: two passes. Pass 1 runs the full mixture and keeps the router's top-1 expert at
        its last evaluation (the lowest noise level it sees, where the router is most accurate);
        pass 2 re-samples from the same noise with that expert alone — "the expert the sample
        turns out to belong to", picked without any label.
        """
        params = params.reshape(self.num_experts, -1)
        batch = batch or ctx.cfg.eval.sample_batch
        method = "euler" if ctx.cfg.eval.sampler == "euler" else "heun"
        steps = ctx.cfg.eval.sampler_steps
        ctx.model.eval()
        out = []
        try:
            for i in range(0, noise.shape[0], batch):
                x = noise[i:i + batch].to(ctx.device)
                fixed = None
                if self.mode == "oracle" and self.num_experts > 1:
                    record: list[torch.Tensor] = []
                    ctx.integrate_velocity(lambda z, t: self.mixture_velocity(params, z, t, ctx, record=record), x, steps, method)
                    fixed = F.one_hot(record[-1].argmax(1), self.num_experts).to(x.dtype)
                x = ctx.integrate_velocity(lambda z, t: self.mixture_velocity(params, z, t, ctx, fixed=fixed), x, steps, method)
                out.append(x.cpu())
        finally:
            ctx.model.train()
        return torch.cat(out)
