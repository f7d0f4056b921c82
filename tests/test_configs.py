"""Every option of every config group composes and instantiates."""
from __future__ import annotations

import pytest
import torch

from src.data import build_data
from src.optim import build_optimizer
from src.run_setup import build_model
from tests.conftest import CONF, compose_cfg


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("model", options("model"))
def test_every_model_builds_and_trains_one_step(model):
    cfg = compose_cfg([f"model={model}", "dataset=synthetic", "dataset.num_train=8", "dataset.num_test=4"])
    data = build_data(cfg.dataset, seed=0)
    net, full = build_model(cfg.model, data)
    assert full["image_size"] == 32 and full["in_channels"] == 3 and full["num_classes"] == 10
    opt = build_optimizer(net, cfg.optimizer, torch.device("cpu"))
    x = (data.x_train.float() / 255)
    loss = torch.nn.functional.cross_entropy(net(x), data.y_train)
    loss.backward()
    opt.step()
    assert torch.isfinite(loss) and all(p.grad is not None for p in net.parameters() if p.requires_grad)


@pytest.mark.parametrize("optimizer", options("optimizer"))
def test_every_optimizer_instantiates(optimizer):
    cfg = compose_cfg([f"optimizer={optimizer}", "model=cnn", "model.width=4"])
    net = torch.nn.Linear(3, 2)
    opt = build_optimizer(net, cfg.optimizer, torch.device("cpu"))
    assert type(opt).__name__.lower() == optimizer
    assert opt.param_groups[0]["lr"] == pytest.approx(cfg.optimizer.lr)


def test_vit_init_choices():
    """``model.init=torch`` keeps PyTorch's layer defaults (weights and biases within 1/sqrt(fan_in));
    ``big_vision`` zeroes the biases and draws Xavier-uniform weights; anything else names the key."""
    from src.models.vit import ViT

    kw = dict(image_size=16, in_channels=1, num_classes=10, patch=4, dim=64, depth=1, heads=2, mlp_dim=128)
    torch.manual_seed(0)
    torch_init = ViT(**kw, init="torch").blocks[0].mlp.fc1
    torch.manual_seed(0)
    big_vision = ViT(**kw, init="big_vision").blocks[0].mlp.fc1
    bound = 64 ** -0.5  # PyTorch's Linear: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases
    assert torch_init.weight.abs().max() <= bound and torch_init.bias.abs().max() > 0
    assert big_vision.weight.abs().max() > bound and (big_vision.bias == 0).all()  # Xavier: sqrt(6/192) > 1/8
    with pytest.raises(ValueError, match="model.init='lecun'"):
        ViT(**kw, init="lecun")


@pytest.mark.parametrize("dataset", ["digits", "synthetic"])
def test_embedded_datasets_build(dataset):
    cfg = compose_cfg([f"dataset={dataset}"])
    data = build_data(cfg.dataset, seed=0)
    assert data.x_train.dtype == torch.uint8 and data.x_train.shape[-1] == cfg.dataset.image_size


@pytest.mark.parametrize("group", ["dataset", "scheduler", "label_noise", "trainer"])
def test_every_option_composes(group):
    for option in options(group):
        cfg = compose_cfg([f"{group}={option}"])
        assert cfg[group] is not None


def test_unknown_option_lists_the_valid_ones():
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="Available options"):
        compose_cfg(["model=transformer"])


def test_a_study_file_hydra_did_not_find_fails_before_training(tiny_cfg):
    """``+sweeps=<study>`` without ``--config-dir .`` (or from another folder): Hydra finds no ``sweeps`` group and
    adds ``sweeps: <study>`` as a plain value, so the run trained the defaults (the digits ViT) under the study's
    name without a word. Found running ``python -m src.train +sweeps=double_descent_vit dataset.root=...mnist.npz``."""
    from src.validate import check_config

    cfg = tiny_cfg("+sweeps=double_descent_vit")
    assert cfg.sweeps == "double_descent_vit" and cfg.dataset.name == "digits"  # what Hydra made of it
    with pytest.raises(ValueError, match=r"(?s)sweeps=double_descent_vit.*--config-dir \. \+sweeps=double_descent_vit"):
        check_config(cfg)
