"""Transformer building blocks: dropout, patch embedding, attention, MLP, pre-norm block."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def dropout_keep(x: torch.Tensor, p: float) -> torch.Tensor:
    """A boolean keep-mask shaped like ``x``: True with probability 1 - p (rounded to 1/32768).

    PyTorch's CPU Bernoulli draws one float per element and dominates a ViT's dropout time (measured
    here: 130 ms against 56 ms for fwd+bwd of a (128, 65, 512) dropout). This cuts four 15-bit
    integers out of each 64-bit draw of the same seeded generator.
    """
    n = x.numel()
    bits = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device).random_().view(torch.int16)[:n]
    return (bits.bitwise_and_(0x7FFF) >= round(p * 32768)).view(x.shape)  # int64 draws lie in [0, 2^63)


class _MaskedScale(torch.autograd.Function):
    """x * keep / (1 - p), saving only the boolean mask for backward (as ``F.dropout`` does)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return (x * keep).mul_(scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return (grad * keep).mul_(ctx.scale), None, None


def _eager_cpu(x: torch.Tensor) -> bool:
    """The fast CPU dropout paths are for eager mode: under ``torch.compile`` inductor generates its
    own fused RNG (and ``random_`` would break the graph)."""
    return x.device.type == "cpu" and not torch.compiler.is_compiling()


class Dropout(nn.Dropout):
    """``nn.Dropout`` whose eager CPU training path uses :func:`dropout_keep`; CUDA, compiled and
    eval paths are ``F.dropout``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or not _eager_cpu(x) or not 0.0 < self.p < 1.0:
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
    the attention weights (for attention maps); both paths compute the same output. CPU training
    with dropout (eager) takes the explicit path too: there SDPA falls back to its math kernel with the slow
    Bernoulli, and the explicit path with :class:`Dropout` is ~1.6x faster (fwd+bwd, measured).
    """

    def __init__(self, dim: int, heads: int, dropout: float = 0.0):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = Dropout(dropout)
        self.attn_drop = Dropout(dropout)  # on the attention weights, explicit path only
        self.attn_dropout = dropout

    def forward(self, x: torch.Tensor, return_attn: bool = False):
        B, T, D = x.shape
        qkv = self.qkv(x).reshape(B, T, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each (B, heads, T, head_dim)
        if return_attn or (self.training and self.attn_dropout > 0 and _eager_cpu(x)):
            attn = (q @ k.transpose(-2, -1)) * self.head_dim**-0.5  # (B, heads, T, T)
            attn = attn.float().softmax(dim=-1)
            out = self.attn_drop(attn.to(v.dtype)) @ v
        else:
            attn = None
            p = self.attn_dropout if self.training else 0.0
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p)  # (B, heads, T, head_dim)
        out = out.transpose(1, 2).reshape(B, T, D)
        return self.proj_drop(self.proj(out)), attn


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, dim: int, heads: int, mlp_dim: int, dropout: float = 0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, mlp_dim, dropout)

    def forward(self, x: torch.Tensor, return_attn: bool = False):
        y, attn = self.attn(self.norm1(x), return_attn)
        x = x + y
        x = x + self.mlp(self.norm2(x))
        return x, attn
