"""src.attention (the attention tool beside the trainer): planted maps, hand-written checkpoints, a trained run."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from hydra.utils import instantiate
from omegaconf import OmegaConf
from PIL import Image

from src.attention import maps
from src.attention.tool import attention_maps, check_has_attention, load_model, main, run
from src.trainer import train
from tests.conftest import TINY, compose_cfg

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
    assert maps.cls_attention(attns).shape == (3, 5, 2, 4, 4)
    roll = maps.attention_rollout(attns)
    assert roll.shape == (5, 4, 4) and (roll > 0).all() and (roll.sum((1, 2)) < 1).all()


def test_mean_attention_distance_on_planted_maps():
    n = 16  # 4x4 grid of 4-pixel patches, plus CLS
    self_only = torch.zeros(1, 1, n + 1, n + 1)
    self_only[..., 0, 0] = 1
    self_only[..., 1:, 1:] = torch.eye(n)
    uniform = torch.full((1, 1, n + 1, n + 1), 1.0 / (n + 1))
    d = maps.mean_attention_distance([self_only, uniform], patch_size=4)
    assert d.shape == (2, 1)
    assert d[0, 0] == 0  # attending only to yourself integrates nothing from elsewhere
    ij = torch.stack(torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij"), -1).reshape(-1, 2).float()
    expected = 4 * torch.cdist(ij, ij).mean()  # uniform over patches: the mean pairwise distance in pixels
    torch.testing.assert_close(d[1, 0], expected)


def test_rollout_of_identity_attention_keeps_all_mass_on_cls():
    n = 9
    eye = torch.eye(n + 1).expand(2, 3, n + 1, n + 1)
    roll = maps.attention_rollout([eye, eye])  # tokens never mix: CLS keeps all of its own mass
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


def test_class_means_on_planted_values():
    values = torch.arange(12.0).reshape(6, 2)  # image b carries (2b, 2b + 1)
    labels = torch.tensor([0, 2, 0, 2, 2, 0])
    means, counts = maps.class_means(values, labels, 4)
    assert counts.tolist() == [3, 0, 3, 0]
    torch.testing.assert_close(means[0], values[[0, 2, 5]].mean(0))
    torch.testing.assert_close(means[2], values[[1, 3, 4]].mean(0))
    assert torch.isnan(means[1]).all() and torch.isnan(means[3]).all()  # no images: no mean, not zero


def test_position_similarity_on_planted_embeddings():
    g, dim = 3, 8
    rows = torch.eye(dim)[:g]  # patches of one grid row share one embedding, rows are orthogonal
    pos = torch.cat([torch.randn(1, dim), rows.repeat_interleave(g, 0)]).unsqueeze(0)  # (1, 1 + 9, dim), CLS first
    sim = maps.position_similarity(pos)
    assert sim.shape == (g, g, g, g)
    for i in range(g):
        for j in range(g):
            expected = torch.zeros(g, g)
            expected[i] = 1.0  # similar to its whole row, orthogonal to the others
            torch.testing.assert_close(sim[i, j], expected)
    with pytest.raises(ValueError, match="square grid"):
        maps.position_similarity(torch.randn(1, 1 + 6, dim))


def _trained_run(tmp_path: Path, *extra: str) -> Path:
    base = [o for o in TINY if not o.startswith(("model.depth", "trainer.checkpoint", "dataset.n_train"))]
    cfg = compose_cfg([*base, "model.depth=2", "model.patch=4", "dataset=digits", "dataset.n_train=300",
                       "trainer.checkpoint=true", "trainer.num_threads=1", *extra])
    (tmp_path / ".hydra").mkdir(parents=True)
    (tmp_path / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    train(cfg, tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def vit_run(tmp_path_factory) -> Path:
    return _trained_run(tmp_path_factory.mktemp("vit"))


def test_tool_writes_per_image_class_mean_and_position_figures(vit_run, tmp_path, capsys):
    main([str(vit_run), "--images", "3", "--per-class", "5", "--per-head", "--out", str(tmp_path)])
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["attention.npz", "attention_distance.png", "cls_attention.png", "cls_attention_class_mean.png",
                     "cls_attention_heads_0.png", "cls_attention_heads_1.png", "cls_attention_heads_2.png",
                     "position_similarity.png"]
    assert capsys.readouterr().out.count(str(tmp_path)) == 8
    for p in tmp_path.glob("*.png"):
        with Image.open(p) as im:
            im.verify()
            assert min(im.size) > 200
    z = np.load(tmp_path / "attention.npz")
    assert list(z["class_names"]) == [str(i) for i in range(10)] and list(z["class_counts"]) == [5] * 10
    assert z["class_mean_cls"].shape == (10, 2, 4, 4) and z["class_mean_rollout"].shape == (10, 4, 4)  # 16 px / 4
    assert z["mean_distance"].shape == (2, 2) and z["position_similarity"].shape == (4, 4, 4, 4)
    np.testing.assert_allclose(np.einsum("ijij->ij", z["position_similarity"]), 1.0, rtol=1e-5)  # self-similarity


def test_class_mean_map_is_the_mean_of_that_class_s_maps(vit_run, tmp_path):
    from src.attention.tool import load_test_split, normalise

    run(vit_run, images=1, per_class=4, out=tmp_path)
    z = np.load(tmp_path / "attention.npz")
    model, ckpt = load_model(vit_run)
    raw, labels, _ = load_test_split(vit_run)
    sevens = raw[labels == 7][:4]
    _, attns = attention_maps(model, normalise(sevens, ckpt))
    expected = maps.cls_attention(attns).mean(2).mean(1)  # heads, then the 4 images: (layers, g, g)
    np.testing.assert_allclose(z["class_mean_cls"][7], expected.numpy(), rtol=1e-4, atol=1e-6)
    assert (z["class_mean_cls"].sum((-1, -2)) <= 1 + 1e-5).all()  # CLS attention to patches, CLS itself excluded


def test_five_versus_eight_run_gives_two_class_rows(tmp_path):
    run_dir = _trained_run(tmp_path / "run", "dataset.classes=[5,8]", "dataset.n_train=200")
    run(run_dir, images=2, per_class=3, out=tmp_path / "att")
    z = np.load(tmp_path / "att" / "attention.npz")
    assert list(z["class_names"]) == ["5", "8"] and z["class_mean_cls"].shape[0] == 2


def test_cli_reports_a_missing_checkpoint(tmp_path):
    with pytest.raises(SystemExit, match="src.attention: .*checkpoint.pt not found"):
        main([str(tmp_path)])


def test_uniform_attention_distance_is_the_reference_the_figure_draws(tmp_path, monkeypatch):
    """A layer's mean distance reads as local or global only against attention spread evenly over the grid."""
    n = 16
    uniform = torch.full((1, 1, n + 1, n + 1), 1.0 / (n + 1))
    ref = maps.uniform_attention_distance(4, patch_size=4)
    torch.testing.assert_close(torch.tensor(ref), maps.mean_attention_distance([uniform], 4)[0, 0])
    from src.attention import plots

    seen = {}
    monkeypatch.setattr(plots, "save_figure", lambda fig, out: seen.setdefault("fig", fig) and out)
    plots.plot_distance(torch.rand(2, 3) * 8, 16, tmp_path / "d.png", uniform=ref)
    ax = seen["fig"].axes[0]
    assert any(np.allclose(line.get_ydata(), ref) for line in ax.get_lines())
    assert "uniform attention" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_attention_overlays_share_one_colour_scale_per_column(tmp_path, monkeypatch):
    """A flat map must look flat beside a peaked one: each column (a layer, or the rollout) has one scale from 0,
    not one per panel stretched to its own range."""
    from src.attention import plots

    seen = {}
    monkeypatch.setattr(plots, "save_figure", lambda fig, out: seen.setdefault("fig", fig) and out)
    raw = torch.zeros(2, 1, 8, 8, dtype=torch.uint8)
    flat, peaked = torch.full((2, 2), 0.25), torch.tensor([[0.97, 0.01], [0.01, 0.01]])
    cls = torch.stack([flat, peaked])[None]  # (layers=1, rows=2, g, g), head-mean already
    plots.plot_cls_grid(raw, cls, torch.stack([flat, peaked]), ["a", "b"], tmp_path / "g.png", "t")
    axes = np.array(seen["fig"].axes).reshape(2, 3)
    for col in (1, 2):
        limits = [axes[row, col].get_images()[-1].get_clim() for row in range(2)]
        assert limits == [(0.0, pytest.approx(0.97, rel=1e-6))] * 2, limits


def test_shown_images_take_turns_over_the_classes():
    """In a 5-vs-8 run the first test images can all be 5s; the figure shows every class before repeating one."""
    from src.attention.tool import first_per_class, spread_over_classes

    labels = torch.tensor([5, 5, 5, 8, 8, 5])
    assert spread_over_classes(labels, 4).tolist() == [0, 3, 1, 4]
    assert spread_over_classes(torch.tensor([7, 2, 1, 0, 4]), 3).tolist() == [0, 1, 2]  # mixed: the first N
    assert first_per_class(labels, 2).tolist() == [0, 1, 3, 4]


def test_attention_to_central_patches_from_every_query_does_not_read_as_local():
    """A head that attends to the same central patches whatever the query (no locality at all) has a mean distance
    below uniform attention's (14.66 against 16.55 px on the 8 x 8 grid of 4 px patches): below the uniform line is
    not "local". The locality reference is the same head's attention made query-independent (each image's mean
    attention over the queries, seen from every query): a head reads as local only below that."""
    g, n = 8, 64
    central = torch.zeros(g, g)
    central[1:7, 1:7] = 1
    fixed = torch.zeros(1, 1, n + 1, n + 1)
    fixed[..., 0, 0] = 1
    fixed[0, 0, 1:, 1:] = central.flatten() / central.sum()  # every query: the same 36 central patches
    d = maps.mean_attention_distance([fixed], patch_size=4)
    assert d[0, 0] < maps.uniform_attention_distance(g, 4) - 1.5  # the uniform line would call it local
    torch.testing.assert_close(maps.query_independent_distance([fixed], patch_size=4), d)  # not local: equal

    self_only = torch.zeros(1, 1, n + 1, n + 1)
    self_only[..., 0, 0] = 1
    self_only[0, 0, 1:, 1:] = torch.eye(n)  # every query on its own patch: local, every key attended once
    ref = maps.query_independent_distance([self_only], patch_size=4)
    torch.testing.assert_close(ref[0, 0], torch.tensor(maps.uniform_attention_distance(g, 4)))
    assert maps.mean_attention_distance([self_only], patch_size=4)[0, 0] == 0


def test_tool_writes_and_draws_the_query_independent_reference(vit_run, tmp_path, monkeypatch):
    """attention.npz holds the locality reference beside the distances, computed on the same images, and the
    distance figure draws it per layer (the uniform line alone reads attention to the digit's centre as local)."""
    from src.attention import plots
    from src.attention.tool import first_per_class, load_test_split, normalise

    seen = {}
    save = plots.save_figure
    monkeypatch.setattr(plots, "save_figure", lambda fig, out: seen.setdefault(out.name, fig) and save(fig, out))
    run(vit_run, images=1, per_class=3, out=tmp_path)
    z = np.load(tmp_path / "attention.npz")
    model, ckpt = load_model(vit_run)
    raw, labels, _ = load_test_split(vit_run)
    _, attns = attention_maps(model, normalise(raw[first_per_class(labels, 3)], ckpt))
    np.testing.assert_allclose(z["query_independent_distance"], maps.query_independent_distance(attns, 4).numpy(),
                               rtol=1e-4)
    np.testing.assert_allclose(z["mean_distance"], maps.mean_attention_distance(attns, 4).numpy(), rtol=1e-4)
    ax = seen["attention_distance.png"].axes[0]
    drawn = [line for line in ax.get_lines() if line.get_label() == "query-independent reference"]
    assert len(drawn) == 1
    np.testing.assert_allclose(drawn[0].get_ydata(), z["query_independent_distance"].mean(1), rtol=1e-5)
