"""Feature extractors for image-distribution metrics, loaded from verified local files.

Four extractors, each named in every metric row it produces:

- ``fmnist``: a small CNN trained on Fashion-MNIST by
  ``scripts/train_fmnist_classifier.py``; weights committed in
  ``benchmark/metrics/assets`` and sha256-pinned here. Its 128-d penultimate features
  give ``fd_fmnist`` (a Frechet distance, deliberately *not* called FID).
- ``fmnist_ae``: the encoder of a convolutional autoencoder trained *without labels*
  on the Fashion-MNIST train split by ``scripts/train_fmnist_encoder.py`` (committed
  and pinned likewise): a second Fashion-MNIST feature space, independent in kind of
  the classifier (what it keeps is what reconstructs pixels, not what tells classes
  apart). Its 64-d bottleneck gives ``fd_fmnist_ae`` and ``kid_fmnist_ae``.
- ``inception``: the standard FID network, pytorch-fid's ``InceptionV3``
  pool3 (2048-d) with the TF-Inception port ``pt_inception-2015-12-05-6726825d.pth``.
- ``clean``: clean-fid's TorchScript TF-Inception with clean-fid's own resize
  (PIL bicubic, ``clean`` mode) or its ``legacy_tensorflow`` mode (see
  ``benchmark/metrics/clean_fid.py``).
- ``dinov2``: DINOv2 ViT-L/14 (1024-d CLS token after the final norm), the network of
  FD_DINOv2 (Stein et al., NeurIPS 2023), written in plain torch in
  ``benchmark/metrics/dinov2.py`` with dgm-eval's preprocessing; its weights file
  ``dinov2_vitl14_pretrain.pth`` is supplied by the user (no published checksum: its keys and
  shapes are checked, and its own sha256 is the extractor's identity).

Nothing is downloaded here: a weights file is looked up locally (explicit path,
env var, ``$DFBENCH_CACHE/weights`` where ``dfbench fetch inception`` /
``clean-inception`` put it, torch hub's checkpoints), its sha256 is checked, and
only then is it loaded (``torch.load(weights_only=True)``; the clean-fid file is
TorchScript, which ``torch.jit.load`` runs, so the hash check is what makes
loading it safe). A missing file raises `MissingWeightsError` naming the file,
its size, hash, source URL, the fetch command and where to put it by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
import torchvision
from pytorch_fid.inception import (
    FIDInceptionA,
    FIDInceptionC,
    FIDInceptionE_1,
    FIDInceptionE_2,
)
from torch import nn

# The weights lookup lives in .weights (also used by `dfbench fetch`); re-exported here.
from dfbench.benchmark.core.numerics import exact_float32, features_key
from dfbench.benchmark.metrics.table import EXTRACTORS, ExtractorName
from dfbench.benchmark.metrics.weight_files import (
    CLEAN_INCEPTION_WEIGHTS,
    INCEPTION_WEIGHTS,
    _KNOWN_WEIGHTS,  # noqa: F401 - the documented test hook (monkeypatch.setitem)
    MissingWeightsError,
    WeightsHashError,
    WeightsSpec,
    _spec,
    _verify,
    file_sha256,
    find_weights,
    weights_dir,
)

__all__ = [
    "ASSETS_DIR",
    "CLEAN_INCEPTION_WEIGHTS",
    "Extractor",
    "FMNISTAutoencoder",
    "FMNISTClassifier",
    "FMNIST_AE_SHA256",
    "FMNIST_CLASSIFIER_SHA256",
    "FIDInceptionFeatures",
    "INCEPTION_WEIGHTS",
    "MissingWeightsError",
    "WeightsHashError",
    "WeightsSpec",
    "build_fid_inception_v3",
    "file_sha256",
    "find_weights",
    "get_extractor",
    "seeded_fid_inception_state_dict",
    "to_rgb",
    "weights_dir",
]

CleanMode = Literal["clean", "legacy_tensorflow"]
CLEAN_MODES: tuple[str, ...] = ("clean", "legacy_tensorflow")

ASSETS_DIR = Path(__file__).resolve().parent / "assets"
FMNIST_CLASSIFIER_FILE = "fmnist_classifier.pt"
# sha256 of benchmark/metrics/assets/fmnist_classifier.pt, as written by
# scripts/train_fmnist_classifier.py (also recorded in fmnist_classifier.json).
FMNIST_CLASSIFIER_SHA256 = "8756b342e7577d865356ffd5674c55f2be8489f45033af462381dcced270b06f"
FMNIST_AE_FILE = "fmnist_ae.pt"
# sha256 of benchmark/metrics/assets/fmnist_ae.pt (the autoencoder's encoder only), as written by
# scripts/train_fmnist_encoder.py (also recorded in fmnist_ae.json).
FMNIST_AE_SHA256 = "ce721f70f1045f363dba34192ee14c87f41d8b629f1eacba37aadec03c89919e"


# --------------------------------------------------------------------------- fmnist


class FMNISTClassifier(nn.Module):
    """Small CNN for Fashion-MNIST; `embed` gives the 128-d features of fd_fmnist.

    Input: float [B, 1, 28, 28] in [0, 1] (uint8 / 255). The network
    standardises it itself with the Fashion-MNIST train-split mean and std
    (0.2860, 0.3530), so no caller can forget the normalisation.
    """

    MEAN = 0.2860
    STD = 0.3530
    FEATURE_DIMS = 128

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 28 -> 14
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 14 -> 7
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 7 -> 3
        )
        self.fc1 = nn.Linear(64 * 3 * 3, self.FEATURE_DIMS)
        self.fc2 = nn.Linear(self.FEATURE_DIMS, 10)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate features, taken *before* the ReLU: no dead (constant-zero)
        coordinates, so the feature covariance stays well conditioned."""
        x = (x - self.MEAN) / self.STD
        return self.fc1(self.conv(x).flatten(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.embed(x)))


class _FMNISTFeatures(nn.Module):
    def __init__(self, classifier: FMNISTClassifier) -> None:
        super().__init__()
        self.classifier = classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier.embed(x)


class FMNISTAutoencoder(nn.Module):
    """Convolutional autoencoder for Fashion-MNIST; `embed` gives the 64-d features of fd_fmnist_ae.

    Trained on pixels alone (MSE reconstruction, no labels), and built unlike
    `FMNISTClassifier` on purpose: strided convolutions instead of max-pooling,
    GroupNorm and SiLU instead of bare ReLU, a linear 64-d bottleneck. Encoder
    28 -> 14 -> 7 -> 64; the decoder mirrors it with transposed convolutions.
    Input float [B, 1, 28, 28] in [0, 1], standardised inside with the
    train-split mean and std, like the classifier; `forward` returns the
    reconstruction in the same [0, 1] units (not clamped).
    """

    MEAN = FMNISTClassifier.MEAN
    STD = FMNISTClassifier.STD
    FEATURE_DIMS = 64

    def __init__(self, decoder: bool = True) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Conv2d(1, 32, 4, stride=2, padding=1), nn.GroupNorm(8, 32), nn.SiLU(),  # 28 -> 14
            nn.Conv2d(32, 64, 4, stride=2, padding=1), nn.GroupNorm(8, 64), nn.SiLU(),  # 14 -> 7
            nn.Conv2d(64, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.SiLU(),  # 7 (32 channels: a small file)
            nn.Flatten(), nn.Linear(32 * 7 * 7, self.FEATURE_DIMS),  # linear bottleneck
        )
        # the features need only the encoder (the committed file holds only its weights)
        self.decoder = nn.Sequential(
            nn.Linear(self.FEATURE_DIMS, 32 * 7 * 7), nn.Unflatten(1, (32, 7, 7)), nn.GroupNorm(8, 32), nn.SiLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.GroupNorm(8, 64), nn.SiLU(),  # 7
            nn.ConvTranspose2d(64, 32, 4, stride=2, padding=1), nn.GroupNorm(8, 32), nn.SiLU(),  # 7 -> 14
            nn.ConvTranspose2d(32, 1, 4, stride=2, padding=1),  # 14 -> 28
        ) if decoder else None

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The bottleneck: 64 linear features of the standardised image."""
        return self.encoder((x - self.MEAN) / self.STD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.decoder is None:
            raise RuntimeError("this FMNISTAutoencoder was built without its decoder (features only)")
        return self.decoder(self.embed(x)) * self.STD + self.MEAN


class _FMNISTAEFeatures(nn.Module):
    def __init__(self, autoencoder: FMNISTAutoencoder) -> None:
        super().__init__()
        self.autoencoder = autoencoder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.autoencoder.embed(x)


def _prepare_fmnist(images: torch.Tensor) -> torch.Tensor:
    if images.shape[1:] != (1, 28, 28):
        raise ValueError(
            f"the fmnist extractors take Fashion-MNIST-shaped images [N, 1, 28, 28], got "
            f"{tuple(images.shape)}; use the 'inception' extractor for other datasets"
        )
    return images.float() / 255.0


# ------------------------------------------------------------------------ inception

# The blocks in which the FID Inception (TF port) differs from torchvision's
# Inception3: pool without padded zeros, and max- instead of avg-pool in the
# last block. The classes come from pytorch-fid, so the maths is its own.
_FID_BLOCKS: dict[str, Callable[[], nn.Module]] = {
    "Mixed_5b": lambda: FIDInceptionA(192, pool_features=32),
    "Mixed_5c": lambda: FIDInceptionA(256, pool_features=64),
    "Mixed_5d": lambda: FIDInceptionA(288, pool_features=64),
    "Mixed_6b": lambda: FIDInceptionC(768, channels_7x7=128),
    "Mixed_6c": lambda: FIDInceptionC(768, channels_7x7=160),
    "Mixed_6d": lambda: FIDInceptionC(768, channels_7x7=160),
    "Mixed_6e": lambda: FIDInceptionC(768, channels_7x7=192),
    "Mixed_7b": lambda: FIDInceptionE_1(1280),
    "Mixed_7c": lambda: FIDInceptionE_2(2048),
}


def build_fid_inception_v3() -> torchvision.models.Inception3:
    """The FID Inception architecture with uninitialised-by-download weights.

    Same module tree (hence same state-dict keys) as pytorch-fid's
    ``fid_inception_v3()``, but it never calls ``load_state_dict_from_url``.
    """
    net = torchvision.models.inception_v3(
        weights=None, aux_logits=False, num_classes=1008, init_weights=False
    )
    for name, make in _FID_BLOCKS.items():
        setattr(net, name, make())
    return net


class FIDInceptionFeatures(nn.Module):
    """pool3 (2048-d) features of the FID Inception, as pytorch-fid computes them.

    Input float [B, 3, H, W] in [0, 1]; resized to 299x299 bilinearly
    (align_corners=False) and mapped to [-1, 1] inside, exactly like
    ``pytorch_fid.inception.InceptionV3(resize_input=True, normalize_input=True)``.
    """

    def __init__(self, inception: torchvision.models.Inception3) -> None:
        super().__init__()
        n = inception
        self.body = nn.Sequential(
            n.Conv2d_1a_3x3, n.Conv2d_2a_3x3, n.Conv2d_2b_3x3, nn.MaxPool2d(3, stride=2),
            n.Conv2d_3b_1x1, n.Conv2d_4a_3x3, nn.MaxPool2d(3, stride=2),
            n.Mixed_5b, n.Mixed_5c, n.Mixed_5d, n.Mixed_6a,
            n.Mixed_6b, n.Mixed_6c, n.Mixed_6d, n.Mixed_6e,
            n.Mixed_7a, n.Mixed_7b, n.Mixed_7c, nn.AdaptiveAvgPool2d(1),
        )
        # channels_last: ~1.6x faster convolutions on CPU (oneDNN) and tensor-core
        # friendly on CUDA; features agree with pytorch-fid's NCHW path to ~1e-6.
        self.to(memory_format=torch.channels_last)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, size=(299, 299), mode="bilinear", align_corners=False)
        x = (2.0 * x - 1.0).contiguous(memory_format=torch.channels_last)
        return self.body(x).flatten(1)


def seeded_fid_inception_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    """A seeded random state dict of the FID Inception, for tests and offline smoke runs.

    Convolutions get He (fan-in) normal init so activations keep their scale
    through the ~50 conv layers (PyTorch's default init shrinks them towards
    zero, which would make feature comparisons vacuous). Not a metric: FIDs
    computed with it mean nothing.
    """
    generator = torch.Generator().manual_seed(seed)
    net = build_fid_inception_v3()
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, nn.Conv2d):
                fan_in = module.weight[0].numel()
                module.weight.copy_(
                    torch.randn(module.weight.shape, generator=generator) * (2.0 / fan_in) ** 0.5
                )
            elif isinstance(module, nn.Linear):
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * 0.01)
                module.bias.zero_()
    return net.state_dict()


def to_rgb(images: torch.Tensor) -> torch.Tensor:
    if images.shape[1] == 1:
        # Grayscale repeated to 3 channels, as PIL's convert("RGB") does in
        # pytorch-fid's and clean-fid's image loaders.
        return images.expand(-1, 3, -1, -1)
    if images.shape[1] != 3:
        raise ValueError(f"expected 1 or 3 channels, got {images.shape[1]} (shape {tuple(images.shape)})")
    return images


def _prepare_inception(images: torch.Tensor) -> torch.Tensor:
    # uint8 -> [0, 1], as torchvision's ToTensor in pytorch-fid's loader.
    return to_rgb(images).float() / 255.0


# ------------------------------------------------------------------------ extractor


@dataclass
class Extractor:
    """A named, hash-identified feature network with its preprocessing.

    `prepare` maps a uint8 [B, C, H, W] batch (on `device`) to the network's
    float input; `network` maps that to [B, dims] features.
    """

    name: str
    sha256: str
    backend: str
    resize: str
    dims: int
    network: nn.Module = field(repr=False)
    prepare: Callable[[torch.Tensor], torch.Tensor] = field(repr=False)
    device: str = "cpu"

    @property
    def numerics(self) -> str:
        """What besides the weights changes its features: device type and GPU model (numerics.features_key)."""
        return features_key(self.device)

    def features(
        self,
        images_uint8: torch.Tensor,
        batch_size: int = 256,
        device: str | torch.device | None = None,
        progress: bool = False,
    ) -> np.ndarray:
        """Features of uint8 images [N, C, H, W] as float64 [N, dims].

        Batched, under `torch.inference_mode`, on `device` (default: the
        device the extractor was built for), in float32 with TF32 off
        (`numerics.exact_float32`: on Ampere and later GPUs TF32 would move the
        features away from the float32 references). Results do not depend on
        `batch_size` beyond float rounding of the backend.
        """
        if not isinstance(images_uint8, torch.Tensor) or images_uint8.dtype != torch.uint8:
            raise TypeError(
                "features() takes a uint8 torch.Tensor [N, C, H, W] with values 0..255; "
                "convert model outputs in [-1, 1] with ((x + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)"
            )
        if images_uint8.ndim != 4:
            raise ValueError(f"expected images [N, C, H, W], got shape {tuple(images_uint8.shape)}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        target = torch.device(device if device is not None else self.device)
        self.network.to(target).eval()
        count = images_uint8.shape[0]
        out = np.empty((count, self.dims), dtype=np.float64)
        starts = range(0, count, batch_size)
        if progress:
            from tqdm import tqdm

            starts = tqdm(starts, desc=f"{self.name} features", unit="batch")
        with torch.inference_mode(), exact_float32():
            for start in starts:
                batch = images_uint8[start : start + batch_size].to(target, non_blocking=True)
                feats = self.network(self.prepare(batch).to(target))
                if feats.shape != (batch.shape[0], self.dims):
                    raise RuntimeError(
                        f"{self.name} network returned {tuple(feats.shape)}, expected ({batch.shape[0]}, {self.dims})"
                    )
                out[start : start + batch.shape[0]] = feats.double().cpu().numpy()
        return out


def _compose(first: Callable[[torch.Tensor], torch.Tensor],
             then: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda images: then(first(images))


def get_extractor(
    name: ExtractorName,
    *,
    weights: str | Path | None = None,
    device: str = "cpu",
    clean_mode: CleanMode = "clean",
) -> Extractor:
    """Build a verified feature extractor.

    name: "fmnist" (committed classifier), "fmnist_ae" (committed label-free
    autoencoder's encoder; for both `weights` may relocate the file, the hash stays
    pinned), "inception" (pytorch-fid FID network), "clean" (clean-fid,
    `clean_mode` "clean" or "legacy_tensorflow") or "dinov2" (DINOv2 ViT-L/14,
    benchmark/metrics/dinov2.py). Weights for the third-party networks come from
    `weights`, else the env var, else dfbench's weights folder, else torch hub's
    checkpoints dir; `MissingWeightsError` / `WeightsHashError` otherwise (for
    dinov2, whose file has no pinned hash: `DinoV2WeightsError` when the file is
    not the official architecture's state dict).
    """
    if name not in EXTRACTORS:
        raise ValueError(f"unknown extractor {name!r}; choose one of {list(EXTRACTORS)}")
    if clean_mode not in CLEAN_MODES:
        raise ValueError(f"unknown clean_mode {clean_mode!r}; choose one of {list(CLEAN_MODES)}")

    if name == "fmnist":
        path = Path(weights) if weights is not None else ASSETS_DIR / FMNIST_CLASSIFIER_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"Fashion-MNIST classifier weights not found at {path}; they are committed in "
                f"benchmark/metrics/assets (regenerate with scripts/train_fmnist_classifier.py)"
            )
        _verify(path, FMNIST_CLASSIFIER_SHA256)
        classifier = FMNISTClassifier()
        classifier.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        return Extractor(
            name="fmnist", sha256=FMNIST_CLASSIFIER_SHA256, backend="dfbench", resize="none-28",
            dims=FMNISTClassifier.FEATURE_DIMS, network=_FMNISTFeatures(classifier).eval().to(device),
            prepare=_prepare_fmnist, device=device,
        )
    if name == "fmnist_ae":
        path = Path(weights) if weights is not None else ASSETS_DIR / FMNIST_AE_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"Fashion-MNIST autoencoder weights not found at {path}; they are committed in "
                f"benchmark/metrics/assets (regenerate with scripts/train_fmnist_encoder.py)"
            )
        _verify(path, FMNIST_AE_SHA256)
        autoencoder = FMNISTAutoencoder(decoder=False)
        autoencoder.encoder.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        return Extractor(
            name="fmnist_ae", sha256=FMNIST_AE_SHA256, backend="dfbench", resize="none-28",
            dims=FMNISTAutoencoder.FEATURE_DIMS, network=_FMNISTAEFeatures(autoencoder).eval().to(device),
            prepare=_prepare_fmnist, device=device,
        )

    spec = _spec(name)
    path = find_weights(name, weights)  # type: ignore[arg-type]
    if name == "dinov2":
        from dfbench.benchmark.metrics import dinov2

        network = dinov2.load_dinov2(path, dinov2.FD_SPEC)  # every key and shape checked: the file has no pinned hash
        return Extractor(
            name="dinov2", sha256=dinov2.weights_identity(path), backend="dfbench-dinov2",
            resize=f"pil-bicubic-{dinov2.DINOV2_INPUT}", dims=network.spec.embed_dim, network=network.to(device),
            prepare=dinov2.dinov2_prepare, device=device,
        )
    assert spec.sha256 is not None
    _verify(path, spec.sha256, spec.url)
    if name == "inception":
        inception = build_fid_inception_v3()
        inception.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        return Extractor(
            name="inception", sha256=spec.sha256, backend="pytorch-fid", resize="torch-bilinear-299",
            dims=2048, network=FIDInceptionFeatures(inception).eval().to(device),
            prepare=_prepare_inception, device=device,
        )
    from dfbench.benchmark.metrics.clean_fid import CleanFIDNetwork, clean_prepare  # clean-fid is imported only when used

    resize = "clean-fid-PIL-bicubic-299" if clean_mode == "clean" else "clean-fid-legacy-tensorflow-299"
    return Extractor(
        name="clean" if clean_mode == "clean" else "clean-legacy_tensorflow", sha256=spec.sha256,
        backend="clean-fid", resize=resize, dims=2048,
        network=CleanFIDNetwork(path, clean_mode).eval().to(device),
        prepare=_compose(to_rgb, clean_prepare(clean_mode)), device=device,
    )
