"""The simulated clock: how long a client and a round take, in simulated seconds.

A client k in a round:
    seconds_k = downlink_bits / downlink + work_k / (compute_rate * speed_k) + uplink_bits / uplink
    work_k    = local steps * batch size * flop_fraction   (images through the full model's forward
                and backward: a pruned or narrow sub-model does proportionally less, ClientPlan.flop_fraction)
Links in Mbit/s (system.downlink_mbps, system.uplink_mbps; 1 Mbit = 1e6 bits); 0 (the default) is
instantaneous. `compute_rate` is the images per second of a
speed-1 client (system.compute_rate: a unit, about small28 on one CPU thread, not a measurement).

A synchronous round lasts until its slowest reporting client is done. With a deadline
(system.deadline > 0) a client whose seconds exceed it is late: its update is dropped and the
round lasts the deadline (the server waits that long, then aggregates who reported). A late
client is known before it trains when its downlink and compute alone pass the deadline (it is
then not trained at all: the same result, no wasted compute), else after its upload.

Speeds (system.speed): "" = every client 1.0; tiers "SPEED:FRACTION,..." (e.g. "1.0:0.5,0.25:0.5":
half the clients 4x slower), assigned like the capacity tiers and in the same seeded order, so
tier i of system.speed is tier i of system.capacity when both list the same fractions (a slow
client is then a small one); "lognormal:SIGMA" = exp(SIGMA * z), z ~ N(0, 1) per client (median 1),
from the run seed.

Limits (docs/heterogeneity.md, "The simulated clock"): no contention between clients for the server or the
network, no failures beyond dropout and the deadline, compute time proportional to the FLOP
fraction (real sparse kernels rarely reach that), and links that are the same in every round.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dfbench.benchmark.core.parsing import parse_speed
from dfbench.benchmark.core.seeds import np_rng, tier_values


def assign_speeds(num_clients: int, spec: str, seed: int) -> np.ndarray:
    """Per-client relative compute speed (> 0) from system.speed; see the module docstring."""
    kind, arg = parse_speed(spec)
    if kind == "none":
        return np.ones(num_clients)
    if kind == "lognormal":
        return np.exp(float(arg) * np_rng(seed, "speed").standard_normal(num_clients))
    return tier_values(num_clients, arg, seed)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Clock:
    speed: np.ndarray  # per client
    compute_rate: float  # images / s of a speed-1 client
    uplink_mbps: float  # 0 = instantaneous
    downlink_mbps: float  # 0 = instantaneous
    deadline: float  # 0 = none

    def compute_seconds(self, client: int, steps: int, batch: int, flop_fraction: float) -> float:
        return steps * batch * flop_fraction / (self.compute_rate * float(self.speed[client]))

    @staticmethod
    def link_seconds(bits: float, mbps: float) -> float:
        return bits / (mbps * 1e6) if mbps > 0 else 0.0

    def before_upload(self, client: int, steps: int, batch: int, flop_fraction: float, downlink_bits: float) -> float:
        """A client's seconds up to its upload: the downlink, then its local work."""
        return self.link_seconds(downlink_bits, self.downlink_mbps) + self.compute_seconds(client, steps, batch, flop_fraction)

    def with_upload(self, seconds: float, uplink_bits: float) -> float:
        return seconds + self.link_seconds(uplink_bits, self.uplink_mbps)

    def late(self, seconds: float) -> bool:
        return self.deadline > 0 and seconds > self.deadline

    def round_seconds(self, reported: list[float], any_late: bool) -> float:
        """A synchronous round: the slowest reporting client, or the deadline when someone was late."""
        if any_late:
            return float(self.deadline)
        return float(max(reported)) if reported else 0.0


def build_clock(num_clients: int, system: object, seed: int) -> Clock:
    s = system
    return Clock(speed=assign_speeds(num_clients, s.speed, seed), compute_rate=float(s.compute_rate),  # type: ignore[attr-defined]
                 uplink_mbps=float(s.uplink_mbps), downlink_mbps=float(s.downlink_mbps), deadline=float(s.deadline))  # type: ignore[attr-defined]
