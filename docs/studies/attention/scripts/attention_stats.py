"""Numbers behind the attention figures, per run and layer. Reads each run's attention/attention.npz (written by
`python -m src.attention`) and its checkpoint, and writes attention_stats.csv. A forward pass over 200 test
images, no training. Columns:
- mean_distance_px: mean attention distance (mean over heads, from attention.npz), with the value uniform
  attention over the 8x8 patch grid would give (uniform_distance_px);
- eff_patches: exp(entropy) of a patch token's attention over the 64 patches, mean over queries, heads and
  200 test images (64 = uniform);
- ink_corr: correlation over the 64 patches between the class-mean CLS attention and the class-mean ink per
  patch (the 32 px images average-pooled to 8x8), mean over classes;
- ink_share: share of the class-mean CLS attention on the quarter of patches with the most ink (0.25 = no
  preference), mean over classes.

    python docs/studies/attention/scripts/attention_stats.py RUNS_DIR \
        docs/studies/attention/analysis/attention_stats.csv

RUNS_DIR holds one folder per run (a run dir, or a link to one), named as the table's `run` column, each with the
tool's attention/attention.npz.
"""
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))
from src.attention.tool import attention_maps, first_per_class, load_model, load_test_split, normalise  # noqa: E402


def uniform_distance(grid: int, patch: int) -> float:
    ij = torch.stack(torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij"), -1).reshape(-1, 2).float()
    return float((torch.cdist(ij, ij) * patch).mean())


def run_stats(run: Path) -> list[dict]:
    z = np.load(run / "attention" / "attention.npz")
    model, ckpt = load_model(run)
    x, y, _ = load_test_split(run)
    _, attns = attention_maps(model, normalise(x[:200], ckpt))
    idx = first_per_class(y, 100)
    side = ckpt["data"]["image_shape"][-1]
    patch = model.patch_size
    img = F.interpolate(x[idx].float(), size=(side, side), mode="bilinear", align_corners=False)
    ink = F.avg_pool2d(img, patch)[:, 0]  # (B, g, g)
    labels = y[idx]
    k = len(z["class_names"])
    rows = []
    maps = [z["class_mean_cls"][:, layer] for layer in range(z["class_mean_cls"].shape[1])]
    for layer, cls_map in enumerate([*maps, z["class_mean_rollout"]]):
        corr, share = [], []
        for c in range(k):
            m = ink[labels == c].mean(0).numpy().ravel()
            a = cls_map[c].ravel()
            corr.append(np.corrcoef(m, a)[0, 1])
            top = m > np.quantile(m, 0.75)
            share.append(a[top].sum() / a.sum())
        row = {"run": run.name, "layer": layer + 1 if layer < len(maps) else "rollout",
               "ink_corr": np.mean(corr), "ink_share": np.mean(share)}
        if layer < len(maps):
            p = attns[layer][:, :, 1:, 1:]
            p = p / p.sum(-1, keepdim=True)
            ent = -(p.clamp_min(1e-12) * p.clamp_min(1e-12).log()).sum(-1)
            row.update(mean_distance_px=float(z["mean_distance"][layer].mean()),
                       head_distance_px=" ".join(f"{d:.2f}" for d in z["mean_distance"][layer]),
                       uniform_distance_px=uniform_distance(int(len(p[0, 0]) ** 0.5), patch),
                       eff_patches=float(ent.exp().mean()))
        rows.append(row)
    return rows


def main() -> None:
    torch.set_num_threads(1)
    root, out = Path(sys.argv[1]), Path(sys.argv[2])
    runs = sorted(p.parent.parent for p in root.glob("*/attention/attention.npz"))
    if not runs:
        raise SystemExit(f"{root}: no <run>/attention/attention.npz; run `python -m src.attention <run dir>` first")
    table = pd.DataFrame([r for run in runs for r in run_stats(run)])
    table.to_csv(out, index=False, float_format="%.3f")
    print(table.round(3).to_string(index=False))


if __name__ == "__main__":
    main()
