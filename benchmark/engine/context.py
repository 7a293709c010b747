"""RunContext: what a method may read about the run, and the engine services it may use.

Data, layout, clients and their capacities; seeded generators; the objectives, samplers and
the velocity-space ODE; the run's network (and the same architecture at another width). The
methods type their hooks against their own protocol, `methods.MethodContext` (methods/context.py),
which RunContext satisfies (tests/runs/test_protocol.py): a method imports nothing from the engine.

The context is a value: built once per run by `build_context` (the life cycle adds the run's
mechanisms when it builds it), and never assigned to afterwards (a frozen dataclass; the tensors
and the network it holds are the run's buffers, which the round computes in). What changes from
round to round is a `RoundState` (round index, its aggregation weight, its learning rate): a
driver hands the hooks `ctx.at_round(r, weight)`, a shallow copy that carries the round's state,
so a method reads `ctx.round` and nothing in the loop writes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from dfbench import datasets

from dfbench.benchmark.engine import diffusion
from dfbench.benchmark.engine import distributed
from dfbench.benchmark.core.config import ConfigError, RunConfig, parse_capacity, round_lr, time_sampling_for
from dfbench.benchmark.core.seeds import tier_values
from dfbench.benchmark.engine.clock import Clock, build_clock
from dfbench.benchmark.core import presets
from dfbench.benchmark.core.presets import MLPSpec, UNetSpec
from dfbench.benchmark.engine.model import Layout, build_model, build_network, flatten_, resolve_preset
from dfbench.benchmark.core.seeds import derive_seed, np_rng, torch_gen


@dataclass(frozen=True)
class RoundState:
    """What the hooks of one round (one server step of an asynchronous driver) see of it."""

    round: int = 0  # 1-based; 0 outside any round (set-up, finalize, evaluation)
    weight: float = 1.0  # sum of n_k over the clients aggregated in this round (p_k = n_k / weight)
    lr: float | None = None  # the clients' learning rate this round (train.lr under train.lr_decay)


@dataclass(frozen=True, eq=False)
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
    # Per-client capacity in (0, 1] from the capacity tiers (system.capacity; None = no tiers).
    # Each method interprets it: pruning as the keep ratio of the sub-model, HeteroFL as its width.
    capacity: np.ndarray | None
    local_steps: np.ndarray  # per-client local steps (stragglers run fewer)
    clock: Clock  # simulated seconds of clients and rounds (benchmark/engine/clock.py)
    objectives: dict[str, Any] = field(default_factory=dict)  # "ddpm"/"fm" -> objective object (a cache, filled on use)
    # the round the hooks are called in (a driver passes them `at_round(...)`; 0 = outside any round)
    round_state: RoundState = RoundState()
    progress: bool = False  # tqdm bars for sampling (evaluation passes a copy with its own)
    # what wraps every round's accumulation from outside the method (methods.Mechanism, e.g. DP's
    # clipping and noise: benchmark/engine/privacy.py), set by the run's life cycle from the config
    mechanisms: tuple[Any, ...] = ()
    rank: int = 0
    world: int = 1

    # -- the round ------------------------------------------------------------------------
    def at_round(self, round_: int, weight: float = 1.0, lr: float | None = None) -> "RunContext":
        """This context in round `round_` whose aggregated clients hold `weight` samples in all:
        a shallow copy (the same data, network and buffers) with that round's `RoundState`. Its lr is
        `round_`'s under train.lr_decay unless given (an edge round has its cloud round's, hierarchical.py)."""
        lr = round_lr(self.cfg.train, round_) if lr is None else lr
        return replace(self, round_state=RoundState(round=round_, weight=weight, lr=lr))

    @property
    def round(self) -> int:
        """The current round (1-based; 0 outside any round)."""
        return self.round_state.round

    @property
    def round_weight(self) -> float:
        """Sum of n_k over the clients aggregated in this round."""
        return self.round_state.weight

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
    def bounded(self) -> bool:
        """Whether the data live in the pixel range [-1, 1] (uint8 images), so samplers may clip to it; False
        for float data (the ground-truth mixtures, datasets/gmm.py: clipping would change their law)."""
        return self.images.dtype == torch.uint8

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
            t = self.cfg.train
            self.objectives[name] = diffusion.make_objective(name, t.schedule, t.timesteps, time_sampling_for(t, name))
        return self.objectives[name]

    @property
    def model_spec(self) -> UNetSpec | MLPSpec:
        """The architecture of the run's network (its preset)."""
        return presets.network_spec(resolve_preset(self.cfg.train.model, self.cfg.data.dataset))

    def network_at_width(self, channels: int) -> torch.nn.Module:
        """The run's architecture at another base width, on the meta device (structure only:
        `torch.func.functional_call` supplies its parameters), e.g. for HeteroFL's sub-models."""
        with torch.device("meta"):
            return build_network(replace(self.model_spec, channels=channels), self.image_shape)

    def velocity(self, net: Any, x: torch.Tensor, t: torch.Tensor, objective: str) -> torch.Tensor:
        """The velocity of network `net` (trained with `objective`) at flow-matching state (x, t):
        flow matching predicts it; a DDPM network's epsilon is converted by SNR matching."""
        if objective == "fm":
            return net(x, t)
        return self.get_objective("ddpm").velocity(net, x, t, clamp=self.bounded)

    def integrate_velocity(self, velocity: Any, noise: torch.Tensor, steps: int, method: str = "heun") -> torch.Tensor:
        """The velocity-space ODE from t = 1 (noise) to 0 (data): diffusion.sample_ode (clipped to [-1, 1] for
        images, not for the unbounded ground-truth data)."""
        return diffusion.sample_ode(velocity, noise, steps, method, clip=self.bounded)  # type: ignore[arg-type]

    def client_lr(self) -> float:
        """The clients' learning rate in the current round (train.lr under train.lr_decay)."""
        lr = self.round_state.lr
        return round_lr(self.cfg.train, self.round) if lr is None else lr

    def sampler_name(self, objective: str) -> str:
        s = self.cfg.eval.sampler
        return diffusion.default_sampler(objective) if s == "auto" else s

    @torch.no_grad()
    def sample_single(self, params: torch.Tensor, noise: torch.Tensor, objective: str, batch: int | None = None,
                      network: torch.nn.Module | None = None) -> torch.Tensor:
        """Sample one model (flat params) from the given noise, in batches, on the device.

        `network`: what to run instead of ctx.model (its parameters must be ctx.model's, views of
        ctx.flat, e.g. a sub-model that slices them); it is sampled as it is, in its own mode.
        """
        batch = batch or self.cfg.eval.sample_batch
        self.flat.copy_(params)
        obj = self.get_objective(objective)
        sampler = self.sampler_name(objective)
        net = self.model if network is None else network
        if network is None:
            self.model.eval()
        out = []
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=noise.shape[0], desc=f"sampling ({sampler}, {self.cfg.eval.sampler_steps} steps)", unit="img", leave=False)
        for i in range(0, noise.shape[0], batch):
            x = noise[i:i + batch].to(self.device)
            out.append(diffusion.sample(obj, net, x, sampler, self.cfg.eval.sampler_steps, clip=self.bounded).cpu())
            if bar is not None:
                bar.update(x.shape[0])
        if bar is not None:
            bar.close()
        if network is None:
            self.model.train()
        return torch.cat(out)


def assign_tiers(num_clients: int, spec: str, seed: int) -> np.ndarray | None:
    """Capacity tiers -> per-client capacity (None without tiers); see tier_values."""
    tiers = parse_capacity(spec)
    return tier_values(num_clients, tiers, seed) if tiers else None


def assign_local_steps(num_clients: int, steps: int, fraction: float, straggler_steps: float, seed: int) -> np.ndarray:
    """A seeded set of round(fraction * N) stragglers runs ceil(straggler_steps * S) steps."""
    out = np.full(num_clients, steps, dtype=np.int64)
    k = int(round(fraction * num_clients))
    if k:
        who = np_rng(seed, "stragglers").choice(num_clients, size=k, replace=False)
        out[who] = max(1, math.ceil(straggler_steps * steps))
    return out


def sample_round_clients(num_clients: int, participation: float, dropout: float, seed: int, round_: int,
                         sampling: str = "fixed") -> tuple[list[int], list[int]]:
    """(sampled, dropped): `fixed` draws max(1, round(frac*N)) clients without replacement, `poisson` each
    client independently with probability frac (possibly none: the subsampling DP accountants assume);
    then each drops out with probability `dropout`. Depends only on (seed, round), never on devices or ranks."""
    rng = np_rng(seed, "participation", round_)
    if sampling == "poisson":
        chosen = np.flatnonzero(rng.random(num_clients) < participation)
    else:
        chosen = np.sort(rng.choice(num_clients, size=max(1, int(round(participation * num_clients))), replace=False))
    m = len(chosen)
    drop = np_rng(seed, "dropout", round_).random(m) < dropout
    return [int(c) for c in chosen[~drop]], [int(c) for c in chosen[drop]]


def run_partition(cfg: RunConfig, labels: np.ndarray, images: torch.Tensor) -> datasets.Partition:
    """The run's clients: data.partition, seeded by the run's seed, capped at data.images_per_client each."""
    part = datasets.partition(labels, cfg.data.partition, cfg.data.clients, derive_seed(cfg.seed, "partition"),
                              min_size=cfg.data.min_client_size, images=images)
    cap = cfg.data.images_per_client  # its seed keeps the name the field had (data.client_images): same subsets
    return part.capped(cap, derive_seed(cfg.seed, "client_images")) if cap else part


def starting_network(cfg: RunConfig, model: torch.nn.Module, image_shape: tuple[int, ...], bounded: bool = True) -> torch.nn.Module:
    """The run's network as training starts: `model` (seeded; for samples of `image_shape`) with train.init's weights
    copied in, in its parameter order, after checking them against the digest the config recorded
    (benchmark/engine/init_weights.py); under train.init_objective=ddpm wrapped so that it predicts a velocity
    (diffusion.EpsAsVelocity, with the DDPM schedule of train.schedule and train.timesteps; `bounded`: the data
    are images in [-1, 1], so x0_hat is clamped to them, as the expert mixtures do)."""
    t = cfg.train
    if not t.init:
        return model
    from dfbench.benchmark.engine.init_weights import load_init

    weights = load_init(t.init, resolve_preset(t.model, cfg.data.dataset), image_shape)
    if t.init_sha256 and weights.sha256 != t.init_sha256:
        raise ConfigError(f"invalid value for 'train.init': the weights in {weights.file} changed since the config was "
                          f"resolved (sha256 {weights.sha256}, recorded {t.init_sha256}); restore them, or start a new run")
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(weights.flat[offset:offset + p.numel()].view(p.shape))
            offset += p.numel()
    if t.init_objective == "ddpm":
        return diffusion.EpsAsVelocity(model, diffusion.DDPM(t.schedule, t.timesteps), clamp=bounded)
    return model


def build_context(cfg: RunConfig, *, data: datasets.ImageSet | None = None, rank: int = 0, world: int = 1) -> RunContext:
    """The run's context (data, partition, the seeded network); `rank`/`world` of torch.distributed."""
    device = torch.device(distributed.local_device(cfg.device))  # "cuda" -> cuda:LOCAL_RANK under torchrun
    if data is None:
        data = datasets.load(cfg.data.dataset, "train", root=cfg.data.root)
    labels = data.labels.numpy()
    if cfg.data.clients > len(labels):
        from dfbench.benchmark.core.config import ConfigError

        raise ConfigError(f"invalid value for 'data.clients': {cfg.data.clients}; allowed: at most the {len(labels)} training samples")
    part = run_partition(cfg, labels, data.images)
    images = data.images.to(device)
    torch.manual_seed(derive_seed(cfg.seed, "init"))
    model = build_model(resolve_preset(cfg.train.model, cfg.data.dataset), tuple(images.shape[1:])).to(device)
    model = starting_network(cfg, model, tuple(images.shape[1:]), bounded=images.dtype == torch.uint8)
    flat, layout = flatten_(model)
    return RunContext(
        cfg=cfg, device=device, images=images, labels=labels, partition=part,
        client_indices=[torch.tensor(ix, dtype=torch.long, device=device) for ix in part.indices],
        client_sizes=np.array([len(ix) for ix in part.indices], dtype=np.int64),
        model=model, flat=flat, layout=layout, init_params=flat.detach().clone(),
        capacity=assign_tiers(cfg.data.clients, cfg.system.capacity, cfg.seed),
        local_steps=assign_local_steps(cfg.data.clients, cfg.train.local_steps, cfg.system.stragglers, cfg.system.straggler_steps, cfg.seed),
        clock=build_clock(cfg.data.clients, cfg.system, cfg.seed),
        rank=rank, world=world,
    )
