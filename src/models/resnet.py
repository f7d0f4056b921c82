"""torchvision's ResNet-18 with an optional CIFAR stem and local pretrained weights."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torchvision.models import resnet18 as tv_resnet18


def resnet18(image_size: int, in_channels: int, num_classes: int, cifar_stem: bool = True,
             weights: str | None = None) -> nn.Module:
    """ResNet-18; ``cifar_stem`` replaces the 7x7/2 conv and max-pool by a 3x3/1 conv.

    ``weights`` is a local state_dict file (no downloads), plain, under a ``model`` or ``state_dict`` key, or
    with DataParallel's ``module.`` prefix. The classifier and the stem are left at their initialisation where
    their shapes differ from this model's (another number of classes, the CIFAR stem); every other tensor must
    load, or it raises.
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
        for wrapper in ("model", "state_dict"):  # a training checkpoint's weights under one key
            if isinstance(state.get(wrapper), dict):
                state = state[wrapper]
        if state and all(k.startswith("module.") for k in state):  # saved from DataParallel / DDP
            state = {k.removeprefix("module."): v for k, v in state.items()}
        own = model.state_dict()
        kept = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
        backbone = [k for k in own if not k.startswith(("fc.", "conv1."))]
        missing = [k for k in backbone if k not in kept]
        if missing:  # the classifier and the stem may differ (another task, a CIFAR stem); the rest may not
            raise ValueError(
                f"model.weights={weights} matches {len(backbone) - len(missing)} of this ResNet-18's "
                f"{len(backbone)} backbone tensors (missing or of another shape: {missing[:3]} ...): give a "
                "torchvision resnet18 state_dict, or model.weights=null to train from scratch")
        model.load_state_dict(kept, strict=False)
    return model
