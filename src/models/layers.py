"""Transformer building blocks: patch embedding, attention, MLP, pre-norm block."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


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
    the attention weights (for attention maps); both paths compute the same output.
    """

    def __init__(self, dim: int, heads: int, dropout: float = 0.0):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(dropout)
        self.attn_dropout = dropout

    def forward(self, x: torch.Tensor, return_attn: bool = False):
        B, T, D = x.shape
        qkv = self.qkv(x).reshape(B, T, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each (B, heads, T, head_dim)
        if return_attn:
            attn = (q @ k.transpose(-2, -1)) * self.head_dim**-0.5  # (B, heads, T, T)
            attn = attn.float().softmax(dim=-1)
            out = (attn.to(v.dtype) @ v)
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
        self.drop = nn.Dropout(dropout)

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
