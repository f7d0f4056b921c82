"""The in-memory form every dataset loader returns: uint8 images plus integer labels."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class DataSplits:
    """Train/val/test splits as uint8 NCHW image tensors and int64 label tensors.

    Images stay uint8 until a batch is drawn: the loader normalises with ``mean``/``std``
    (per channel, in [0, 1] units) on the training device. ``x_*`` may be backed by a
    memory-mapped array for datasets too large for memory (then ``resident`` is False).
    """

    x_train: torch.Tensor  # (N, C, H, W) uint8
    y_train: torch.Tensor  # (N,) int64
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    x_val: torch.Tensor | None = None
    y_val: torch.Tensor | None = None
    classes: list[str] = field(default_factory=list)
    class_weights: torch.Tensor | None = None  # per-class loss weights (e.g. pos_weight), or None
    sample_weights: torch.Tensor | None = None  # per-train-image sampling weights, or None
    info: dict = field(default_factory=dict)  # extra facts recorded in summary.json

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.x_train.shape[1:])  # (C, H, W)
