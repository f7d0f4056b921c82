"""Step size of the width-parametrised CNN over widths: does one SGD step move the logits the same at every C1?

    python benchmarks/cnn_step_size.py                    # digits at 32 x 32 (no data needed)
    python benchmarks/cnn_step_size.py --mnist ../shared/data/mnist.npz --steps 200

The images come from the trainer's own pipeline (``src.data.build_data``: a class-stratified subset of 1024, resized
to ``--image-size``, 32 as the double-descent studies, standardised with the subset's channel statistics as the loader
does). For C1 = 1 ... 64, the studies' widths, it prints one markdown row per width and parametrisation:

- ``standard``: PyTorch's standard parametrisation with the constant lr of ``conf/optimizer/sgd.yaml``
  (0.05, momentum 0.9): what vitsweep trains.
- ``mean-field``: the EPFL paper's literal readout (logits / C1, sec. 3.2 of its text) with lr = eta_eff x C1,
  the reading of its eta_eff = eta / h for that parametrisation.

Columns (each the mean over ``--seeds`` initialisations): the global gradient norm at init, the mean absolute
logit change after one step on one batch of 128 images, and the training loss after ``--steps`` steps
(n 1024, batch 128; nan = diverged).
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from src.data import build_data  # noqa: E402
from src.models.cnn import WidthCNN  # noqa: E402

WIDTHS = (1, 2, 4, 8, 16, 32, 64)


class MeanFieldReadout(nn.Module):
    """``model(x) / width``: the 1/h output scaling of the paper's parametrisation."""

    def __init__(self, model: WidthCNN):
        super().__init__()
        self.model, self.width = model, model.width

    def forward(self, x):
        return self.model(x) / self.width


def build(name: str, width: int, seed: int, size: int) -> nn.Module:
    torch.manual_seed(seed)
    model = WidthCNN(size, 1, 10, width=width)
    return model if name == "standard" else MeanFieldReadout(model)


def images(mnist: str | None, n: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` training images and labels as the trainer sees them: MNIST when given, else digits (8 x 8, resized)."""
    cfg = {"name": "mnist", "root": mnist} if mnist else {"name": "digits"}
    data = build_data({**cfg, "n_train": n, "image_size": size}, seed=0)
    mean = torch.tensor(data.mean).view(1, -1, 1, 1) * 255.0
    std = torch.tensor(data.std).view(1, -1, 1, 1) * 255.0
    return (data.x_train.float() - mean) / std, data.y_train


def one_step(model: nn.Module, lr: float, xb: torch.Tensor, yb: torch.Tensor) -> tuple[float, float]:
    """(global gradient norm at the current weights, mean |logit change| after one SGD step, momentum 0.9)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    before = model(xb)
    F.cross_entropy(before, yb).backward()
    grad = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters()))
    opt.step()
    with torch.no_grad():
        return grad, float((model(xb) - before.detach()).abs().mean())


def loss_after(model: nn.Module, lr: float, x: torch.Tensor, y: torch.Tensor, steps: int) -> float:
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    loss = torch.tensor(math.nan)
    for step in range(steps):
        if step % (len(y) // 128) == 0:
            order = torch.randperm(len(y), generator=g)
        idx = order[(step % (len(y) // 128)) * 128:][:128]
        loss = F.cross_entropy(model(x[idx]), y[idx])
        if not torch.isfinite(loss):
            return math.nan
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(loss.detach())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mnist", help="an MNIST .npz (x_train, y_train); default: scikit-learn's digits")
    ap.add_argument("--image-size", type=int, default=32, help="side the images are resized to (the studies: 32)")
    ap.add_argument("--lr", type=float, default=0.05, help="constant lr, and eta_eff of the mean-field variant")
    ap.add_argument("--steps", type=int, default=100, help="steps of the short training run per width")
    ap.add_argument("--seeds", type=int, default=3, help="initialisations averaged per width")
    args = ap.parse_args()
    torch.set_num_threads(1)
    x, y = images(args.mnist, 1024, args.image_size)
    print("| parametrisation | C1 | lr | grad norm at init | mean abs logit change, 1 step | loss after "
          f"{args.steps} steps |\n|---|---|---|---|---|---|")
    for name in ("standard", "mean-field"):
        for width in WIDTHS:
            lr = args.lr if name == "standard" else args.lr * width
            probes, losses = [], []
            for seed in range(args.seeds):
                probes.append(one_step(build(name, width, seed, args.image_size), lr, x[:128], y[:128]))
                losses.append(loss_after(build(name, width, seed, args.image_size), lr, x, y, args.steps))
            grad, change = np.mean(probes, axis=0)
            print(f"| {name} | {width} | {lr:g} | {grad:.3f} | {change:.4f} | {np.mean(losses):.3f} |", flush=True)

if __name__ == "__main__":
    main()
