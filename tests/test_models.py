"""Model shapes, parameter counts and the attention paths."""
from __future__ import annotations

import pytest
import torch

from src.models.cnn import VGGCNN, WidthCNN
from src.models.layers import Attention
from src.models.vit import ViT


def n_params(m):
    return sum(p.numel() for p in m.parameters())


def test_default_vit_has_3_2m_parameters_on_cifar():
    assert n_params(ViT(32, 3, 10, patch=4, dim=256, depth=6, heads=8, mlp_dim=512)) == pytest.approx(3.2e6, abs=0.1e6)


def test_cnn_vgg_has_5_9m_parameters_on_cifar():
    assert n_params(VGGCNN(32, 3, 10)) == pytest.approx(5.9e6, abs=0.1e6)


def test_heads_do_not_change_the_parameter_count():
    counts = {h: n_params(ViT(32, 3, 10, dim=128, depth=2, heads=h, mlp_dim=256)) for h in (1, 2, 4, 8, 16)}
    assert len(set(counts.values())) == 1


def test_width_cnn_channels_follow_c1_2c1_4c1():
    convs = [m for m in WidthCNN(32, 3, 10, width=5).modules() if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [5, 10, 20] and convs[0].kernel_size == (5, 5)


def test_explicit_attention_path_matches_sdpa():
    torch.manual_seed(0)
    attn = Attention(dim=32, heads=4).eval()
    x = torch.randn(3, 17, 32)
    fast, none = attn(x)
    slow, weights = attn(x, return_attn=True)
    assert none is None and torch.allclose(fast, slow, atol=1e-5)
    assert weights.shape == (3, 4, 17, 17) and torch.allclose(weights.sum(-1), torch.ones(3, 4, 17))


def test_vit_returns_attention_per_layer():
    model = ViT(16, 1, 10, patch=4, dim=32, depth=3, heads=2, mlp_dim=64).eval()
    logits, attns = model(torch.randn(2, 1, 16, 16), return_attn=True)
    assert logits.shape == (2, 10) and len(attns) == 3 and attns[0].shape == (2, 2, 17, 17)
    assert torch.allclose(model(torch.zeros(2, 1, 16, 16)), model(torch.zeros(2, 1, 16, 16), return_attn=True)[0], atol=1e-5)


@pytest.mark.parametrize("kwargs, key", [(dict(patch=5), "model.patch=5"), (dict(heads=3), "model.heads=3")])
def test_bad_vit_shapes_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        ViT(32, 3, 10, **{"dim": 64, **kwargs})


@pytest.mark.parametrize("size", [28, 32])
def test_cnns_take_mnist_and_cifar_sizes(size):
    x = torch.randn(2, 1, size, size)
    assert WidthCNN(size, 1, 10, width=3)(x).shape == (2, 10) and VGGCNN(size, 1, 10)(x).shape == (2, 10)
