"""The ONE local training step shared by every method.

A client starts from `start` (already masked for pruned sub-models), runs `steps`
Adam steps on mini-batches drawn on the device from its own indices, and returns its
new flat parameters. What a method asks of the step is a `LocalStep` (methods/base.py:
mask, proximal term, objective, network, step correction); the run's own settings
(train.*: batch size, the round's learning rate, clipping, probe, precision, layout) are
a `StepSettings`. Pruned weights are zero in the forward pass (they are zero in
`start`) and receive no update (their gradient is masked, and Adam with an all-zero
gradient history moves nothing).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from dfbench.benchmark.core import numerics
from dfbench.benchmark.engine.diffusion import DDPM, FlowMatching
from dfbench.methods.base import LocalStep

if TYPE_CHECKING:
    from dfbench.benchmark.core.config import TrainConfig


@dataclass(frozen=True)
class StepSettings:
    """The run's settings of the local step (train.*), the same for every client of a round."""

    batch_size: int
    lr: float  # this round's client learning rate (train.lr under train.lr_decay)
    grad_clip: float = 0.0
    probe_steps: int = 0  # train.sigma1_probe_steps
    amp: str = "off"
    channels_last: bool = False

    @classmethod
    def of(cls, t: "TrainConfig", lr: float) -> "StepSettings":
        return cls(batch_size=t.batch_size, lr=lr, grad_clip=t.grad_clip, probe_steps=t.sigma1_probe_steps, amp=t.amp,
                   channels_last=t.channels_last)


@dataclass
class LocalResult:
    params: torch.Tensor  # flat [P], a fresh tensor
    loss: float  # mean diffusion loss over the steps
    sigma1_sq: float | None  # mini-batch gradient variance estimate (see below)
    seconds: float | None = None  # measured wall time of the client's training (None: not measured alone, e.g. lockstep)


def draw_batch(images: torch.Tensor, indices: torch.Tensor, batch_size: int, gen: torch.Generator) -> torch.Tensor:
    """A batch (with replacement) from this client's own indices, on the device, scaled to [-1, 1]."""
    pick = torch.randint(0, indices.numel(), (batch_size,), generator=gen, device=indices.device)
    return images[indices[pick]].float().div_(127.5).sub_(1.0)


def autocast(device: torch.device, amp: str) -> contextlib.AbstractContextManager:
    """bfloat16 autocast for the forward pass and loss when amp == "bf16"; a no-op otherwise.

    bf16 keeps float32's exponent range, so no loss scaling is needed (unlike fp16). On a CPU
    without native bfloat16 it falls back to float32 with a warning (numerics.effective_amp).
    """
    if amp == "bf16" and numerics.warn_amp_fallback(device, amp) == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def make_optimizer(params: list[torch.Tensor], lr: float) -> torch.optim.Optimizer:
    """Adam, fresh per client and round (no optimizer state crosses the wire); fused where supported."""
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(params, lr=lr, foreach=True)


def clip_rows_(grad: torch.Tensor, max_norm: float) -> None:
    """clip_grad_norm_ on flat gradients, one per row of the last dim: scale by min(1, max_norm / (||g|| + 1e-6))."""
    norms = torch.linalg.vector_norm(grad, 2, dim=-1, keepdim=True)
    grad.mul_((max_norm / (norms + 1e-6)).clamp_(max=1.0))


def flat_grad_(model: nn.Module, flat: torch.Tensor) -> tuple[torch.Tensor, list[nn.Parameter]]:
    """(a zeroed gradient buffer shaped like `flat`, the parameters), every parameter's .grad a view of it.

    Backward then accumulates in place into the buffer (the grads are defined, so autograd
    adds into them), and masking, the probe, FedProx, clipping and Adam are each ONE op on
    the flat vector instead of one per parameter tensor.
    """
    grad = torch.zeros_like(flat)
    params = list(model.parameters())
    sizes = [p.numel() for p in params]
    if sum(sizes) != flat.numel() or params[0].data_ptr() != flat.data_ptr():
        raise ValueError("the model's parameters must be the views of `flat` that benchmark.engine.model.flatten_ made")
    for p, g in zip(params, torch.split(grad, sizes)):
        p.grad = g.view_as(p)
    flat.grad = grad
    return grad, params


def local_train(
    model: nn.Module,
    flat: torch.Tensor,
    start: torch.Tensor,
    images: torch.Tensor,
    indices: torch.Tensor,
    objective: DDPM | FlowMatching,
    step: LocalStep,
    settings: StepSettings,
    *,
    steps: int,
    gen: torch.Generator,
) -> LocalResult:
    """Train `step.network` (else `model`), whose parameters are views of `flat`, from `start`, for `steps` steps.

    sigma_1^2 (Qiao et al.'s stochastic-gradient variance) is estimated on the first
    `probe_steps` mini-batch gradients g_1..g_m of the diffusion loss:
        sigma1_sq = 1/(m-1) * sum_s ||g_s - mean(g)||^2   (a sum over parameters),
    i.e. the trace of the mini-batch gradient covariance at batch size B. The
    parameters move a little between those steps, so the estimate includes that drift;
    a short window keeps it small. None when probe_steps < 2.

    amp="bf16" runs the forward pass and loss under bf16 autocast (weights, gradients and
    Adam stay float32). channels_last feeds NHWC batches: the weights stay views of the
    flat buffer (NCHW), the convolutions follow the input's layout.

    step.step_correction (e.g. SCAFFOLD's c - c_i): after every optimizer step the parameters also
    move by -lr * step_correction, i.e. the correction is added to the step's direction.
    """
    t0 = time.perf_counter()
    net = step.network if step.network is not None else model
    mask, prox_mu, step_correction = step.mask, step.proximal_mu, step.step_correction
    batch_size, lr, grad_clip, amp = settings.batch_size, settings.lr, settings.grad_clip, settings.amp
    flat.copy_(start)
    grad, params = flat_grad_(net, flat)  # p.grad are views of grad
    opt = make_optimizer([flat], lr)  # Adam is elementwise: one flat tensor == every parameter tensor
    probe = min(settings.probe_steps, steps)
    probe = probe if probe >= 2 else 0  # a variance needs two gradients (a 1-step straggler has one)
    g_sum = g_sq = None
    total = torch.zeros((), device=flat.device)
    for s in range(steps):  # (s: the step index; `step` is what the method asked for)
        x0 = draw_batch(images, indices, batch_size, gen)
        if settings.channels_last:
            x0 = x0.contiguous(memory_format=torch.channels_last)
        with autocast(flat.device, amp):
            loss = objective.loss(net, x0, gen)
        grad.zero_()
        loss.backward()
        if mask is not None:
            grad.mul_(mask)
        if s < probe:
            g = grad.double()
            g_sum = g.clone() if g_sum is None else g_sum.add_(g)
            g_sq = g.square().sum() if g_sq is None else g_sq + g.square().sum()
        if prox_mu > 0:
            # grad of mu/2 ||w - w_global||^2 is mu (w - w_global) (FedProx, Li et al. 2020, eq. 2)
            grad.add_(flat - start, alpha=prox_mu)
            if mask is not None:
                grad.mul_(mask)
        if grad_clip > 0:
            clip_rows_(grad, grad_clip)
        opt.step()
        if step_correction is not None:
            flat.sub_(step_correction, alpha=lr)
        total += loss.detach()
    for p in params:  # no dangling views of this client's gradient buffer
        p.grad = None
    flat.grad = None
    sigma1 = None
    if probe:
        sigma1 = float((g_sq - g_sum.square().sum() / probe) / (probe - 1))
    params = flat.detach().clone()
    if params.device.type == "cuda":
        torch.cuda.synchronize(params.device)  # the measured time is the work's, not the queue's
    return LocalResult(params=params, loss=float(total) / steps, sigma1_sq=sigma1, seconds=time.perf_counter() - t0)
