"""Whole-batch augmentation on the training device (no per-image Python, no PIL), on raw pixel values.

Each function takes a float batch (B, C, H, W) and a ``torch.Generator`` on the batch's device.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

AUGMENTS = ("none", "flip_crop", "resized_crop", "translate")


def _rand(n: int, g: torch.Generator, device) -> torch.Tensor:
    return torch.rand(n, generator=g, device=device)


def flip_crop(x: torch.Tensor, g: torch.Generator, pad: int = 4) -> torch.Tensor:
    """Random horizontal flip and a random crop from the image zero-padded by ``pad`` pixels."""
    B, C, H, W = x.shape
    dev = x.device
    flip = _rand(B, g, dev) < 0.5
    dy = torch.randint(0, 2 * pad + 1, (B,), generator=g, device=dev)
    dx = torch.randint(0, 2 * pad + 1, (B,), generator=g, device=dev)
    # One gather from the padded batch: output pixel (y, x) reads padded pixel (y + dy, x + dx), or
    # (y + dy, Wp - 1 - x - dx) when flipped (the crop of the mirrored padded image).
    Wp = W + 2 * pad
    cols = torch.arange(W, device=dev)[None, :] + dx[:, None]  # (B, W)
    cols = torch.where(flip[:, None], Wp - 1 - cols, cols)
    rows = torch.arange(H, device=dev)[None, :] + dy[:, None]  # (B, H)
    flat = (rows[:, :, None] * Wp + cols[:, None, :]).view(B, 1, H * W).expand(B, C, H * W)
    xp = F.pad(x, (pad, pad, pad, pad)).view(B, C, -1)
    return xp.gather(2, flat).view(B, C, H, W)


def _affine(x: torch.Tensor, sx: torch.Tensor, sy: torch.Tensor, tx: torch.Tensor, ty: torch.Tensor) -> torch.Tensor:
    """Sample each image through its own scale/translation (normalised coords, bilinear, zero fill)."""
    B = x.shape[0]
    theta = torch.zeros(B, 2, 3, device=x.device, dtype=x.dtype)
    theta[:, 0, 0], theta[:, 0, 2], theta[:, 1, 1], theta[:, 1, 2] = sx, tx, sy, ty
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def resized_crop(x: torch.Tensor, g: torch.Generator, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)) -> torch.Tensor:
    """Random horizontal flip + RandomResizedCrop (area fraction ``scale``, aspect ``ratio``), resized back."""
    B, dev = x.shape[0], x.device
    area = scale[0] + (scale[1] - scale[0]) * _rand(B, g, dev)
    log_r = math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * _rand(B, g, dev)
    r = log_r.exp()
    w = (area * r).sqrt().clamp(max=1.0)  # crop width / image width
    h = (area / r).sqrt().clamp(max=1.0)
    cx = (1 - w) * (2 * _rand(B, g, dev) - 1)  # crop centre in [-1+w, 1-w]
    cy = (1 - h) * (2 * _rand(B, g, dev) - 1)
    flip = torch.where(_rand(B, g, dev) < 0.5, -1.0, 1.0)
    return _affine(x, (w * flip).to(x.dtype), h.to(x.dtype), cx.to(x.dtype), cy.to(x.dtype))


def translate(x: torch.Tensor, g: torch.Generator, max_shift: float = 0.05) -> torch.Tensor:
    """Random shift of up to ``max_shift`` of the image size in each direction (the MNIST recipe)."""
    B, dev = x.shape[0], x.device
    one = torch.ones(B, device=dev, dtype=x.dtype)
    tx = (2 * _rand(B, g, dev) - 1) * 2 * max_shift  # normalised coords span 2
    ty = (2 * _rand(B, g, dev) - 1) * 2 * max_shift
    return _affine(x, one, one, tx.to(x.dtype), ty.to(x.dtype))


def augment(x: torch.Tensor, kind: str, g: torch.Generator) -> torch.Tensor:
    if kind == "none":
        return x
    if kind == "flip_crop":
        return flip_crop(x, g)
    if kind == "resized_crop":
        return resized_crop(x, g)
    if kind == "translate":
        return translate(x, g)
    raise ValueError(f"dataset.augment={kind!r} is unknown: choose one of {list(AUGMENTS)}")
