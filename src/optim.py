"""Optimizer construction: weight-decay groups, learning-rate scaling with width, fused kernels."""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import hydra.utils
import torch
from torch import nn


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices and conv kernels only: biases, norms and the names in ``model.no_weight_decay``
    (position and CLS embeddings) are exempt."""
    exempt_names = set(getattr(model, "no_weight_decay", ()))
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or name.split(".")[-1] in exempt_names else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, cfg: Mapping[str, Any], width: int | None,
                    device: torch.device) -> torch.optim.Optimizer:
    """Instantiate the ``optimizer`` group. ``scale_lr_by_width`` divides lr by ``model.width``."""
    cfg = dict(cfg)
    scale = cfg.pop("scale_lr_by_width", False)
    lr = float(cfg.pop("lr"))
    if scale:
        if not width:
            raise ValueError("optimizer.scale_lr_by_width=true needs a model with a `width` (model=cnn)")
        lr = lr / width
    weight_decay = float(cfg.pop("weight_decay", 0.0))
    factory = hydra.utils.instantiate(cfg)  # a functools.partial of the optimizer class
    extra = {}
    if device.type == "cuda" and "fused" in inspect.signature(factory.func).parameters:
        extra["fused"] = True
    opt = factory(param_groups(model, weight_decay), lr=lr, **extra)
    for group in opt.param_groups:
        group["base_lr"] = lr
    return opt
