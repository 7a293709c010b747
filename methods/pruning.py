"""Sub-model pruning: random and top-k magnitude masks with masked aggregation.

Qiao et al., "How Distributed Collaboration Influences the Diffusion Model Training?"
(ICML 2025): each round every participating client trains a pruned sub-model
theta * m_k of the current global model theta at its keep ratio, and the server
averages each parameter over the clients that trained it.

- `random_prune`: m_k is drawn fresh per (round, client) from a seeded stream, so the
  client and the server can both rebuild it from one 64-bit seed.
- `topk_prune`: m_k keeps the largest |theta| of the current global weights (per tensor
  with `scope = "layer"`, across all prunable tensors with `scope = "global"`); every
  client of a round with the same keep ratio gets the same mask.

What is prunable: conv/linear weight tensors (`Layout.is_weight()`, ndim >= 2). Biases
and norm scales/shifts are never pruned unless `prune_biases = true`. With capacity
tiers (`system.capacity`) the per-client keep ratio comes from the tiers and overrides
`keep_ratio`. A keep ratio of 1.0 is exactly FedAvg (no mask at all).

How many entries a prunable tensor (or, for global top-k, the pool of all prunable
entries) keeps: k = max(1, floor(keep * n + 1/2)), so no layer goes entirely dark.

Ties in top-k: scores are sorted with a *stable* descending sort, so among equal
magnitudes the entry with the lower flat index is kept first.

Bits on the wire (32-bit floats):
- downlink: 32 per kept value, plus the mask: random = the 64-bit seed; top-k = a
  bitmap of 1 bit per prunable entry (the client cannot derive it: it lacks theta).
- uplink: 32 per kept value, plus the mask: random = the 64-bit seed echoed back;
  top-k = 0 (the server derives the mask from the weights it sent and the keep ratio).

Inference rule (`inference`, how the trained global model is sampled; bits and FLOPs of
training are unaffected):
- `full`: the global model as it is, every weight dense.
- `scaled`: every prunable tensor l multiplied by c_l = sum_k (n_k / n) keep_count(n_l, p_k) / n_l,
  the data-weighted mean fraction of the tensor the clients trained (p_k: client k's keep ratio;
  without capacity tiers c_l = keep_count(n_l, keep_ratio) / n_l, i.e. about keep_ratio). For a
  linear layer y = (theta * m) x this is exactly E[y] over the training distribution of
  sub-models (client k with probability n_k / n, a uniform mask of exactly keep_count entries):
  dropout's weight-scaling rule. The training loss is the n_k-weighted sum of the client losses,
  so that client distribution is the one the model was fitted under. (Per-parameter empirical
  coverage would estimate the same c_l for random masks with more noise, and needs state.)
  For top-k the mask is not random, so the argument does not apply; the mode is offered for
  comparison.
- `submodel`: one fixed sub-model theta * m, as a pruned device would sample: m has keep ratio
  `inference_keep` (0 = the clients' n_k-weighted mean keep ratio); random_prune draws m with
  `random_mask` from the generator (run seed, "inference_mask", `inference_seed`); topk_prune
  takes the magnitude mask of the sampled weights (`inference_seed` is unused).
Every rule returns the model unchanged when every client trains the full model (keep 1.0), so
keep 1.0 stays bitwise FedAvg.

The configured rule is the run's result. Evaluation also scores the other rules on the same
trained model, noises and sampler (`sample_variants`; rows tagged `inference`, off with
`eval.inference_variants=false`); a rule that samples the same model as the configured one
or an earlier one (e.g. every rule at keep 1.0) is not sampled again.

FLOP fraction (ClientPlan.flop_fraction): the multiply-accumulates of every
conv/linear layer for one sample, each scaled by the fraction of that layer's weights
the client keeps (unstructured sparsity realised as sparse compute), over the dense
total. Norms, activations and the attention matmuls are not counted.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ClassVar, Literal

import numpy as np
import torch
from torch import nn

from dfbench.benchmark.core.parsing import parse_capacity

from .base import FLOAT_BITS, ClientPlan, LocalStep, Method, SampleVariants, ServerState, Upload
from .registry import register_method

if TYPE_CHECKING:
    from dfbench.benchmark.core.config import RunConfig

    from .context import MethodContext, ParamLayout

SEED_BITS = 64
Scope = Literal["layer", "global"]
MaskedMean = Literal["covered", "zero_fill"]  # how masked updates are averaged (methods.base.masked_weighted_mean)
Inference = Literal["full", "scaled", "submodel"]
INFERENCE_MODES = ("full", "scaled", "submodel")


# -- pure mask functions ------------------------------------------------------------------

def keep_count(n: int, keep: float) -> int:
    """Entries kept out of n at keep ratio `keep`: round half up, at least 1, at most n."""
    return min(n, max(1, math.floor(keep * n + 0.5)))


def prunable_tensors(layout: "ParamLayout", prune_biases: bool) -> list[bool]:
    """Per layout entry: may it be pruned? Weight matrices always; biases/norms only on request."""
    return [True] * len(layout.names) if prune_biases else list(layout.is_weight())


def top_k_mask(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean mask of the k largest scores; ties go to the lower index (stable sort)."""
    order = torch.sort(scores, descending=True, stable=True).indices
    out = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
    out[order[:k]] = True
    return out


def mask_from_scores(scores: torch.Tensor, layout: "ParamLayout", keep: float, prunable: list[bool],
                     scope: Scope = "layer") -> torch.Tensor:
    """Float 0/1 mask [P] keeping the top-scored entries of the prunable tensors; the rest is 1.

    layer:  each prunable tensor keeps keep_count(its size) of its own entries.
    global: one pool of all prunable entries keeps keep_count(pool size) of them.
    """
    mask = torch.ones_like(scores)
    slices = [sl for (_, sl, _), p in zip(layout.slices(), prunable) if p]
    if not slices:
        return mask
    if scope == "layer":
        for sl in slices:
            mask[sl] = top_k_mask(scores[sl], keep_count(sl.stop - sl.start, keep)).to(mask.dtype)
    elif scope == "global":
        idx = torch.cat([torch.arange(sl.start, sl.stop, device=scores.device) for sl in slices])
        pool = scores[idx]
        mask[idx] = top_k_mask(pool, keep_count(pool.numel(), keep)).to(mask.dtype)
    else:
        raise ValueError(f"unknown scope {scope!r}; allowed: layer, global")
    return mask


def random_mask(layout: "ParamLayout", keep: float, prunable: list[bool], gen: torch.Generator,
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Uniformly random mask, exactly keep_count entries per prunable tensor, from `gen`.

    The first keep_count entries of a uniform random permutation are a uniform random subset
    of that size (randperm: O(n), about 15x cheaper per client than sorting random scores).
    """
    mask = torch.ones(layout.total, dtype=dtype, device=gen.device)
    for (_, sl, _), p in zip(layout.slices(), prunable):
        if p:
            n = sl.stop - sl.start
            dropped = torch.randperm(n, generator=gen, device=gen.device)[keep_count(n, keep):]
            mask[sl.start + dropped] = 0
    return mask


def magnitude_mask(params: torch.Tensor, layout: "ParamLayout", keep: float, prunable: list[bool],
                   scope: Scope = "layer") -> torch.Tensor:
    """Top-k magnitude mask of the global weights (per layer or global pool)."""
    return mask_from_scores(params.abs(), layout, keep, prunable, scope).to(params.dtype)


# -- compute accounting -------------------------------------------------------------------

def weight_macs(model: nn.Module, layout: "ParamLayout", image_shape: tuple[int, ...], device: torch.device | str = "cpu") -> np.ndarray:
    """Multiply-accumulates per sample of each layout entry's conv/linear weight (0 elsewhere).

    Measured with forward hooks on one dummy sample: a conv weight costs its size times the
    output's spatial positions, a linear weight its size times the output rows per sample.
    Transposed convolutions are not counted (the UNet has none).
    """
    positions: dict[str, int] = {}

    def record(name: str, conv: bool) -> Callable[..., None]:  # output positions per sample that reuse each weight
        def hook(mod: nn.Module, inputs: object, out: torch.Tensor) -> None:
            per_sample = out[0, 0].numel() if conv else out.numel() // (out.shape[0] * out.shape[-1])
            positions[name] = positions.get(name, 0) + per_sample
        return hook

    hooks = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.modules.conv._ConvNd) and not mod.transposed:
            hooks.append(mod.register_forward_hook(record(name, True)))
        elif isinstance(mod, nn.Linear):
            hooks.append(mod.register_forward_hook(record(name, False)))
    try:
        with torch.no_grad():
            model(torch.zeros(1, *image_shape, device=device), torch.zeros(1, device=device))
    finally:
        for h in hooks:
            h.remove()
    macs = np.zeros(len(layout.names), dtype=np.float64)
    for i, (name, numel) in enumerate(zip(layout.names, layout.numels)):
        module, _, leaf = name.rpartition(".")
        if leaf == "weight" and module in positions:
            macs[i] = float(numel) * positions[module]
    return macs


def flop_fraction(mask: torch.Tensor, layout: "ParamLayout", macs: np.ndarray) -> float:
    """sum_l macs_l * kept_l / n_l over sum_l macs_l (1.0 when nothing is counted)."""
    total = float(macs.sum())
    if total <= 0:
        return 1.0
    kept = torch.stack([m.sum(dtype=torch.float64) for m in torch.split(mask, list(layout.numels))]).cpu().numpy()
    return float((macs * kept / np.asarray(layout.numels, dtype=np.float64)).sum() / total)


# -- the methods ----------------------------------------------------------------------------

@dataclass(frozen=True)
class PruneConfig:
    """Hyperparameters shared by both pruning methods."""

    METHOD: ClassVar[str] = "random_prune"
    keep_ratio: float = 0.5  # fraction of each prunable tensor a client trains (capacity tiers override)
    prune_biases: bool = False  # also prune biases and norm scales/shifts
    # covered | zero_fill (see methods.base.masked_weighted_mean); was method.aggregation, the name run ids hash
    masked_mean: MaskedMean = "covered"
    inference: Inference = "scaled"  # how the global model is sampled: full | scaled | submodel (module docstring)
    inference_keep: float = 0.0  # submodel: keep ratio of the sampling sub-model; 0 = the clients' mean keep ratio
    inference_seed: int = 0  # submodel (random_prune): which random mask, derived with the run seed

    def _fail(self, key: str, value: object, allowed: str) -> None:
        raise ValueError(f"invalid value for 'method.{key}' of {self.METHOD!r}: {value!r}; allowed: {allowed}")

    def validate(self) -> None:
        if not (math.isfinite(self.keep_ratio) and 0.0 < self.keep_ratio <= 1.0):
            self._fail("keep_ratio", self.keep_ratio, "a number in (0, 1]")
        if self.masked_mean not in ("covered", "zero_fill"):
            self._fail("masked_mean", self.masked_mean, "covered, zero_fill")
        if self.inference not in INFERENCE_MODES:
            self._fail("inference", self.inference, ", ".join(INFERENCE_MODES))
        if not (math.isfinite(self.inference_keep) and 0.0 <= self.inference_keep <= 1.0):
            self._fail("inference_keep", self.inference_keep, "0 (the clients' mean keep ratio) or a number in (0, 1]")
        if self.inference_seed < 0:
            self._fail("inference_seed", self.inference_seed, "an integer >= 0")


class _SubModelPruning(Method):
    """Shared mechanics: per-client keep ratio, masked start point, bit and FLOP accounting."""

    headline_params = ("keep_ratio",)
    dense_param = "keep_ratio"  # keep 1.0 without tiers: no mask at all, bitwise FedAvg

    def __init__(self, config: PruneConfig) -> None:
        super().__init__(config)
        self.masked_mean = config.masked_mean
        self._macs: np.ndarray | None = None

    def keep_for(self, client: int, ctx: "MethodContext") -> float:
        """A client's capacity (system.capacity tiers, ctx.capacity) is its keep ratio; else keep_ratio."""
        return float(ctx.capacity[client]) if ctx.capacity is not None else float(self.config.keep_ratio)

    def prunable(self, layout: "ParamLayout") -> list[bool]:
        return prunable_tensors(layout, self.config.prune_biases)

    def make_mask(self, state: ServerState, client: int, keep: float, ctx: "MethodContext") -> torch.Tensor:
        raise NotImplementedError

    def mask_bits(self, layout: "ParamLayout", direction: Literal["down", "up"]) -> int:
        """Bits that tell the other side which entries are kept."""
        raise NotImplementedError

    def client_view(self, state: ServerState, client: int, ctx: "MethodContext") -> ClientPlan:
        keep = self.keep_for(client, ctx)
        total = ctx.layout.total
        if keep >= 1.0:  # the full model: literally FedAvg's plan, so keep 1.0 == fedavg bitwise
            plan = super().client_view(state, client, ctx)
            plan.trained_params = total
            return plan
        mask = self.make_mask(state, client, keep, ctx)
        kept = int(torch.count_nonzero(mask))
        if self._macs is None:
            self._macs = weight_macs(ctx.model, ctx.layout, ctx.image_shape, ctx.device)
        # start = theta * m: pruned weights are zero in the forward pass; the local step masks their gradient
        return ClientPlan(start=state.params * mask, step=LocalStep(mask=mask),
                          downlink_bits=FLOAT_BITS * kept + self.mask_bits(ctx.layout, "down"),
                          trained_params=kept, flop_fraction=flop_fraction(mask, ctx.layout, self._macs))

    # -- inference rule ------------------------------------------------------------------
    def client_weights(self, ctx: "MethodContext") -> tuple[np.ndarray, np.ndarray]:
        """(p_k, n_k / n) over all clients: the training distribution of sub-model keep ratios."""
        sizes = np.asarray(ctx.client_sizes, dtype=np.float64)
        keeps = np.asarray(ctx.capacity, dtype=np.float64) if ctx.capacity is not None else np.full(len(sizes), float(self.config.keep_ratio))
        return keeps, sizes / sizes.sum()

    def inference_scales(self, ctx: "MethodContext") -> list[float]:
        """Per layout entry: c_l = sum_k (n_k/n) keep_count(n_l, p_k) / n_l (1.0 if not prunable)."""
        keeps, w = self.client_weights(ctx)
        out = []
        for n, p in zip(ctx.layout.numels, self.prunable(ctx.layout)):
            out.append(float(sum(wk * (keep_count(n, pk) / n if pk < 1.0 else 1.0) for pk, wk in zip(keeps, w))) if p else 1.0)
        return out

    def sampling_keep(self, ctx: "MethodContext") -> float:
        """Keep ratio of the `submodel` rule: inference_keep, or the n_k-weighted mean of the p_k."""
        if self.config.inference_keep > 0:
            return float(self.config.inference_keep)
        keeps, w = self.client_weights(ctx)
        return 1.0 if (keeps >= 1.0).all() else float((keeps * w).sum())

    def inference_mask(self, params: torch.Tensor, keep: float, ctx: "MethodContext") -> torch.Tensor:
        """The `submodel` rule's mask for the sampled parameters."""
        raise NotImplementedError

    def inference_params(self, params: torch.Tensor, ctx: "MethodContext", mode: Inference | None = None) -> torch.Tensor:
        """The parameters the sampler uses under inference rule `mode` (None: the configured rule)."""
        mode = self.config.inference if mode is None else mode
        if mode == "full":
            return params
        if mode == "scaled":
            scales = self.inference_scales(ctx)
            if all(c == 1.0 for c in scales):
                return params  # nobody trained a sub-model: FedAvg's model, bit for bit
            out = params.clone()
            for (_, sl, _), c in zip(ctx.layout.slices(), scales):
                if c != 1.0:
                    out[sl] *= c
            return out
        keep = self.sampling_keep(ctx)
        return params if keep >= 1.0 else params * self.inference_mask(params, keep, ctx)

    def sample(self, params: torch.Tensor, noise: torch.Tensor, ctx: "MethodContext") -> torch.Tensor:
        return self.sample_as(self.config.inference, params, noise, ctx)

    def velocity(self, params: torch.Tensor, ctx: "MethodContext") -> Callable[[torch.Tensor, float], torch.Tensor]:
        """The configured inference rule's model as a velocity field (what `sample` samples)."""
        return super().velocity(self.inference_params(params, ctx, self.config.inference), ctx)

    def sample_as(self, mode: Inference, params: torch.Tensor, noise: torch.Tensor, ctx: "MethodContext") -> torch.Tensor:
        """Samples of the model under inference rule `mode` (the submodel rule with the configured
        inference_keep / inference_seed)."""
        return ctx.sample_single(self.inference_params(params, ctx, mode), noise, ctx.objective)

    def rule_model(self, mode: Inference, run: "RunConfig") -> str:
        """Which model rule `mode` samples, as far as the config tells: "unchanged" (the global model
        as it is) or the rule's own name. When no client trains a sub-model (every keep ratio 1.0),
        full and scaled leave the model unchanged, and so does submodel unless 0 < inference_keep < 1."""
        keep = float(self.config.inference_keep)
        if mode == "full" or (mode == "submodel" and keep >= 1.0):
            return "unchanged"
        keeps = [k for k, _ in parse_capacity(run.system.capacity)] or [float(self.config.keep_ratio)]
        if all(k >= 1.0 for k in keeps) and not (mode == "submodel" and keep > 0.0):
            return "unchanged"
        return mode

    def sample_variants(self, run: "RunConfig") -> SampleVariants:
        """The configured rule is the result; the other rules are its variants, one per distinct
        model (`rule_model`), in INFERENCE_MODES order."""
        mode = self.config.inference
        seen = {self.rule_model(mode, run)}
        others = {}
        for other in INFERENCE_MODES:
            model = self.rule_model(other, run)
            if model not in seen:
                seen.add(model)
                others[other] = functools.partial(self.sample_as, other)
        return SampleVariants(label=mode, others=others)

    def upload(self, local: torch.Tensor, plan: ClientPlan, client: int, state: ServerState, ctx: "MethodContext") -> Upload:
        if plan.step.mask is None:
            return super().upload(local, plan, client, state, ctx)
        bits = FLOAT_BITS * int(plan.trained_params) + self.mask_bits(ctx.layout, "up")
        return Upload(params=local, weight=float(ctx.client_sizes[client]), uplink_bits=bits, mask=plan.step.mask, group=plan.group)


@register_method("random_prune")
class RandomPrune(_SubModelPruning):
    """Each client trains a uniformly random sub-network, fresh per round, rebuilt from a seed."""

    @dataclass(frozen=True)
    class Config(PruneConfig):
        METHOD: ClassVar[str] = "random_prune"
        # measured (docs/methods.md, pruning): sampling the full model doubles pre-activations the clients
        # never saw; the weight-scaling rule matches the sub-models' mean output
        inference: Inference = "scaled"

    def make_mask(self, state: ServerState, client: int, keep: float, ctx: "MethodContext") -> torch.Tensor:
        return random_mask(ctx.layout, keep, self.prunable(ctx.layout), ctx.gen("mask", ctx.round, client), state.params.dtype)

    def mask_bits(self, layout: "ParamLayout", direction: Literal["down", "up"]) -> int:
        return SEED_BITS  # both sides rebuild the mask from (seed, round, client)

    def inference_mask(self, params: torch.Tensor, keep: float, ctx: "MethodContext") -> torch.Tensor:
        gen = ctx.gen("inference_mask", self.config.inference_seed)
        return random_mask(ctx.layout, keep, self.prunable(ctx.layout), gen, params.dtype)


@register_method("topk_prune")
class TopKPrune(_SubModelPruning):
    """Each client trains the largest-magnitude weights of the current global model."""

    @dataclass(frozen=True)
    class Config(PruneConfig):
        METHOD: ClassVar[str] = "topk_prune"
        scope: Scope = "layer"  # layer: top-k within each tensor; global: one threshold over all prunable tensors
        # chosen on held-out seed 7 over keep 0.75 / 0.5 / 0.25 (results/paper-fmnist/rules): the
        # weights outside the final top-k mask are stale or never trained, so the sub-model wins
        inference: Inference = "submodel"

        def validate(self) -> None:
            super().validate()
            if self.scope not in ("layer", "global"):
                self._fail("scope", self.scope, "layer, global")

    def __init__(self, config: "TopKPrune.Config") -> None:
        super().__init__(config)
        # The mask depends only on (global weights, keep ratio): computed once per round and keep ratio.
        self._cache_src: torch.Tensor | None = None
        self._cache: dict[float, torch.Tensor] = {}

    def make_mask(self, state: ServerState, client: int, keep: float, ctx: "MethodContext") -> torch.Tensor:
        if self._cache_src is not state.params:
            self._cache_src, self._cache = state.params, {}
        if keep not in self._cache:
            self._cache[keep] = magnitude_mask(state.params, ctx.layout, keep, self.prunable(ctx.layout), self.config.scope)
        return self._cache[keep]

    def mask_bits(self, layout: "ParamLayout", direction: Literal["down", "up"]) -> int:
        if direction == "up":
            return 0  # the server derives the mask from the weights it sent
        return sum(n for n, p in zip(layout.numels, self.prunable(layout)) if p)  # 1-bit bitmap per prunable entry

    def inference_mask(self, params: torch.Tensor, keep: float, ctx: "MethodContext") -> torch.Tensor:
        return magnitude_mask(params, ctx.layout, keep, self.prunable(ctx.layout), self.config.scope)
