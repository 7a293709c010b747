"""Train the Fashion-MNIST classifier behind the offline metric fd_fmnist.

    .venv/bin/python scripts/train_fmnist_classifier.py

Writes benchmark/metrics/assets/fmnist_classifier.pt (a plain state dict) and
benchmark/metrics/assets/fmnist_classifier.json (sha256, size, test accuracy, the
command, versions). Copy the printed sha256 into
benchmark/metrics/features.py:FMNIST_CLASSIFIER_SHA256 when the weights change.

Deterministic: fixed seed for the initialisation and the per-epoch data order,
torch.use_deterministic_algorithms(True), and one intra-op thread by default
(CPU kernels may split reductions differently with other thread counts, which
changes the last bits and hence the file hash). The same torch build on the
same kind of CPU reproduces the file byte for byte; another build may differ
in the last bits, which is why the committed file, not the script, is pinned.
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
from dfbench.benchmark.metrics.features import ASSETS_DIR, FMNIST_CLASSIFIER_FILE, FMNISTClassifier


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (1 = reproducible hash)")
    p.add_argument("--data-root", default=None, help="Fashion-MNIST folder (default: datasets' default)")
    p.add_argument("--out", type=Path, default=ASSETS_DIR, help="output folder (default benchmark/metrics/assets)")
    return p.parse_args(argv)


def accuracy(model: FMNISTClassifier, images: torch.Tensor, labels: torch.Tensor) -> float:
    """Top-1 accuracy on uint8 images [N, 1, 28, 28]."""
    model.eval()
    correct = 0
    with torch.inference_mode():
        for start in range(0, images.shape[0], 1000):
            logits = model(images[start : start + 1000].float() / 255.0)
            correct += int((logits.argmax(1) == labels[start : start + 1000]).sum())
    return correct / images.shape[0]


def train(args: argparse.Namespace) -> tuple[FMNISTClassifier, float, dict[str, str]]:
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    train_set = datasets.load("fmnist", "train", root=args.data_root)
    test_set = datasets.load("fmnist", "test", root=args.data_root)

    model = FMNISTClassifier()
    optimiser = torch.optim.Adam(model.parameters(), lr=args.lr)
    order = torch.Generator().manual_seed(args.seed)  # data order, independent of the init stream
    x_all, y_all = train_set.images, train_set.labels
    for epoch in range(args.epochs):
        model.train()
        started, total = time.perf_counter(), 0.0
        perm = torch.randperm(x_all.shape[0], generator=order)
        for start in range(0, x_all.shape[0], args.batch_size):
            idx = perm[start : start + args.batch_size]
            loss = F.cross_entropy(model(x_all[idx].float() / 255.0), y_all[idx])
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            total += loss.item() * idx.shape[0]
        print(
            f"epoch {epoch + 1}/{args.epochs}: train loss {total / x_all.shape[0]:.4f}, "
            f"{time.perf_counter() - started:.1f} s",
            flush=True,
        )
    test_acc = accuracy(model, test_set.images, test_set.labels)
    hashes = {"train": train_set.sha256, "test": test_set.sha256}
    return model, test_acc, hashes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model, test_acc, data_hashes = train(args)
    print(f"test accuracy: {test_acc:.4f}")

    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    payload = buffer.getvalue()
    digest = hashlib.sha256(payload).hexdigest()
    args.out.mkdir(parents=True, exist_ok=True)
    weights_path = args.out / FMNIST_CLASSIFIER_FILE
    weights_path.write_bytes(payload)
    command = "python scripts/train_fmnist_classifier.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("out", "data_root")
    )
    meta = {
        "file": FMNIST_CLASSIFIER_FILE,
        "sha256": digest,
        "bytes": len(payload),
        "test_accuracy": round(test_acc, 4),
        "command": command,
        "architecture": "benchmark.metrics.features.FMNISTClassifier (3x conv3-relu-maxpool, fc 576->128, fc 128->10)",
        "features": "fc1 output before ReLU, 128-d (FMNISTClassifier.embed)",
        "input_normalisation": {
            "scale": "uint8 / 255",
            "mean": FMNISTClassifier.MEAN,
            "std": FMNISTClassifier.STD,
            "note": "Fashion-MNIST train-split pixel mean/std; applied inside the network",
        },
        "data": {"dataset": "fmnist", "train_sha256": data_hashes["train"], "test_sha256": data_hashes["test"]},
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    (args.out / "fmnist_classifier.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {weights_path} ({len(payload)} bytes)")
    print(f"sha256 {digest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
