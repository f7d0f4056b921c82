"""Vision Transformer (CLS token, learned positions, pre-norm blocks) and its hybrid CNN-stem variant."""
from __future__ import annotations

import torch
from torch import nn

from src.models.layers import Attention, Block, Dropout, PatchEmbed, check_attention_path
from src.models.lean import LeanBlock


def check_vit_depth(depth: int) -> None:
    """No block: the CLS token never attends to a patch, so the logits are the same for every image."""
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
        raise ValueError(f"model.depth={depth} must be a whole number >= 1 (transformer blocks): with none the CLS "
                         "token never sees a patch and the model gives every image the same logits")


def check_vit_shape(image_size: int, patch: int, dim: int, heads: int) -> None:
    """Fail early, naming the config key, for shapes the ViT cannot take."""
    if patch < 1 or image_size % patch:
        raise ValueError(
            f"model.patch={patch} does not divide the image size {image_size}: choose a patch size "
            f"that divides it (e.g. {[p for p in (1, 2, 4, 7, 8, 14, 16, 32) if image_size % p == 0]}) "
            f"or set dataset.image_size to a multiple of {patch}"
        )
    if heads < 1 or dim % heads:
        raise ValueError(
            f"model.heads={heads} does not divide model.dim={dim}: the head size is dim // heads, "
            f"so choose heads from {[h for h in range(1, dim + 1) if dim % h == 0 and h <= 64]}"
        )


INITS = ("big_vision", "torch")  # model.init choices (ViT.init_weights)


class ViT(nn.Module):
    """ViT classifier. ``forward(x, return_attn=True)`` returns ``(logits, [attn per layer])``,
    each attention map (B, heads, T, T) with T = 1 + num_patches and the CLS token first."""

    no_weight_decay = ("pos_embed", "cls_token")  # plus every bias and norm weight (ndim < 2)

    def __init__(
        self,
        image_size: int,
        in_channels: int,
        num_classes: int,
        patch: int = 4,
        dim: int = 256,
        depth: int = 6,
        heads: int = 8,
        mlp_dim: int = 512,
        dropout: float = 0.0,
        stem: nn.Module | None = None,
        stem_channels: int | None = None,
        stem_stride: int = 1,
        lean: bool = True,
        init: str = "big_vision",
        attention: str = "auto",
    ):
        super().__init__()
        check_attention_path(attention, allow_auto=True)
        if init not in INITS:
            raise ValueError(f"model.init={init!r} is not one of {INITS}: big_vision (the original ViT's scheme) "
                             "or torch (PyTorch's layer defaults, as in the UvA tutorial the EPFL study cites)")
        grid_input = image_size // stem_stride
        check_vit_shape(grid_input, patch, dim, heads)
        check_vit_depth(depth)
        self.patch_size = patch * stem_stride  # pixels per token side in the input image
        self.stem = stem if stem is not None else nn.Identity()
        self.patch_embed = PatchEmbed(stem_channels or in_channels, dim, patch)
        num_patches = (grid_input // patch) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + num_patches, dim))
        self.pos_drop = Dropout(dropout)
        block = LeanBlock if lean else Block  # same parameters; LeanBlock saves less on CPU (src/models/lean.py)
        # `auto` is resolved by the trainer's set-up (src.models.attention_probe); until then: sdpa
        self.attention = attention
        path = "sdpa" if attention == "auto" else attention
        self.blocks = nn.ModuleList(block(dim, heads, mlp_dim, dropout, path) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        self.init_weights(init)

    def attention_path(self) -> str:
        """The path every block's attention takes now (``model.attention``, ``auto`` once resolved)."""
        return self.blocks[0].attn.path

    def set_attention_path(self, path: str) -> None:
        check_attention_path(path)
        for m in self.modules():
            if isinstance(m, Attention):
                m.path = path

    def init_weights(self, init: str = "big_vision") -> None:
        """``big_vision``: after the original ViT's scheme: Xavier-uniform dense layers, zero biases, LeCun-normal
        patch embedding, N(0, 0.02) positions and CLS token. Unlike timm's fixed N(0, 0.02) it scales with
        the width, which matters for the small widths these studies sweep (dim 8..256). Departures from the original
        (google-research/vision_transformer, ``vit_jax/models_vit.py``), kept so the committed runs made with them
        stay reproducible (``tests/test_models.py``): the head is Xavier-uniform like the other dense layers (the
        original's head kernel is zeros), the CLS token is N(0, 0.02) (the original's is zeros), the MLP biases are
        zeros (the original's N(0, 1e-6)), and q, k and v are one fused ``dim -> 3 dim`` layer initialised as a
        whole, so their bound is sqrt(6 / (4 dim)), sqrt(2) smaller than Xavier over each ``dim -> dim`` projection,
        sqrt(6 / (2 dim)) (the original's q, k and v are separate projections, each bounded on its own).

        ``torch``: PyTorch's own layer initialisation (Linear and Conv2d: U(+-1/sqrt(fan_in)) weights and
        biases; LayerNorm 1 and 0), with N(0, 0.02) positions and CLS token (PyTorch has no default for bare
        parameters)."""
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        if init == "torch":
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Conv2d, nn.LayerNorm)):
                    m.reset_parameters()
            return
        w = self.patch_embed.proj.weight
        nn.init.trunc_normal_(w, std=(1.0 / w[0].numel()) ** 0.5)  # LeCun normal: 1 / fan_in
        nn.init.zeros_(self.patch_embed.proj.bias)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor, return_attn: bool = False):
        x = self.patch_embed(self.stem(x))  # (B, T-1, dim)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = self.pos_drop(torch.cat([cls, x], dim=1) + self.pos_embed)  # (B, T, dim)
        attns = []
        for block in self.blocks:
            x, attn = block(x, return_attn)
            attns.append(attn)
        logits = self.head(self.norm(x[:, 0]))
        return (logits, attns) if return_attn else logits


def conv_stem(in_channels: int, channels: int, stride: int) -> nn.Sequential:
    """3x3 conv-BN-ReLU layers; each halving step is a stride-2 conv, so total stride = ``stride``."""
    if stride not in (1, 2, 4, 8):
        raise ValueError(f"model.stem_stride={stride} must be 1, 2, 4 or 8")
    layers, c_in, s = [], in_channels, 1
    widths = [channels // 2] * max(1, stride.bit_length() - 1) + [channels]
    for c_out in widths:
        step = 2 if s < stride else 1
        layers += [nn.Conv2d(c_in, c_out, 3, step, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]
        c_in, s = c_out, s * step
    return nn.Sequential(*layers)


def HybridViT(image_size: int, in_channels: int, num_classes: int, stem_channels: int = 64,
              stem_stride: int = 4, **vit_kwargs) -> ViT:
    """A ViT whose tokens are the cells of a small CNN's feature map (patch 1 on that map)."""
    if image_size % stem_stride:
        raise ValueError(f"model.stem_stride={stem_stride} does not divide the image size {image_size}")
    stem = conv_stem(in_channels, stem_channels, stem_stride)
    return ViT(image_size, in_channels, num_classes, patch=1, stem=stem, stem_channels=stem_channels,
               stem_stride=stem_stride, **vit_kwargs)
