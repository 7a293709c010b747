"""Every random stream is derived from (run seed, stream name, round, client): stateless.

So a stream never depends on how many processes or devices ran before it, which makes
resume, distributed runs and batched clients reproduce the single-process run exactly.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch


def derive_seed(seed: int, *keys: object) -> int:
    """A 63-bit seed from the run seed and a path of keys (sha256, so no accidental collisions)."""
    blob = ":".join([str(seed), *map(str, keys)]).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "little") >> 1


def np_rng(seed: int, *keys: object) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, *keys))


def torch_gen(seed: int, *keys: object, device: str | torch.device = "cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(derive_seed(seed, *keys))
    return g


def tier_values(num_clients: int, tiers: list[tuple[float, float]], seed: int) -> np.ndarray:
    """Tiers [(value, fraction)] -> per-client values: tier sizes by largest remainder, order seeded.

    The order is the same permutation for every tier list of the same sizes (the shuffle depends
    on the seed and the number of clients only), so the capacity tiers and the speed tiers
    (benchmark/engine/clock.py) put tier i on the same clients when their fractions agree."""
    counts = [int(math.floor(f * num_clients)) for _, f in tiers]
    rema = sorted(range(len(tiers)), key=lambda i: -(tiers[i][1] * num_clients - counts[i]))
    for i in rema[: num_clients - sum(counts)]:
        counts[i] += 1
    values = np.concatenate([np.full(c, v, dtype=np.float64) for (v, _), c in zip(tiers, counts)])
    return np_rng(seed, "capacity").permutation(values)
