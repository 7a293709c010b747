"""HeteroFL structured width sub-models (Diao et al., "HeteroFL: Computation and Communication
Efficient Federated Learning for Heterogeneous Clients", ICLR 2021).

A client at rate r trains a real narrower UNet: the UNet of base width c0' = ceil(r * c0)
(level widths m * c0', time-embedding width 4 * c0'), whose every parameter is the leading
block of the global one: the first c' output channels and the first c' input channels of
every conv/linear layer, the first c' scales/shifts of every norm. Inputs and outputs of the
network (image channels, the sinusoidal time features) keep their full size. Two places hold
several channel blocks, and each block keeps its own leading channels:
- the attention's qkv projection outputs [q | k | v] (the first c' of each);
- an up-path ResBlock reads cat([h, skip]): its first norm, its first conv and its 1x1 skip
  keep the first channels of h and the first channels of the skip connection.
When r * c0 is a whole number every layer of width c keeps exactly ceil(r * c) channels.

Forward pass: `SubModel` runs `torch.func.functional_call` of a UNet built at the narrow width
(its own weights unused, on the meta device; its first time layer reads the full c0 sinusoidal
features) with the sliced full parameters, so the client's
convolutions really have the narrow shapes (the compute saving is real) and the gradient flows
back into the kept entries of the global parameters only. That is how sampling runs it. Training runs
its `DenseNetwork` form (methods/base.py, `SubModel.dense`): the kept entries gathered once, the narrow
UNet trained in a flat buffer of its own size (gradient, clipping, Adam), the result scattered back once:
the same update at the narrow network's cost per step (`make bench-submodel-speed`).

Which channels a sub-model keeps is a `Channels` choice per channel space (HeteroFL: `leading`;
FedRolex's rolling window, methods/fedrolex.py); what HeteroFL, FedRolex and FjORD (methods/fjord.py)
share (the refusals, the plans, the bits, the width `sample` uses) is `WidthSubModels`.

Scaling (the paper's "Scaler", output / r during training, so the full model stays on scale):
a layer whose inputs were narrowed sums over a fraction s = c_in' / c_in of its inputs, so its
weight term is divided by s (s = r when r * c0 is whole); the bias, not a sum over inputs, is
left alone; layers with full inputs (the first conv, the first time-MLP layer) have s = 1.
`scaler = false` turns this off. The attention logits keep the narrow network's own
1 / sqrt(c') (not rescaled).

Norm layers: the UNet uses GroupNorm, which keeps no running statistics, so HeteroFL's static
BatchNorm (sBN) is not needed. The sub-model's norms are the narrow UNet's own
GroupNorm(gcd(8, c'), c') over the kept channels, with the first c' affine scale/shift entries:
as in HeteroFL's GroupNorm variant the number of groups is kept, so at r = 1/2 a group holds
half as many channels as in the full model (channels are normalized with fewer partners).

Rates: capacity tiers (`system.capacity`, e.g. "1.0:0.5,0.5:0.5") give each client its rate;
without tiers every client uses `rate`. Rate 1.0 is FedAvg's plan exactly (bitwise).

Aggregation: each parameter is the sample-size-weighted mean over the clients that hold it
(masked "covered" aggregation of methods/base.py); HeteroFL's server averages each entry over
the clients that hold it (unweighted in the paper; weighted here, as every method of the
benchmark). A parameter nobody holds keeps its value.

Inference rule: samples come from the largest rate any client holds, with its training-time
scaling (the same function the clients trained); with a rate-1 tier that is the full model.

Diagnostics (docs/diagnostics.md): a client trains its window (the kept mask: HeteroFL's leading channels,
FedRolex's window of the round); Γ, the uncovered fraction and w² are taken over the network `sample` runs
(`deployed_mask`: the full model with a rate-1 tier, else the leading channels of the largest rate).

Bits: 32 per kept parameter each way; no index is sent (the rate, fixed by the seeded tiers,
determines the kept blocks). `rounds.jsonl` records each client's `trained_params` (the
narrow network's parameter count) and `flop_fraction`, measured with
torch.utils.flop_counter on one sample (convolutions, linear layers and attention matmuls of
the narrow forward over the full one).

Refuses train.clients_mode=batched when a client trains a sub-model (the vmapped step runs
ctx.model at full width).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Literal

import torch
from torch import nn
from torch.func import functional_call

from dfbench.benchmark.core import presets
from dfbench.benchmark.core.parsing import parse_capacity

from .base import FLOAT_BITS, Capabilities, ClientPlan, DenseNetwork, LocalStep, Method, ServerState, Upload
from .registry import register_method

if TYPE_CHECKING:
    from dfbench.benchmark.core.config import RunConfig

    from .context import MethodContext

MaskedMean = Literal["covered", "zero_fill"]  # how masked updates are averaged (methods.base.masked_weighted_mean)


# -- the sub-model ------------------------------------------------------------------------------

def narrow_width(c0: int, rate: float) -> int:
    """Base width of the sub-model at `rate`: ceil(rate * c0), at least 1."""
    return max(1, math.ceil(rate * c0 - 1e-9))  # the epsilon: 0.3 * 10 is 3.0000000000000004


#: Which channels a sub-model keeps of one channel space: (its full size C, the kept count c') -> the c'
#: kept indices in [0, C), in the sub-model's channel order. It depends on (C, c') alone, so a layer's
#: outputs and the next layer's inputs (the same space) keep the same channels.
Channels = Callable[[int, int], torch.Tensor]


def leading(full: int, kept: int) -> torch.Tensor:
    """HeteroFL's choice (Diao et al. 2021, Sec. 3.1), and FjORD's ordered dropout: the first `kept` channels."""
    return torch.arange(kept)


def block_index(full: list[int], narrow: list[int], choose: Channels = leading) -> torch.Tensor:
    """Kept indices of a dimension made of blocks: `choose` applied within each full block b (by
    default the first narrow[b] entries of each)."""
    out, start = [], 0
    for f, n in zip(full, narrow):
        out.append(start + choose(f, n))
        start += f
    return torch.cat(out)


def _cat_blocks(net: nn.Module) -> dict[str, tuple[int, int]]:
    """Up-path ResBlocks of a UNet -> (width of h, width of the skip) of their cat([h, skip]) input.

    The UNet's up path (benchmark/engine/model.py) holds, per entry, either a residual block
    (first module with conv1/conv2) or [Upsample, Conv2d]. The MLP has no up path: none.
    """
    if not hasattr(net, "up"):
        return {}
    out, cur = {}, net.mid[2].conv2.out_channels
    for i, blk in enumerate(net.up):
        if not isinstance(blk[0], nn.Upsample):
            out[f"up.{i}.0"] = (cur, blk[0].conv1.in_channels - cur)
            cur = blk[0].conv2.out_channels
        else:  # [Upsample, Conv2d]
            cur = blk[1].out_channels
    return out


@dataclass
class SliceSpec:
    """How one parameter of the sub-model is cut from the global one."""

    index: list[torch.Tensor | None]  # per dimension: kept indices (None = all)
    scale: float  # the Scaler: the kept entries are divided by this (1.0 = none)


def slice_specs(full: nn.Module, narrow: nn.Module, scaler: bool, choose: Channels = leading) -> dict[str, SliceSpec]:
    """Per parameter name of the UNet: the kept index per dimension (`choose` in every channel space,
    within each block of a [q | k | v] or cat([h, skip]) dimension) and the fan-in scale."""
    fblocks, nblocks = _cat_blocks(full), _cat_blocks(narrow)
    nparams = dict(narrow.named_parameters())
    specs: dict[str, SliceSpec] = {}
    for name, p in full.named_parameters():
        q = nparams[name]
        module, _, leaf = name.rpartition(".")
        owner = module.rpartition(".")[0]  # e.g. "up.3.0" for "up.3.0.conv1"
        index: list[torch.Tensor | None] = []
        for d, (f, n) in enumerate(zip(p.shape, q.shape)):
            if f == n:
                index.append(None)
                continue
            if d == 0 and module.endswith("qkv"):  # [q | k | v]
                index.append(block_index([f // 3] * 3, [n // 3] * 3, choose))
            elif owner in fblocks and (module.endswith(("conv1", "skip")) and d == 1 or module.endswith("norm1")):
                index.append(block_index(list(fblocks[owner]), list(nblocks[owner]), choose))  # cat([h, skip])
            else:
                index.append(choose(f, n))
        kept_in = q.shape[1] / p.shape[1] if leaf == "weight" and p.dim() >= 2 else 1.0
        specs[name] = SliceSpec(index=index, scale=kept_in if scaler and kept_in < 1.0 else 1.0)
        if tuple(len(ix) if ix is not None else f for ix, f in zip(index, p.shape)) != tuple(q.shape):
            raise RuntimeError(f"width slicing of {name}: {tuple(p.shape)} does not map onto {tuple(q.shape)}")
    return specs


class SubModel(nn.Module):
    """The narrow network as a module: full parameters in, narrow forward out.

    Its parameters are the full model's (views of ctx.flat, as the shared local step needs);
    the narrow UNet only supplies the architecture (held in a tuple so nn.Module does not
    register its placeholder parameters).
    """

    def __init__(self, full: nn.Module, narrow: nn.Module, specs: dict[str, SliceSpec]) -> None:
        super().__init__()
        self.full = full
        self._arch = (narrow,)
        device = next(full.parameters()).device  # index tensors live where the parameters do (no copy per step)
        self.specs = {n: SliceSpec([ix.to(device) if ix is not None else None for ix in s.index], s.scale) for n, s in specs.items()}

    def sliced(self) -> dict[str, torch.Tensor]:
        """name -> the narrow parameter (kept entries of the full one, divided by its scale)."""
        out = {}
        for name, p in self.full.named_parameters():
            spec = self.specs[name]
            for d, ix in enumerate(spec.index):
                if ix is not None:
                    p = p.index_select(d, ix)
            out[name] = p / spec.scale if spec.scale != 1.0 else p
        return out

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return functional_call(self._arch[0], self.sliced(), (x, t))

    def dense(self, layout_names: tuple[str, ...], layout_shapes: tuple[tuple[int, ...], ...],
              layout_offsets: tuple[int, ...]) -> DenseNetwork:
        """The same network as a `DenseNetwork`: each narrow parameter entry's global flat position and the
        segments divided by a scale, so the local step trains it at its own size (methods/base.py)."""
        where = {n: (shape, off) for n, shape, off in zip(layout_names, layout_shapes, layout_offsets)}
        parts, scaled, off = [], [], 0
        for name, q in self._arch[0].named_parameters():
            shape, start = where[name]
            pos = torch.arange(math.prod(shape)).view(shape)
            for d, ix in enumerate(self.specs[name].index):
                if ix is not None:
                    pos = pos.index_select(d, ix.cpu())
            parts.append(pos.reshape(-1) + start)
            if self.specs[name].scale != 1.0:
                scaled.append((off, q.numel(), self.specs[name].scale))
            off += q.numel()
        index = torch.cat(parts).to(next(self.full.parameters()).device)
        return DenseNetwork(arch=self._arch[0], index=index, scaled=tuple(scaled))


def kept_mask(layout_names: tuple[str, ...], layout_shapes: tuple[tuple[int, ...], ...],
              specs: dict[str, SliceSpec], device: torch.device | str = "cpu") -> torch.Tensor:
    """Float 0/1 [P] in the flat layout: 1 on every entry the sub-model holds."""
    parts = []
    for name, shape in zip(layout_names, layout_shapes):
        kept = torch.ones(shape, dtype=torch.bool)
        for d, ix in enumerate(specs[name].index):
            if ix is not None:  # an entry is kept when its index is kept along every dimension
                along = torch.zeros(shape[d], dtype=torch.bool)
                along[ix] = True
                kept &= along.view([-1 if k == d else 1 for k in range(len(shape))])
        parts.append(kept.reshape(-1))
    return torch.cat(parts).to(device=device, dtype=torch.float32)


def measured_flops(net: nn.Module, image_shape: tuple[int, ...], device: torch.device | str) -> int:
    """Forward FLOPs of one sample, counted by torch.utils.flop_counter (conv, linear, attention)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        net(torch.zeros(1, *image_shape, device=device), torch.full((1,), 0.5, device=device))
    return int(counter.get_total_flops())


@dataclass
class SubModelInfo:
    model: SubModel
    mask: torch.Tensor
    trained_params: int
    flop_fraction: float
    width: int
    dense: DenseNetwork | None = None  # the model trained at its own size (set by `submodel_info`)


def submodel_info(ctx: "MethodContext", sub: SubModel, flop_fraction: float | None, width: int) -> SubModelInfo:
    """A sub-model's flat mask, its dense form, parameter count and FLOP fraction (measured unless given)."""
    names, shapes = ctx.layout.names, ctx.layout.shapes
    mask = kept_mask(names, shapes, sub.specs, ctx.flat.device)
    dense = sub.dense(names, shapes, ctx.layout.offsets)
    if flop_fraction is None:
        flop_fraction = measured_flops(sub, ctx.image_shape, ctx.device) / max(1, measured_flops(ctx.model, ctx.image_shape, ctx.device))
    return SubModelInfo(model=sub, mask=mask, trained_params=int(mask.sum()), flop_fraction=float(flop_fraction), width=width,
                        dense=dense)


def build_submodel(ctx: "MethodContext", rate: float, scaler: bool = True, choose: Channels = leading,
                   flop_fraction: float | None = None) -> SubModelInfo:
    """The rate-r sub-model of the run's UNet (the channels `choose` keeps), its flat mask, parameter count
    and FLOP fraction (measured unless given: it depends on the rate alone, not on which channels)."""
    if not presets.width_aware(ctx.cfg.train.model):  # refused by WidthSubModels.check already; never a KeyError here
        raise TypeError(f"width sub-models slice the benchmark's UNet (benchmark/engine/model.py); train.model={ctx.cfg.train.model} is not one")
    spec = ctx.model_spec
    if getattr(ctx.model, "base", None) != spec.channels or not hasattr(ctx.model, "time"):
        raise TypeError("width sub-models slice the benchmark's UNet or MLP (benchmark/engine/model.py); ctx.model is not the preset's")
    width = narrow_width(spec.channels, rate)
    narrow = ctx.network_at_width(width)  # architecture only (meta device): functional_call supplies every parameter
    with torch.device("meta"):
        # The sinusoidal time features are an input: the sub-model reads all c0 of them (the
        # narrow UNet alone would compute a different, c0'-dimensional embedding).
        narrow.base = spec.channels
        narrow.time[0] = nn.Linear(spec.channels, narrow.time[0].out_features)
    return submodel_info(ctx, SubModel(ctx.model, narrow, slice_specs(ctx.model, narrow, scaler, choose)), flop_fraction, width)


# -- the methods ---------------------------------------------------------------------------------

def validate_rate(method: str, rate: float) -> None:
    """A width rate (a client's capacity without tiers) is a number in (0, 1]."""
    if not (math.isfinite(rate) and 0.0 < rate <= 1.0):
        raise ValueError(f"invalid value for 'method.rate' of '{method}': {rate!r}; allowed: a number in (0, 1]")


class WidthSubModels(Method):
    """What the width sub-model methods share (HeteroFL, FedRolex, FjORD): a client of capacity r trains
    a real narrower UNet cut from the global one, uploads 32 bits per kept parameter, and the server
    averages each parameter over the clients that hold it. Subclasses choose the channels (and
    `inference_rate`); this base refuses what the narrow networks cannot run."""

    # The width sub-models differ in which channels a client trains (HeteroFL's leading ones, FedRolex's
    # rolling window, FjORD's sampled prefixes): one family, covered by the demo grid's heterofl cell.
    family: ClassVar[str | None] = "heterofl"
    capabilities = Capabilities(needs="it trains narrower networks, and the vmapped step runs the full model")
    #: the setting under which every client trains the full width (FedAvg), named in refusals
    full_width_setting: ClassVar[str] = "method.rate=1.0 without capacity tiers"

    def __init__(self, config: Any, scaler: bool) -> None:
        super().__init__(config)
        self.scaler = scaler  # HeteroFL's Scaler on the narrowed sums (see the module docstring)
        self._subs: dict[float, SubModelInfo] = {}  # per rate, the leading-channel sub-model, built once per run

    def rate_for(self, client: int, ctx: "MethodContext") -> float:
        """A client's capacity (system.capacity tiers, ctx.capacity) is its width rate; else method.rate."""
        return float(ctx.capacity[client]) if ctx.capacity is not None else float(self.config.rate)

    @classmethod
    def narrowest(cls, config: Any, run: "RunConfig") -> float:
        """The narrowest width any client trains (1.0: every client trains the full model)."""
        tiers = parse_capacity(run.system.capacity)
        return min(k for k, _ in tiers) if tiers else config.rate

    @classmethod
    def check(cls, config: Any, run: "RunConfig", world: int = 1) -> None:
        """Narrow widths only of a width-aware network (the built-in UNet), and batched clients only while
        every client trains the full width (FedAvg)."""
        super().check(config, run, world)
        narrowest = cls.narrowest(config, run)
        if narrowest < 1.0 and not presets.width_aware(run.train.model):
            raise ValueError(f"method {cls.name!r} cannot train width sub-models of train.model={run.train.model} (narrowest "
                             f"rate {narrowest:g}): it rebuilds the network at a narrower base width and slices every "
                             "layer's channels, which needs a width-aware network (the built-in UNet, "
                             "benchmark/engine/model.py); a diffusers UNet2DModel has no such builder. Use a built-in "
                             f"train.model ({', '.join(('auto', *presets.BUILTIN))}), or {cls.full_width_setting} (FedAvg)")
        if run.train.init_objective and narrowest < 1.0:
            raise ValueError(f"method {cls.name!r} cannot train width sub-models (narrowest rate {narrowest:g}) with "
                             f"train.init_objective={run.train.init_objective}: the conversion wraps the run's network, "
                             "and a sub-model is another network; use train.init_objective='' or "
                             f"{cls.full_width_setting} (FedAvg)")
        if run.train.clients_mode == "batched" and narrowest < 1.0:
            raise ValueError(f"method {cls.name!r} cannot run with train.clients_mode=batched ({cls.capabilities.needs}; narrowest "
                             f"rate {narrowest:g}); use --set train.clients_mode=sequential")

    def submodel(self, rate: float, ctx: "MethodContext") -> SubModelInfo:
        """The sub-model of the leading channels at `rate` (built once per run)."""
        if rate not in self._subs:
            self._subs[rate] = build_submodel(ctx, rate, self.scaler)
        return self._subs[rate]

    def full_plan(self, state: ServerState, client: int, ctx: "MethodContext") -> ClientPlan:
        """The full model: literally FedAvg's plan, so a full-width client is FedAvg bitwise."""
        plan = Method.client_view(self, state, client, ctx)
        plan.trained_params = ctx.layout.total
        return plan

    @staticmethod
    def sub_plan(state: ServerState, sub: SubModelInfo, network: nn.Module | None = None,
                 flop_fraction: float | None = None) -> ClientPlan:
        """Train `network` (default: the sub-model) inside `sub`'s mask; 32 bits per kept parameter down."""
        # start = the global parameters: the sub-model reads only the kept entries, the rest
        # gets a zero gradient (Adam then moves nothing) and is masked out of the aggregate
        step = LocalStep(mask=sub.mask, network=sub.model) if network is None else LocalStep(mask=sub.mask, network=network)
        if network is None:  # trained at its own size (the same update; see methods/base.DenseNetwork)
            step.dense = sub.dense
        return ClientPlan(start=state.params, step=step,
                          downlink_bits=FLOAT_BITS * sub.trained_params, trained_params=sub.trained_params,
                          flop_fraction=sub.flop_fraction if flop_fraction is None else flop_fraction)

    def upload(self, local: torch.Tensor, plan: ClientPlan, client: int, state: ServerState, ctx: "MethodContext") -> Upload:
        up = super().upload(local, plan, client, state, ctx)
        up.uplink_bits = FLOAT_BITS * int(plan.trained_params)
        return up

    def inference_rate(self, ctx: "MethodContext") -> float:
        """The width `sample` samples at (its leading channels); 1.0 = the full model."""
        return 1.0

    def deployed_mask(self, state: ServerState, ctx: "MethodContext") -> torch.Tensor | None:
        """The network `sample` runs: the leading channels at `inference_rate` (None: the full model). The bound's
        diagnostics count these entries only (docs/diagnostics.md)."""
        rate = self.inference_rate(ctx)
        return None if rate >= 1.0 else self.submodel(rate, ctx).mask

    def velocity(self, params: torch.Tensor, ctx: "MethodContext") -> Callable[[torch.Tensor, float], torch.Tensor]:
        """The network `sample` samples (`inference_rate`) as a velocity field."""
        rate = self.inference_rate(ctx)
        if rate >= 1.0:
            return super().velocity(params, ctx)
        ctx.flat.copy_(params)
        net = self.submodel(rate, ctx).model  # views of ctx.flat, in its own mode, as `sample` runs it
        objective = ctx.objective
        return lambda x, t: ctx.velocity(net, x, torch.full((x.shape[0],), t, device=x.device), objective)

    def sample(self, params: torch.Tensor, noise: torch.Tensor, ctx: "MethodContext") -> torch.Tensor:
        """Inference rule: the leading channels at `inference_rate`, with their training-time scaling."""
        rate = self.inference_rate(ctx)
        if rate >= 1.0:
            return ctx.sample_single(params, noise, ctx.objective)
        # batches of 500, as the committed results were sampled (a batch size moves samples by ~1e-6)
        return ctx.sample_single(params, noise, ctx.objective, batch=500, network=self.submodel(rate, ctx).model)


@register_method("heterofl")
class HeteroFL(WidthSubModels):
    """Each client trains the leading channels of every layer: a real narrower UNet."""

    headline_params = ("rate",)

    @dataclass(frozen=True)
    class Config:
        rate: float = 0.5  # width rate of every client without capacity tiers (tiers override it)
        scaler: bool = True  # divide narrowed sums by the kept fraction (HeteroFL's Scaler)
        # covered | zero_fill (see methods.base.masked_weighted_mean); was method.aggregation, the name run ids hash
        masked_mean: MaskedMean = "covered"

        def validate(self) -> None:
            validate_rate("heterofl", self.rate)
            if self.masked_mean not in ("covered", "zero_fill"):
                raise ValueError(f"invalid value for 'method.masked_mean' of 'heterofl': {self.masked_mean!r}; allowed: covered, zero_fill")

    def __init__(self, config: "HeteroFL.Config") -> None:
        super().__init__(config, config.scaler)
        self.masked_mean = config.masked_mean

    def client_view(self, state: ServerState, client: int, ctx: "MethodContext") -> ClientPlan:
        rate = self.rate_for(client, ctx)
        if rate >= 1.0:  # rate 1.0 == fedavg bitwise
            return self.full_plan(state, client, ctx)
        return self.sub_plan(state, self.submodel(rate, ctx))

    def inference_rate(self, ctx: "MethodContext") -> float:
        """Samples come from the largest rate any client holds (with a rate-1 tier, the full model)."""
        return max(self.rate_for(k, ctx) for k in range(ctx.num_clients))
