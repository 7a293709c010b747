"""Batched clients: a round's clients train in lockstep as ONE vmapped computation.

`train.clients_mode = "batched"` replaces the per-client loop of `local_step.local_train` by
`train_clients`: the clients' parameters are stacked into one [G, P] tensor, and each
step computes all G clients' gradients at once with
`torch.func.vmap(torch.func.grad_and_value(loss))` over `torch.func.functional_call` of the
shared model. Everything after the gradient (pruning masks, the FedProx term, per-client
gradient clipping, Adam, the sigma_1^2 probe) is plain tensor maths on [G, P] rows.

The result equals the sequential mode within float tolerance (tests/runs/test_batched.py):

- Random numbers: client k draws from its own generator `ctx.gen("client", r, k)`, in the
  same order as the sequential step (per step: batch indices, then the objective's time,
  then its noise), so each client sees exactly the same batches and noise.
- Adam: `FunctionalAdam` is torch.optim.Adam's update (Kingma & Ba 2015, Algorithm 1, as
  torch writes it), one optimizer state row per client.
- Stragglers: clients are grouped by local step count (and objective), so every group
  runs in true lockstep and nothing is computed for a finished client.
- GroupNorm keeps no running statistics and dropout is 0, so vmapping the model is exact.
- Attention runs as `model.product_attention` (softmax(QK^T/sqrt d)V written out) inside the
  vmap: the fused scaled_dot_product_attention kernels have no batching rule, so vmap would run
  them client by client in a Python loop; the two agree within float rounding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from dfbench import datasets
from dfbench.benchmark.engine.diffusion import DDPM, FlowMatching
from dfbench.benchmark.engine.local_step import LocalResult, StepSettings, autocast, clip_rows_
from dfbench.benchmark.engine.model import product_attention_in

if TYPE_CHECKING:
    from dfbench.methods.base import ClientPlan

    from dfbench.benchmark.engine.context import RunContext
    from dfbench.benchmark.engine.model import Layout


# -- sampling: the same draws as the sequential step, one generator per client ------------------

def draw_batches(images: torch.Tensor, indices: Sequence[torch.Tensor], batch_size: int,
                 gens: Sequence[torch.Generator]) -> torch.Tensor:
    """Client j's batch from its own indices, for every j: [G, B, C, H, W] in [-1, 1].

    Row j equals `local_step.draw_batch(images, indices[j], batch_size, gens[j])` and consumes
    gens[j] exactly as it does; the image gather is one op for all clients.
    """
    rows = [ix[torch.randint(0, ix.numel(), (batch_size,), generator=g, device=ix.device)] for ix, g in zip(indices, gens)]
    return datasets.to_model_space(images[torch.stack(rows)])


def noised_inputs(objective: DDPM | FlowMatching, x0: torch.Tensor, gens: Sequence[torch.Generator]
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_t, network time, regression target) for x0 [G, B, ...], client j drawing from gens[j].

    The objective's own `draw` (time first, then noise) per client and its own `noised` maths
    on the stacked draws, so the per-client loss is exactly the sequential step's.
    """
    draws = [objective.draw(tuple(x0.shape[1:]), g, x0.device, x0.dtype) for g in gens]
    times = torch.stack([t for t, _ in draws])
    eps = torch.stack([e for _, e in draws])
    return objective.noised(x0, times, eps)


# -- Adam on stacked rows -------------------------------------------------------------------------

class FunctionalAdam:
    """torch.optim.Adam (no weight decay, no amsgrad) on a [G, P] tensor, one state row per client.

    m <- lerp(m, g, 1 - b1);  v <- b2 v + (1 - b2) g^2
    theta <- theta - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
    A coordinate whose gradient was always 0 (a pruned weight) keeps m = v = 0 and never moves.
    """

    def __init__(self, params: torch.Tensor, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.lr, self.betas, self.eps = lr, betas, eps
        self.m = torch.zeros_like(params)
        self.v = torch.zeros_like(params)
        self.t = 0

    @torch.no_grad()
    def step(self, params: torch.Tensor, grad: torch.Tensor) -> None:
        """One in-place Adam step of `params` with gradient `grad` (same shape)."""
        b1, b2 = self.betas
        self.t += 1
        self.m.lerp_(grad, 1 - b1)
        self.v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        step_size = self.lr / (1 - b1 ** self.t)
        denom = (self.v.sqrt() / math.sqrt(1 - b2 ** self.t)).add_(self.eps)
        params.addcdiv_(self.m, denom, value=-step_size)


# -- one lockstep group ---------------------------------------------------------------------------

@dataclass
class ClientJob:
    """What one client of a lockstep group trains: its plan's start, mask, proximal weight, data and generator."""

    start: torch.Tensor  # flat [P]
    indices: torch.Tensor  # this client's sample indices (on the device)
    gen: torch.Generator
    mask: torch.Tensor | None = None
    prox_mu: float = 0.0


def _gradient_fn(model: nn.Module) -> Callable[..., tuple[dict[str, torch.Tensor], torch.Tensor]]:
    """vmap over clients of (d loss / d params, loss) for one client's ||net(x_t, t) - target||^2 mean."""

    def loss(params: dict[str, torch.Tensor], xt: torch.Tensor, tin: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (functional_call(model, params, (xt, tin)) - target).square().mean()

    return vmap(grad_and_value(loss))


def train_lockstep(
    model: nn.Module,
    layout: "Layout",
    jobs: Sequence[ClientJob],
    images: torch.Tensor,
    objective: DDPM | FlowMatching,
    settings: StepSettings,
    *,
    steps: int,
) -> list[LocalResult]:
    """`local_step.local_train` for every job at once (all with the same `steps`); one LocalResult per job.

    The step is the sequential one, row by row: mask the gradient, record it for the sigma_1^2
    probe, add the FedProx gradient mu (w - w_start) and mask again, clip per client, Adam.
    """
    G, dev = len(jobs), images.device
    batch_size, lr, grad_clip, amp = settings.batch_size, settings.lr, settings.grad_clip, settings.amp
    theta = torch.stack([j.start for j in jobs])  # [G, P], fresh: the clients' local models
    views = {n: theta[:, sl].view(G, *shape) for n, sl, shape in layout.slices()}  # functional_call's params
    masks = torch.stack([j.mask if j.mask is not None else torch.ones_like(j.start) for j in jobs]) \
        if any(j.mask is not None for j in jobs) else None
    mu = torch.tensor([j.prox_mu for j in jobs], dtype=theta.dtype, device=dev).view(G, 1)
    anchor = theta.clone() if any(j.prox_mu > 0 for j in jobs) else None  # w_global of FedProx's term (= start)
    adam = FunctionalAdam(theta, lr)
    step_fn = _gradient_fn(model)
    gens = [j.gen for j in jobs]
    indices = [j.indices for j in jobs]
    probe = min(settings.probe_steps, steps)
    probe = probe if probe >= 2 else 0  # a variance needs two gradients (a 1-step straggler has one)
    g_sum = torch.zeros((G, layout.total if probe else 0), dtype=torch.float64, device=dev)
    g_sq = torch.zeros(G, dtype=torch.float64, device=dev)
    total = torch.zeros(G, device=dev)
    for s in range(steps):
        x0 = draw_batches(images, indices, batch_size, gens)
        xt, tin, target = noised_inputs(objective, x0, gens)
        with autocast(images.device, amp), product_attention_in(model):
            grads, losses = step_fn(views, xt, tin, target)
        grad = torch.cat([grads[n].reshape(G, -1) for n in layout.names], dim=1)
        if masks is not None:
            grad.mul_(masks)
        if s < probe:  # the sigma_1^2 estimator of train.local_train, per row
            g64 = grad.double()
            g_sum.add_(g64)
            g_sq.add_(g64.square().sum(1))
        if anchor is not None:  # FedProx (Li et al. 2020, eq. 2): grad of mu/2 ||w - w_global||^2
            grad.addcmul_(theta - anchor, mu)  # one rounding, as grad.add_(w - start, alpha=mu) in local_train
            if masks is not None:
                grad.mul_(masks)
        if grad_clip > 0:  # per client: row j alone
            clip_rows_(grad, grad_clip)
        adam.step(theta, grad)
        total += losses.detach()
    sigma1: list[float | None] = [None] * G
    if probe:
        sigma1 = ((g_sq - g_sum.square().sum(1) / probe) / (probe - 1)).tolist()
    mean_loss = (total / steps).tolist()
    return [LocalResult(params=row, loss=mean_loss[j], sigma1_sq=sigma1[j]) for j, row in enumerate(theta.unbind(0))]


# -- a round's clients ----------------------------------------------------------------------------

def lockstep_groups(clients: Sequence[int], steps: Sequence[int], objectives: Sequence[str | None], size: int) -> list[list[int]]:
    """Clients grouped by (local steps, objective), in order of first appearance, in chunks of at most `size`."""
    by_key: dict[tuple[int, str | None], list[int]] = {}
    for k, s, o in zip(clients, steps, objectives):
        by_key.setdefault((s, o), []).append(k)
    size = size if size > 0 else max(1, len(clients))
    return [members[i:i + size] for members in by_key.values() for i in range(0, len(members), size)]


def train_clients(ctx: "RunContext", plans: dict[int, "ClientPlan"], r: int, settings: StepSettings) -> dict[int, LocalResult]:
    """Train every planned client of round r in lockstep groups; client k -> its LocalResult.

    Each client's result equals `local_step.local_train` with the same plan and generator.
    A plan whose LocalStep cannot run in lockstep (a network of its own, a step correction)
    is refused: the method should have declared `Capabilities(batched_clients=False)` (methods/base.py).
    """
    refused = {k: p.step.beyond_lockstep() for k, p in sorted(plans.items()) if not p.step.lockstep}
    if refused:
        fields = sorted({f for names in refused.values() for f in names})
        raise ValueError(f"method {ctx.cfg.method!r} gave client(s) {sorted(refused)} a local step that sets "
                         f"{', '.join(fields)}, which train.clients_mode=batched does not carry out (LocalStep."
                         "LOCKSTEP_FIELDS); the method should declare capabilities = Capabilities(batched_clients=False). "
                         "Use --set train.clients_mode=sequential")
    clients = list(plans)
    steps = [int(ctx.local_steps[k]) for k in clients]
    groups = lockstep_groups(clients, steps, [plans[k].step.objective for k in clients], ctx.cfg.train.client_batch)
    out: dict[int, LocalResult] = {}
    for group in groups:
        # the LocalStep.LOCKSTEP_FIELDS: mask and proximal_mu per client, the objective per group
        jobs = [ClientJob(start=plans[k].start, indices=ctx.client_indices[k], gen=ctx.gen("client", r, k),
                          mask=plans[k].step.mask, prox_mu=plans[k].step.proximal_mu) for k in group]
        res = train_lockstep(ctx.model, ctx.layout, jobs, ctx.images, ctx.get_objective(plans[group[0]].step.objective),
                             settings, steps=int(ctx.local_steps[group[0]]))
        out.update(zip(group, res))
    return out
