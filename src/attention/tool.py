"""The attention tool: rebuild a ViT run's model and test images, compute the maps, write PNGs and attention.npz."""
from __future__ import annotations

import argparse
import inspect
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from src.attention import maps, plots
from src.checkpoint import load_checkpoint


def load_model(run_dir: str | Path, device: str = "cpu") -> tuple[torch.nn.Module, dict]:
    """The run's model in eval mode with its trained weights, and the checkpoint dict."""
    from hydra.utils import instantiate

    path = Path(run_dir) / "checkpoint.pt"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: expected a finished run dir holding checkpoint.pt "
                                "(trainer.checkpoint=true, the default)")
    ckpt = load_checkpoint(path)
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


def load_test_split(run_dir: str | Path) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """The run's whole test split as built for training (dataset.classes applied): uint8 images, labels,
    class names."""
    from omegaconf import OmegaConf

    from src.data import build_data

    cfg = OmegaConf.load(Path(run_dir) / ".hydra" / "config.yaml")
    data = build_data(OmegaConf.to_container(cfg.dataset, resolve=True), int(cfg.seed))
    names = data.classes or [str(i) for i in range(data.num_classes)]
    return data.x_test, data.y_test, names


def normalise(raw: torch.Tensor, ckpt: dict) -> torch.Tensor:
    """uint8 images -> the model's input: resized to the trained size and normalised as in training."""
    x = raw.float() / 255.0
    c, h, w = ckpt["data"]["image_shape"]
    if tuple(x.shape[-2:]) != (h, w):  # the loader resizes on the fly when the dataset does not
        x = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False)
    mean = torch.tensor(ckpt["data"]["mean"], dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(ckpt["data"]["std"], dtype=torch.float32).view(1, -1, 1, 1)
    return (x - mean) / std


@torch.no_grad()
def attention_maps(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Logits and one (B, heads, T, T) attention tensor per layer (rows sum to one, CLS first); ``model``
    must have attention maps (``check_has_attention``)."""
    logits, attns = model(x, return_attn=True)
    return logits, [a.float() for a in attns]


def class_rank(labels: torch.Tensor) -> torch.Tensor:
    """Each image's position among the images of its class, in index order (0 for the first of a class)."""
    rank = torch.zeros_like(labels)
    for c in labels.unique():
        sel = labels == c
        rank[sel] = torch.arange(int(sel.sum()))
    return rank


def first_per_class(labels: torch.Tensor, per_class: int) -> torch.Tensor:
    """Indices of the first ``per_class`` images of every class, in index order."""
    return torch.nonzero(class_rank(labels) < per_class).flatten()


def spread_over_classes(labels: torch.Tensor, n: int) -> torch.Tensor:
    """``n`` image indices taking turns over the classes: the first image of every class (in index order), then the
    second of every class, and so on; on a shuffled 10-class test split the first 10 are the first 10 images."""
    key = class_rank(labels) * len(labels) + torch.arange(len(labels))
    return torch.argsort(key)[:n]


@torch.no_grad()
def summarise(model, raw: torch.Tensor, ckpt: dict, patch_size: int, batch: int = 256, device: str = "cpu"):
    """Head-mean CLS attention (layers, B, g, g), rollout (B, g, g), the mean attention distance (layers, heads)
    and its query-independent reference (layers, heads) of ``raw`` images, in batches so that the full attention
    tensors stay small."""
    cls, roll, dist, ref = [], [], 0.0, 0.0
    for i in range(0, len(raw), batch):
        _, attns = attention_maps(model, normalise(raw[i:i + batch], ckpt).to(device))
        cls.append(maps.cls_attention(attns).mean(2).cpu())
        roll.append(maps.attention_rollout(attns).cpu())
        dist = dist + maps.mean_attention_distance(attns, patch_size).cpu() * len(attns[0])
        ref = ref + maps.query_independent_distance(attns, patch_size).cpu() * len(attns[0])
    return torch.cat(cls, 1), torch.cat(roll), dist / len(raw), ref / len(raw)


def run(run_dir: str | Path, images: int = 8, per_class: int = 100, per_head: bool = False,
        out: str | Path | None = None, device: str = "cpu") -> list[Path]:
    """Write the attention figures and attention.npz of ``run_dir`` into ``out`` (default RUN_DIR/attention);
    return the paths written."""
    run_dir = Path(run_dir)
    out = Path(out) if out is not None else run_dir / "attention"
    model, ckpt = load_model(run_dir, device)
    check_has_attention(model, ckpt["model_cfg"].get("_target_", ""))
    raw_all, labels_all, names = load_test_split(run_dir)
    patch, side = int(getattr(model, "patch_size", 1)), int(ckpt["data"]["image_shape"][-1])

    shown = spread_over_classes(labels_all, images)
    raw, labels = raw_all[shown], labels_all[shown]
    logits, attns = attention_maps(model, normalise(raw, ckpt).to(device))
    cls, preds = maps.cls_attention(attns).cpu(), logits.argmax(-1).cpu()
    titles = [f"label {names[int(t)]}, pred {names[int(p)]}" for t, p in zip(labels, preds, strict=True)]
    written = [plots.plot_cls_grid(raw, cls, maps.attention_rollout(attns).cpu(), titles, out / "cls_attention.png",
                                   "CLS-token attention over the image (mean over heads) and attention rollout")]
    if per_head:
        written += [plots.plot_heads(raw, cls, i, out / f"cls_attention_heads_{i}.png",
                                     f"test image {int(shown[i])} ({titles[i]})") for i in range(len(raw))]

    idx = first_per_class(labels_all, per_class)
    k = len(names)
    c_cls, c_roll, dist, ref = summarise(model, raw_all[idx], ckpt, patch, device=device)
    lab = labels_all[idx]
    mean_cls, counts = maps.class_means(c_cls.transpose(0, 1), lab, k)  # (K, layers, g, g)
    mean_roll, _ = maps.class_means(c_roll, lab, k)
    mean_img, _ = maps.class_means(raw_all[idx].float(), lab, k)
    shown = counts > 0
    written.append(plots.plot_cls_grid(
        mean_img[shown], mean_cls[shown].transpose(0, 1), mean_roll[shown],
        [f"class {names[c]} (mean of {int(counts[c])})" for c in range(k) if shown[c]],
        out / "cls_attention_class_mean.png",
        f"class-mean CLS attention (mean over heads and up to {per_class} test images per class) and rollout"))
    uniform = maps.uniform_attention_distance(side // patch, patch)
    written.append(plots.plot_distance(dist, side, out / "attention_distance.png", uniform, ref))
    sim = maps.position_similarity(model.pos_embed)
    written.append(plots.plot_position_similarity(sim, out / "position_similarity.png"))
    npz = out / "attention.npz"
    np.savez_compressed(npz, class_names=np.array(names), class_counts=counts.numpy(),
                        class_mean_cls=mean_cls.numpy(), class_mean_rollout=mean_roll.numpy(),
                        mean_distance=dist.numpy(), uniform_distance=uniform, query_independent_distance=ref.numpy(),
                        position_similarity=sim.numpy())
    return [*written, npz]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m src.attention", description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", help="a ViT run dir holding checkpoint.pt and .hydra/config.yaml")
    ap.add_argument("--images", type=int, default=8,
                    help="test images shown one per row, taking turns over the classes (the first of every class, "
                         "then the second, ...)")
    ap.add_argument("--per-class", type=int, default=100,
                    help="test images per class averaged into the class-mean maps and the attention distance")
    ap.add_argument("--per-head", action="store_true", help="also one grid per image with every head")
    ap.add_argument("--out", default=None, help="output folder (default RUN_DIR/attention)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    if args.images < 1 or args.per_class < 1:
        ap.error(f"--images={args.images} and --per-class={args.per_class} must be >= 1")
    try:
        paths = run(args.run_dir, args.images, args.per_class, args.per_head, args.out, args.device)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"src.attention: {e}") from None
    for p in paths:
        print(p)
