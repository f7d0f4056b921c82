"""Pure tensor functions on attention weights and position embeddings (no I/O, no model building)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def grid_side(num_patches: int) -> int:
    g = int(round(num_patches**0.5))
    if g * g != num_patches:
        raise ValueError(f"{num_patches} patch tokens do not form a square grid")
    return g


def cls_attention(attns: list[torch.Tensor]) -> torch.Tensor:
    """The CLS token's attention to every patch: (layers, B, heads, g, g)."""
    a = torch.stack(attns)[:, :, :, 0, 1:]  # (L, B, heads, T-1)
    g = grid_side(a.shape[-1])
    return a.reshape(*a.shape[:-1], g, g)


def attention_rollout(attns: list[torch.Tensor]) -> torch.Tensor:
    """Abnar & Zuidema's rollout: head-mean attention plus identity (the residual), renormalised,
    multiplied through the layers; returns the CLS row over the patches, (B, g, g)."""
    a0 = attns[0]
    eye = torch.eye(a0.shape[-1], dtype=a0.dtype, device=a0.device)
    joint = eye.expand(a0.shape[0], -1, -1)
    for a in attns:
        step = a.mean(1) + eye  # (B, T, T)
        joint = (step / step.sum(-1, keepdim=True)) @ joint
    r = joint[:, 0, 1:]
    g = grid_side(r.shape[-1])
    return r.reshape(-1, g, g)


def patch_distances(grid: int, patch_size: int) -> torch.Tensor:
    """(N, N) distances in pixels between the centres of the ``grid`` x ``grid`` patches, row-major."""
    ij = torch.stack(torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij"), -1).reshape(-1, 2).float()
    return torch.cdist(ij, ij) * patch_size


def mean_attention_distance(attns: list[torch.Tensor], patch_size: int) -> torch.Tensor:
    """(layers, heads) mean distance in input pixels between a query patch and the patches it attends
    to, weighted by attention (CLS excluded, weights renormalised over patches), averaged over
    queries and images, as in the ViT paper's analysis."""
    dist = patch_distances(grid_side(attns[0].shape[-1] - 1), patch_size)
    out = []
    for a in attns:
        p = a[:, :, 1:, 1:]  # (B, heads, N, N)
        p = p / p.sum(-1, keepdim=True)
        out.append((p * dist).sum(-1).mean((0, 2)))  # (heads,)
    return torch.stack(out)


def uniform_attention_distance(grid: int, patch_size: int) -> float:
    """The mean attention distance (pixels) of attention spread evenly over a ``grid`` x ``grid`` patch grid. Not a
    locality reference on its own: a head that attends to the same central patches from every query lies below it
    with no locality at all (14.7 px against 16.5 on 8 x 8 patches of 4 px); see ``query_independent_distance``."""
    return float(patch_distances(grid, patch_size).mean())


def query_independent_distance(attns: list[torch.Tensor], patch_size: int) -> torch.Tensor:
    """(layers, heads) the locality reference of ``mean_attention_distance``: the distance each head would have if
    its attention did not depend on where the query is, i.e. every query attending as the head does on average
    over the image's queries (CLS excluded, renormalised over patches; averaged over queries and images). A head
    reads as local only below this; equal to it, it attends to the same places from everywhere."""
    dist = patch_distances(grid_side(attns[0].shape[-1] - 1), patch_size)
    out = []
    for a in attns:
        p = a[:, :, 1:, 1:]  # (B, heads, N, N)
        p = (p / p.sum(-1, keepdim=True)).mean(2, keepdim=True)  # (B, heads, 1, N): the same for every query
        out.append((p * dist).sum(-1).mean((0, 2)))  # (heads,)
    return torch.stack(out)


def class_means(values: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean of ``values`` (B, ...) over the images of each class: (num_classes, ...) and the counts
    (num_classes,); a class without images gets NaN."""
    onehot = F.one_hot(labels.long(), num_classes).to(values.dtype)  # (B, K)
    counts = onehot.sum(0)
    sums = torch.einsum("bk,b...->k...", onehot, values)
    shape = (-1, *([1] * (values.ndim - 1)))
    return sums / counts.view(shape), counts.long()  # 0 / 0 = NaN for an absent class


def position_similarity(pos_embed: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of each patch's position embedding with every other: (g, g, g, g), where
    ``[i, j]`` is the map of patch (row i, column j) over the grid. ``pos_embed``: (1, 1 + N, dim) with
    the CLS position first (it is left out), or (N, dim)."""
    p = pos_embed.detach().float()
    p = p[0, 1:] if p.ndim == 3 else p  # (N, dim): CLS left out
    g = grid_side(p.shape[0])
    p = F.normalize(p, dim=-1)
    return (p @ p.T).reshape(g, g, g, g)
