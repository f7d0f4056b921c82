"""torchvision's ResNet-18 with an optional CIFAR stem and local pretrained weights."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torchvision.models import resnet18 as tv_resnet18


def resnet18(image_size: int, in_channels: int, num_classes: int, cifar_stem: bool = True,
             weights: str | None = None) -> nn.Module:
    """ResNet-18; ``cifar_stem`` replaces the 7x7/2 conv and max-pool by a 3x3/1 conv.

    ``weights`` is a local state_dict file (no downloads); tensors whose shape differs from this
    model's (e.g. the classifier for another number of classes) are left at their initialisation.
    """
    model = tv_resnet18(num_classes=num_classes)
    if cifar_stem:
        model.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
        model.maxpool = nn.Identity()
    elif in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)
    if weights:
        path = Path(weights)
        if not path.is_file():
            raise FileNotFoundError(f"model.weights={weights} is not a file: give a local state_dict path or null")
        state = torch.load(path, map_location="cpu", weights_only=True)
        state = state.get("model", state)
        own = model.state_dict()
        kept = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
        model.load_state_dict(kept, strict=False)
    return model
