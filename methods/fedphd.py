"""FedPhD: federated pruning with hierarchical learning of diffusion models (Long, Wang, Anagnostopoulos and
Bi, "FedPhD: Federated Pruning with Hierarchical Learning of Diffusion Models", arXiv 2507.06449, 2025).

Sources. The paper's text beyond its abstract was not available where this was written, so no section or
equation number is quoted: each rule below cites the authors' public code (github.com/EricLoong/fed_phd,
December 2024, "code checking for ICDE 2025"; files under standalone/fedphd_ddim/ and exp/fedphd/), read,
not copied. The abstract's three parts are: hierarchical FL with a homogeneity-aware model aggregation and
an edge selection policy, and distributed structured pruning of the diffusion UNet.

1. Hierarchy (the engine's two-level topology, benchmark/engine/hierarchical.py: system.edges = E edge
   servers, system.edge_rounds = H; the authors' scripts run E = 2, H = 5 = their `aggr_freq`). Each edge
   round the sampled clients train from their edge's model and the edge averages them (FedAvg,
   fedphd_api._aggregate); every H edge rounds the cloud averages the edge models and every edge restarts
   from the result (fedphd_api.train).

2. Statistical homogeneity (client.calculate_homogeneity_score): a label distribution P over C classes
   scores  SH(P) = 2 - ||P - Q||_2  against the target Q, the uniform distribution (fedphd_api's
   server_distribution); SH in [2 - sqrt(2), 2], 2 = perfectly balanced.

3. Edge selection (client.select_best_edge_server): a sampled client k (label counts c_k, n_k samples)
   scores every edge e by the edge's label mix if k joined it,
       P_e+k = (counts_e + c_k) / (s_e + n_k),   score_e = max(A_sel * SH(P_e+k) - s_e, 0) + 1e-8,
   where counts_e and s_e are the labels and samples of every update edge e aggregated since the last
   cloud aggregation (one entry per participation, fedphd_api._update_edge_distribution), and joins edge
   e with probability score_e / sum score (A_sel = 10000, the code's constant: `select_a`). Homogeneity
   attracts, load repels. All clients of an edge round choose from the loads at the round's start (the
   code assigns every sampled client first, then trains); the draws come from ctx.rng("fedphd", "edges",
   edge round), one per client in client order.

4. Homogeneity-aware cloud aggregation (fedphd_api._aggregate_server): edge e's weight is
       w_e = max(n_e + a * SH(P_e) + b, 0),   theta = sum_e w_e theta_e / sum_e w_e,
   with n_e the samples of the clients of the edge's last aggregation (the code's edge_models[e][0]) and
   P_e its label mix since the last cloud aggregation; a = `agg_a` (5000, the code's default; its
   CIFAR-10 scripts use 40000-50000, CelebA 20000), b = `agg_b` (0).

5. Structured pruning (structure_prune.group_norm_prune): channel pruning with torch_pruning's MetaPruner
   and GroupNormImportance(p=2) at `pruning_ratio` (the scripts: 0.2 on CIFAR-10, 0.4 on CelebA), the output
   conv's image channels kept. Here, without torch_pruning: the UNet's coupled channel spaces are traced
   (`channel_spaces`: a layer's outputs with the next layers' inputs, its norm, its bias; residual sums,
   the up path's cat([h, skip]) blocks, attention's shared q/k space and its v space, the time MLP), a
   channel's importance is the sum of squared entries of every weight tied to it (conv and linear output
   and input slices, GroupNorm scales: the group L2 criterion, whose mean over the group's layers ranks
   alike), and each space keeps its most important channels (ties: the lower index), in index order.
   The kept counts are those of the UNet at base width ceil((1 - prune_ratio) c0) (level m keeps
   m * ceil((1 - ratio) c0) of m c0: torch_pruning keeps C - floor(ratio C), the same for small28 at 0.2),
   so the clients then train a really smaller dense network: the narrow UNet through HeteroFL's
   `SubModel` (methods/heterofl.py: functional_call with the kept slices of the global parameters, no
   Scaler: pruning does not rescale; trained in its `DenseNetwork` form, at its own size), its GroupNorms
   with gcd(8, c') groups. The authors' scripts prune
   the initial model (`--train_scratch`); `prune_round = R` trains the full model for R cloud rounds
   first, then prunes it once, on the server, by the same criterion (their other mode trains those
   rounds with a sparsity regularizer, see below). Pruned entries stay in the flat vector, never trained
   and never sent; sampling and the held-out loss run the pruned network, and the bound's diagnostics
   (Γ, the uncovered fraction, w²: `deployed_mask`, docs/diagnostics.md) count the pruned network's entries only.

Bits: 32 per kept parameter each way on every link (client <-> edge: the plans and uploads; edge <-> cloud:
`model_bits`, the engine's edge_uplink_bits / edge_downlink_bits); the kept channels are not sent (the
server prunes once and every party holds the smaller network). Without edges (system.edges = 0) FedPhD
is its pruning alone: one server, nothing for the selection or the homogeneity weights to choose.

Left out (and why): the sparse-training phase (`--sparse_training`, lambda * sum of each weight's L2 norm
added to the local loss for `st_rounds` rounds before pruning: the shared local step has no regularizer
hook; `prune_round` prunes after plain training instead); the code's quirk that an edge which aggregated
nothing since the last cloud aggregation keeps a stale model with the uniform distribution's maximal
homogeneity (here it weighs 0); the code's first cloud aggregation after one edge round (here every
cloud round has H); the exact kept counts of torch_pruning where they differ (above); attention heads
(this UNet's attention has one head); its DDIM/EMA training details (the benchmark's own local step).
FedPhD's edges hold no state between cloud rounds, as in the code (edge models and distributions are
reset at every cloud aggregation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

import numpy as np
import torch
from torch import nn

from dfbench.benchmark.core import presets

from .base import FLOAT_BITS, Capabilities, ClientPlan, EdgeLoad, LocalStep, Method, ServerState, Upload
from .heterofl import SliceSpec, SubModel, SubModelInfo, narrow_width, submodel_info
from .registry import register_method

if TYPE_CHECKING:
    from dfbench.benchmark.core.config import RunConfig

    from .context import MethodContext

KEEP_KEY = "fedphd_keep"  # state.extra: the kept channel indices of every channel space (set once, at pruning)
SELECT_EPS = 1e-8  # the selection score's floor (client.select_best_edge_server's epsilon)


# -- homogeneity, selection, cloud weights (items 2-4 of the module doc) -------------------------------

def homogeneity(dist: np.ndarray, target: np.ndarray) -> np.ndarray:
    """SH(P) = 2 - ||P - Q||_2 over the last axis (one score per row of `dist`)."""
    return 2.0 - np.sqrt(np.square(np.asarray(dist, dtype=np.float64) - target).sum(-1))


def selection_probabilities(edge_counts: np.ndarray, client_counts: np.ndarray, select_a: float) -> np.ndarray:
    """Client k's probability of joining each edge: score_e = max(A SH((counts_e + c_k) / (s_e + n_k)) - s_e, 0)
    + 1e-8, normalized; `edge_counts` [E, C] label counts the edges aggregated so far, `client_counts` [C]."""
    edge_counts = np.asarray(edge_counts, dtype=np.float64)
    c = np.asarray(client_counts, dtype=np.float64)
    s = edge_counts.sum(1)
    merged = (edge_counts + c) / (s + c.sum())[:, None]
    target = np.full(c.shape[0], 1.0 / c.shape[0])
    score = np.maximum(select_a * homogeneity(merged, target) - s, 0.0) + SELECT_EPS
    return score / score.sum()


def cloud_weight(n_e: float, counts: np.ndarray, a: float, b: float) -> float:
    """w_e = max(n_e + a SH(P_e) + b, 0), P_e = counts / sum(counts) (0 for an edge that aggregated nothing)."""
    counts = np.asarray(counts, dtype=np.float64)
    if counts.sum() <= 0:
        return 0.0
    target = np.full(counts.shape[0], 1.0 / counts.shape[0])
    return float(max(n_e + a * float(homogeneity(counts / counts.sum(), target)) + b, 0.0))


# -- structured pruning (item 5) -------------------------------------------------------------------------

@dataclass
class ChannelSpace:
    """One set of coupled channels: the same C channels along every listed (parameter, dim, offset) slice
    (its channels are [offset, offset + C) of that dim), so one kept choice applies to all of them."""

    size: int
    slices: list[tuple[str, int, int]] = field(default_factory=list)


def channel_spaces(net: nn.Module) -> list[ChannelSpace]:
    """The coupled channel spaces of the benchmark's UNet (benchmark/engine/model.py), traced in forward order.
    The image channels and the sinusoidal time features are inputs, in no space (never pruned)."""
    parent: list[int] = []
    sizes: list[int] = []
    slices: list[list[tuple[str, int, int]]] = []

    def new(c: int) -> int:
        parent.append(len(parent))
        sizes.append(c)
        slices.append([])
        return len(parent) - 1

    def find(a: int) -> int:
        while parent[a] != a:
            a = parent[a]
        return a

    def add(s: int, name: str, dim: int, offset: int = 0) -> None:
        slices[s].append((name, dim, offset))

    tdim = net.time[0].out_features
    t1 = new(tdim)
    for name, d in (("time.0.weight", 0), ("time.0.bias", 0), ("time.2.weight", 1)):
        add(t1, name, d)
    temb = new(tdim)
    for name, d in (("time.2.weight", 0), ("time.2.bias", 0)):
        add(temb, name, d)

    def conv(prefix: str, x: int, c: int) -> int:  # a plain conv: inputs x, a new output space
        add(x, f"{prefix}.weight", 1)
        y = new(c)
        add(y, f"{prefix}.weight", 0)
        add(y, f"{prefix}.bias", 0)
        return y

    def res(prefix: str, blk: nn.Module, ins: list[int]) -> int:  # a ResBlock on cat(ins)
        offset, has_skip = 0, isinstance(blk.skip, nn.Conv2d)
        for s in ins:
            for name, d in (("norm1.weight", 0), ("norm1.bias", 0), ("conv1.weight", 1)) + ((("skip.weight", 1),) if has_skip else ()):
                add(s, f"{prefix}.{name}", d, offset)
            offset += sizes[s]
        a = new(blk.conv1.out_channels)
        for name, d in (("conv1.weight", 0), ("conv1.bias", 0), ("temb.weight", 0), ("temb.bias", 0),
                        ("norm2.weight", 0), ("norm2.bias", 0), ("conv2.weight", 1)):
            add(a, f"{prefix}.{name}", d)
        add(temb, f"{prefix}.temb.weight", 1)
        if has_skip:
            y = new(blk.conv2.out_channels)
            add(y, f"{prefix}.skip.weight", 0)
            add(y, f"{prefix}.skip.bias", 0)
        else:  # identity skip: the block's output is its input's space (a residual sum)
            (y,) = ins
        add(y, f"{prefix}.conv2.weight", 0)
        add(y, f"{prefix}.conv2.bias", 0)
        return y

    def attn(prefix: str, blk: nn.Module, x: int) -> int:  # x + out(attention(qkv(norm(x))))
        c = blk.out.out_channels
        for name, d in (("norm.weight", 0), ("norm.bias", 0), ("qkv.weight", 1), ("out.weight", 0), ("out.bias", 0)):
            add(x, f"{prefix}.{name}", d)
        qk = new(c)  # q and k: channel i of q meets channel i of k in the dot product
        v = new(c)
        for s, offset in ((qk, 0), (qk, c), (v, 2 * c)):
            add(s, f"{prefix}.qkv.weight", 0, offset)
            add(s, f"{prefix}.qkv.bias", 0, offset)
        add(v, f"{prefix}.out.weight", 1)
        return x

    def block(prefix: str, blk: nn.Module, ins: list[int]) -> int:  # [ResBlock, Attention...]
        h = res(f"{prefix}.0", blk[0], ins)
        for j, extra in enumerate(blk[1:], start=1):
            h = attn(f"{prefix}.{j}", extra, h)
        return h

    h = new(net.inp.out_channels)
    add(h, "inp.weight", 0)
    add(h, "inp.bias", 0)
    hs = [h]
    for i, blk in enumerate(net.down):
        h = conv(f"down.{i}.0", h, blk[0].out_channels) if isinstance(blk[0], nn.Conv2d) else block(f"down.{i}", blk, [h])
        hs.append(h)
    h = res("mid.0", net.mid[0], [h])
    if not isinstance(net.mid[1], nn.Identity):
        h = attn("mid.1", net.mid[1], h)
    h = res("mid.2", net.mid[2], [h])
    for i, blk in enumerate(net.up):
        h = conv(f"up.{i}.1", h, blk[1].out_channels) if isinstance(blk[0], nn.Upsample) else block(f"up.{i}", blk, [h, hs.pop()])
    for name, d in (("out.0.weight", 0), ("out.0.bias", 0), ("out.2.weight", 1)):
        add(h, name, d)
    # identity skips made some spaces one: gather every slice under its root, in order of first appearance
    out: dict[int, ChannelSpace] = {}
    for s in range(len(parent)):
        root = find(s)
        out.setdefault(root, ChannelSpace(size=sizes[root])).slices.extend(slices[s])
    return list(out.values())


def channel_importance(params: dict[str, torch.Tensor], space: ChannelSpace) -> torch.Tensor:
    """float64 [C]: per channel, the sum of squared entries of every weight slice tied to it (conv and linear
    weights along their output or input dim, GroupNorm scales; biases and shifts are not weights)."""
    imp = torch.zeros(space.size, dtype=torch.float64)
    for name, dim, offset in space.slices:
        if not name.endswith("weight"):
            continue
        w = params[name].detach().narrow(dim, offset, space.size).double().square()
        imp += w.sum(dim=[d for d in range(w.dim()) if d != dim]).cpu() if w.dim() > 1 else w.cpu()
    return imp


def keep_most_important(importance: torch.Tensor, kept: int) -> torch.Tensor:
    """The `kept` channels of largest importance (ties: the lower index), in index order."""
    order = torch.argsort(-importance, stable=True)
    return torch.sort(order[:kept]).values


def prune_choice(params: dict[str, torch.Tensor], spaces: list[ChannelSpace], c0: int, width: int) -> list[torch.Tensor]:
    """The kept channels of every space: a space of m * c0 channels keeps its m * width most important ones."""
    out = []
    for space in spaces:
        if space.size % c0:
            raise RuntimeError(f"a channel space of {space.size} channels is no multiple of the base width {c0}")
        out.append(keep_most_important(channel_importance(params, space), space.size // c0 * width))
    return out


def pruned_specs(full: nn.Module, narrow: nn.Module, spaces: list[ChannelSpace], keep: list[torch.Tensor]) -> dict[str, SliceSpec]:
    """Per parameter of the UNet: the kept index along every dim (the kept channels of the spaces that dim
    holds, each shifted by its offset, in offset order; None = every entry), no scaling."""
    along: dict[tuple[str, int], list[tuple[int, torch.Tensor]]] = {}
    for space, kept in zip(spaces, keep):
        for name, dim, offset in space.slices:
            along.setdefault((name, dim), []).append((offset, offset + kept))
    nparams = dict(narrow.named_parameters())
    specs: dict[str, SliceSpec] = {}
    for name, p in full.named_parameters():
        index: list[torch.Tensor | None] = []
        for d in range(p.dim()):
            parts = sorted(along.get((name, d), []), key=lambda x: x[0])
            index.append(torch.cat([ix for _, ix in parts]).long() if parts else None)
        shape = tuple(len(ix) if ix is not None else f for ix, f in zip(index, p.shape))
        if shape != tuple(nparams[name].shape):
            raise RuntimeError(f"pruning {name}: {tuple(p.shape)} keeps {shape}, the pruned UNet has {tuple(nparams[name].shape)}")
        specs[name] = SliceSpec(index=index, scale=1.0)
    return specs


def pruned_width(c0: int, prune_ratio: float) -> int:
    """The pruned UNet's base width: ceil((1 - prune_ratio) * c0), at least 1."""
    return narrow_width(c0, 1.0 - prune_ratio)


# -- the method ---------------------------------------------------------------------------------------------

@register_method("fedphd")
class FedPhD(Method):
    """Hierarchical FL with homogeneity-aware edge selection and cloud aggregation, and a channel-pruned UNet."""

    # a structured sub-model (a really narrower dense network), like HeteroFL's: the demo grid's heterofl cell
    family: ClassVar[str | None] = "heterofl"
    headline_params = ("prune_ratio",)
    capabilities = Capabilities(needs="it trains a channel-pruned, narrower network, and the vmapped step runs the full model")

    @dataclass(frozen=True)
    class Config:
        prune_ratio: float = 0.2  # fraction of every channel space pruned (the authors' pruning_ratio; 0 = no pruning)
        prune_round: int = 0  # cloud rounds of the full model before it is pruned (0: the initial model, --train_scratch)
        agg_a: float = 5000.0  # cloud weights max(n_e + agg_a SH_e + agg_b, 0) (the code's balance_agg_a, balance_agg_b)
        agg_b: float = 0.0
        select_a: float = 10000.0  # edge selection scores max(select_a SH - s_e, 0) (the code's constant)

        def validate(self) -> None:
            if not (math.isfinite(self.prune_ratio) and 0.0 <= self.prune_ratio < 1.0):
                raise ValueError(f"invalid value for 'method.prune_ratio' of 'fedphd': {self.prune_ratio!r}; allowed: a number in [0, 1)")
            if self.prune_round < 0:
                raise ValueError(f"invalid value for 'method.prune_round' of 'fedphd': {self.prune_round!r}; allowed: an integer >= 0")
            for key in ("agg_a", "agg_b"):
                if not math.isfinite(getattr(self, key)):
                    raise ValueError(f"invalid value for 'method.{key}' of 'fedphd': {getattr(self, key)!r}; allowed: a finite number")
            if not (math.isfinite(self.select_a) and self.select_a > 0):
                raise ValueError(f"invalid value for 'method.select_a' of 'fedphd': {self.select_a!r}; allowed: a finite number > 0")

    def __init__(self, config: "FedPhD.Config") -> None:
        super().__init__(config)
        self._keep: list[torch.Tensor] | None = None  # the kept channels, once pruned
        self._sub: SubModelInfo | None = None  # the pruned network of self._keep
        self._hist: np.ndarray | None = None  # [clients, classes] label counts

    @classmethod
    def check(cls, config: "FedPhD.Config", run: "RunConfig", world: int = 1) -> None:
        """Pruning only of the built-in UNet (width-aware, and the channel spaces it traces are a UNet's: not the MLP);
        batched clients only without pruning."""
        super().check(config, run, world)
        if config.prune_ratio > 0 and not presets.width_aware(run.train.model):
            raise ValueError(f"method 'fedphd' cannot prune train.model={run.train.model}: it traces the built-in UNet's "
                             "channels and trains the pruned network at a narrower base width, which needs a width-aware "
                             f"network (benchmark/engine/model.py); use a built-in train.model ({', '.join(('auto', *presets.BUILTIN))}), "
                             "or method.prune_ratio=0")
        model = presets.resolve_name(run.train.model, run.data.dataset)
        if config.prune_ratio > 0 and presets.family(model) == "mlp":
            raise ValueError(f"method 'fedphd' cannot prune train.model={model} (an MLP): it traces the UNet's channel "
                             "spaces (convolutions, skips, norm groups) to choose the channels it keeps; use a built-in "
                             f"UNet ({', '.join(presets.BUILTIN)}) or method.prune_ratio=0 (no pruning); for width "
                             "sub-models of the MLP use heterofl, fedrolex or fjord")
        if config.prune_ratio > 0 and run.train.init_objective:
            raise ValueError(f"method 'fedphd' cannot prune with train.init_objective={run.train.init_objective}: the "
                             "conversion wraps the run's network, and the pruned network is another one; use "
                             "train.init_objective='' or method.prune_ratio=0")
        if config.prune_ratio > 0 and run.train.clients_mode == "batched":
            raise ValueError(f"method 'fedphd' cannot run with train.clients_mode=batched ({cls.capabilities.needs}); use "
                             "--set train.clients_mode=sequential")

    # -- pruning ------------------------------------------------------------------------------------------
    def choose_channels(self, params: torch.Tensor, ctx: "MethodContext") -> list[torch.Tensor]:
        """The kept channels of every channel space of the run's UNet at `params` (item 5)."""
        views = {n: params[sl].view(s) for n, sl, s in ctx.layout.slices()}
        c0 = ctx.model_spec.channels
        return prune_choice(views, channel_spaces(ctx.model), c0, pruned_width(c0, self.config.prune_ratio))

    def pruned(self, state: ServerState, ctx: "MethodContext") -> SubModelInfo | None:
        """The pruned network, None before pruning. The server prunes once, at the first round after
        `prune_round` cloud rounds (`prune_round * edge_rounds` edge rounds under edge servers), from the
        model every client and edge then starts from; the choice lives in state.extra (checkpointed)."""
        keep = state.extra.get(KEEP_KEY)
        edge_rounds = ctx.cfg.system.edge_rounds if ctx.cfg.system.edges else 1
        if keep is None and self.config.prune_ratio > 0 and ctx.round > self.config.prune_round * edge_rounds:
            keep = state.extra[KEEP_KEY] = self.choose_channels(state.params, ctx)
        return self._network(keep, ctx) if keep is not None else None

    def _network(self, keep: list[torch.Tensor], ctx: "MethodContext") -> SubModelInfo:
        if self._sub is None or self._keep is None or not all(torch.equal(a, b) for a, b in zip(keep, self._keep)):
            self._keep, self._sub = [k.clone() for k in keep], build_pruned(ctx, self.config.prune_ratio, keep)
        return self._sub

    # -- server and clients ---------------------------------------------------------------------------
    def init_state(self, params: torch.Tensor, ctx: "MethodContext") -> ServerState:
        state = super().init_state(params, ctx)
        if self.config.prune_ratio > 0 and self.config.prune_round == 0:  # the authors' --train_scratch
            state.extra[KEEP_KEY] = self.choose_channels(state.params, ctx)
            self._network(state.extra[KEEP_KEY], ctx)
        return state

    def client_view(self, state: ServerState, client: int, ctx: "MethodContext") -> ClientPlan:
        sub = self.pruned(state, ctx)
        if sub is None:  # the full model: FedAvg's plan
            plan = super().client_view(state, client, ctx)
            plan.trained_params = ctx.layout.total
            return plan
        # start = the global parameters: the pruned network reads only the kept entries; the others get no
        # gradient and are masked out of every aggregate
        return ClientPlan(start=state.params, step=LocalStep(mask=sub.mask, network=sub.model, dense=sub.dense),
                          downlink_bits=FLOAT_BITS * sub.trained_params, trained_params=sub.trained_params,
                          flop_fraction=sub.flop_fraction)

    def upload(self, local: torch.Tensor, plan: ClientPlan, client: int, state: ServerState, ctx: "MethodContext") -> Upload:
        up = super().upload(local, plan, client, state, ctx)
        up.uplink_bits = FLOAT_BITS * int(plan.trained_params if plan.trained_params is not None else local.numel())
        return up

    def deployed_mask(self, state: ServerState, ctx: "MethodContext") -> torch.Tensor | None:
        """The pruned network's entries once pruned (what FedPhD deploys: its pruned channels are no part of the
        model), else every entry. The bound's diagnostics count these only (docs/diagnostics.md)."""
        keep = state.extra.get(KEEP_KEY)
        return self._network(keep, ctx).mask if keep is not None else None

    def model_bits(self, state: ServerState, ctx: "MethodContext") -> int:
        """32 bits per parameter of the (pruned) model between the edges and the cloud."""
        keep = state.extra.get(KEEP_KEY)
        return FLOAT_BITS * (self._network(keep, ctx).trained_params if keep is not None else state.params.numel())

    # -- the hierarchy's policies (items 3 and 4) ---------------------------------------------------------
    def label_counts(self, ctx: "MethodContext") -> np.ndarray:
        """[clients, classes] float64: each client's label counts (what a client tells its edge server)."""
        if self._hist is None:
            labels = np.asarray(ctx.labels)
            classes = int(labels.max()) + 1 if labels.size else 1
            self._hist = ctx.partition.histogram(labels, classes).astype(np.float64)
        return self._hist

    def _edge_counts(self, loads: Sequence[EdgeLoad], ctx: "MethodContext") -> np.ndarray:
        hist = self.label_counts(ctx)
        return np.stack([hist[list(load.clients)].sum(0) if load.clients else np.zeros(hist.shape[1]) for load in loads])

    def assign_edges(self, clients: list[int], loads: Sequence[EdgeLoad], ctx: "MethodContext") -> list[int]:
        """Each client draws its edge by `selection_probabilities` from the loads at the edge round's start."""
        hist, counts = self.label_counts(ctx), self._edge_counts(loads, ctx)
        rng = ctx.rng("fedphd", "edges", ctx.round)
        return [int(rng.choice(len(loads), p=selection_probabilities(counts, hist[k], self.config.select_a))) for k in clients]

    def cloud_weights(self, loads: Sequence[EdgeLoad], ctx: "MethodContext") -> list[float]:
        """w_e = max(n_e + agg_a SH(P_e) + agg_b, 0), n_e the samples of the edge's last aggregation."""
        counts, sizes = self._edge_counts(loads, ctx), ctx.client_sizes
        last = [next((ks for ks in reversed(load.rounds) if ks), ()) for load in loads]
        return [cloud_weight(float(sum(int(sizes[k]) for k in ks)), c, self.config.agg_a, self.config.agg_b)
                for ks, c in zip(last, counts)]

    # -- sampling --------------------------------------------------------------------------------------
    def finalize(self, state: ServerState, ctx: "MethodContext") -> dict[str, Any]:
        if (keep := state.extra.get(KEEP_KEY)) is not None:  # (a resumed run's method has not seen it yet)
            self._network(keep, ctx)
        return {}

    def _sampled(self) -> nn.Module | None:
        return self._sub.model if self._keep is not None and self._sub is not None else None

    def sample(self, params: torch.Tensor, noise: torch.Tensor, ctx: "MethodContext") -> torch.Tensor:
        """The pruned network once pruned (the model FedPhD deploys), else the full one."""
        return ctx.sample_single(params, noise, ctx.objective, network=self._sampled())

    def velocity(self, params: torch.Tensor, ctx: "MethodContext") -> Callable[[torch.Tensor, float], torch.Tensor]:
        net = self._sampled()
        if net is None:
            return super().velocity(params, ctx)
        ctx.flat.copy_(params)
        objective = ctx.objective
        return lambda x, t: ctx.velocity(net, x, torch.full((x.shape[0],), t, device=x.device), objective)


def build_pruned(ctx: "MethodContext", prune_ratio: float, keep: list[torch.Tensor]) -> SubModelInfo:
    """The pruned UNet keeping channels `keep` (one index tensor per `channel_spaces` space): the UNet at the
    pruned base width run on the kept slices of the global parameters, its flat mask, size and FLOP fraction."""
    if not presets.width_aware(ctx.cfg.train.model) or not hasattr(ctx.model, "up"):  # refused by FedPhD.check already
        raise TypeError(f"fedphd prunes the benchmark's UNet (benchmark/engine/model.py); train.model={ctx.cfg.train.model} is not one")
    spec = ctx.model_spec
    width = pruned_width(spec.channels, prune_ratio)
    narrow = ctx.network_at_width(width)  # architecture only (meta device)
    with torch.device("meta"):  # the sinusoidal time features stay whole (an input), as in methods/heterofl.py
        narrow.base = spec.channels
        narrow.time[0] = nn.Linear(spec.channels, narrow.time[0].out_features)
    specs = pruned_specs(ctx.model, narrow, channel_spaces(ctx.model), keep)
    return submodel_info(ctx, SubModel(ctx.model, narrow, specs), None, width)
