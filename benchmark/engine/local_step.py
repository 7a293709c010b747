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
import copy
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from dfbench import datasets
from dfbench.benchmark.core import numerics
from dfbench.benchmark.engine.diffusion import DDPM, FlowMatching
from dfbench.benchmark.engine.model import flatten_
from dfbench.methods.base import DenseNetwork, LocalStep

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
    return datasets.to_model_space(images[indices[pick]])


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


_DENSE_BUILT: "weakref.WeakKeyDictionary[DenseNetwork, tuple[nn.Module, torch.Tensor]]" = weakref.WeakKeyDictionary()


def dense_network(dense: DenseNetwork, device: torch.device) -> tuple[nn.Module, torch.Tensor]:
    """(the narrow network built on `device`, its flat parameter buffer), built once per DenseNetwork."""
    built = _DENSE_BUILT.get(dense)
    if built is None or built[1].device != device:
        net = copy.deepcopy(dense.arch).to_empty(device=device)
        nflat, _ = flatten_(net)
        if nflat.numel() != dense.index.numel():
            raise ValueError(f"a DenseNetwork's index has {dense.index.numel()} entries for {nflat.numel()} parameters")
        built = _DENSE_BUILT[dense] = (net, nflat)
    return built


def load_dense_(nflat: torch.Tensor, w: torch.Tensor, dense: DenseNetwork) -> None:
    """Narrow parameters <- the trained entries, each scaled segment divided by its scale (as the sliced forward does)."""
    with torch.no_grad():
        nflat.copy_(w)
        for off, n, s in dense.scaled:
            torch.div(w[off:off + n], s, out=nflat[off:off + n])


def gather_dense_grad_(w_grad: torch.Tensor, grad: torch.Tensor, dense: DenseNetwork) -> None:
    """Gradient of the trained entries from the narrow network's: d(w / s)/dw = 1 / s on the scaled segments."""
    w_grad.copy_(grad)
    for off, n, s in dense.scaled:
        torch.div(grad[off:off + n], s, out=w_grad[off:off + n])


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

    step.dense (a structured sub-model, methods/base.DenseNetwork): the entries it names are gathered
    from `start`, trained as the narrow network's own flat buffer (mask, proximal term, correction, probe,
    clipping and Adam all at its size) and scattered back into a copy of `start`; every other entry is
    the start's. `flat` is not written.
    """
    t0 = time.perf_counter()
    mask, prox_mu, step_correction = step.mask, step.proximal_mu, step.step_correction
    batch_size, lr, grad_clip, amp = settings.batch_size, settings.lr, settings.grad_clip, settings.amp
    dense = step.dense
    if dense is None:  # the network's parameters are views of `flat`: Adam trains `flat` itself
        net = step.network if step.network is not None else model
        flat.copy_(start)
        grad, params = flat_grad_(net, flat)  # p.grad are views of grad
        w, w_start, w_grad = flat, start, grad
    else:  # a structured sub-model: train its own entries at its own size (methods/base.DenseNetwork)
        net, nflat = dense_network(dense, flat.device)
        grad, params = flat_grad_(net, nflat)
        w = start.index_select(0, dense.index)  # the trained entries, in the global parameterization
        w_start = w.clone()
        w_grad = torch.zeros_like(w)
        w.grad = w_grad
        mask = mask.index_select(0, dense.index) if mask is not None else None
        mask = None if mask is None or bool(mask.all()) else mask
        if step_correction is not None:
            step_correction = step_correction.index_select(0, dense.index)
    opt = make_optimizer([w], lr)  # Adam is elementwise: one flat tensor == every parameter tensor
    probe = min(settings.probe_steps, steps)
    probe = probe if probe >= 2 else 0  # a variance needs two gradients (a 1-step straggler has one)
    g_sum = g_sq = None
    total = torch.zeros((), device=flat.device)
    for s in range(steps):  # (s: the step index; `step` is what the method asked for)
        x0 = draw_batch(images, indices, batch_size, gen)
        if settings.channels_last:
            x0 = x0.contiguous(memory_format=torch.channels_last)
        if dense is not None:
            load_dense_(nflat, w, dense)
        with autocast(flat.device, amp):
            loss = objective.loss(net, x0, gen)
        grad.zero_()
        loss.backward()
        if dense is not None:
            gather_dense_grad_(w_grad, grad, dense)
        if mask is not None:
            w_grad.mul_(mask)
        if s < probe:
            g = w_grad.double()
            g_sum = g.clone() if g_sum is None else g_sum.add_(g)
            g_sq = g.square().sum() if g_sq is None else g_sq + g.square().sum()
        if prox_mu > 0:
            # grad of mu/2 ||w - w_global||^2 is mu (w - w_global) (FedProx, Li et al. 2020, eq. 2)
            w_grad.add_(w - w_start, alpha=prox_mu)
            if mask is not None:
                w_grad.mul_(mask)
        if grad_clip > 0:
            clip_rows_(w_grad, grad_clip)
        opt.step()
        if step_correction is not None:
            w.sub_(step_correction, alpha=lr)
        total += loss.detach()
    for p in params:  # no dangling views of this client's gradient buffer
        p.grad = None
    flat.grad = None
    w.grad = None
    sigma1 = None
    if probe:
        sigma1 = float((g_sq - g_sum.square().sum() / probe) / (probe - 1))
    if dense is None:
        params = flat.detach().clone()
    else:  # scattered back once: every other entry is the start's (the masked path leaves them untouched too)
        params = start.detach().clone().index_copy_(0, dense.index, w.detach())
    if params.device.type == "cuda":
        torch.cuda.synchronize(params.device)  # the measured time is the work's, not the queue's
    return LocalResult(params=params, loss=float(total) / steps, sigma1_sq=sigma1, seconds=time.perf_counter() - t0)
