"""Diagnostic for the cnn_vgg run of this study: its accuracy with the BatchNorm running statistics it was
evaluated with, then with those statistics recomputed from its training images (no gradient step, the
weights are unchanged). Inference only, one thread.

    python docs/studies/vit_vs_cnn/scripts/bn_recalibration.py RUN_DIR
"""
import sys

import torch
from hydra.utils import instantiate

from src.data import build_data

torch.set_num_threads(1)
ck = torch.load(f"{sys.argv[1]}/checkpoint.pt", weights_only=True, map_location="cpu")
cfg = ck["config"]
data = build_data(cfg["dataset"], seed=cfg["seed"])  # the run's own training subset and test split
model = instantiate(ck["model_cfg"])
model.load_state_dict(ck["model"])
mean = torch.tensor(data.mean).view(1, -1, 1, 1) * 255
std = torch.tensor(data.std).view(1, -1, 1, 1) * 255


def forward(x):
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # as trained: precision=auto -> bf16
        return model((x.float() - mean) / std)


def accuracy(x, y):
    model.eval()
    return sum((forward(x[i:i + 500]).argmax(1) == y[i:i + 500]).sum().item() for i in range(0, len(y), 500)) / len(y)


def report(label):
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    print(f"{label}: train acc {accuracy(data.x_train, data.y_train):.4f}, test acc "
          f"{accuracy(data.x_test, data.y_test):.4f}; BN running_var means "
          + ", ".join(f"{b.running_var.mean().item():.4f}" for b in bns))


report(f"as trained ({ck['step']} steps, eval mode)")
for m in model.modules():
    if isinstance(m, torch.nn.BatchNorm2d):
        m.reset_running_stats()
        m.momentum = None  # cumulative average over the batches below
model.train()
for i in range(0, len(data.y_train), 125):  # the training batch size 128 would leave a short last batch
    forward(data.x_train[i:i + 125])
report(f"BN statistics recomputed on the {len(data.y_train):,} training images (no augmentation)")
