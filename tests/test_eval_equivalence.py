"""Evaluation: the fast path records the same metrics as a plain reference evaluation, and
``trainer.test_every`` scores the test split only where due, always at the final evaluation."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from src.checkpoint import config_differences
from src.loop import evaluation_row, train_epoch
from src.run_setup import plain_config, setup
from src.stop_signal import StopSignal
from src.trainer import train

CNN = ["model=cnn", "model.width=4", "optimizer=sgd", "optimizer.lr=0.05", "scheduler=constant",
       "label_noise.p=0.4", "dataset.n_train=300", "trainer.batch_size=64"]


class _NoBar:
    def update(self, *a):
        pass

    def set_postfix(self, **k):
        pass


def reference(model, x_uint8, labels, mean, std, clean=None, flipped=None) -> dict[str, float]:
    """Metrics computed the plain way: every image normalised, one forward pass each in float64 numpy."""
    model.eval()
    x = (x_uint8.float() / 255.0 - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)
    with torch.no_grad():
        logits = torch.cat([model(x[i:i + 1]) for i in range(len(x))]).double().numpy()
    logp = logits - logits.max(1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(1, keepdims=True))
    pred, y = logits.argmax(1), labels.numpy()
    out = {"loss": -logp[np.arange(len(y)), y].mean(), "error": float((pred != y).mean())}
    out["acc"] = 1 - out["error"]
    if clean is not None:
        yc, f = clean.numpy(), flipped.numpy()
        out.update(loss_clean=-logp[np.arange(len(yc)), yc].mean(), error_clean=float((pred != yc).mean()),
                   error_noisy_subset=float((pred[f] != y[f]).mean()))
    return out


@pytest.mark.parametrize("eval_batch", [7, 1024])
def test_evaluation_row_matches_a_plain_reference(tiny_cfg, eval_batch):
    state = setup(tiny_cfg(*CNN, f"trainer.eval_batch_size={eval_batch}"), None)
    train_epoch(state, StopSignal(), _NoBar())
    row = evaluation_row(state, 0, 1.0)
    d = state.data
    y_clean, flipped = state.train_eval_clean
    ref_train = reference(state.model, d.x_train.cpu(), d.y_train.cpu(), d.mean, d.std, y_clean, flipped)
    ref_test = reference(state.model, d.x_test.cpu(), d.y_test.cpu(), d.mean, d.std)
    for split, ref in (("train", ref_train), ("test", ref_test)):
        for k, v in ref.items():
            assert row[f"{split}_{k}"] == pytest.approx(v, abs=1e-5), f"{split}_{k}"
    # label noise is in effect, so the clean-label metrics are a different measurement
    assert flipped.any() and row["train_error_clean"] != row["train_error"]
    assert 0.0 < row["train_error_noisy_subset"] <= 1.0


def test_evaluation_draws_no_random_numbers_and_leaves_the_loader(tiny_cfg):
    state = setup(tiny_cfg(*CNN), None)
    train_epoch(state, StopSignal(), _NoBar())
    rng, loader = torch.get_rng_state(), state.train_loader.state_dict()
    evaluation_row(state, 0, 1.0, final=True)
    assert torch.equal(rng, torch.get_rng_state())
    after = state.train_loader.state_dict()
    assert torch.equal(loader["gen"], after["gen"]) and loader["batch"] == after["batch"]


def rows_of(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_test_every_scores_the_test_split_when_due_and_at_the_end(tiny_cfg, tmp_path):
    summary = train(tiny_cfg(*CNN, "trainer.max_epochs=5", "trainer.test_every=2"), tmp_path)
    rows = rows_of(tmp_path)
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4, 5]
    assert [("test_error" in r) for r in rows] == [False, True, False, True, True]  # 2, 4 and the final 5
    assert all("train_error" in r and "train_error_clean" in r for r in rows)
    assert summary["test_error"] == rows[-1]["test_error"] == summary["objective"]
    assert summary["best_test_error"] == min(r["test_error"] for r in rows if "test_error" in r)


def test_test_every_gives_the_same_final_metrics(tiny_cfg, tmp_path):
    every = train(tiny_cfg(*CNN, "trainer.max_epochs=3"), tmp_path / "every")
    final = train(tiny_cfg(*CNN, "trainer.max_epochs=3", "trainer.test_every=null"), tmp_path / "final")
    assert [("test_error" in r) for r in rows_of(tmp_path / "final")] == [False, False, True]
    for k in ("test_error", "test_loss", "train_error", "train_error_clean", "train_loss"):
        assert final[k] == every[k], k


def test_a_convergence_stop_scores_the_test_split(tiny_cfg, tmp_path):
    # lr 0 freezes the model: the train error is constant, so the run converges after 2 epochs
    summary = train(tiny_cfg(*CNN, "trainer.max_epochs=50", "trainer.converge_epochs=2", "optimizer.lr=0",
                             "trainer.stalled_margin=null", "trainer.test_every=null"), tmp_path)
    rows = rows_of(tmp_path)
    assert summary["stop_reason"] == "converged" and len(rows) == 3
    assert "test_error" in rows[-1] and all("test_error" not in r for r in rows[:-1])
    assert summary["test_error"] == rows[-1]["test_error"] == summary["objective"]


def test_the_pruner_sees_only_scored_objectives(tiny_cfg, tmp_path):
    seen = []
    train(tiny_cfg(*CNN, "trainer.max_epochs=5", "trainer.test_every=2"), tmp_path,
          reporter=lambda value, epoch: seen.append((epoch, value)) and False)
    assert [e for e, _ in seen] == [2, 4]  # epoch 5 stops the run: no report then
    assert all(v == v for _, v in seen)  # never NaN


@pytest.mark.parametrize("overrides", [("trainer.test_every=3", "trainer.eval_every=2"), ("trainer.test_every=0",),
                                       ("trainer.test_every=1.5",)])
def test_bad_test_every_fails_naming_the_key(tiny_cfg, tmp_path, overrides):
    with pytest.raises(ValueError, match=r"trainer\.test_every=.*multiple of trainer\.eval_every"):
        train(tiny_cfg(*CNN, *overrides), tmp_path)
    assert not (tmp_path / "metrics.jsonl").exists()


def test_test_every_1_scores_every_evaluation_whatever_eval_every(tiny_cfg, tmp_path):
    train(tiny_cfg(*CNN, "trainer.max_epochs=4", "trainer.eval_every=2"), tmp_path)
    assert [(r["epoch"], "test_error" in r) for r in rows_of(tmp_path)] == [(2, True), (4, True)]


def test_eval_settings_may_change_on_resume(tiny_cfg):
    a = plain_config(tiny_cfg(*CNN))
    b = plain_config(tiny_cfg(*CNN, "trainer.eval_batch_size=64", "trainer.test_every=null"))
    assert config_differences(a, b) == []


def test_history_figure_draws_sparse_test_rows_as_lines(tmp_path, monkeypatch):
    import pandas as pd

    from analysis import figures

    hist = pd.DataFrame({"epoch": [1, 2, 3, 4], "w": 1, "train_error": [0.5, 0.4, 0.3, 0.2],
                         "train_loss": [1.0, 0.9, 0.8, 0.7], "test_error": [np.nan, 0.45, np.nan, 0.35],
                         "test_loss": [np.nan, 1.1, np.nan, 1.0]})
    drawn = []
    real = figures.save_figure
    monkeypatch.setattr(figures, "save_figure", lambda fig, out: drawn.extend(fig.axes[0].lines) or real(fig, out))
    figures.plot_history(hist, ["w"], tmp_path / "h.png")
    test_line = next(line for line in drawn if line.get_label().endswith("(test)"))
    assert list(test_line.get_xdata()) == [2, 4]  # the scored epochs, joined (NaN gaps would hide them)


def test_reference_sees_label_noise_alone():
    """The reference itself: with the clean labels equal to the trained ones, clean and noisy metrics agree."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    x, y = torch.randint(0, 255, (20, 1, 2, 2), dtype=torch.uint8), torch.randint(0, 3, (20,))
    r = reference(model, x, y, [0.5], [0.25], y, torch.ones(20, dtype=torch.bool))
    assert r["loss"] == pytest.approx(r["loss_clean"]) and r["error"] == r["error_clean"] == r["error_noisy_subset"]
    logits = model((x.float() / 255 - 0.5) / 0.25)
    assert r["loss"] == pytest.approx(F.cross_entropy(logits, y).item(), abs=1e-6)
