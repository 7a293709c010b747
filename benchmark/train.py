"""The ONE local training step shared by every method.

A client starts from `start` (already masked for pruned sub-models), runs `steps`
Adam steps on mini-batches drawn on the device from its own indices, and returns its
new flat parameters. Pruned weights are zero in the forward pass (they are zero in
`start`) and receive no update (their gradient is masked, and Adam with an all-zero
gradient history moves nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .diffusion import DDPM, FlowMatching


@dataclass
class LocalResult:
    params: torch.Tensor  # flat [P], a fresh tensor
    loss: float  # mean diffusion loss over the steps
    sigma1_sq: float | None  # mini-batch gradient variance estimate (see below)


def draw_batch(images: torch.Tensor, indices: torch.Tensor, batch_size: int, gen: torch.Generator) -> torch.Tensor:
    """A batch (with replacement) from this client's own indices, on the device, scaled to [-1, 1]."""
    pick = torch.randint(0, indices.numel(), (batch_size,), generator=gen, device=indices.device)
    return images[indices[pick]].float().div_(127.5).sub_(1.0)


def make_optimizer(params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """Adam, fresh per client and round (no optimizer state crosses the wire); fused where supported."""
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(params, lr=lr, foreach=True)


def local_train(
    model: nn.Module,
    flat: torch.Tensor,
    start: torch.Tensor,
    images: torch.Tensor,
    indices: torch.Tensor,
    objective: DDPM | FlowMatching,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    gen: torch.Generator,
    mask: torch.Tensor | None = None,
    prox_mu: float = 0.0,
    grad_clip: float = 0.0,
    probe_steps: int = 0,
) -> LocalResult:
    """Train the model whose parameters are views of `flat`, from `start`, for `steps` steps.

    sigma_1^2 (Qiao et al.'s stochastic-gradient variance) is estimated on the first
    `probe_steps` mini-batch gradients g_1..g_m of the diffusion loss:
        sigma1_sq = 1/(m-1) * sum_s ||g_s - mean(g)||^2   (a sum over parameters),
    i.e. the trace of the mini-batch gradient covariance at batch size B. The
    parameters move a little between those steps, so the estimate includes that drift;
    a short window keeps it small. None when probe_steps < 2.
    """
    flat.copy_(start)
    params = [p for p in model.parameters()]
    opt = make_optimizer(params, lr)
    mask_views = None
    if mask is not None:
        mask_views = [m.view_as(p) for m, p in zip(torch.split(mask, [p.numel() for p in params]), params)]
    anchor_views = None
    if prox_mu > 0:
        anchor_views = [a.view_as(p) for a, p in zip(torch.split(start, [p.numel() for p in params]), params)]
    probe = min(probe_steps, steps) if probe_steps >= 2 else 0
    g_sum = g_sq = None
    total = torch.zeros((), device=flat.device)
    for s in range(steps):
        x0 = draw_batch(images, indices, batch_size, gen)
        loss = objective.loss(model, x0, gen)
        opt.zero_grad(set_to_none=False) if s else opt.zero_grad(set_to_none=True)
        loss.backward()
        grads = [p.grad for p in params]
        if mask_views is not None:
            torch._foreach_mul_(grads, mask_views)
        if s < probe:
            g = torch.cat([gr.reshape(-1) for gr in grads]).double()
            g_sum = g.clone() if g_sum is None else g_sum.add_(g)
            g_sq = g.square().sum() if g_sq is None else g_sq + g.square().sum()
        if anchor_views is not None:
            # grad of mu/2 ||w - w_global||^2 is mu (w - w_global) (FedProx, Li et al. 2020, eq. 2)
            diffs = torch._foreach_sub([p.detach() for p in params], anchor_views)
            torch._foreach_add_(grads, diffs, alpha=prox_mu)
            if mask_views is not None:
                torch._foreach_mul_(grads, mask_views)
        if grad_clip > 0:
            nn.utils.clip_grad_norm_(params, grad_clip, foreach=True)
        opt.step()
        total += loss.detach()
    sigma1 = None
    if probe:
        sigma1 = float((g_sq - g_sum.square().sum() / probe) / (probe - 1))
    return LocalResult(params=flat.detach().clone(), loss=float(total) / steps, sigma1_sq=sigma1)
