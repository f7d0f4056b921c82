"""Symmetric label noise, applied once to the training labels before the first epoch."""
from __future__ import annotations

import warnings

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
    random = (num_classes - 1) / num_classes  # p at which a noisy label is uniform over the classes
    if num_classes >= 2 and p > random + 1e-12:
        warnings.warn(f"label_noise.p={p} with {num_classes} classes is above (K - 1) / K = {random:.3g} (random "
                      f"labels): the true class is the least likely training label ({1 - p:.3g} against "
                      f"{p / (num_classes - 1):.3g} for each other class), so the model is trained away from it. "
                      f"Fix: label_noise.p <= {random:.3g}", UserWarning, stacklevel=2)
    flip = torch.rand(labels.shape, generator=generator) < p
    # An offset in 1..K-1 added modulo K picks a different class uniformly.
    offset = torch.randint(1, max(num_classes, 2), labels.shape, generator=generator)
    noisy = torch.where(flip, (labels + offset) % num_classes, labels)
    return noisy, flip
