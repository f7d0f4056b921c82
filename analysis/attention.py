"""Attention maps of a trained ViT run: CLS attention per layer (and head), rollout, mean distance.

    python -m analysis.attention RUN_DIR --images 8 [--per-head] [--out DIR]

The model is rebuilt from the checkpoint's ``model_cfg`` (hydra.utils.instantiate) and the test
images from the run's own dataset config (``src.data.build_data``), normalised as in training.
"""
from __future__ import annotations

import argparse
import inspect
import pickle
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from analysis.figures import save_figure  # noqa: E402


def load_model(run_dir: str | Path, device: str = "cpu") -> tuple[torch.nn.Module, dict]:
    """The run's model in eval mode with its trained weights, and the checkpoint dict."""
    from hydra.utils import instantiate

    path = Path(run_dir) / "checkpoint.pt"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: expected a finished run dir holding checkpoint.pt")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError:
        warnings.warn(f"{path}: not loadable with weights_only=True, loading it in full", stacklevel=2)
        ckpt = torch.load(path, map_location=device, weights_only=False)
    model = instantiate(ckpt["model_cfg"])
    state = {k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()}  # torch.compile prefix
    model.load_state_dict(state)
    return model.to(device).eval(), ckpt


def check_has_attention(model: torch.nn.Module, target: str = "") -> None:
    if "return_attn" not in inspect.signature(model.forward).parameters:
        raise ValueError(
            f"the checkpoint holds a {type(model).__name__} ({target or 'model_cfg._target_'}), which has no "
            "attention maps: the attention tool needs a ViT run (model=vit or model=hybrid_vit), "
            "whose forward(x, return_attn=True) returns (logits, attention per layer)"
        )


def load_test_images(run_dir: str | Path, n: int, ckpt: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The first ``n`` test images of the run's dataset: (normalised float, uint8, labels)."""
    from omegaconf import OmegaConf

    from src.data import build_data

    cfg = OmegaConf.load(Path(run_dir) / ".hydra" / "config.yaml")
    data = build_data(cfg.dataset, int(cfg.seed))
    raw, labels = data.x_test[:n].clone(), data.y_test[:n].clone()
    x = raw.float() / 255.0
    c, h, w = ckpt["data"]["image_shape"]
    if tuple(x.shape[-2:]) != (h, w):  # the loader resizes on the fly when the dataset does not
        x = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False)
    mean = torch.tensor(ckpt["data"]["mean"], dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(ckpt["data"]["std"], dtype=torch.float32).view(1, -1, 1, 1)
    return (x - mean) / std, raw, labels


@torch.no_grad()
def attention_maps(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Logits and one (B, heads, T, T) attention tensor per layer (rows sum to one, CLS first)."""
    check_has_attention(model)
    logits, attns = model(x, return_attn=True)
    return logits, [a.float() for a in attns]


def _grid(num_patches: int) -> int:
    g = int(round(num_patches**0.5))
    if g * g != num_patches:
        raise ValueError(f"{num_patches} patch tokens do not form a square grid")
    return g


def cls_attention(attns: list[torch.Tensor]) -> torch.Tensor:
    """The CLS token's attention to every patch: (layers, B, heads, g, g)."""
    a = torch.stack(attns)[:, :, :, 0, 1:]  # (L, B, heads, T-1)
    g = _grid(a.shape[-1])
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
    g = _grid(r.shape[-1])
    return r.reshape(-1, g, g)


def mean_attention_distance(attns: list[torch.Tensor], patch_size: int) -> torch.Tensor:
    """(layers, heads) mean distance in input pixels between a query patch and the patches it attends
    to, weighted by attention (CLS excluded, weights renormalised over patches), averaged over
    queries and images, as in the ViT paper's analysis."""
    g = _grid(attns[0].shape[-1] - 1)
    ij = torch.stack(torch.meshgrid(torch.arange(g), torch.arange(g), indexing="ij"), -1).reshape(-1, 2).float()
    dist = torch.cdist(ij, ij) * patch_size  # (N, N) pixels between patch centres
    out = []
    for a in attns:
        p = a[:, :, 1:, 1:]  # (B, heads, N, N)
        p = p / p.sum(-1, keepdim=True)
        out.append((p * dist).sum(-1).mean((0, 2)))  # (heads,)
    return torch.stack(out)


def _show(ax, img: np.ndarray, att: np.ndarray | None = None, title: str = "") -> None:
    h, w = img.shape[:2]
    ax.imshow(img, cmap="gray" if img.ndim == 2 else None, extent=(0, w, h, 0))
    if att is not None:
        ax.imshow(att, cmap="inferno", alpha=0.6, extent=(0, w, h, 0), interpolation="bilinear")
    ax.set_title(title, fontsize=7)
    ax.set_xticks([])
    ax.set_yticks([])


def _as_image(raw: torch.Tensor) -> np.ndarray:
    img = raw.permute(1, 2, 0).cpu().numpy()
    return img[..., 0] if img.shape[-1] == 1 else img


def plot_cls_grid(raw: torch.Tensor, cls: torch.Tensor, rollout: torch.Tensor, labels, preds, out: Path) -> Path:
    """Rows = images; columns = input, head-mean CLS attention of each layer, rollout."""
    n, layers = raw.shape[0], cls.shape[0]
    fig, axes = plt.subplots(n, layers + 2, figsize=(1.6 * (layers + 2), 1.7 * n), squeeze=False)
    for i in range(n):
        img = _as_image(raw[i])
        _show(axes[i, 0], img, title=f"label {int(labels[i])}, pred {int(preds[i])}")
        for layer in range(layers):
            _show(axes[i, layer + 1], img, cls[layer, i].mean(0).cpu().numpy(), f"layer {layer + 1} CLS attn")
        _show(axes[i, -1], img, rollout[i].cpu().numpy(), "rollout")
    fig.suptitle("CLS-token attention over the image (mean over heads) and attention rollout", fontsize=9)
    return save_figure(fig, out)


def plot_heads(raw: torch.Tensor, cls: torch.Tensor, index: int, out: Path) -> Path:
    """One image: rows = layers, columns = heads, CLS attention of each."""
    layers, heads = cls.shape[0], cls.shape[2]
    fig, axes = plt.subplots(layers, heads, figsize=(1.5 * heads, 1.5 * layers), squeeze=False)
    img = _as_image(raw[index])
    for layer in range(layers):
        for h in range(heads):
            _show(axes[layer, h], img, cls[layer, index, h].cpu().numpy(), f"layer {layer + 1} head {h + 1}")
    fig.suptitle(f"test image {index}: CLS attention per layer and head", fontsize=9)
    return save_figure(fig, out)


def plot_distance(dist: torch.Tensor, image_size: int, out: Path) -> Path:
    layers = np.arange(1, dist.shape[0] + 1)
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for h in range(dist.shape[1]):
        ax.scatter(layers, dist[:, h].cpu().numpy(), s=12, color="C0", alpha=0.5, label="one head" if h == 0 else None)
    ax.plot(layers, dist.mean(1).cpu().numpy(), "o-", color="C1", label="mean over heads")
    ax.set(xlabel="layer (network depth)", ylabel="mean attention distance (pixels)", ylim=(0, image_size),
           title="mean attention distance per layer")
    ax.set_xticks(layers)
    ax.legend(fontsize=8)
    return save_figure(fig, out)


def run(run_dir: str | Path, images: int = 8, per_head: bool = False, out: str | Path | None = None,
        device: str = "cpu") -> list[Path]:
    """Write the attention figures of ``run_dir`` into ``out`` (default RUN_DIR/attention); return the paths."""
    run_dir = Path(run_dir)
    out = Path(out) if out is not None else run_dir / "attention"
    model, ckpt = load_model(run_dir, device)
    check_has_attention(model, ckpt["model_cfg"].get("_target_", ""))
    x, raw, labels = load_test_images(run_dir, images, ckpt)
    logits, attns = attention_maps(model, x.to(device))
    cls, roll = cls_attention(attns), attention_rollout(attns)
    dist = mean_attention_distance(attns, int(getattr(model, "patch_size", 1)))
    written = [
        plot_cls_grid(raw, cls, roll, labels, logits.argmax(-1), out / "cls_attention.png"),
        plot_distance(dist, int(ckpt["data"]["image_shape"][-1]), out / "attention_distance.png"),
    ]
    if per_head:
        written += [plot_heads(raw, cls, i, out / f"cls_attention_heads_{i}.png") for i in range(raw.shape[0])]
    return written


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m analysis.attention", description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", help="a ViT run dir holding checkpoint.pt and .hydra/config.yaml")
    ap.add_argument("--images", type=int, default=8, help="number of test images (first N of the test split)")
    ap.add_argument("--per-head", action="store_true", help="also one grid per image with every head")
    ap.add_argument("--out", default=None, help="output folder (default RUN_DIR/attention)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    try:
        paths = run(args.run_dir, args.images, args.per_head, args.out, args.device)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"analysis.attention: {e}") from None
    for p in paths:
        print(p)


if __name__ == "__main__":
    main()
