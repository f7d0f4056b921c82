"""Epochs until a ViT leaves chance, per initialisation (model.init), on 1024 MNIST images at 32 px, AdamW lr 1e-3
constant, batch 128, no dropout, 1,000 test images, one thread; prints the first epochs at <= 85% and <= 50% train
error and the final (epoch, train error, test error). The full per-epoch record is the run dir's metrics.jsonl.

    python docs/studies/heads_depth/scripts/init_epochs_at_chance.py INIT ARCH SEED [EPOCHS [RUN_DIR]]

INIT: big_vision | torch | uva (torch layers plus N(0, 1) CLS token and positions, as the UvA ViT tutorial's
torch.randn); ARCH: h1_d1 (dim 128, 1 head, 1 layer) | h4_d3_d32 (dim 32, 4 heads, 3 layers)."""
import json
import sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from torch import nn

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))
from src.models.vit import ViT  # noqa: E402
from src.trainer import train  # noqa: E402

init, arch, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
epochs = int(sys.argv[4]) if len(sys.argv) > 4 else 40
if init == "uva":
    base = ViT.init_weights

    def uva(self, init="torch"):
        base(self, "torch")
        nn.init.normal_(self.pos_embed, std=1.0)
        nn.init.normal_(self.cls_token, std=1.0)
    ViT.init_weights = uva
ARCH = {"h1_d1": ["model.dim=128", "model.heads=1", "model.depth=1", "model.mlp_dim=256"],
        "h4_d3_d32": ["model.dim=32", "model.heads=4", "model.depth=3", "model.mlp_dim=64"]}[arch]
ov = ["dataset=mnist", f"dataset.root={ROOT.parent / 'shared' / 'data' / 'mnist.npz'}", "dataset.image_size=32",
      "dataset.n_train=1024",
      "dataset.test_size=1000", *ARCH, "model.dropout=0.0", f"model.init={'torch' if init == 'uva' else init}",
      "optimizer.lr=1e-3", "scheduler=constant", "trainer.batch_size=128", f"trainer.max_epochs={epochs}",
      "trainer.progress=false", "trainer.checkpoint=false", "trainer.num_threads=1", f"seed={seed}",
      "trainer.stalled_margin=null"]
with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
    cfg = compose(config_name="config", overrides=ov)
run = Path(sys.argv[5] if len(sys.argv) > 5 else f"/tmp/init_probe/{init}_{arch}_s{seed}")
run.mkdir(parents=True, exist_ok=True)
torch.manual_seed(seed)
s = train(cfg, str(run), None)
rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
errs = [(r["epoch"], r["train_error"], r.get("test_error")) for r in rows if "train_error" in r]
left = next((e for e, tr, _ in errs if tr <= 0.85), None)
half = next((e for e, tr, _ in errs if tr <= 0.5), None)
print(json.dumps({"init": init, "arch": arch, "seed": seed, "left_chance_epoch(tr<=0.85)": left,
                  "tr<=0.5_epoch": half, "final": errs[-1], "wall_s": s.get("wall_s")}), flush=True)
