"""Learning rate as a pure function of the optimizer step."""
from __future__ import annotations

import math

SCHEDULERS = ("cosine", "constant")


def lr_at(step: int, base_lr: float, total_steps: int, warmup_steps: int = 0, name: str = "cosine",
          min_lr_ratio: float = 0.0) -> float:
    """Linear warm-up over ``warmup_steps``, then ``cosine`` decay to ``min_lr_ratio * base_lr`` at
    ``total_steps`` (or ``constant``)."""
    if name not in SCHEDULERS:
        raise ValueError(f"scheduler.name={name!r} is unknown: choose one of {list(SCHEDULERS)}")
    if warmup_steps > 0 and step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    if name == "constant":
        return base_lr
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    floor = min_lr_ratio * base_lr
    return floor + (base_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
