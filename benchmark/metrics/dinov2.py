"""DINOv2 ViT-L/14 features for FD_DINOv2 (Stein et al., NeurIPS 2023), from a user-supplied file.

Stein et al. ("Exposing flaws of generative model evaluation metrics", NeurIPS 2023) found the
Frechet distance in the space of DINOv2 ViT-L/14 (Oquab et al. 2023) to track human judgement
better than Inception's; their library dgm-eval computes it as:

    PIL image -> Resize((224, 224), bicubic) -> ToTensor -> Normalize(ImageNet mean, std)
              -> DINOv2 ViT-L/14 -> CLS token after the final LayerNorm (1024-d)

and the Frechet maths of FID on those features (here: `benchmark.metrics.fid.frechet_distance`).

The network is written here in plain torch (no torch.hub, no xFormers, no internet): patch
embedding (14x14 convolution), a CLS token, learned position embeddings for a 37 x 37 grid (518 px)
interpolated to the input's grid, 24 pre-norm blocks (LayerNorm eps 1e-6 -> 16-head attention ->
LayerScale; LayerNorm -> MLP 1024-4096-1024 with exact GELU -> LayerScale), a final LayerNorm. Its
parameter names are those of the official checkpoint ``dinov2_vitl14_pretrain.pth`` (cls_token,
pos_embed, mask_token, patch_embed.proj.*, blocks.{i}.{norm1,attn.qkv,attn.proj,ls1,norm2,mlp.fc1,
mlp.fc2,ls2}.*, norm.*), so the file loads with ``load_state_dict`` after `check_state_dict` has
refused anything that is not exactly that architecture (every missing or unexpected key, and every
wrong shape, named).

Position embeddings follow DINOv2's ``interpolate_pos_encoding``: at another grid than the trained
one, the 37 x 37 table is resized bicubically (align_corners=False, no antialias) with the *scale
factor* (g + 0.1) / 37 rather than the output size -- the "+0.1" offset of DINO's issue 8, kept by
DINOv2 for compatibility. The output grid is floor(37 * (g + 0.1) / 37) = g, but the sampling
positions use that scale factor, so the offset changes the values; the CLS position is kept as is.

Preprocessing replicates dgm-eval's default path (torchvision's Resize on a PIL uint8 image, then
ToTensor): PIL resamples 8-bit images in two passes, horizontal then vertical, rounding and clipping
to 0..255 after each; the bicubic kernel is PIL's (a = -0.5), which is torch's antialiased bicubic.
Measured against PIL on random 32x32 images: at most one grey level apart (tests/unit/test_dinov2.py).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dfbench.benchmark.metrics.weight_files import DINOV2_WEIGHTS, file_sha256

__all__ = [
    "DINOV2_INPUT",
    "DinoV2WeightsError",
    "DinoViT",
    "FD_SPEC",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ViTSpec",
    "VITL14",
    "check_state_dict",
    "dinov2_prepare",
    "expected_shapes",
    "load_dinov2",
    "seeded_dinov2_state_dict",
    "weights_identity",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DINOV2_INPUT = 224  # dgm-eval's input size (16 x 16 patches of 14 px)
POS_OFFSET = 0.1  # DINOv2's interpolate_offset


@dataclass(frozen=True)
class ViTSpec:
    """The shape of a DINOv2 vision transformer (defaults: ViT-L/14, the FD_DINOv2 network)."""

    embed_dim: int = 1024
    depth: int = 24
    heads: int = 16
    mlp_ratio: float = 4.0
    patch: int = 14
    grid: int = 37  # the position-embedding grid it was trained at (518 px / 14)
    in_chans: int = 3
    eps: float = 1e-6  # LayerNorm epsilon
    name: str = "DINOv2 ViT-L/14"

    def __post_init__(self) -> None:
        if self.embed_dim % self.heads:
            raise ValueError(f"embed_dim {self.embed_dim} is not a multiple of heads {self.heads}")

    @property
    def hidden(self) -> int:
        return int(self.embed_dim * self.mlp_ratio)

    def num_parameters(self) -> int:
        return sum(math.prod(s) for s in expected_shapes(self).values())


VITL14 = ViTSpec()
# the network fd_dinov2 loads (`features.get_extractor("dinov2")` reads it at call time, so a test can
# substitute a small spec of the same architecture; the metric itself is ViT-L/14)
FD_SPEC = VITL14


def expected_shapes(spec: ViTSpec = VITL14) -> dict[str, tuple[int, ...]]:
    """Every key of the official checkpoint format and its shape, in the checkpoint's order."""
    d, h, p = spec.embed_dim, spec.hidden, spec.patch
    shapes: dict[str, tuple[int, ...]] = {
        "cls_token": (1, 1, d),
        "pos_embed": (1, 1 + spec.grid * spec.grid, d),
        "mask_token": (1, d),
        "patch_embed.proj.weight": (d, spec.in_chans, p, p),
        "patch_embed.proj.bias": (d,),
    }
    for i in range(spec.depth):
        b = f"blocks.{i}."
        shapes.update({
            b + "norm1.weight": (d,), b + "norm1.bias": (d,),
            b + "attn.qkv.weight": (3 * d, d), b + "attn.qkv.bias": (3 * d,),
            b + "attn.proj.weight": (d, d), b + "attn.proj.bias": (d,),
            b + "ls1.gamma": (d,),
            b + "norm2.weight": (d,), b + "norm2.bias": (d,),
            b + "mlp.fc1.weight": (h, d), b + "mlp.fc1.bias": (h,),
            b + "mlp.fc2.weight": (d, h), b + "mlp.fc2.bias": (d,),
            b + "ls2.gamma": (d,),
        })
    shapes.update({"norm.weight": (d,), "norm.bias": (d,)})
    return shapes


# -- the network -------------------------------------------------------------------------------------


class _PatchEmbed(nn.Module):
    def __init__(self, spec: ViTSpec) -> None:
        super().__init__()
        self.proj = nn.Conv2d(spec.in_chans, spec.embed_dim, kernel_size=spec.patch, stride=spec.patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # [B, D, h, w] -> [B, h*w, D], row-major patches


class _Attention(nn.Module):
    def __init__(self, spec: ViTSpec) -> None:
        super().__init__()
        self.heads = spec.heads
        self.qkv = nn.Linear(spec.embed_dim, 3 * spec.embed_dim)
        self.proj = nn.Linear(spec.embed_dim, spec.embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        # softmax(q k^T / sqrt(d_head)) v per head (Vaswani et al. 2017)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


class _Mlp(nn.Module):
    def __init__(self, spec: ViTSpec) -> None:
        super().__init__()
        self.fc1 = nn.Linear(spec.embed_dim, spec.hidden)
        self.fc2 = nn.Linear(spec.hidden, spec.embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))  # exact (erf) GELU, as nn.GELU()


class _LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class _Block(nn.Module):
    """x + ls1(attn(norm1(x))), then + ls2(mlp(norm2(x))): DINOv2's pre-norm block at inference."""

    def __init__(self, spec: ViTSpec) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(spec.embed_dim, eps=spec.eps)
        self.attn = _Attention(spec)
        self.ls1 = _LayerScale(spec.embed_dim)
        self.norm2 = nn.LayerNorm(spec.embed_dim, eps=spec.eps)
        self.mlp = _Mlp(spec)
        self.ls2 = _LayerScale(spec.embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.ls1(self.attn(self.norm1(x)))
        return x + self.ls2(self.mlp(self.norm2(x)))


class DinoViT(nn.Module):
    """A DINOv2 vision transformer whose forward is the CLS token after the final LayerNorm.

    Input: float [B, 3, H, W], already normalised (see `dinov2_prepare`), H and W multiples of the
    patch size. Output: [B, embed_dim].
    """

    def __init__(self, spec: ViTSpec = VITL14) -> None:
        super().__init__()
        self.spec = spec
        d = spec.embed_dim
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + spec.grid * spec.grid, d))
        self.mask_token = nn.Parameter(torch.zeros(1, d))  # in the checkpoint; used only in training (masked tokens)
        self.patch_embed = _PatchEmbed(spec)
        self.blocks = nn.ModuleList(_Block(spec) for _ in range(spec.depth))
        self.norm = nn.LayerNorm(d, eps=spec.eps)

    def position_embeddings(self, rows: int, cols: int) -> torch.Tensor:
        """[1, 1 + rows * cols, D]: the trained table, resized to a rows x cols patch grid as DINOv2 does."""
        g = self.spec.grid
        if (rows, cols) == (g, g):
            return self.pos_embed
        # DINOv2 interpolates in float32 (for half-precision models); a float64 copy stays float64 (tests)
        table = self.pos_embed if self.pos_embed.dtype in (torch.float32, torch.float64) else self.pos_embed.float()
        cls, patches = table[:, :1], table[:, 1:]
        grid = patches.reshape(1, g, g, -1).permute(0, 3, 1, 2)  # [1, D, g, g]
        # the scale factor, not the size, sets the sampling positions (DINOv2's "+0.1" offset)
        scale = ((rows + POS_OFFSET) / g, (cols + POS_OFFSET) / g)
        resized = F.interpolate(grid, scale_factor=scale, mode="bicubic", align_corners=False)
        if resized.shape[-2:] != (rows, cols):
            raise RuntimeError(f"position embeddings resized to {tuple(resized.shape[-2:])}, expected {(rows, cols)}")
        patches = resized.permute(0, 2, 3, 1).reshape(1, rows * cols, -1)
        return torch.cat([cls, patches], dim=1).to(self.pos_embed.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.spec.patch
        if x.shape[-2] % p or x.shape[-1] % p:
            raise ValueError(f"input {tuple(x.shape[-2:])} is not a multiple of the patch size {p}")
        tokens = self.patch_embed(x)
        tokens = torch.cat([self.cls_token.expand(tokens.shape[0], -1, -1), tokens], dim=1)
        tokens = tokens + self.position_embeddings(x.shape[-2] // p, x.shape[-1] // p)
        for block in self.blocks:
            tokens = block(tokens)
        return self.norm(tokens)[:, 0]


# -- preprocessing -----------------------------------------------------------------------------------


def _pil_bicubic_pass(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    # one PIL resampling pass of an 8-bit image: PIL's bicubic kernel (a = -0.5; torch's antialiased
    # bicubic is the same filter), then rounding and clipping to 0..255 as PIL stores the pass
    return F.interpolate(x, size=size, mode="bicubic", align_corners=False, antialias=True).round_().clamp_(0.0, 255.0)


def dinov2_prepare(images: torch.Tensor, size: int = DINOV2_INPUT) -> torch.Tensor:
    """uint8 [B, 1 or 3, H, W] -> the network's float input [B, 3, size, size], as dgm-eval prepares it:
    grey repeated to RGB, resized to size x size as torchvision's Resize(bicubic) does on a PIL image
    (horizontal pass, then vertical, each rounded to 0..255), / 255, ImageNet mean and std."""
    if images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"expected images [B, 1 or 3, H, W], got shape {tuple(images.shape)}")
    x = images.expand(-1, 3, -1, -1).float()  # grey repeated to RGB, as PIL's convert("RGB")
    h, w = x.shape[-2:]
    if w != size:
        x = _pil_bicubic_pass(x, (h, size))
    if h != size:
        x = _pil_bicubic_pass(x, (size, size))
    mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=x.device).view(1, 3, 1, 1)
    return (x / 255.0 - mean) / std


# -- loading -----------------------------------------------------------------------------------------


class DinoV2WeightsError(ValueError):
    """A file was found but is not the expected DINOv2 checkpoint; says what was expected and where to get it."""


def _refuse(path: Path, spec: ViTSpec, problem: str) -> DinoV2WeightsError:
    return DinoV2WeightsError(
        f"{path} is not a {spec.name} checkpoint in the official format: {problem}.\n"
        f"Expected: {DINOV2_WEIGHTS.expected}.\n"
        f"Get it from {DINOV2_WEIGHTS.url} (dfbench does not download it) and point "
        f"{DINOV2_WEIGHTS.cli_flag} / ${DINOV2_WEIGHTS.env_var} at it. The file was not used."
    )


def _listed(keys: list[str], limit: int = 8) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def check_state_dict(state: Any, spec: ViTSpec = VITL14, path: str | Path = "<state dict>") -> dict[str, torch.Tensor]:
    """`state` if it holds exactly the keys and shapes of `spec`'s official checkpoint; else
    `DinoV2WeightsError` naming every missing and unexpected key (a few, then a count) and wrong shape."""
    path = Path(path)
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise _refuse(path, spec, f"it holds a {type(state).__name__}, not a state dict of named tensors")
    want = expected_shapes(spec)
    missing = [k for k in want if k not in state]
    unexpected = sorted(k for k in state if k not in want)
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing key(s): {_listed(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected key(s): {_listed(unexpected)}")
    wrong = [f"{k} has shape {tuple(state[k].shape)}, expected {want[k]}"
             for k in want if k in state and tuple(state[k].shape) != want[k]]
    if wrong:
        problems.append(f"{len(wrong)} wrong shape(s): {_listed(wrong, 4)}")
    if not problems:
        bad = [k for k in want if not state[k].is_floating_point()]
        if bad:
            problems.append(f"non-float tensors: {_listed(bad)}")
    if problems:
        raise _refuse(path, spec, "; ".join(problems))
    return state


def load_dinov2(path: str | Path, spec: ViTSpec = VITL14) -> DinoViT:
    """The network with the weights of `path` (``torch.load(weights_only=True)``, checked by
    `check_state_dict`), in eval mode, float32, on the CPU. Never downloads anything."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (expected {spec.name} weights, dinov2_vitl14_pretrain.pth)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file is refused with the same message
        raise _refuse(path, spec, f"torch.load could not read it as a state dict ({type(err).__name__}: "
                                  f"{str(err).splitlines()[0] if str(err) else ''})") from None
    state = check_state_dict(state, spec, path)
    net = DinoViT(spec)
    net.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    return net.eval()


@functools.lru_cache(maxsize=8)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    return file_sha256(path)


def weights_identity(path: str | Path) -> str:
    """The sha256 of a weights file without a pinned hash, hashed once per (path, size, mtime) and process."""
    st = Path(path).stat()
    return _sha256_cached(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


def seeded_dinov2_state_dict(spec: ViTSpec = VITL14, seed: int = 0) -> dict[str, torch.Tensor]:
    """A seeded random state dict in the official key format, for tests and offline smoke runs (speed
    only: distances computed with it mean nothing). Linear and conv weights ~ N(0, 1/fan_in), LayerNorm
    weights near 1, LayerScale near 0.1 (DINOv2's trained gammas are small), the rest ~ N(0, 0.02^2)."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for key, shape in expected_shapes(spec).items():
        noise = torch.randn(shape, generator=gen)
        if key.endswith(".weight") and len(shape) >= 2:
            value = noise / math.sqrt(math.prod(shape[1:]))
        elif key.endswith(".weight"):  # the 1-d weights are the LayerNorms'
            value = 1.0 + 0.1 * noise
        elif key.endswith(".gamma"):
            value = 0.1 + 0.02 * noise
        else:
            value = 0.02 * noise
        out[key] = value.float()
    return out
