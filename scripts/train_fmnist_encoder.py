"""Train the label-free Fashion-MNIST autoencoder behind fd_fmnist_ae and kid_fmnist_ae.

    .venv/bin/python scripts/train_fmnist_encoder.py

Trains `FMNISTAutoencoder` on the Fashion-MNIST train split with an MSE
reconstruction loss, no labels; the test split is only used for the reported
reconstruction MSE. Writes benchmark/metrics/assets/fmnist_ae.pt (the state dict
of the *encoder* only: the features need nothing else) and
benchmark/metrics/assets/fmnist_ae.json (sha256, size, test reconstruction MSE, the
command, versions). Copy the printed sha256 into
benchmark/metrics/features.py:FMNIST_AE_SHA256 when the weights change.

Deterministic like scripts/train_fmnist_classifier.py: fixed seed for the
initialisation and the per-epoch data order, torch.use_deterministic_algorithms(True),
one intra-op thread by default. The same torch build on the same kind of CPU
reproduces the file byte for byte; the committed file, not the script, is pinned.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from dfbench import datasets
from dfbench.benchmark.metrics.features import ASSETS_DIR, FMNIST_AE_FILE, FMNISTAutoencoder


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=7)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (1 = reproducible hash)")
    p.add_argument("--data-root", default=None, help="Fashion-MNIST folder (default: datasets' default)")
    p.add_argument("--out", type=Path, default=ASSETS_DIR, help="output folder (default benchmark/metrics/assets)")
    return p.parse_args(argv)


def reconstruction_mse(model: FMNISTAutoencoder, images: torch.Tensor) -> float:
    """Mean squared reconstruction error per pixel, in [0, 1] pixel units, on uint8 images [N, 1, 28, 28]."""
    model.eval()
    total = 0.0
    with torch.inference_mode():
        for start in range(0, images.shape[0], 1000):
            x = images[start : start + 1000].float() / 255.0
            total += F.mse_loss(model(x), x, reduction="sum").item()
    return total / images[0].numel() / images.shape[0]


def train(args: argparse.Namespace) -> tuple[FMNISTAutoencoder, float, dict[str, str]]:
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    train_set = datasets.load("fmnist", "train", root=args.data_root)
    test_set = datasets.load("fmnist", "test", root=args.data_root)

    model = FMNISTAutoencoder()
    optimiser = torch.optim.Adam(model.parameters(), lr=args.lr)
    order = torch.Generator().manual_seed(args.seed)  # data order, independent of the init stream
    x_all = train_set.images  # the labels are never read
    for epoch in range(args.epochs):
        model.train()
        started, total = time.perf_counter(), 0.0
        perm = torch.randperm(x_all.shape[0], generator=order)
        for start in range(0, x_all.shape[0], args.batch_size):
            x = x_all[perm[start : start + args.batch_size]].float() / 255.0
            loss = F.mse_loss(model(x), x)  # reconstruction, in [0, 1] pixel units
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            total += loss.item() * x.shape[0]
        print(
            f"epoch {epoch + 1}/{args.epochs}: train MSE {total / x_all.shape[0]:.5f}, "
            f"{time.perf_counter() - started:.1f} s",
            flush=True,
        )
    test_mse = reconstruction_mse(model, test_set.images)
    hashes = {"train": train_set.sha256, "test": test_set.sha256}
    return model, test_mse, hashes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    model, test_mse, data_hashes = train(args)
    seconds = time.perf_counter() - started
    print(f"test reconstruction MSE: {test_mse:.5f}")

    buffer = io.BytesIO()
    torch.save(model.encoder.state_dict(), buffer)
    payload = buffer.getvalue()
    digest = hashlib.sha256(payload).hexdigest()
    args.out.mkdir(parents=True, exist_ok=True)
    weights_path = args.out / FMNIST_AE_FILE
    weights_path.write_bytes(payload)
    command = "python scripts/train_fmnist_encoder.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("out", "data_root")
    )
    meta = {
        "file": FMNIST_AE_FILE,
        "sha256": digest,
        "bytes": len(payload),
        "contents": "state dict of FMNISTAutoencoder.encoder (the decoder is not kept)",
        "test_reconstruction_mse": round(test_mse, 5),
        "test_reconstruction_mse_note": "mean squared error per pixel in [0, 1] units on the 10,000 test images",
        "epochs": args.epochs,
        "training_seconds": round(seconds, 1),
        "command": command,
        "architecture": ("benchmark.metrics.features.FMNISTAutoencoder: encoder conv4/2 1->32, conv4/2 32->64, "
                         "conv3 64->32 (each GroupNorm(8) + SiLU; 28->14->7), linear 1568->64; decoder mirrored "
                         "(linear 64->1568, conv3 32->64, transposed conv4/2 64->32, 32->1)"),
        "training": "MSE reconstruction on the Fashion-MNIST train split, no labels; Adam",
        "features": "the linear 64-d bottleneck (FMNISTAutoencoder.embed)",
        "input_normalisation": {
            "scale": "uint8 / 255",
            "mean": FMNISTAutoencoder.MEAN,
            "std": FMNISTAutoencoder.STD,
            "note": "Fashion-MNIST train-split pixel mean/std; applied inside the network",
        },
        "data": {"dataset": "fmnist", "train_sha256": data_hashes["train"], "test_sha256": data_hashes["test"]},
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    (args.out / "fmnist_ae.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {weights_path} ({len(payload)} bytes)")
    print(f"sha256 {digest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
