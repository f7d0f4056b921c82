"""Optimizer construction: weight-decay groups and fused kernels.

The lr is the same at every model width: in PyTorch's standard parametrisation the width-parametrised CNN's
gradients do not shrink with width (global gradient norm at init 0.13-0.21 for C1 = 1 to 32, 0.26 at 64: digits at
32 px through the trainer's pipeline, 3 initialisations), so a constant lr keeps one SGD step's logit change within
about 2x from C1 = 1 to 32 and 3.5x to 64 (0.0011-0.0038 on MNIST at 32 px, lr 0.05: conf/optimizer/sgd.yaml,
docs/benchmarks/README.md; both measured by ``benchmarks/cnn_step_size.py``). The EPFL study's eta_eff = eta / h holds
for its own parametrisation, whose gradients scale as 1/h (sec. 3.2); the old ``optimizer.scale_lr_by_width``
divided the lr by the width here instead and shrank the step h-fold, so it was removed.
"""
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


def build_optimizer(model: nn.Module, cfg: Mapping[str, Any], device: torch.device) -> torch.optim.Optimizer:
    """Instantiate the ``optimizer`` group with its ``lr`` as every group's ``base_lr`` (the schedule's peak)."""
    cfg = dict(cfg)
    lr = float(cfg.pop("lr"))
    weight_decay = float(cfg.pop("weight_decay", 0.0))
    factory = hydra.utils.instantiate(cfg)  # a functools.partial of the optimizer class
    extra = {}
    if device.type == "cuda" and "fused" in inspect.signature(factory.func).parameters:
        extra["fused"] = True
    opt = factory(param_groups(model, weight_decay), lr=lr, **extra)
    for group in opt.param_groups:
        group["base_lr"] = lr
    return opt
