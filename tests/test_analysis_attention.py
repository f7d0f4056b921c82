"""analysis.attention on checkpoints written in the run-directory contract's format."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from hydra.utils import instantiate

from analysis.attention import (attention_maps, attention_rollout, check_has_attention, cls_attention, load_model,
                                mean_attention_distance, run)

VIT = {"_target_": "src.models.vit.ViT", "image_size": 16, "in_channels": 1, "num_classes": 3, "patch": 4,
       "dim": 16, "depth": 3, "heads": 2, "mlp_dim": 32, "dropout": 0.0}
CNN = {"_target_": "src.models.cnn.WidthCNN", "image_size": 16, "in_channels": 1, "num_classes": 3, "width": 2}


def write_checkpoint(run_dir: Path, model_cfg: dict) -> torch.nn.Module:
    torch.manual_seed(0)
    model = instantiate(model_cfg)
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"seed": 0, "dataset": {"name": "synthetic"}}))
    torch.save({"model": model.state_dict(), "optimizer": {}, "model_cfg": model_cfg, "epoch": 1, "step": 1,
                "data": {"mean": (0.5,), "std": (0.25,), "image_shape": (1, 16, 16), "num_classes": 3}},
               run_dir / "checkpoint.pt")
    return model


def test_checkpoint_round_trip_and_attention_shapes(tmp_path):
    original = write_checkpoint(tmp_path, VIT)
    model, ckpt = load_model(tmp_path)
    x = torch.randn(5, 1, 16, 16)
    logits, attns = attention_maps(model, x)
    torch.testing.assert_close(logits, original.eval()(x))  # trained weights restored
    torch.testing.assert_close(logits, model(x), atol=1e-5, rtol=1e-5)  # explicit path == SDPA path
    assert len(attns) == 3 and all(a.shape == (5, 2, 17, 17) for a in attns)  # T = 1 + (16/4)^2
    for a in attns:
        torch.testing.assert_close(a.sum(-1), torch.ones(5, 2, 17))
        assert (a >= 0).all()
    assert cls_attention(attns).shape == (3, 5, 2, 4, 4)
    roll = attention_rollout(attns)
    assert roll.shape == (5, 4, 4) and (roll > 0).all() and (roll.sum((1, 2)) < 1).all()


def test_mean_attention_distance_on_planted_maps():
    n = 16  # 4x4 grid of 4-pixel patches, plus CLS
    self_only = torch.zeros(1, 1, n + 1, n + 1)
    self_only[..., 0, 0] = 1
    self_only[..., 1:, 1:] = torch.eye(n)
    uniform = torch.full((1, 1, n + 1, n + 1), 1.0 / (n + 1))
    d = mean_attention_distance([self_only, uniform], patch_size=4)
    assert d.shape == (2, 1)
    assert d[0, 0] == 0  # attending only to yourself integrates nothing from elsewhere
    ij = torch.stack(torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij"), -1).reshape(-1, 2).float()
    expected = 4 * torch.cdist(ij, ij).mean()  # uniform over patches: the mean pairwise distance in pixels
    torch.testing.assert_close(d[1, 0], expected)


def test_rollout_of_identity_attention_keeps_all_mass_on_cls():
    n = 9
    eye = torch.eye(n + 1).expand(2, 3, n + 1, n + 1)
    roll = attention_rollout([eye, eye])  # tokens never mix: CLS keeps all of its own mass
    assert roll.shape == (2, 3, 3) and torch.count_nonzero(roll) == 0


def test_model_without_attention_gets_a_clear_error(tmp_path):
    write_checkpoint(tmp_path, CNN)
    model, _ = load_model(tmp_path)
    with pytest.raises(ValueError, match="WidthCNN.*no attention maps.*ViT"):
        check_has_attention(model)
    with pytest.raises(ValueError, match="no attention maps"):
        run(tmp_path, images=2, out=tmp_path / "att")


def test_missing_checkpoint_says_what_was_expected(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint.pt"):
        load_model(tmp_path)
