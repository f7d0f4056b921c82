"""Why the heads_depth ViTs train slowly: vitsweep's ViT (src.models.vit.ViT: dim 128, 1 head, 1 block, patch 4,
MLP 512, dropout 0.2) against a tutorial-style ViT of nn.TransformerEncoder (pre-norm, the same sizes), 300 AdamW
steps (lr 3e-4, weight decay 0.05, batch 128, constant lr) on 1024 MNIST training images, one thread. Prints
the training loss every 50 steps.

    python docs/studies/heads_depth/scripts/init_probe.py ref|plain|noinit|zerohead [lr] [seed]

plain: vitsweep's ViT as configured (big_vision's initialisation: Xavier-uniform dense layers, LeCun-normal patch
embedding); noinit: the same module with PyTorch's default initialisation; zerohead: plain with a zero head.
"""
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))
from src.models.vit import ViT  # noqa: E402


class Ref(nn.Module):
    """Tutorial-style ViT: conv patches, CLS token, learned positions, pre-norm nn.TransformerEncoder."""

    def __init__(self, dim=128, depth=1, heads=1, mlp=512, patch=4, drop=0.2):
        super().__init__()
        self.pe = nn.Conv2d(1, dim, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, (28 // patch) ** 2 + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, mlp, drop, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.enc = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        t = self.pe(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(len(t), -1, -1), t], 1) + self.pos
        return self.head(self.norm(self.enc(t)[:, 0]))


def main() -> None:
    which = sys.argv[1]
    lr = float(sys.argv[2]) if len(sys.argv) > 2 else 3e-4
    torch.set_num_threads(1)
    torch.manual_seed(int(sys.argv[3]) if len(sys.argv) > 3 else 0)
    d = np.load(ROOT.parent / "shared" / "data" / "mnist.npz")
    idx = np.random.default_rng(0).permutation(60000)[:1024]
    x = (torch.tensor(d["x_train"][idx], dtype=torch.float32).unsqueeze(1) / 255.0 - 0.1307) / 0.3081
    y = torch.tensor(d["y_train"][idx]).long()
    if which == "noinit":
        ViT.init_weights = lambda self, *args, **kwargs: None
    if which == "zerohead":
        base = ViT.init_weights

        def with_zero_head(self, *args, **kwargs):
            base(self, *args, **kwargs)
            nn.init.zeros_(self.head.weight)

        ViT.init_weights = with_zero_head
    model = Ref() if which == "ref" else ViT(28, 1, 10, patch=4, dim=128, depth=1, heads=1, mlp_dim=512,
                                             dropout=0.2, lean=False)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    g = torch.Generator().manual_seed(0)
    step = 0
    while step < 300:
        perm = torch.randperm(1024, generator=g)
        for i in range(0, 1024, 128):
            loss = F.cross_entropy(model(x[perm[i:i + 128]]), y[perm[i:i + 128]])
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step % 50 == 0:
                print(which, step, round(loss.item(), 4), flush=True)


if __name__ == "__main__":
    main()
