"""The optimizer group: a CNN step size that does not depend on the width, and the removed lr / width rule."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from sklearn.datasets import load_digits

import src.optim
from src.models.cnn import WidthCNN
from src.optim import build_optimizer
from src.trainer import train
from tests.conftest import CONF

WIDTHS = (1, 2, 4, 8, 16, 32)


def _mnist_shaped_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """128 digits resized from 8 x 8 to MNIST's 1 x 28 x 28, standardised as the loader does."""
    d = load_digits()
    x = F.interpolate(torch.tensor(d.images[:128]).float().unsqueeze(1), size=28, mode="bilinear")
    return (x - x.mean()) / x.std(), torch.tensor(d.target[:128]).long()


def _one_step(width: int, seed: int, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(gradient norm at init, mean |logit change|) for one step of the shipped SGD optimizer group."""
    torch.manual_seed(seed)
    model = WidthCNN(28, 1, 10, width=width)
    cfg = OmegaConf.to_container(OmegaConf.load(CONF / "optimizer" / "sgd.yaml"))
    opt = build_optimizer(model, cfg, torch.device("cpu"))
    before = model(x)
    F.cross_entropy(before, y).backward()
    grad = torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item()
    opt.step()
    with torch.no_grad():
        return grad, (model(x) - before.detach()).abs().mean().item()


def test_one_sgd_step_moves_the_logits_alike_at_every_cnn_width(capsys):
    """Defect: dividing the lr by the width (PyTorch's standard parametrisation, where gradients do not shrink
    with width) made the step 32x smaller at C1 = 32, and no wide CNN interpolated. The shipped SGD group must move
    the logits by a similar amount from C1 = 1 to 32 (each width averaged over 3 inits): max / min within 5x, well
    under the defect's 32x (measured 2.97 here; a limit of 3x passed by a float's width on another CPU)."""
    x, y = _mnist_shaped_batch()
    table = {w: [sum(v) / 3 for v in zip(*(_one_step(w, s, x, y) for s in range(3)), strict=True)] for w in WIDTHS}
    with capsys.disabled():
        print("\nC1  grad norm  mean |logit change| after one SGD step (lr 0.05, momentum 0.9)")
        for w, (grad, change) in table.items():
            print(f"{w:>2}  {grad:9.3f}  {change:.5f}")
    changes = [change for _, change in table.values()]
    assert max(changes) / min(changes) < 5.0, table


def test_optim_docstring_quotes_the_gradient_norms_and_step_sizes_measured():
    """src/optim.py's docstring said the CNN's gradient norm at init is "0.12-0.17 on MNIST for C1 = 1 to 32" (no
    committed measurement gives it) and that a constant lr moves the logits "alike" at every width, a word the
    re-measurement (sgd.yaml, docs/benchmarks/README.md: within about 2x to C1 = 32, 3.5x to 64) withdrew. The
    gradient-norm range it quotes must be the one measured on the benchmark's own data (digits at 32 px through the
    trainer's pipeline, 3 initialisations, benchmarks/cnn_step_size.py), and its step sizes sgd.yaml's."""
    from benchmarks.cnn_step_size import build, images, one_step

    doc = " ".join(src.optim.__doc__.split())
    assert "alike" not in doc
    sgd = " ".join(line.lstrip("# ") for line in (CONF / "optimizer" / "sgd.yaml").read_text().splitlines())
    steps = re.search(r"\((0\.\d+-0\.\d+) on MNIST at 32 px", sgd).group(1)
    assert steps in doc
    lo, hi = map(float, re.search(r"gradient norm at init (0\.\d+)-(0\.\d+)", doc).groups())
    x, y = images(None, 1024, 32)
    norms = [sum(one_step(build("standard", w, s, 32), 0.05, x[:128], y[:128])[0] for s in range(3)) / 3
             for w in WIDTHS]
    assert lo - 0.005 <= min(norms) and max(norms) <= hi + 0.005, norms


@pytest.mark.parametrize("value", ["true", "false"])
def test_the_removed_lr_width_rule_fails_before_any_work(tiny_cfg, tmp_path, value):
    cfg = tiny_cfg("model=cnn", "optimizer=sgd", f"+optimizer.scale_lr_by_width={value}")
    with pytest.raises(ValueError, match=r"optimizer.scale_lr_by_width was removed.*constant.*optimizer.lr"):
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
