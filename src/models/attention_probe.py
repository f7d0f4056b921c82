"""``model.attention=auto``: the attention path chosen per run by measurement, as ``trainer.precision=auto`` is.

One copy of the model's first transformer block trains a forward + backward pass on a synthetic batch of the
run's shape (batch, tokens, width), under the run's autocast and on its device, once per candidate path
(``src.models.layers.ATTENTION_PATHS``). The fastest wins; ``sdpa`` (the one that never holds the T x T matrix)
is kept unless another path is at least ``MARGIN`` times faster. Paths that materialise the attention matrix are
not candidates when the matrices the whole model would save for backward exceed ``MATRIX_BUDGET_BYTES``
(patch 2 at 32 px, the RSNA images). Measured, never hard-coded from one CPU: on one AVX512-BF16 EPYC the
explicit ops beat the CPU flash kernel's backward in bf16 and tied it in fp32 (docs/benchmarks/README.md).

The probe restores the global random state, so the run it chooses for is the run it would be without it; a
resumed run keeps what its first start chose (the checkpoint records it).
"""
from __future__ import annotations

import contextlib
import copy
import time

import torch

from src.models.layers import ATTENTION_PATHS, MATERIALISES

MARGIN = 1.05  # another path must beat sdpa by this factor
MATRIX_BUDGET_BYTES = 2 * 2**30  # saved T x T matrices of all blocks together, for the materialising paths
REPEATS = 3  # timed passes per path (median), after one untimed warm-up


def matrix_bytes(batch: int, heads: int, tokens: int, depth: int, element_bytes: int) -> int:
    """Bytes of the (batch, heads, T, T) probabilities the materialising paths save, summed over the blocks
    (the explicit path also saves a boolean keep-mask of the same shape when dropout is on)."""
    return batch * heads * tokens * tokens * depth * (element_bytes + 1)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def block_seconds(block: torch.nn.Module, x: torch.Tensor, autocast: contextlib.AbstractContextManager) -> float:
    """Median seconds of one forward + backward pass of ``block`` on ``x``."""
    times = []
    for i in range(REPEATS + 1):
        _sync(x.device)
        start = time.perf_counter()
        with autocast:
            y, _ = block(x)
        y.float().square().mean().backward()
        _sync(x.device)
        if i:
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def choose_attention(model: torch.nn.Module, batch_size: int, autocast: contextlib.AbstractContextManager,
                     bf16: bool) -> tuple[str, dict[str, float], str]:
    """Resolve ``model.attention=auto`` for this run. Returns (path, seconds per candidate, reason)."""
    blocks = model.blocks
    block = blocks[0]
    device = next(model.parameters()).device
    tokens, dim = model.pos_embed.shape[1], model.pos_embed.shape[2]
    heads, depth = block.attn.heads, len(blocks)
    need = matrix_bytes(batch_size, heads, tokens, depth, 2 if bf16 else 4)
    candidates = [p for p in ATTENTION_PATHS if p not in MATERIALISES or need <= MATRIX_BUDGET_BYTES]
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    try:
        probe = copy.deepcopy(block).train()
        x = torch.randn(batch_size, tokens, dim, generator=torch.Generator().manual_seed(0)).to(device)
        x.requires_grad_(True)
        seconds = {}
        for path in candidates:
            probe.attn.path = path
            seconds[path] = block_seconds(probe, x, autocast)
    finally:
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng, device)
    best = min(seconds, key=seconds.get)
    choice = best if seconds[best] * MARGIN < seconds["sdpa"] else "sdpa"
    times = ", ".join(f"{p} {1e3 * s:.1f} ms" for p, s in seconds.items())
    dropped = [p for p in ATTENTION_PATHS if p not in candidates]
    reason = f"one block's forward + backward at batch {batch_size}, {tokens} tokens: {times}"
    if dropped:
        reason += (f"; {', '.join(dropped)} not tried: their T x T matrices would take {need / 2**30:.1f} GiB "
                   f"(budget {MATRIX_BUDGET_BYTES / 2**30:.0f} GiB)")
    return choice, seconds, reason
