"""Which ReLU layers of a trained `cnn` (WidthCNN) still fire: for each run dir given, the share of each ReLU
layer's units (channels for the conv layers) that are positive on at least one of the run's own training images,
and the spread of the logits over those images (0: the network answers every image alike, i.e. chance).

    python docs/studies/double_descent_cnn_cifar10/scripts/dead_units.py <sweep dir>/17 <sweep dir>/16 ...

Needs each run's checkpoint.pt (the last one a run wrote) and its dataset (the path recorded in its config).
"""

import sys
from pathlib import Path

import torch
from torch import nn

from src.data import build_data
from src.models.cnn import WidthCNN


def relu_activity(run_dir: Path, n_images: int = 2048) -> tuple[int, int, list[float], float]:
    ck = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=False)
    cfg = ck["config"]
    data = build_data(cfg["dataset"], seed=int(cfg["seed"]))  # the run's own training images (src.run_setup)
    width = ck["model"]["features.0.weight"].shape[0]
    model = WidthCNN(data.image_shape[-1], data.image_shape[0], data.num_classes, width)
    model.load_state_dict(ck["model"])
    model.eval()
    mean = torch.tensor(data.mean).view(1, -1, 1, 1)
    std = torch.tensor(data.std).view(1, -1, 1, 1)
    h = (data.x_train[:n_images].float() / 255 - mean) / std
    active = []
    with torch.no_grad():
        for layer in [*model.features, *model.head]:
            h = layer(h)
            if isinstance(layer, nn.ReLU):
                fired = h > 0
                fired = fired.flatten(2).any(2) if fired.dim() == 4 else fired
                active.append(float(fired.any(0).float().mean()))
    return width, int(ck["epoch"]), active, float(h.std(0).mean())


if __name__ == "__main__":
    print("run  C1  epoch  units active per ReLU layer (conv1, conv2, conv3, head)  logit std over images")
    for arg in sys.argv[1:]:
        width, epoch, active, spread = relu_activity(Path(arg))
        print(f"{Path(arg).name:>4} {width:>3} {epoch:>6}  {' '.join(f'{a:.2f}' for a in active):<52} {spread:.3f}")
