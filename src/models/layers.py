"""Transformer building blocks: dropout, patch embedding, attention, MLP, pre-norm block (nanoGPT's shape).

The memory-lean CPU training paths of the block live in ``src.models.lean`` (``model.lean``)."""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

# model.attention: how softmax(q k^T / sqrt(d)) v is computed in training and evaluation (attention maps and
# stacked members always take the explicit ops). ``auto`` is resolved per run by ``src.models.attention_probe``.
#   sdpa      F.scaled_dot_product_attention with PyTorch's backend choice (flash / memory-efficient / cuDNN;
#             on CPU the flash kernel, or the math one when dropout is on): never materialises the T x T matrix
#   math      the same call restricted to SDPBackend.MATH (composite ops, T x T materialised)
#   explicit  this module's own ops (on eager CPU training: the memory-lean custom autograd of src.models.lean)
ATTENTION_PATHS = ("sdpa", "math", "explicit")
MATERIALISES = ("math", "explicit")  # paths that hold the (B, heads, T, T) matrix


def check_attention_path(path: str, allow_auto: bool = False) -> None:
    """Fail early, naming the config key and the choices, for an unknown ``model.attention``."""
    choices = ("auto", *ATTENTION_PATHS) if allow_auto else ATTENTION_PATHS
    if path not in choices:
        raise ValueError(f"model.attention={path!r} is not one of {choices}: auto (measured per run, "
                         "src/models/attention_probe.py) or a path named in src/models/layers.py")


def dropout_keep(x: torch.Tensor, p: float) -> torch.Tensor:
    """A boolean keep-mask shaped like ``x``: True with probability 1 - p (p rounded to 1/65536).

    PyTorch's CPU Bernoulli draws one float per element and dominates a ViT's dropout time (measured
    here: 130 ms against 56 ms for fwd+bwd of a (128, 65, 512) dropout). This cuts four 16-bit integers out
    of each 64-bit draw of the same seeded generator. The draw spans the full 64-bit range (``random_(-2**63,
    None)``), so every bit is uniform and no masking pass is needed (``random_()``'s int64 draws lie in [0, 2**63):
    their top 16-bit lane holds 15 random bits). It costs what ``random_()`` does (3.5 ms for a (128, 8, 65, 65)
    mask, Zen 4, once the buffer's pages are touched).
    """
    n = x.numel()
    bits = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device).random_(-(2**63), None)
    return (bits.view(torch.int16)[:n] >= round(p * 65536) - 32768).view(x.shape)


def keep_scaled(x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
    """``x * keep * scale`` for a boolean ``keep``, read as uint8 (the same bytes, a free view): the product
    converts the mask to ``x``'s dtype on the way, and PyTorch's CPU conversion from bool is scalar where the one
    from uint8 is vectorized (one (128, 8, 65, 65) bf16 product: about 7 ms from bool, 1 ms from uint8; bitwise
    the same result). Both measured faster than ``torch.where`` or ``masked_fill`` on CPU."""
    return (x * keep.view(torch.uint8)).mul_(scale)


class _MaskedScale(torch.autograd.Function):
    """x * keep / (1 - p), saving only the boolean mask for backward (as ``F.dropout`` does)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return keep_scaled(x, keep, scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return keep_scaled(grad, keep, ctx.scale), None, None


def under_torch_func(x: torch.Tensor) -> bool:
    """True inside ``torch.func`` transforms (the stacked members' ``vmap``); never traced by dynamo."""
    return not torch.compiler.is_compiling() and torch._C._functorch.is_functorch_wrapped_tensor(x)


def eager_cpu(x: torch.Tensor) -> bool:
    """The fast CPU paths are for plain eager mode: under ``torch.compile`` inductor generates its own
    fused RNG (and ``random_`` would break the graph); under ``torch.func`` transforms custom autograd
    functions and in-place draws do not apply."""
    return x.device.type == "cpu" and not torch.compiler.is_compiling() and not under_torch_func(x)


class Dropout(nn.Dropout):
    """``nn.Dropout`` whose eager CPU training path uses :func:`dropout_keep`; CUDA, compiled and
    eval paths are ``F.dropout``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or not eager_cpu(x) or not 0.0 < self.p < 1.0:
            return super().forward(x)
        return _MaskedScale.apply(x, dropout_keep(x, self.p), 1.0 / (1.0 - self.p))


class PatchEmbed(nn.Module):
    """Cut an image into non-overlapping patches and project each to ``dim`` (one strided conv)."""

    def __init__(self, in_channels: int, dim: int, patch: int):
        super().__init__()
        self.proj = nn.Conv2d(in_channels, dim, kernel_size=patch, stride=patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)  # (B, dim, H/p, W/p)
        return x.flatten(2).transpose(1, 2)  # (B, T, dim)


class Attention(nn.Module):
    """Multi-head self-attention: one fused QKV projection and ``F.scaled_dot_product_attention``.

    ``forward(x, return_attn=True)`` takes an explicit softmax(QK^T/sqrt(d)) path that also returns
    the attention weights (for attention maps), also taken under ``torch.func`` transforms (stacked
    members), where SDPA has no batching rule; both paths compute the same output. The memory-lean
    CPU training path (``src.models.lean``) reuses :meth:`split_heads` and :meth:`merge_heads`.
    """

    def __init__(self, dim: int, heads: int, dropout: float = 0.0, path: str = "sdpa"):
        super().__init__()
        check_attention_path(path)
        self.path = path
        self.heads = heads
        self.head_dim = dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = Dropout(dropout)
        self.attn_drop = Dropout(dropout)  # on the attention weights (explicit path; sdpa and math: dropout_p)
        self.attn_dropout = dropout

    def split_heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, T, 3 * dim) -> q, k, v, each (B, heads, T, head_dim)."""
        B, T = qkv.shape[0], qkv.shape[1]
        return qkv.reshape(B, T, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def merge_heads(self, out: torch.Tensor) -> torch.Tensor:
        """(B, heads, T, head_dim) -> the projected output (B, T, dim)."""
        B, _, T, _ = out.shape
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, T, self.heads * self.head_dim)))

    def forward(self, x: torch.Tensor, return_attn: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        q, k, v = self.split_heads(self.qkv(x))  # each (B, heads, T, head_dim)
        if return_attn or under_torch_func(q) or self.path == "explicit":  # SDPA has no vmap batching rule
            scores = (q @ k.transpose(-2, -1)) * self.head_dim**-0.5  # (B, heads, T, T)
            if return_attn:  # the maps: probabilities in fp32
                attn = scores.float().softmax(dim=-1)
                return self.merge_heads(self.attn_drop(attn.to(v.dtype)) @ v), attn
            # softmax in the scores' dtype (the kernel accumulates bf16 in fp32), as the lean training path does: an
            # fp32 copy of the (B, heads, T, T) scores and its conversion back made bf16 evaluation of the
            # double-descent ViT 3x slower per image than its training forward (docs/benchmarks/README.md)
            return self.merge_heads(self.attn_drop(scores.softmax(dim=-1).to(v.dtype)) @ v), None
        p = self.attn_dropout if self.training else 0.0
        return self.merge_heads(sdpa(q, k, v, p, self.path)), None


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: float, path: str) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` on the ``sdpa`` path (PyTorch's backend choice) or the ``math`` one."""
    with sdpa_kernel(SDPBackend.MATH) if path == "math" else contextlib.nullcontext():
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p)


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.from_hidden(self.fc1(x))

    def from_hidden(self, a: torch.Tensor) -> torch.Tensor:
        """The MLP after ``fc1``: dropout(fc2(dropout(act(a))))."""
        return self.drop(self.fc2(self.drop(self.act(a))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x)).
    ``src.models.lean.LeanBlock`` is the same block with memory-lean CPU training paths."""

    def __init__(self, dim: int, heads: int, mlp_dim: int, dropout: float = 0.0, attention: str = "sdpa"):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, dropout, attention)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, mlp_dim, dropout)

    def forward(self, x: torch.Tensor, return_attn: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        y, attn = self.attn(self.norm1(x), return_attn)
        x = x + y
        return x + self.mlp(self.norm2(x)), attn
