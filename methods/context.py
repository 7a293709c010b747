"""What a method sees of the run: the protocol its hooks are typed against (`MethodContext`).

The methods own this protocol; the engine's `RunContext` (benchmark/engine/context.py) satisfies it
(tests/runs/test_protocol.py checks every member), so a method imports nothing of the engine, not even to
type its hooks, and the methods sit below the engine in the layers. A member a method needs is added
here first, then to RunContext. Every member is read-only: the context is a value (a driver hands the
hooks `ctx.at_round(r, weight)`, a copy carrying the round's state).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import nn

    from dfbench.benchmark.core.config import RunConfig
    from dfbench.benchmark.core.presets import UNetSpec
    from dfbench.datasets import Partition


@runtime_checkable
class ParamLayout(Protocol):
    """Where each named parameter lives in the ONE flat parameter vector (names in the network's order)."""

    @property
    def names(self) -> tuple[str, ...]: ...

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]: ...

    @property
    def total(self) -> int:
        """The number of parameters, P."""

    @property
    def numels(self) -> tuple[int, ...]: ...

    def slices(self) -> list[tuple[str, slice, tuple[int, ...]]]:
        """(name, its slice of the flat vector, its shape), in order."""

    def is_weight(self) -> list[bool]:
        """True for conv/linear weight matrices (ndim >= 2), False for biases and norm scales."""


@runtime_checkable
class MethodContext(Protocol):
    """The run as a method's hooks see it: data, layout, clients and their capacities, seeded generators,
    the objectives, samplers and the velocity-space ODE, the network (and the same architecture at another
    width), and the round the hooks are called in."""

    # -- the run ---------------------------------------------------------------------------
    @property
    def cfg(self) -> RunConfig: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def images(self) -> torch.Tensor:
        """The training images, uint8 [N, C, H, W] on the device."""

    @property
    def image_shape(self) -> tuple[int, int, int]: ...

    @property
    def labels(self) -> np.ndarray:
        """The training images' class labels, int64 [N] (a client's label mix: labels[partition.indices[k]])."""

    @property
    def objective(self) -> str:
        """The run's objective (train.objective): "ddpm" or "fm"."""

    # -- the clients -------------------------------------------------------------------------
    @property
    def partition(self) -> Partition:
        """The clients' indices into the training images (and their clusters, if the partition has any)."""

    @property
    def num_clients(self) -> int: ...

    @property
    def client_sizes(self) -> np.ndarray:
        """n_k, each client's number of samples."""

    @property
    def capacity(self) -> np.ndarray | None:
        """Each client's capacity in (0, 1] from system.capacity's tiers (None without tiers); the method
        interprets it (pruning: the keep ratio, HeteroFL: the width)."""

    @property
    def local_steps(self) -> np.ndarray:
        """Each client's local steps (stragglers run fewer)."""

    # -- the network ---------------------------------------------------------------------------
    @property
    def model(self) -> nn.Module:
        """The ONE network buffer every client reuses; its parameters are views of `flat`."""

    @property
    def flat(self) -> torch.Tensor:
        """The network's parameters as one flat vector [P]."""

    @property
    def layout(self) -> ParamLayout: ...

    @property
    def model_spec(self) -> UNetSpec:
        """The architecture of the built-in UNet the run trains (its preset's)."""

    def network_at_width(self, channels: int) -> nn.Module:
        """The run's architecture at another base width, on the meta device (structure only)."""

    # -- the round -----------------------------------------------------------------------------
    @property
    def round(self) -> int:
        """The current round (1-based; 0 outside any round)."""

    @property
    def round_weight(self) -> float:
        """Sum of n_k over the clients aggregated in this round."""

    def client_lr(self) -> float:
        """The clients' learning rate in the current round (train.lr under train.lr_decay)."""

    # -- seeded randomness ---------------------------------------------------------------------
    def rng(self, *keys: object) -> np.random.Generator:
        """A numpy generator seeded by (run seed, *keys)."""

    def gen(self, *keys: object) -> torch.Generator:
        """A torch generator on the device, seeded by (run seed, *keys)."""

    # -- objectives and sampling ---------------------------------------------------------------
    @property
    def bounded(self) -> bool:
        """Whether the data are pixels in [-1, 1] that samplers may clip to (False: the unbounded gmm: data)."""

    def get_objective(self, name: str | None) -> Any:
        """The objective object of `name` (None: the run's): its schedule (a DDPM's ``T``, ``abar64``) and sampler."""

    def velocity(self, net: Any, x: torch.Tensor, t: torch.Tensor, objective: str) -> torch.Tensor:
        """The velocity of network `net` (trained with `objective`) at flow-matching state (x, t)."""

    def integrate_velocity(self, velocity: Callable[[torch.Tensor, float], torch.Tensor], noise: torch.Tensor,
                           steps: int, method: str = "heun") -> torch.Tensor:
        """The velocity-space ODE from t = 1 (noise) to 0 (data)."""

    def sample_single(self, params: torch.Tensor, noise: torch.Tensor, objective: str, batch: int | None = None,
                      network: nn.Module | None = None) -> torch.Tensor:
        """Sample one model (flat params) from the given noise with the run's sampler, in batches."""
