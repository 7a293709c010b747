"""Every random stream is derived from (run seed, stream name, round, client): stateless.

So a stream never depends on how many processes or devices ran before it, which makes
resume, distributed runs and batched clients reproduce the single-process run exactly.
"""

from __future__ import annotations

import hashlib

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
