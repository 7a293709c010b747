"""Server optimizers (Reddi et al., "Adaptive Federated Optimization", ICLR 2021).

The clients train exactly as under FedAvg; the server treats the (sample-size-weighted)
mean client update as a pseudo-gradient and feeds it to an optimizer of its own:

    Delta_t = mean_k(x_k) - x_t                         (Algorithm 2: Delta_t = mean_k Delta_t^k)

    fedavgm     m_t = beta m_{t-1} + Delta_t;            x_{t+1} = x_t + eta m_t
                (server momentum, Hsu et al. 2019; the heavy-ball form of SGD with momentum)
    fedadagrad  m_t = beta1 m_{t-1} + (1 - beta1) Delta_t
                v_t = v_{t-1} + Delta_t^2            (no beta2: method.beta2 is refused for it)
    fedyogi     v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)
    fedadam     v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2
                x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)   (all three adaptive methods)

with m_{-1} = 0 and v_{-1} = tau^2 (Algorithm 2 asks v_{-1} >= tau^2; we take the smallest),
and no bias correction (the paper has none). Defaults: beta1 = 0.9, beta2 = 0.99 as fixed in
the paper's experiments, tau = 1e-3 (the paper tunes tau on 1e-5..1e-1 and finds 1e-3 a good
default). The server learning rate eta is tuned per task in the paper (no single value); the
defaults here are 1.0 for fedavgm (beta = 0.9) and 1e-2 for the adaptive methods.

Exactness: the new model is computed in float64 as  mean + (step - Delta_t)  (mathematically
x_t + step), so fedavgm with beta = 0 and eta = 1 (step = Delta_t exactly) is FedAvg bitwise.
The optimizer state (m, v) is kept in the parameters' dtype in `state.extra`, as torch.optim
does, and is checkpointed with the model, so a resumed run continues bitwise.

Bits: what FedAvg sends (the optimizer lives on the server; nothing extra crosses the wire).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from .base import Capabilities, Method, ServerState, masked_weighted_mean
from .registry import register_method

if TYPE_CHECKING:
    from .context import MethodContext

MOMENT_KEY = "server_m"  # state.extra keys of the optimizer state
SECOND_KEY = "server_v"


def _fail(method: str, key: str, value: object, allowed: str) -> None:
    raise ValueError(f"invalid value for 'method.{key}' of {method!r}: {value!r}; allowed: {allowed}")


class _ServerOptimizer(Method):
    """FedAvg's clients and aggregation, then one server optimizer step on the pseudo-gradient."""

    family: ClassVar[str | None] = "serveropt"
    capabilities = Capabilities(hierarchical=False,  # the moments are one server's: no cloud average of edge copies
                                needs="it keeps the server optimizer's moments across rounds")

    def server_step(self, delta: torch.Tensor, extra: dict, dtype: torch.dtype) -> torch.Tensor:
        """float64 step s with x_{t+1} = x_t + s; updates the optimizer state in `extra` (stored in `dtype`)."""
        raise NotImplementedError

    def apply(self, state: ServerState, acc: dict[str, torch.Tensor], ctx: "MethodContext") -> ServerState:
        theta = state.params
        wt = float(acc["wtotal"][0])
        if wt <= 0:  # nobody reported: no pseudo-gradient, the optimizer state stays as it was
            return ServerState(params=theta.clone(), extra=state.extra)
        mean = masked_weighted_mean(theta, acc["wsum"][0], acc["wcov"][0], wt, self.masked_mean)  # float64
        delta = mean - theta.double()  # Delta_t, the pseudo-gradient (an ascent direction: x + step)
        step = self.server_step(delta, state.extra, theta.dtype)
        return ServerState(params=(mean + (step - delta)).to(theta.dtype), extra=state.extra)


@register_method("fedavgm")
class FedAvgM(_ServerOptimizer):
    """Server momentum: m <- beta m + Delta; x <- x + eta m."""

    headline_params = ("momentum",)

    @dataclass(frozen=True)
    class Config:
        server_lr: float = 1.0
        momentum: float = 0.9

        def validate(self) -> None:
            if not (math.isfinite(self.server_lr) and self.server_lr > 0):
                _fail("fedavgm", "server_lr", self.server_lr, "a finite number > 0")
            if not (0.0 <= self.momentum < 1.0):
                _fail("fedavgm", "momentum", self.momentum, "a number in [0, 1)")

    def server_step(self, delta: torch.Tensor, extra: dict, dtype: torch.dtype) -> torch.Tensor:
        cfg = self.config
        m = delta if MOMENT_KEY not in extra else extra[MOMENT_KEY].double() * cfg.momentum + delta  # m_{-1} = 0
        extra[MOMENT_KEY] = m.to(dtype)
        return m * cfg.server_lr


@dataclass(frozen=True)
class AdaptiveConfig:
    """Hyperparameters of FedAdagrad / FedYogi / FedAdam (Reddi et al., Algorithm 2)."""

    METHOD: ClassVar[str] = "fedadam"
    server_lr: float = 1e-2  # eta
    beta1: float = 0.9
    beta2: float = 0.99  # not fedadagrad's: it refuses any other value (the field stays so its run ids do)
    tau: float = 1e-3  # adaptivity: the floor of the denominator, and v_{-1} = tau^2

    def validate(self) -> None:
        if not (math.isfinite(self.server_lr) and self.server_lr > 0):
            _fail(self.METHOD, "server_lr", self.server_lr, "a finite number > 0")
        for key in ("beta1", "beta2"):
            if not (0.0 <= getattr(self, key) < 1.0):
                _fail(self.METHOD, key, getattr(self, key), "a number in [0, 1)")
        if not (math.isfinite(self.tau) and self.tau > 0):
            _fail(self.METHOD, "tau", self.tau, "a finite number > 0")


class _Adaptive(_ServerOptimizer):
    headline_params = ("server_lr",)

    def second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
        """v_t from v_{t-1} and Delta_t^2 (float64)."""
        raise NotImplementedError

    def server_step(self, delta: torch.Tensor, extra: dict, dtype: torch.dtype) -> torch.Tensor:
        cfg = self.config
        m_prev = extra[MOMENT_KEY].double() if MOMENT_KEY in extra else torch.zeros_like(delta)
        v_prev = extra[SECOND_KEY].double() if SECOND_KEY in extra else torch.full_like(delta, cfg.tau ** 2)
        m = cfg.beta1 * m_prev + (1 - cfg.beta1) * delta
        v = self.second_moment(v_prev, delta.square())
        extra[MOMENT_KEY], extra[SECOND_KEY] = m.to(dtype), v.to(dtype)
        # Yogi keeps v >= 0 only while v_{-1} > 0 (it moves by at most (1 - beta2) Delta^2 toward
        # Delta^2); the clamp guards the square root against a rounding step below zero.
        return cfg.server_lr * m / (v.clamp_min(0).sqrt() + cfg.tau)


@register_method("fedadagrad")
class FedAdagrad(_Adaptive):
    """Adagrad at the server: v_t = v_{t-1} + Delta_t^2."""

    @dataclass(frozen=True)
    class Config(AdaptiveConfig):
        METHOD: ClassVar[str] = "fedadagrad"

        def validate(self) -> None:
            super().validate()
            # Adagrad sums every Delta_t^2: it has no beta2. The field stays, at the shared default, only
            # because published fedadagrad run ids hash it (config.json records beta2 = 0.99); any other
            # value would make a new run id for the very same training, so it is refused.
            if self.beta2 != AdaptiveConfig.beta2:
                raise ValueError(f"'method.beta2' is not a hyperparameter of 'fedadagrad' (Adagrad's v_t = v_{{t-1}} + "
                                 f"Delta_t^2 has no decay; got {self.beta2!r}): leave it out, or use fedadam / "
                                 f"fedyogi, whose second moment uses it")

    def second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
        return v + d2


@register_method("fedyogi")
class FedYogi(_Adaptive):
    """Yogi at the server: v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)."""

    @dataclass(frozen=True)
    class Config(AdaptiveConfig):
        METHOD: ClassVar[str] = "fedyogi"

    def second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
        return v - (1 - self.config.beta2) * d2 * torch.sign(v - d2)


@register_method("fedadam")
class FedAdam(_Adaptive):
    """Adam at the server (no bias correction): v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2."""

    @dataclass(frozen=True)
    class Config(AdaptiveConfig):
        METHOD: ClassVar[str] = "fedadam"

    def second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
        return self.config.beta2 * v + (1 - self.config.beta2) * d2
