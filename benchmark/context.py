"""RunContext: what a method may read about the run (data, layout, clients, sampler).

Built once per run by `build_context`; methods never see the loop's bookkeeping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dfbench import datasets

from . import diffusion, distributed
from .config import RunConfig, parse_capacity, round_lr
from .model import Layout, build_model, flatten_, resolve_preset
from .seeds import derive_seed, np_rng, torch_gen


@dataclass
class RunContext:
    cfg: RunConfig
    device: torch.device
    images: torch.Tensor  # uint8 [N, C, H, W] on the device
    labels: np.ndarray  # int64 [N]
    partition: datasets.Partition
    client_indices: list[torch.Tensor]  # per client, int64 on the device
    client_sizes: np.ndarray  # n_k
    model: torch.nn.Module  # the ONE model buffer, reused by every client
    flat: torch.Tensor  # its parameters as one flat vector (the model's params are views of it)
    layout: Layout
    init_params: torch.Tensor  # seeded initial parameters [P]
    keep_ratios: np.ndarray | None  # per-client keep ratio from capacity tiers (None = no tiers)
    local_steps: np.ndarray  # per-client local steps (stragglers run fewer)
    objectives: dict[str, Any] = field(default_factory=dict)  # "ddpm"/"fm" -> objective object
    round: int = 0
    round_weight: float = 1.0  # sum of n_k over this round's clients (set by the loop)
    progress: bool = False  # tqdm bars for sampling (set by the loop)
    rank: int = 0
    world: int = 1

    # -- conveniences for methods ---------------------------------------------------------
    @property
    def num_clients(self) -> int:
        return len(self.client_indices)

    @property
    def objective(self) -> str:
        return self.cfg.train.objective

    @property
    def seed(self) -> int:
        return self.cfg.seed

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.images.shape[1:])  # type: ignore[return-value]

    def rng(self, *keys: object) -> np.random.Generator:
        return np_rng(self.cfg.seed, *keys)

    def gen(self, *keys: object) -> torch.Generator:
        return torch_gen(self.cfg.seed, *keys, device=self.device)

    def get_objective(self, name: str | None) -> Any:
        name = name or self.cfg.train.objective
        if name not in self.objectives:
            self.objectives[name] = diffusion.make_objective(name, self.cfg.train.schedule, self.cfg.train.timesteps)
        return self.objectives[name]

    def client_lr(self) -> float:
        """The clients' learning rate in the current round (train.lr under train.lr_decay)."""
        return round_lr(self.cfg.train, self.round)

    def sampler_name(self, objective: str) -> str:
        s = self.cfg.eval.sampler
        return diffusion.default_sampler(objective) if s == "auto" else s

    @torch.no_grad()
    def sample_single(self, params: torch.Tensor, noise: torch.Tensor, objective: str, batch: int = diffusion.SAMPLE_BATCH) -> torch.Tensor:
        """Sample one model (flat params) from the given noise, in batches, on the device."""
        self.flat.copy_(params)
        obj = self.get_objective(objective)
        sampler = self.sampler_name(objective)
        self.model.eval()
        out = []
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=noise.shape[0], desc=f"sampling ({sampler}, {self.cfg.eval.sampler_steps} steps)", unit="img", leave=False)
        for i in range(0, noise.shape[0], batch):
            x = noise[i:i + batch].to(self.device)
            out.append(diffusion.sample(obj, self.model, x, sampler, self.cfg.eval.sampler_steps).cpu())
            if bar is not None:
                bar.update(x.shape[0])
        if bar is not None:
            bar.close()
        self.model.train()
        return torch.cat(out)


def assign_tiers(num_clients: int, spec: str, seed: int) -> np.ndarray | None:
    """Capacity tiers -> per-client keep ratio; tier sizes by largest remainder, order seeded."""
    tiers = parse_capacity(spec)
    if not tiers:
        return None
    counts = [int(math.floor(f * num_clients)) for _, f in tiers]
    rema = sorted(range(len(tiers)), key=lambda i: -(tiers[i][1] * num_clients - counts[i]))
    for i in rema[: num_clients - sum(counts)]:
        counts[i] += 1
    keeps = np.concatenate([np.full(c, k) for (k, _), c in zip(tiers, counts)])
    return np_rng(seed, "capacity").permutation(keeps)


def assign_local_steps(num_clients: int, steps: int, fraction: float, straggler_steps: float, seed: int) -> np.ndarray:
    """A seeded set of round(fraction * N) stragglers runs ceil(straggler_steps * S) steps."""
    out = np.full(num_clients, steps, dtype=np.int64)
    k = int(round(fraction * num_clients))
    if k:
        who = np_rng(seed, "stragglers").choice(num_clients, size=k, replace=False)
        out[who] = max(1, math.ceil(straggler_steps * steps))
    return out


def sample_round_clients(num_clients: int, participation: float, dropout: float, seed: int, round_: int) -> tuple[list[int], list[int]]:
    """(sampled, dropped): max(1, round(frac*N)) clients without replacement, then each drops
    out with probability `dropout`. Depends only on (seed, round), never on devices or ranks."""
    m = max(1, int(round(participation * num_clients)))
    chosen = np.sort(np_rng(seed, "participation", round_).choice(num_clients, size=m, replace=False))
    drop = np_rng(seed, "dropout", round_).random(m) < dropout
    return [int(c) for c in chosen[~drop]], [int(c) for c in chosen[drop]]


def build_context(cfg: RunConfig, *, data: datasets.ImageSet | None = None) -> RunContext:
    device = torch.device(distributed.local_device(cfg.device))  # "cuda" -> cuda:LOCAL_RANK under torchrun
    if data is None:
        data = datasets.load(cfg.data.dataset, "train", root=cfg.data.root)
    labels = data.labels.numpy()
    if cfg.data.clients > len(labels):
        from .config import ConfigError

        raise ConfigError(f"invalid value for 'data.clients': {cfg.data.clients}; allowed: at most the {len(labels)} training samples")
    part = datasets.partition(labels, cfg.data.partition, cfg.data.clients, derive_seed(cfg.seed, "partition"),
                              min_size=cfg.data.min_client_size, images=data.images)
    images = data.images.to(device)
    torch.manual_seed(derive_seed(cfg.seed, "init"))
    model = build_model(resolve_preset(cfg.train.model, cfg.data.dataset), images.shape[1]).to(device)
    flat, layout = flatten_(model)
    return RunContext(
        cfg=cfg, device=device, images=images, labels=labels, partition=part,
        client_indices=[torch.tensor(ix, dtype=torch.long, device=device) for ix in part.indices],
        client_sizes=np.array([len(ix) for ix in part.indices], dtype=np.int64),
        model=model, flat=flat, layout=layout, init_params=flat.detach().clone(),
        keep_ratios=assign_tiers(cfg.data.clients, cfg.system.capacity, cfg.seed),
        local_steps=assign_local_steps(cfg.data.clients, cfg.train.local_steps, cfg.system.stragglers, cfg.system.straggler_steps, cfg.seed),
    )
