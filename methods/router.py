"""The router of a decentralized expert mixture: p(cluster | x_t, t) (McAllister et al., 2025).

A tiny time-conditioned conv classifier, trained on training images noised on the
flow-matching path x_t = (1 - t) x0 + t eps with t ~ U[0, 1], to predict which expert's
cluster a sample came from. At sampling time its posterior weights the experts'
velocities (full mixture, top-1, top-k).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dfbench import datasets
from torch import nn
import torch.nn.functional as F

# noise-level buckets for the held-out accuracy (t = 0 is clean data, t = 1 pure noise)
BUCKETS: tuple[tuple[float, float], ...] = ((0.0, 0.2), (0.2, 0.4), (0.4, 0.6), (0.6, 0.8), (0.8, 1.0))


def bucket_name(lo: float, hi: float) -> str:
    return f"t={lo:.1f}-{hi:.1f}"


class Router(nn.Module):
    """Three stride-2 convs on [x_t, t] -> global average -> MLP on (features, time features) -> K logits."""

    def __init__(self, channels: int, num_experts: int, width: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels + 1, width, 3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1)
        self.conv3 = nn.Conv2d(2 * width, 2 * width, 3, stride=2, padding=1)
        self.fc1 = nn.Linear(2 * width + 3, 4 * width)
        self.fc2 = nn.Linear(4 * width, num_experts)

    @staticmethod
    def time_features(t: torch.Tensor) -> torch.Tensor:
        return torch.stack([t, torch.sin(math.pi * t), torch.cos(math.pi * t)], dim=1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        t = t.to(x.dtype)
        # t as a constant extra channel: the conv features can depend on the noise level
        h = torch.cat([x, t.view(-1, 1, 1, 1).expand(-1, 1, *x.shape[2:])], dim=1)
        h = F.silu(self.conv1(h))
        h = F.silu(self.conv2(h))
        h = F.silu(self.conv3(h)).mean(dim=(2, 3))
        h = F.silu(self.fc1(torch.cat([h, self.time_features(t)], dim=1)))
        return self.fc2(h)


def init_router_(router: Router, gen: torch.Generator) -> None:
    """PyTorch's default uniform(+-1/sqrt(fan_in)) init, drawn from `gen` (no global RNG)."""
    with torch.no_grad():
        for mod in router.modules():
            if isinstance(mod, (nn.Conv2d, nn.Linear)):
                fan_in = mod.weight[0].numel()
                bound = 1.0 / math.sqrt(fan_in)
                mod.weight.uniform_(-bound, bound, generator=gen)
                if mod.bias is not None:
                    mod.bias.uniform_(-bound, bound, generator=gen)


def noise_fm(x0: torch.Tensor, t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """x_t = (1 - t) x0 + t eps (the flow-matching path the sampler walks)."""
    eps = torch.randn(x0.shape, generator=gen, device=x0.device, dtype=x0.dtype)
    tt = t.view(-1, 1, 1, 1)
    return (1 - tt) * x0 + tt * eps


def _scaled(images: torch.Tensor) -> torch.Tensor:
    return datasets.to_model_space(images)


@dataclass
class RouterData:
    """Training images (uint8, on the device) and their cluster labels, split into train / held-out."""

    images: torch.Tensor  # uint8 [N, C, H, W]
    train_idx: torch.Tensor  # int64 indices into images
    train_y: torch.Tensor  # cluster label of each training index
    held_idx: torch.Tensor
    held_y: torch.Tensor


def train_router(router: Router, data: RouterData, *, steps: int, batch_size: int, lr: float, gen: torch.Generator) -> float:
    """Adam on cross-entropy over noised training samples, t ~ U[0, 1]; returns the mean loss of the last 10% of steps."""
    opt = torch.optim.Adam(router.parameters(), lr=lr)
    router.train()
    tail: list[float] = []
    n = data.train_idx.numel()
    for s in range(steps):
        pick = torch.randint(0, n, (batch_size,), generator=gen, device=data.train_idx.device)
        x0 = _scaled(data.images[data.train_idx[pick]])
        t = torch.rand((batch_size,), generator=gen, device=x0.device)
        loss = F.cross_entropy(router(noise_fm(x0, t, gen), t), data.train_y[pick])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if s >= steps - max(1, steps // 10):
            tail.append(float(loss.detach()))
    return sum(tail) / len(tail) if tail else float("nan")


@torch.no_grad()
def router_accuracy(router: Router, data: RouterData, gen: torch.Generator, repeats: int = 4, max_per_bucket: int = 4096,
                    batch: int = 512) -> dict[str, float]:
    """Held-out accuracy per noise bucket: each held-out image noised `repeats` times at t ~ U[lo, hi),
    capped at a seeded random `max_per_bucket` of those (large datasets: evaluation stays cheap)."""
    router.eval()
    out: dict[str, float] = {}
    idx = data.held_idx.repeat(repeats)
    y = data.held_y.repeat(repeats)
    keep = torch.randperm(idx.numel(), generator=gen, device=idx.device)[:max_per_bucket]
    idx, y = idx[keep], y[keep]
    for lo, hi in BUCKETS:
        correct = 0
        for i in range(0, idx.numel(), batch):
            x0 = _scaled(data.images[idx[i:i + batch]])
            t = lo + (hi - lo) * torch.rand((x0.shape[0],), generator=gen, device=x0.device)
            correct += int((router(noise_fm(x0, t, gen), t).argmax(1) == y[i:i + batch]).sum())
        out[bucket_name(lo, hi)] = correct / max(1, idx.numel())
    router.train()
    return out


# -- mixing weights ---------------------------------------------------------------------------

def mixing_weights(probs: torch.Tensor, mode: str, k: int = 1) -> torch.Tensor:
    """Expert weights [B, K] from router posteriors [B, K] (DDM sampling rules).

    full:  w = p                          (the exact mixture velocity sum_k p_k v_k)
    top1:  w = one-hot(argmax p)
    topk:  w = p on the k largest, renormalized to sum 1, 0 elsewhere
    Ties break towards the lower expert index (torch.topk / argmax order).
    """
    if mode == "full":
        return probs
    if mode == "top1":  # exact one-hot, so a sure router reproduces one expert bit for bit
        return torch.zeros_like(probs).scatter_(1, probs.argmax(1, keepdim=True), 1.0)
    if mode != "topk":
        raise ValueError(f"unknown mixing mode {mode!r}; allowed: full, top1, topk")
    k = min(k, probs.shape[1])
    top = probs.topk(k, dim=1)
    w = torch.zeros_like(probs).scatter_(1, top.indices, top.values)
    return w / w.sum(dim=1, keepdim=True).clamp_min(1e-30)
