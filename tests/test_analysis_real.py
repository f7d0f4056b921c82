"""analysis/ on a real tiny multirun made by the trainer (`python -m src.train -m ...`, built-in digits data)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from analysis import load_history, load_runs
from analysis.report import make_report
from src.attention.maps import cls_attention
from src.attention.tool import attention_maps, load_model, load_test_split, normalise

ROOT = Path(__file__).resolve().parents[1]
PATCHES = (2, 4)
TINY = ["model=vit", "model.dim=32", "model.depth=2", "model.heads=2", "model.mlp_dim=64", "model.dropout=0.0",
        "dataset=digits", "dataset.n_train=200", "trainer.max_epochs=2", "trainer.batch_size=50",
        "trainer.precision=fp32", "trainer.progress=false", "trainer.device=cpu"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("multirun")
    cmd = [sys.executable, "-m", "src.train", "-m", f"model.patch={','.join(map(str, PATCHES))}", *TINY,
           f"hydra.sweep.dir={out}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_load_runs_round_trips_a_real_multirun(sweep):
    runs = load_runs(sweep)
    assert len(runs) == 2 and list(runs["model.patch"]) == list(PATCHES)
    assert (runs["status"] == "completed").all() and (runs["dataset.n_train"] == 200).all()
    for row in runs.to_dict("records"):
        summary = json.loads((Path(row["run_dir"]) / "summary.json").read_text())
        for key, value in summary.items():
            if key == "stalled":  # the analysis also flags a run that ended at chance for another reason
                at_chance = summary["train_error"] >= summary["chance_train_error"] - 0.01
                assert row["stalled"] == (value or at_chance)
                continue
            if isinstance(value, dict):  # a nested fact (the attention probe's seconds per path): flattened
                for sub, v in value.items():
                    assert row.get(f"{key}.{sub}", row.get(f"summary.{key}.{sub}")) == pytest.approx(v), (key, sub)
                continue
            assert row.get(key, row.get(f"summary.{key}")) == pytest.approx(value), key
        assert Path(row["run_dir"]).parent == sweep.resolve()
    hist = load_history(sweep)
    assert len(hist) == 4 and list(hist["epoch"]) == [1, 2, 1, 2]
    assert list(hist["model.patch"]) == [2, 2, 4, 4]
    last = hist[hist["epoch"] == 2].set_index("model.patch")["test_error"]
    assert list(last) == pytest.approx(list(runs.set_index("model.patch")["test_error"]))


def test_report_on_a_real_multirun(sweep, tmp_path):
    files = make_report([sweep], tmp_path, n_boot=50)
    names = {p.relative_to(tmp_path).as_posix() for p in files}
    assert {"report.md", "tables/results.csv", "figures/results_bars.png", "figures/history.png"} <= names
    for p in files:
        if p.suffix == ".png":
            with Image.open(p) as im:
                im.verify()
    text = (tmp_path / "report.md").read_text()
    assert "Varied keys: `model.patch`." in text and "| 2 |" in text and "| 4 |" in text


@pytest.mark.parametrize("patch", PATCHES)
def test_attention_maps_of_a_trained_vit(sweep, patch):
    run_dir = sweep / str(PATCHES.index(patch))
    model, ckpt = load_model(run_dir)
    raw, labels, _ = load_test_split(run_dir)
    raw, labels = raw[:4], labels[:4]
    x = normalise(raw, ckpt)
    c, h, w = ckpt["data"]["image_shape"]
    assert x.shape == (4, c, h, w) and raw.dtype == torch.uint8 and labels.shape == (4,)
    logits, attns = attention_maps(model, x)
    tokens = 1 + (h // patch) * (w // patch)
    assert len(attns) == 2 and all(a.shape == (4, 2, tokens, tokens) for a in attns)
    for a in attns:
        torch.testing.assert_close(a.sum(-1), torch.ones(4, 2, tokens))
    torch.testing.assert_close(logits, model(x), atol=1e-5, rtol=1e-4)  # explicit attention path == SDPA path
    assert cls_attention(attns).shape == (2, 4, 2, h // patch, w // patch)


# the suite's time: the analysis reads config.json whatever refused the start; the default suite keeps a changed config
@pytest.mark.parametrize("checkpoint, refused_by", [("true", "model.patch=2"),
                                                    pytest.param("false", "label_noise.p=1.5", marks=pytest.mark.slow)])
def test_a_refused_start_in_a_finished_runs_dir_does_not_relabel_that_run(tmp_path, checkpoint, refused_by):
    """Hydra writes `.hydra/config.yaml` before the trainer's checks run, so a start refused in a finished run's
    dir (another config where a checkpoint is kept, or bad input) left the old results under the refused command's
    config: `model.patch=1,2,4,8` into a sweep that held 2, 4, 8 read back patch 2's accuracy as patch 1's. The
    analysis reads the config the run ended under."""
    base = [sys.executable, "-m", "src.train", *TINY, f"trainer.checkpoint={checkpoint}", f"hydra.run.dir={tmp_path}"]
    subprocess.run([*base, "model.patch=4"], cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    refused = subprocess.run([*base, refused_by], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0, refused.stderr[-2000:]
    runs = load_runs(tmp_path)
    assert runs[["model.patch", "label_noise.p"]].values.tolist() == [[4, 0.0]]


def test_a_start_refused_by_its_checks_reads_not_started_not_running(tmp_path):
    """Hydra leaves `.hydra/` and `train.log` in a run dir whose start the trainer's checks refuse; with no summary
    the analysis counted it "running" for ever."""
    refused = subprocess.run([sys.executable, "-m", "src.train", *TINY, "label_noise.p=1.5",
                              f"hydra.run.dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and "label_noise.p" in refused.stderr, refused.stderr[-2000:]
    assert load_runs(tmp_path)["status"].tolist() == ["not started"]
