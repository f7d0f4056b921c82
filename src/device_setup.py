"""How a run uses its device: process-wide settings (CPU threads, TF32, cuDNN autotuning) and what the summary says
of them, the autocast of a precision, the attention path (``model.attention=auto`` measured), channels-last memory
format and ``torch.compile``. Each is one small function that ``src.run_setup.setup`` calls; a resumed run's
``RunState`` rebuilds its autocast with ``autocast_for``.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import torch

from src import probe_cache

log = logging.getLogger(__name__)


def autocast_for(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def resolve_attention(model: torch.nn.Module, batch_size: int, device: torch.device,
                      precision: str, context: str = "", shape: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``model.attention``: resolve ``auto`` by measurement (``src.models.attention_probe``) and log the choice.
    Returns the summary's facts: ``attention`` (the path) and, for ``auto``, the probe's seconds and reason.
    With ``shape`` (what the model is: its config and input), this machine's earlier measurement of that shape is
    reused (``src.probe_cache``; ``attention_probe_cached`` names its file)."""
    if not hasattr(model, "attention_path"):
        return {}
    if model.attention != "auto":
        return {"attention": model.attention_path()}
    from src.models.attention_probe import choose_attention

    def measure() -> dict[str, Any]:
        path, seconds, reason = choose_attention(model, batch_size, autocast_for(device, precision),
                                                 precision == "bf16")
        return {"attention": path, "attention_probe_s": seconds, "attention_reason": reason}

    if shape is None:  # measured afresh: nothing names the shape to reuse an earlier measurement of
        facts, source = measure(), None
    else:
        key = {"shape": dict(shape), "batch": batch_size, "device": device.type, "precision": precision}
        facts, source = probe_cache.cached("attention", key, device, measure)
    model.set_attention_path(facts["attention"])
    kept = f"; kept from {source}" if source else ""
    log.info("attention auto%s: %s (%s%s)", context, facts["attention"], facts["attention_reason"], kept)
    return facts | ({"attention_probe_cached": str(source)} if source else {})


def setup_device(device: torch.device, t: Mapping[str, Any]) -> None:
    """Process-wide settings for training on ``device``: CPU threads, TF32 and cuDNN autotuning on CUDA; and on
    CUDA the device's peak-memory counter reset, so the summary's ``peak_gpu_mem_gib`` is this run's peak, not an
    earlier run's in the same process (a launcher worker runs many)."""
    if t.get("num_threads"):
        torch.set_num_threads(int(t["num_threads"]))
    if device.type == "cuda":
        if torch.cuda.is_initialized():  # else no run of this process has allocated yet: the peak is 0
            torch.cuda.reset_peak_memory_stats(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True


def numerics(device: torch.device) -> dict[str, Any]:
    """What ``precision`` leaves unsaid, for the summary: on CUDA whether fp32 matmuls and convolutions ran as TF32
    (``setup_device`` turns it on), so an "fp32" GPU run is not read as true fp32 beside a CPU one."""
    if device.type != "cuda":
        return {}
    return {"tf32": bool(torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32)}


def use_channels_last(model: torch.nn.Module, device: torch.device, setting: bool | str = "auto") -> bool:
    """``trainer.channels_last``: ``auto`` turns it on for convolutional models (no transformer blocks).
    It pays on CPU too (oneDNN): measured 18-25% faster steps for cnn widths 4-8 and ~10% for resnet18."""
    if setting == "auto":
        return not hasattr(model, "blocks")
    return bool(setting)


def compile_model(model: torch.nn.Module) -> torch.nn.Module:
    """``torch.compile`` for one run. Dynamo's in-memory caches are reset first: runs of a sweep in one
    process (Hydra's basic launcher) would otherwise hit its recompile limit after four runs and fall
    back to eager silently. Kernels still come from inductor's on-disk FX graph cache when shapes match."""
    torch._dynamo.reset()
    return torch.compile(model)
