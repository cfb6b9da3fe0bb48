"""A small PyTorch model on synthetic data: the PyTorch counterpart of train.py.

It prints the device it trains on, so a GPU image that silently trains on the CPU is
obvious, and trains a small convolutional classifier (cuDNN's convolutions on a GPU).
"""

import os
import time

import torch
from torch import nn


def main() -> None:
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU"
    print(f"PyTorch {torch.__version__}; GPUs visible: {torch.cuda.device_count()}")
    print(f"device: {device} ({name})")
    torch.manual_seed(0)
    x = torch.randn(2048, 1, 16, 16)
    y = (x.mean(dim=(1, 2, 3)) > 0).long()
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
        nn.Flatten(), nn.Linear(8 * 4 * 4, 2),
    ).to(device)  # fmt: skip
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss()
    x, y = x.to(device), y.to(device)
    start = time.perf_counter()
    for _ in range(int(os.environ.get("EPOCHS", "3"))):
        for i in range(0, len(x), 64):
            optimizer.zero_grad()
            loss = loss_fn(model(x[i : i + 64]), y[i : i + 64])
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        accuracy = (model(x).argmax(dim=1) == y).float().mean().item()
    elapsed = time.perf_counter() - start
    print(f"trained in {elapsed:.1f} s on {device.type.upper()}; accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
