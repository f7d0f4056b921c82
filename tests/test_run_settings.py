"""Settings that a run accepted and then trained meaninglessly (a negative lr, gradient ascent, a warm-up that never
ends): refused before any record, naming the key and the fix."""
from __future__ import annotations

import pytest
import torch

from src.schedule import lr_at
from src.trainer import train


@pytest.mark.parametrize("overrides, message", [
    # the lr ramp never reached optimizer.lr (digits, max_epochs=1, warmup_epochs=5: the run ended at lr 0.2 * lr)
    (["scheduler.warmup_epochs=5"], r"scheduler.warmup_epochs=5 is not shorter than the run \(trainer.max_epochs=1\)"),
    (["scheduler.warmup_epochs=1", "scheduler=constant"], r"scheduler.warmup_epochs=1 is not shorter than the run"),
    # a negative warm-up shifted the cosine: it started part-decayed and never reached its floor
    (["scheduler.warmup_epochs=-1"], r"scheduler.warmup_epochs=-1 must be a number >= 0"),
    # the cosine's floor min_lr_ratio * lr: negative trained the second half at a negative lr (gradient ascent), above
    # 1 the lr rose to min_lr_ratio times the peak summary.json names as base_lr
    (["scheduler.min_lr_ratio=-1"], r"scheduler.min_lr_ratio=-1 must lie in \[0, 1\]"),
    (["scheduler.min_lr_ratio=3"], r"scheduler.min_lr_ratio=3 must lie in \[0, 1\]"),
    # clip_grad_norm_ with a negative norm multiplies every gradient by a negative factor; 0 was read as "off"
    (["trainer.grad_clip=-1"], r"trainer.grad_clip=-1 must be null \(no clipping\) or a number > 0"),
    (["trainer.grad_clip=0"], r"trainer.grad_clip=0 must be null \(no clipping\) or a number > 0"),
    # torch takes a negative smoothing silently and refuses one above 1 only at the first step, after the set-up
    (["trainer.label_smoothing=-0.5"], r"trainer.label_smoothing=-0.5 must lie in \[0, 1\)"),
    (["trainer.label_smoothing=1.5"], r"trainer.label_smoothing=1.5 must lie in \[0, 1\)"),
    # train errors never span a negative band: convergence could never fire, a fixed-budget run under another name
    (["trainer.converge_tol=-1", "trainer.converge_epochs=2"], r"trainer.converge_tol=-1 must be a number >= 0"),
    # a fractional epoch cap set the cosine's horizon at half an epoch and trained the rest of the epoch at lr 0
    (["trainer.max_epochs=0.5"], r"trainer.max_epochs=0.5 must be a whole number >= 1"),
    (["trainer.max_epochs=1.5"], r"trainer.max_epochs=1.5 must be a whole number >= 1"),
    # int(0.5) = 0 images per step: a reshape error deep in the attention probe
    (["trainer.batch_size=0.5"], r"trainer.batch_size=0.5 must be a whole number >= 1"),
    (["trainer.max_epochs=true"], r"trainer.max_epochs=True must be a whole number >= 1"),
    # torch refused these only when the optimizer was built, after the data, the model and the start-up probes, as
    # "Invalid learning rate: -0.1"; a momentum of 1 or more it took (the velocity never decays)
    (["optimizer.lr=-0.1"], r"optimizer.lr=-0.1 must be a number >= 0"),
    (["optimizer.weight_decay=-1"], r"optimizer.weight_decay=-1 must be a number >= 0"),
    (["optimizer=sgd", "optimizer.momentum=1.5"], r"optimizer.momentum=1.5 must lie in \[0, 1\)"),
])
def test_meaningless_run_settings_fail_before_any_record(tiny_cfg, tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        train(tiny_cfg(*overrides), tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_warmup_cut_by_max_steps_fails_before_any_record(tiny_cfg, tmp_path):
    # n_train=200 at batch 50: 4 steps an epoch, so half an epoch of warm-up is the 2-step run's whole length
    with pytest.raises(ValueError, match=r"(?s)scheduler.warmup_epochs=0.5 is 2 steps.*not shorter than the run's 2 "
                                         r"steps \(trainer.max_steps=2, .*lower scheduler.warmup_epochs"):
        train(tiny_cfg("scheduler.warmup_epochs=0.5", "trainer.max_steps=2"), tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_warmup_shorter_than_the_run_still_trains(tiny_cfg, tmp_path):
    summary = train(tiny_cfg("scheduler.warmup_epochs=0.5", "trainer.max_epochs=1"), tmp_path / "run")
    assert summary["status"] == "completed" and summary["steps"] == 4


def test_the_floor_and_warmup_bounds_give_a_schedule_within_the_peak():
    for ratio in (0.0, 0.5, 1.0):
        lrs = [lr_at(s, 1.0, 10, 2, "cosine", ratio) for s in range(10)]
        assert all(ratio - 1e-12 <= lr <= 1.0 for lr in lrs[2:]) and lrs[1] == 1.0


@pytest.mark.parametrize("overrides, message", [
    (["model.patch=3"], r"model.patch=3 does not divide the image size 16"),
    (["model.heads=3"], r"model.heads=3 does not divide model.dim=32"),
    (["model.heads=3", "dataset.image_size=null"], r"model.heads=3 does not divide model.dim=32"),
    (["model=hybrid_vit", "model.stem_stride=8", "dataset.image_size=12"],
     r"model.stem_stride=8 does not divide the image size 12"),
    (["model=hybrid_vit", "model.stem_stride=2", "dataset.image_size=12", "model.heads=5"],
     r"model.heads=5 does not divide model.dim=256"),
    # no block: the CLS token never attends to a patch, so the logits are the same for every image
    (["model.depth=0"], r"model.depth=0 must be a whole number >= 1"),
    (["model=hybrid_vit", "model.depth=-1"], r"model.depth=-1 must be a whole number >= 1"),
])
def test_vit_shapes_fail_before_the_data_is_built(tiny_cfg, monkeypatch, overrides, message):
    # the shapes were checked by the model's constructor, after the data was built (for rsna_mammo at 512 px:
    # after every DICOM was decoded; with dataset.download=true, after the download)
    import src.run_setup

    monkeypatch.setattr(src.run_setup, "build_data", lambda *a, **k: pytest.fail("the data was built first"))
    with pytest.raises(ValueError, match=message):
        src.run_setup.setup(tiny_cfg(*overrides), None)


@pytest.mark.parametrize("p, classes, warns", [(0.7, 2, True), (0.95, 10, True), (0.5, 2, False), (0.9, 10, False),
                                               (0.2, 10, False)])
def test_label_noise_past_random_labels_warns(p, classes, warns):
    # past p = (K - 1) / K (random labels) the true class is the least likely training label: with 2 classes and
    # p = 0.7 the model learns the swapped labels, a run that trains away from the task
    import warnings

    from src.label_noise import apply_label_noise

    labels = torch.arange(1000) % classes
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        noisy, _ = apply_label_noise(labels, p, classes, torch.Generator().manual_seed(0))
    said = [str(w.message) for w in seen if f"label_noise.p={p}" in str(w.message)]
    assert bool(said) == warns
    if warns:
        assert "the true class is the least likely training label" in said[0] and "random labels" in said[0]
        assert (noisy == labels).float().mean() < 1 / classes  # what it warns of


@pytest.mark.parametrize("overrides, message", [
    (["trainer.stalled_margin=-0.1"], r"trainer.stalled_margin=-0.1 must be null \(off\) or lie in \[0, 1\)"),
    (["trainer.stalled_margin=1.5"], r"trainer.stalled_margin=1.5 must be null \(off\) or lie in \[0, 1\)"),
])
def test_bad_stalled_margin_fails_before_any_record(tiny_cfg, tmp_path, overrides, message):
    # below 0 no run could be called stalled (null is the way to say off); 1 or more called every converged run stalled
    with pytest.raises(ValueError, match=message):
        train(tiny_cfg(*overrides), tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize("over, warns", [
    (["trainer.converge_epochs=20", "trainer.max_epochs=10"], True),
    (["trainer.converge_epochs=3", "trainer.eval_every=2", "trainer.max_epochs=4"], True),
    (["trainer.converge_epochs=3", "trainer.eval_every=2", "trainer.max_epochs=5"], False),  # evaluations 2, 4, 5
    (["trainer.converge_epochs=2", "trainer.max_epochs=3"], False),
    (["trainer.converge_epochs=20", "trainer.max_epochs=null", "trainer.max_steps=100"], False),  # unknown up front
])
def test_a_convergence_window_the_cap_never_reaches_warns(tiny_cfg, over, warns):
    import warnings

    from src.validate import check_config

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        check_config(tiny_cfg(*over))
    said = [str(w.message) for w in seen if "trainer.converge_epochs" in str(w.message)]
    assert bool(said) == warns
    if warns:
        assert "can never fire" in said[0] and "trainer.max_epochs" in said[0]


@pytest.mark.parametrize("override, message", [
    # torch's "Input and output sizes should be greater than 0" / "type must be tuple of ints", after the data load
    ("dataset.image_size=0", r"dataset.image_size=0 must be null \(the native size\) or a whole number >= 1"),
    ("dataset.image_size=12.5", r"dataset.image_size=12.5 must be null \(the native size\) or a whole number >= 1"),
    # scikit-learn's train_size message, after the data load; val_size was truncated to 10
    ("dataset.n_train=100.5", r"dataset.n_train=100.5 must be null \(every training image\) or a whole number >= 1"),
    ("dataset.val_size=10.5", r"dataset.val_size=10.5 must be a whole number >= 0"),
    ("dataset.test_size=50.5", r"dataset.test_size=50.5 must be null \(every test image\) or a whole number >= 1"),
])
def test_fractional_dataset_sizes_fail_before_the_data_is_built(tiny_cfg, monkeypatch, override, message):
    import src.run_setup

    monkeypatch.setattr(src.run_setup, "build_data", lambda *a, **k: pytest.fail("the data was built first"))
    with pytest.raises(ValueError, match=message):
        src.run_setup.setup(tiny_cfg(override), None)


def test_a_vit_without_blocks_is_refused_by_its_constructor_too():
    from src.models.vit import ViT

    with pytest.raises(ValueError, match=r"model.depth=0 must be a whole number >= 1"):
        ViT(16, 1, 10, patch=4, dim=32, depth=0, heads=2, mlp_dim=64)


@pytest.mark.parametrize("value", ["off", "no", 1])
def test_a_channels_last_that_is_not_auto_true_or_false_fails_before_any_record(tiny_cfg, tmp_path, value):
    """Review 2026-11-30: ``trainer.channels_last=off`` was read as ``bool("off")``, i.e. on."""
    with pytest.raises(ValueError, match=rf"trainer.channels_last={value!r} must be auto, true or false"):
        train(tiny_cfg(f"trainer.channels_last={value}"), tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_warmup_shorter_than_one_step_says_the_run_has_none(tiny_cfg, tmp_path):
    """Review 2026-11-30: ``warmup_epochs`` times the steps per epoch is rounded down, so 0.1 of a 4-step epoch
    warmed up for 0 steps without a word."""
    with pytest.warns(UserWarning, match=r"scheduler.warmup_epochs=0.1 is 0 steps \(4 steps per epoch\): no warm-up"):
        train(tiny_cfg("scheduler.warmup_epochs=0.1", "trainer.max_steps=1"), tmp_path / "run")


@pytest.mark.parametrize("value", [-1, 0, 1.5])
def test_a_thread_count_that_is_not_a_whole_number_fails_before_any_record(tiny_cfg, tmp_path, value):
    """Review 2026-11-30: ``trainer.num_threads=-1`` failed inside the set-up, in torch's words."""
    with pytest.raises(ValueError, match=rf"trainer.num_threads={value} must be null \(torch's default\) or a whole"):
        train(tiny_cfg(f"trainer.num_threads={value}"), tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
