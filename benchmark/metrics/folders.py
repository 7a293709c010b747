"""`dfbench fid A B`: the Frechet distance between two image sets given as files.

A and B are folders of PNGs or .npz / .npy uint8 arrays (`load_image_source`).
Re-exported by `benchmark.metrics.scoring`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from dfbench.benchmark.metrics import table
from dfbench.benchmark.metrics.features import get_extractor
from dfbench.benchmark.metrics.fid import frechet_distance

__all__ = ["fid_between", "load_image_source"]


def _png_folder(folder: Path) -> torch.Tensor:
    from PIL import Image

    files = sorted(p for p in folder.iterdir() if p.suffix.lower() == ".png")
    if not files:
        raise ValueError(f"{folder} contains no .png files")
    arrays = []
    for file in files:
        with Image.open(file) as img:
            if img.mode in ("L", "1", "I", "I;16", "LA"):
                arrays.append(np.asarray(img.convert("L"))[..., None])
            else:
                arrays.append(np.asarray(img.convert("RGB")))
    if len({a.shape[:2] for a in arrays}) != 1:
        raise ValueError(f"{folder}: images have different sizes; resize them to one size first")
    if len({a.shape[2] for a in arrays}) != 1:
        # Mixed grayscale and colour: promote all to RGB, as PIL's convert("RGB") does.
        arrays = [np.repeat(a, 3, axis=2) if a.shape[2] == 1 else a for a in arrays]
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()


def _array_file(path: Path) -> torch.Tensor:
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            keys = list(data.keys())
            if "images" in keys:
                array = data["images"]
            elif len(keys) == 1:
                array = data[keys[0]]
            else:
                raise ValueError(f"{path}: expected an 'images' array or a single array, found keys {keys}")
    else:
        array = np.load(path, allow_pickle=False)
    if array.dtype != np.uint8:
        raise ValueError(f"{path}: images must be uint8 (0..255), got {array.dtype}")
    if array.ndim == 3:  # [N, H, W] grayscale
        array = array[:, None]
    elif array.ndim == 4:
        nchw, nhwc = array.shape[1] in (1, 3), array.shape[3] in (1, 3)
        if nchw == nhwc:
            raise ValueError(
                f"{path}: cannot tell NCHW from NHWC for shape {array.shape}; "
                "channels (1 or 3) must be either axis 1 or axis 3"
            )
        if nhwc:
            array = array.transpose(0, 3, 1, 2)
    else:
        raise ValueError(f"{path}: expected images [N, H, W], [N, C, H, W] or [N, H, W, C], got {array.shape}")
    return torch.from_numpy(np.ascontiguousarray(array))


def load_image_source(source: str | Path) -> torch.Tensor:
    """uint8 [N, C, H, W] images from a folder of PNGs or an .npz / .npy array.

    npz: the array under key "images", or the file's only array (np.savez's
    "arr_0"). Arrays are uint8, [N, C, H, W] or [N, H, W, C] with C in {1, 3},
    or [N, H, W] grayscale.
    """
    path = Path(source)
    if path.is_dir():
        return _png_folder(path)
    if path.is_file() and path.suffix in (".npz", ".npy"):
        return _array_file(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; pass a folder of .png files or an .npz / .npy file")
    raise ValueError(f"{path}: expected a folder of .png files or an .npz / .npy file")


def fid_between(
    a: str | Path,
    b: str | Path,
    *,
    extractor: table.ExtractorName = "inception",
    weights: str | Path | None = None,
    device: str = "cpu",
    batch_size: int = 256,
) -> dict[str, Any]:
    """Frechet distance between two image sets (`dfbench fid A B`).

    A and B are folders of PNGs or .npz/.npy uint8 arrays (see
    `load_image_source`). The metric is named after the extractor (`table.frechet_metric`):
    "fid" (inception), "fid_clean" (clean), "fd_fmnist" (fmnist), "fd_fmnist_ae" (fmnist_ae) or
    "fd_dinov2" (dinov2).
    """
    metric = table.frechet_metric(extractor)  # ValueError for an unknown extractor, before any file is read
    images_a, images_b = load_image_source(a), load_image_source(b)
    for path, images in ((a, images_a), (b, images_b)):
        if images.shape[0] < 2:
            raise ValueError(f"{path}: need at least 2 images, got {images.shape[0]}")
    net = get_extractor(extractor, weights=weights, device=device)
    feats_a = net.features(images_a, batch_size=batch_size)
    feats_b = net.features(images_b, batch_size=batch_size)
    value = frechet_distance(
        feats_a.mean(axis=0), np.cov(feats_a, rowvar=False), feats_b.mean(axis=0), np.cov(feats_b, rowvar=False)
    )
    return {
        "metric": metric,
        "value": value,
        "extractor": net.name,
        "extractor_sha256": net.sha256,
        "backend": net.backend,
        "resize": net.resize,
        "a": str(a),
        "b": str(b),
        "num_samples_a": int(images_a.shape[0]),
        "num_samples_b": int(images_b.shape[0]),
    }
