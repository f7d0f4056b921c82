"""How a stacked group is cut into the parts that train as one stack, one part after another
(``src.stacked.train_members``): by what the stacked step takes from its first member (its autocast, label smoothing,
class weighting and model definition) first, then, on CUDA, to the members that fit in the device's free memory.
``member_bytes`` estimates one member's need before any step (on the meta device, no memory, no compute);
``device_budget`` is the group's share of the free memory, split between the launcher's processes on one GPU
(``VITSWEEP_GPU_SHARE``, set by the launcher's workers).
"""
from __future__ import annotations

import copy
import json
import logging
import os
from typing import Any

import torch

from src.run_state import RunState

log = logging.getLogger(__name__)


def member_bytes(state: RunState) -> int:
    """Device bytes one more stacked member of ``state``'s kind is estimated to need, before any step: its
    parameters four times (weights, gradients, two optimizer moments) plus every tensor autograd saves for
    one training batch, counted by a forward pass on the meta device (no memory, no compute; in fp32, so
    an overestimate under bf16), all times 1.5 for allocator slack and kernel workspaces. The member's data
    is already on the device when this is asked, so the free memory counts it."""
    model = copy.deepcopy(state.model).to("meta").train()
    loader = state.train_loader
    x = torch.empty((loader.batch_size, *loader.x.shape[1:]), device="meta")
    saved = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    params = sum(p.numel() * p.element_size() for p in state.model.parameters())
    return int(1.5 * (4 * params + saved))


def device_budget(device: torch.device) -> int | None:
    """Bytes a stacked group may take on ``device`` (None: no limit, on CPU): 90% of the free memory,
    shared equally by the launcher's processes on that GPU (``VITSWEEP_GPU_SHARE``)."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(0.9 * free / max(1, int(os.environ.get("VITSWEEP_GPU_SHARE", "1"))))


def fitting_parts(states: dict[int, RunState]) -> list[list[int]]:
    """The members cut into parts that each fit the device's budget (one part where all fit)."""
    keys = list(states)
    first = states[keys[0]]
    budget = device_budget(first.device)
    if budget is None or len(keys) < 2:
        return [keys]
    need = member_bytes(first)
    size = max(1, budget // need)
    if size >= len(keys):
        return [keys]
    parts = [keys[i:i + size] for i in range(0, len(keys), size)]
    log.warning(f"{len(keys)} stacked members need about {len(keys) * need / 2**30:.2f} GiB, {budget / 2**30:.2f} "
                f"GiB fit on {first.device}: training them as {len(parts)} stacks of at most {size}, one after "
                "another (hydra.launcher.max_members sets the largest stack)")
    return parts


def shared_by_the_step(state: RunState) -> tuple:
    """What the stacked step takes from its first member for every member (``src.stacked_loop.MemberStack``): the
    resolved precision (its autocast), the device, the loss's label smoothing, whether the loss is class-weighted and
    the model definition (``functional_call`` runs the first member's module: its dropout rate, say)."""
    return (state.info.get("precision"), str(state.device), float(state.cfg["trainer"].get("label_smoothing", 0.0)),
            state.class_weights is None, json.dumps(state.model_cfg, sort_keys=True, default=str))


def stack_parts(states: dict[int, RunState]) -> list[list[int]]:
    """The members cut into the parts that train as one stack: by what the stacked step shares first
    (``shared_by_the_step``: e.g. ``precision=auto`` may resolve differently for a member resumed from a checkpoint of
    another machine, and a caller of ``src.stacked.train_members`` may pass members that ``plan_groups`` would not
    have grouped), then by the device's memory (``fitting_parts``)."""
    by_shared: dict[Any, dict[int, RunState]] = {}
    for k, s in states.items():
        by_shared.setdefault(shared_by_the_step(s), {})[k] = s
    return [part for group in by_shared.values() for part in fitting_parts(group)]
