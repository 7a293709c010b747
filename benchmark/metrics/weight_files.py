"""Third-party weights files: what they are (pinned size and sha256), where dfbench looks for them,
and the messages when they are missing or wrong.

Looked for, in order: an explicit path (``--inception-weights`` / ``--dinov2-weights`` / ``weights=``;
then nothing else), the file's environment variable, ``$DFBENCH_CACHE/weights`` (where ``dfbench fetch
inception`` / ``dfbench fetch clean-inception`` put them), torch hub's checkpoints folder (where
pytorch-fid's and DINOv2's own downloads land), and for clean-fid also /tmp (clean-fid's own download
folder). Nothing here downloads: :mod:`dfbench.benchmark.grid.fetch` does, on request, for the files it
can verify; the DINOv2 file (no published checksum) is only ever supplied by the user.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from pytorch_fid.inception import FID_WEIGHTS_URL

__all__ = [
    "CLEAN_INCEPTION_WEIGHTS",
    "DINOV2_WEIGHTS",
    "INCEPTION_WEIGHTS",
    "MissingWeightsError",
    "WeightsHashError",
    "WeightsSpec",
    "file_sha256",
    "find_weights",
    "known_weights",
    "weights_dir",
]


@dataclass(frozen=True)
class WeightsSpec:
    """What a third-party weights file is and where dfbench looks for it."""

    description: str
    file_name: str
    size: int | None  # None: not pinned (`expected` says what the file is instead)
    sha256: str | None  # None: not pinned; the sha256 of the file found is recorded as its identity
    url: str
    env_var: str
    fetch_name: str | None  # the `dfbench fetch NAME` that downloads it; None: only the user supplies it
    cli_flag: str | None = None
    extra_dirs: tuple[Path, ...] = ()
    expected: str = ""  # what the file must be, in words (for a file without a pinned hash)


# sha256 and size as published by users of pytorch-fid's release asset (the
# 8-hex prefix in the file name is the torch-hub hash prefix of this digest).
INCEPTION_WEIGHTS = WeightsSpec(
    description="FID Inception weights (pytorch-fid)",
    file_name="pt_inception-2015-12-05-6726825d.pth",
    size=95_628_359,
    sha256="6726825d0af5f729cebd5821db510b11b1cfad8faad88a03f1befd49fb9129b2",
    url=FID_WEIGHTS_URL,
    env_var="DFBENCH_INCEPTION_WEIGHTS",
    fetch_name="inception",
    cli_flag="--inception-weights",
)

# clean-fid's TorchScript port (the StyleGAN2-ADA metrics file); clean-fid
# itself downloads it to /tmp, so that folder is searched too. clean-fid pins no
# checksum for it (cleanfid/downloads_helper.py downloads it unverified); size and
# sha256 here are those of the file at the NVIDIA URL, pinned when this was written.
CLEAN_INCEPTION_WEIGHTS = WeightsSpec(
    description="clean-fid TorchScript Inception",
    file_name="inception-2015-12-05.pt",
    size=95_607_719,
    sha256="f58cb9b6ec323ed63459aa4fb441fe750cfe39fafad6da5cb504a16f19e958f4",
    url="https://nvlabs-fi-cdn.nvidia.com/stylegan2-ada-pytorch/pretrained/metrics/inception-2015-12-05.pt",
    env_var="DFBENCH_CLEAN_INCEPTION_WEIGHTS",
    fetch_name="clean-inception",
    cli_flag=None,
    extra_dirs=(Path("/tmp"),),
)

# The official DINOv2 ViT-L/14 backbone (Oquab et al. 2023), the network of FD_DINOv2 (Stein et al.,
# NeurIPS 2023). Meta publishes no checksum for it and dfbench has not pinned one, so `dfbench fetch`
# does not download it (it downloads only what it can verify): the user supplies the file, and the
# loader checks what it can check instead -- every key and shape of the state dict
# (benchmark/metrics/dinov2.py) -- and records the file's own sha256 in every metric row and in the
# reference statistics' cache key. 304,368,640 float32 parameters: about 1.22 GB.
DINOV2_WEIGHTS = WeightsSpec(
    description="DINOv2 ViT-L/14 weights (FD_DINOv2)",
    file_name="dinov2_vitl14_pretrain.pth",
    size=None,
    sha256=None,
    url="https://dl.fbaipublicfiles.com/dinov2/dinov2_vitl14/dinov2_vitl14_pretrain.pth",
    env_var="DFBENCH_DINOV2_WEIGHTS",
    fetch_name=None,
    cli_flag="--dinov2-weights",
    expected=("the official DINOv2 ViT-L/14 pretrained backbone (facebookresearch/dinov2, "
              "`dinov2_vitl14_pretrain.pth`): a torch state dict of 24 blocks, width 1024, "
              "304,368,640 float32 parameters, about 1.22 GB; no checksum is published, so every "
              "key and shape is checked instead and the file's sha256 is recorded with each score"),
)

# Looked up by key at call time, so tests can substitute a spec for a seeded
# random network of the real architecture (monkeypatch.setitem).
_KNOWN_WEIGHTS: dict[str, WeightsSpec] = {
    "inception": INCEPTION_WEIGHTS,
    "clean": CLEAN_INCEPTION_WEIGHTS,
    "dinov2": DINOV2_WEIGHTS,
}


class MissingWeightsError(RuntimeError):
    """A required weights file is not on this machine; says what to place where."""

    def __init__(self, spec: WeightsSpec, searched: list[tuple[Path, str]]) -> None:
        self.spec = spec
        self.searched = searched
        hub_target = Path(torch.hub.get_dir()) / "checkpoints" / spec.file_name
        looked = "\n".join(f"  - {path} ({why})" for path, why in searched) or "  (nowhere)"
        if spec.fetch_name is not None:
            ways = [f"run `dfbench fetch {spec.fetch_name}` on a machine with internet (it downloads to "
                    f"{weights_dir() / spec.file_name} and checks the sha256; behind a proxy set "
                    f"DFBENCH_MIRROR=BASE_URL to fetch BASE_URL/{spec.file_name})"]
        else:  # a file dfbench cannot verify by hash: the user downloads it and puts it in place
            ways = [f"download {spec.url} yourself (e.g. `curl -L -o {weights_dir() / spec.file_name} {spec.url}`; "
                    f"dfbench does not fetch this file) and leave it at {weights_dir() / spec.file_name}"]
        if spec.cli_flag:
            ways.append(f"pass {spec.cli_flag} /path/to/{spec.file_name} (Python: weights=...)")
        else:
            ways.append(f"pass weights='/path/to/{spec.file_name}' (Python API)")
        ways.append(f"export {spec.env_var}=/path/to/{spec.file_name}")
        ways.append(f"copy it to {hub_target}")
        steps = "\n".join(f"  {i}. {way}" for i, way in enumerate(ways, start=1))
        size = f"{spec.size:,} bytes" if spec.size is not None else "not pinned"
        sha = spec.sha256 or "not pinned (the sha256 of the file found is recorded with every score)"
        what = f"  what:   {spec.expected}\n" if spec.expected else ""
        last = ("dfbench downloads only when asked (`dfbench fetch`, `--download`); the sha256 is checked before loading."
                if spec.sha256 else
                "Nothing was downloaded: dfbench never downloads this file; its keys and shapes are checked before use.")
        super().__init__(
            f"{spec.description} not found.\n"
            f"  file:   {spec.file_name}\n"
            f"{what}"
            f"  size:   {size}\n"
            f"  sha256: {sha}\n"
            f"  source: {spec.url}\n"
            f"Looked in:\n{looked}\n"
            f"Get it in one of these ways (without internet, download it elsewhere first):\n"
            f"{steps}\n"
            f"{last}"
        )

    def one_line(self) -> str:
        """The message in one line (the command line's): the file, where it goes, and the ways to get it there."""
        spec, home = self.spec, weights_dir() / self.spec.file_name
        if spec.fetch_name is not None:
            get = (f"run `dfbench fetch {spec.fetch_name}` (on a machine with internet; copy {weights_dir()} here "
                   f"if this one has none)")
        else:
            get = f"download {spec.url} yourself (dfbench does not fetch it)"
        flag = f", or pass {spec.cli_flag} PATH" if spec.cli_flag else ""
        return (f"{spec.description} not found: {spec.file_name} belongs at {home}; {get}, or export "
                f"{spec.env_var}=/path/to/{spec.file_name}{flag}")


class WeightsHashError(ValueError):
    """A weights file exists but is not the expected file (sha256 mismatch)."""

    def __init__(self, path: Path, expected: str, actual: str, hint: str = "") -> None:
        self.path = path
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"sha256 mismatch for {path}:\n  expected {expected}\n  actual   {actual}\n"
            f"The file is corrupt, truncated or a different file; it was not loaded.{hint}"
        )


def weights_dir() -> Path:
    """Where `dfbench fetch` puts weights: $DFBENCH_CACHE/weights (default ~/.cache/dfbench/weights)."""
    base = os.environ.get("DFBENCH_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "dfbench")
    return Path(base).expanduser() / "weights"


def file_sha256(path: str | Path, chunk_size: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(chunk_size), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _verify(path: Path, expected: str, url: str | None = None) -> None:
    actual = file_sha256(path)
    if actual != expected:
        hint = f" Download it again from {url}." if url else ""
        raise WeightsHashError(path, expected, actual, hint)


def _candidates(spec: WeightsSpec, weights: str | Path | None) -> list[tuple[Path, str]]:
    if weights is not None:
        # An explicit path is the only candidate: silently falling back to
        # another file would hide a typo.
        return [(Path(weights).expanduser(), "given explicitly")]
    found: list[tuple[Path, str]] = []
    env_value = os.environ.get(spec.env_var)
    if env_value:
        found.append((Path(env_value).expanduser(), f"${spec.env_var}"))
    found.append((weights_dir() / spec.file_name,
                  f"dfbench fetch {spec.fetch_name}" if spec.fetch_name else "dfbench's weights folder"))
    found.append((Path(torch.hub.get_dir()) / "checkpoints" / spec.file_name, "torch hub checkpoints"))
    found.extend((folder / spec.file_name, "clean-fid download folder") for folder in spec.extra_dirs)
    return found


def find_weights(key: str, weights: str | Path | None = None) -> Path:
    """Locate a third-party weights file (explicit path, env var, fetch dir, torch hub dir).

    Raises `MissingWeightsError` with the placement message if none exists.
    The hash is not checked here (see `get_extractor`).
    """
    spec = _spec(key)
    searched = _candidates(spec, weights)
    for path, _ in searched:
        if path.is_file():
            return path
    raise MissingWeightsError(spec, searched)


def _spec(key: str) -> WeightsSpec:
    if key not in _KNOWN_WEIGHTS:
        raise ValueError(f"unknown weights {key!r}; expected one of {sorted(_KNOWN_WEIGHTS)}")
    return _KNOWN_WEIGHTS[key]



def known_weights(key: str) -> WeightsSpec:
    """The spec registered under ``key`` (an extractor of `table.THIRD_PARTY_EXTRACTORS`), read at call time."""
    return _spec(key)
