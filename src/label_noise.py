"""Symmetric label noise, applied once to the training labels before the first epoch."""
from __future__ import annotations

import torch


def apply_label_noise(labels: torch.Tensor, p: float, num_classes: int,
                      generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """With probability ``p`` replace each label by a uniformly chosen *different* class.

    Pure and seeded: the same ``generator`` state gives the same result. Returns
    ``(noisy_labels, flipped_mask)``; ``flipped_mask.float().mean()`` is the realised noise rate.
    """
    if not 0.0 <= p < 1.0:
        raise ValueError(f"label_noise.p={p} must be in [0, 1): it is the probability of replacing a label")
    if p > 0 and num_classes < 2:
        raise ValueError("label noise needs at least 2 classes")
    flip = torch.rand(labels.shape, generator=generator) < p
    # An offset in 1..K-1 added modulo K picks a different class uniformly.
    offset = torch.randint(1, max(num_classes, 2), labels.shape, generator=generator)
    noisy = torch.where(flip, (labels + offset) % num_classes, labels)
    return noisy, flip
