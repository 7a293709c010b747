"""clean-fid's Inception (the StyleGAN2-ADA TorchScript file) and clean-fid's own resize.

Only imported when the ``clean`` extractor is built (clean-fid is not needed otherwise); the
file's sha256 has been checked by :func:`dfbench.benchmark.metrics.features.get_extractor` before
:class:`CleanFIDNetwork` loads it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dfbench.benchmark.metrics.weight_files import CLEAN_INCEPTION_WEIGHTS

__all__ = ["CleanFIDNetwork", "clean_prepare"]


class CleanFIDNetwork(nn.Module):
    """clean-fid's own `InceptionV3W` wrapper around the verified TorchScript file."""

    def __init__(self, path: Path, mode: str) -> None:
        super().__init__()
        from cleanfid.inception_torchscript import InceptionV3W

        if path.name != CLEAN_INCEPTION_WEIGHTS.file_name:
            raise ValueError(
                f"clean-fid loads its Inception by file name: rename {path} to "
                f"{CLEAN_INCEPTION_WEIGHTS.file_name} (same folder)"
            )
        # resize_inside=True is clean-fid's legacy_tensorflow mode: the
        # TorchScript graph resizes like TF 1.x; otherwise inputs are 299x299 already.
        self.model = InceptionV3W(str(path.parent), download=False, resize_inside=mode == "legacy_tensorflow")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


def clean_prepare(mode: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """uint8 RGB [B, 3, H, W] -> the float input clean-fid feeds its network in ``mode``
    (grey images are expanded to RGB by the caller, ``features.to_rgb``)."""
    from cleanfid.resize import build_resizer

    resize = build_resizer(mode)

    def prepare(images: torch.Tensor) -> torch.Tensor:
        rgb = images.cpu()
        if mode == "legacy_tensorflow":
            # No resize outside the network; values stay in [0, 255].
            return rgb.float()
        # clean mode: clean-fid's PIL bicubic resize per image and channel, on
        # float32 HWC arrays in [0, 255], as cleanfid.utils.ResizeDataset does.
        hwc = rgb.permute(0, 2, 3, 1).numpy()
        resized = np.stack([resize(image) for image in hwc]).astype(np.float32)
        return torch.from_numpy(resized).permute(0, 3, 1, 2)

    return prepare
