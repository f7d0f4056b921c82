"""Attention figures as PNG files (matplotlib, Agg backend)."""
from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from analysis.figures import save_figure  # noqa: E402 - one figure writer; analysis never imports src


def _show(ax, img: np.ndarray, att: np.ndarray | None = None, title: str = "", vmax: float | None = None) -> None:
    """``img`` with ``att`` over it, coloured on 0..``vmax`` (one scale shared by the panels compared)."""
    h, w = img.shape[:2]
    ax.imshow(img, cmap="gray" if img.ndim == 2 else None, extent=(0, w, h, 0))
    if att is not None:
        ax.imshow(att, cmap="inferno", alpha=0.6, extent=(0, w, h, 0), interpolation="bilinear", vmin=0.0,
                  vmax=vmax)
    ax.set_title(title, fontsize=7)
    ax.set_xticks([])
    ax.set_yticks([])


def _wrap(title: str, columns: int) -> str:
    """A suptitle broken into lines that fit a figure of ``columns`` panels (about 1.6 inches each)."""
    return textwrap.fill(title, width=max(30, 15 * columns))


def as_image(raw: torch.Tensor) -> np.ndarray:
    """(C, H, W) uint8 or float in 0..255 -> (H, W) or (H, W, C) for imshow."""
    img = raw.permute(1, 2, 0).float().cpu().numpy()
    img = img[..., 0] if img.shape[-1] == 1 else img
    return np.clip(img, 0, 255).astype(np.uint8)


def plot_cls_grid(raw: torch.Tensor, cls: torch.Tensor, rollout: torch.Tensor, titles: list[str], out: Path,
                  suptitle: str) -> Path:
    """Rows = images (or classes); columns = input, head-mean CLS attention of each layer, rollout.
    ``cls``: (layers, rows, heads, g, g) or (layers, rows, g, g) already averaged over heads. Each column has
    one colour scale, 0 to its largest weight, so rows compare (a flat map looks flat)."""
    n, layers = raw.shape[0], cls.shape[0]
    fig, axes = plt.subplots(n, layers + 2, figsize=(1.6 * (layers + 2), 1.7 * n), squeeze=False)
    head_mean = (cls.mean(2) if cls.ndim == 5 else cls).float()
    tops = [float(head_mean[layer].nan_to_num().max()) for layer in range(layers)]
    roll_top = float(rollout.float().nan_to_num().max())
    for i in range(n):
        img = as_image(raw[i])
        _show(axes[i, 0], img, title=titles[i])
        for layer in range(layers):
            _show(axes[i, layer + 1], img, head_mean[layer, i].cpu().numpy(), f"layer {layer + 1} CLS attn",
                  tops[layer])
        _show(axes[i, -1], img, rollout[i].cpu().numpy(), "rollout", roll_top)
    fig.suptitle(_wrap(f"{suptitle} (colour: 0 to the column's largest weight, shared by its rows)", layers + 2),
                 fontsize=9)
    return save_figure(fig, out)


def plot_heads(raw: torch.Tensor, cls: torch.Tensor, index: int, out: Path, name: str | None = None) -> Path:
    """One image: rows = layers, columns = heads, CLS attention of each (one colour scale per layer row)."""
    layers, heads = cls.shape[0], cls.shape[2]
    fig, axes = plt.subplots(layers, heads, figsize=(1.5 * heads, 1.5 * layers), squeeze=False)
    img = as_image(raw[index])
    for layer in range(layers):
        top = float(cls[layer, index].float().max())
        for h in range(heads):
            _show(axes[layer, h], img, cls[layer, index, h].cpu().numpy(), f"layer {layer + 1} head {h + 1}", top)
    fig.suptitle(_wrap(f"{name or f'image {index}'}: CLS attention per layer and head (colour scale shared along "
                       "each layer)", heads), fontsize=9)
    return save_figure(fig, out)


def plot_distance(dist: torch.Tensor, image_size: int, out: Path, uniform: float | None = None,
                  reference: torch.Tensor | None = None) -> Path:
    """Mean attention distance per layer and head; ``uniform`` (the distance of evenly spread attention) is drawn
    for scale, and ``reference`` (layers, heads), the same heads' attention made query-independent
    (``maps.query_independent_distance``), as the locality reference per layer: a layer reads as local only below
    it (below ``uniform`` alone it may just attend to the image's centre from everywhere)."""
    layers = np.arange(1, dist.shape[0] + 1)
    fig, ax = plt.subplots(figsize=(5.5, 4))
    if uniform is not None:
        ax.axhline(uniform, color="0.4", ls="--", lw=1, label="uniform attention")
    for h in range(dist.shape[1]):
        ax.scatter(layers, dist[:, h].cpu().numpy(), s=12, color="C0", alpha=0.5, label="one head" if h == 0 else None)
    ax.plot(layers, dist.mean(1).cpu().numpy(), "o-", color="C1", label="mean over heads")
    if reference is not None:
        ax.plot(layers, reference.mean(1).cpu().numpy(), "s:", color="C2", label="query-independent reference")
    ax.set(xlabel="layer (network depth)", ylabel="mean attention distance (pixels)", ylim=(0, image_size),
           title="mean attention distance per layer")
    ax.set_xticks(layers)
    ax.legend(fontsize=8)
    return save_figure(fig, out)


def plot_position_similarity(sim: torch.Tensor, out: Path) -> Path:
    """ViT paper figure 7 (centre): one small map per patch, placed at that patch's grid position,
    showing the cosine similarity of its position embedding with every patch's."""
    g = sim.shape[0]
    cell = g + 1  # one blank row/column between maps
    mosaic = np.full((g * cell - 1, g * cell - 1), np.nan)
    for i in range(g):
        for j in range(g):
            mosaic[i * cell:i * cell + g, j * cell:j * cell + g] = sim[i, j].cpu().numpy()
    fig, ax = plt.subplots(figsize=(6, 5.3))
    im = ax.imshow(mosaic, cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
    ticks = np.arange(g) * cell + (g - 1) / 2
    ax.set_xticks(ticks, [str(j + 1) for j in range(g)], fontsize=7)
    ax.set_yticks(ticks, [str(i + 1) for i in range(g)], fontsize=7)
    ax.set(xlabel="input patch column", ylabel="input patch row",
           title="position embeddings: cosine similarity")
    fig.colorbar(im, ax=ax, label="cosine similarity", shrink=0.8)
    return save_figure(fig, out)
