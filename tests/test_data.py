"""Datasets: layouts, caching, stratified subsets, label noise, batch augmentation."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from src.data import build_data, stratified_subset
from src.data.augment import augment
from src.data.loader import Loader
from src.label_noise import apply_label_noise
from tests.conftest import shared_npz


def _arrays(n=60, size=8, channels=3, seed=0):
    g = np.random.default_rng(seed)
    return g.integers(0, 256, (n, size, size, channels), dtype=np.uint8), np.arange(n) % 3


def test_npz_layout_loads_and_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("VITSWEEP_CACHE", str(tmp_path / "cache"))
    x, y = _arrays()
    np.savez(tmp_path / "toy.npz", x_train=x, y_train=y, x_test=x[:12], y_test=y[:12])
    cfg = dict(name="cifar10", root=str(tmp_path / "toy.npz"), image_size=None)
    data = build_data(cfg)
    assert data.x_train.shape == (60, 3, 8, 8) and torch.equal(data.x_train[5], torch.from_numpy(x[5]).permute(2, 0, 1))
    assert list((tmp_path / "cache").glob("vitsweep-cifar10-*.pt")), "the first load writes a tensor cache"
    again = build_data(cfg)
    assert torch.equal(again.x_train, data.x_train) and torch.equal(again.y_test, data.y_test)


def test_folder_layout_loads(tmp_path):
    x, y = _arrays(n=12, channels=1)
    for split in ("train", "test"):
        for i, (img, label) in enumerate(zip(x, y, strict=True)):
            d = tmp_path / split / f"class{label}"
            d.mkdir(parents=True, exist_ok=True)
            Image.fromarray(img[..., 0]).save(d / f"{i}.png")
    data = build_data(dict(name="mnist", root=str(tmp_path), image_size=16))
    assert data.x_train.shape == (12, 1, 16, 16) and data.num_classes == 3
    assert data.classes == ["class0", "class1", "class2"]


def test_empty_root_names_the_accepted_layouts(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"dataset.root=.*\.npz.*train/<class>.*internet"):
        build_data(dict(name="cifar10", root=str(tmp_path / "nothing")))


def test_stratified_subset_keeps_class_proportions():
    labels = np.repeat(np.arange(10), [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000])
    chosen, rest = stratified_subset(labels, 550, seed=3)
    counts = np.bincount(labels[chosen], minlength=10)
    assert len(chosen) == 550 and len(set(chosen) & set(rest)) == 0
    assert np.abs(counts - np.arange(1, 11) * 10).max() <= 1
    assert np.array_equal(chosen, stratified_subset(labels, 550, seed=3)[0])
    assert not np.array_equal(chosen, stratified_subset(labels, 550, seed=4)[0])


def test_n_train_and_val_size_split_digits_without_overlap():
    data = build_data(dict(name="digits", image_size=8, n_train=300, val_size=200), seed=1)
    assert len(data.y_train) == 300 and len(data.y_val) == 200
    train_rows = {tuple(r) for r in data.x_train.flatten(1).tolist()}
    val_rows = {tuple(r) for r in data.x_val.flatten(1).tolist()}
    assert len(train_rows & val_rows) <= 5  # digits has a few duplicate images


def test_too_large_n_train_plus_val_fails_with_the_keys():
    with pytest.raises(ValueError, match=r"dataset.n_train=1400 \+ dataset.val_size=100 exceeds the 1437"):
        build_data(dict(name="digits", image_size=8, n_train=1400, val_size=100))


def test_label_noise_rate_never_same_class_and_seeded():
    labels = torch.arange(10_000) % 10
    noisy, flipped = apply_label_noise(labels, 0.2, 10, torch.Generator().manual_seed(0))
    assert abs(flipped.float().mean().item() - 0.2) < 0.01
    assert torch.equal(flipped, noisy != labels), "a flipped label always moves to a different class"
    again, _ = apply_label_noise(labels, 0.2, 10, torch.Generator().manual_seed(0))
    assert torch.equal(noisy, again)
    other, _ = apply_label_noise(labels, 0.2, 10, torch.Generator().manual_seed(1))
    assert not torch.equal(noisy, other)
    new_classes = noisy[flipped]
    assert torch.bincount(new_classes, minlength=10).min() > 100, "replacement classes are spread uniformly"


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5])
def test_label_noise_outside_unit_interval_fails(p):
    with pytest.raises(ValueError, match=r"label_noise.p"):
        apply_label_noise(torch.zeros(4, dtype=torch.long), p, 10, torch.Generator())


@pytest.mark.parametrize("kind", ["none", "flip_crop", "resized_crop", "translate"])
def test_batch_augmentation_keeps_shape_and_is_seeded(kind):
    x = torch.randn(16, 3, 32, 32)
    a = augment(x, kind, torch.Generator().manual_seed(0))
    b = augment(x, kind, torch.Generator().manual_seed(0))
    assert a.shape == x.shape and torch.equal(a, b)
    if kind != "none":
        assert not torch.equal(a, x)


def test_flip_crop_moves_pixels_by_whole_pixels():
    x = torch.zeros(64, 1, 8, 8)
    x[:, :, 3, 3] = 1.0
    out = augment(x, "flip_crop", torch.Generator().manual_seed(0))
    assert set(out.unique().tolist()) <= {0.0, 1.0}, "integer shifts: no interpolation"
    assert out.sum((1, 2, 3)).sum() > 32, "most images keep the dot (shifts are at most 4 pixels)"
    assert len({tuple(img.nonzero()[0].tolist()) for img in out if img.any()}) > 5, "shifts vary per image"


def test_loader_normalises_and_covers_an_epoch():
    x = torch.randint(0, 256, (100, 1, 4, 4), dtype=torch.uint8)
    y = torch.arange(100)
    loader = Loader(x, y, 32, torch.device("cpu"), mean=(0.5,), std=(0.25,), shuffle=True, seed=0)
    seen = torch.cat([yb for _, yb in loader])
    assert len(loader) == 4 and sorted(seen.tolist()) == list(range(100))
    xb, yb = next(iter(Loader(x, y, 100, torch.device("cpu"), mean=(0.5,), std=(0.25,))))
    assert torch.allclose(xb, (x.float() / 255 - 0.5) / 0.25, atol=1e-5)


def test_real_mnist_npz_loads():
    data = build_data(dict(name="mnist", root=str(shared_npz("mnist")), image_size=32, n_train=1000))
    assert data.x_train.shape == (1000, 1, 32, 32) and data.x_test.shape == (10000, 1, 32, 32)
    assert data.mean[0] == pytest.approx(0.1307, abs=0.02)


def test_classes_subset_relabels_in_the_given_order_before_n_train_and_val(tmp_path):
    x, y = _arrays(n=90, channels=1)  # labels 0, 1, 2 repeating, 30 each
    x[:, 0, 0, 0] = y  # each image carries its original label in one pixel
    np.savez(tmp_path / "toy.npz", x_train=x, y_train=y, x_test=x[:30], y_test=y[:30])
    data = build_data(dict(name="mnist", root=str(tmp_path / "toy.npz"), classes=[2, 0], n_train=20, val_size=10))
    assert data.num_classes == 2 and data.classes == ["2", "0"]
    assert data.info == {"classes": [2, 0], "class_names": ["2", "0"]}
    assert len(data.y_train) == 20 and len(data.y_val) == 10  # both taken from the 60 images of classes 2 and 0
    for xs, ys in ((data.x_train, data.y_train), (data.x_val, data.y_val), (data.x_test, data.y_test)):
        orig = xs[:, 0, 0, 0].long()
        assert set(orig.tolist()) == {0, 2} and torch.equal(ys, (orig == 0).long())  # 2 -> 0, 0 -> 1
    assert torch.bincount(data.y_train).tolist() == [10, 10]  # stratified within the chosen classes
    assert len(data.y_test) == 20


def test_classes_by_name_and_on_every_labelled_dataset():
    data = build_data(dict(name="digits", image_size=8, classes=[5, 8]))
    assert data.num_classes == 2 and set(data.y_train.unique().tolist()) == {0, 1}
    assert len(data.y_test) == 72  # 36 test images of each digit
    syn = build_data(dict(name="synthetic", num_train=200, num_test=50, image_size=8, channels=1, num_classes=4,
                          classes=["3", "1"]))
    assert syn.num_classes == 2 and syn.info["classes"] == [3, 1] and syn.y_train.max() == 1


@pytest.mark.parametrize(("classes", "match"), [
    ([5, 12], r"dataset.classes=\[5, 12\]: 12 is not a class of dataset=digits, which has labels 0..9"),
    ([5, 5], r"dataset.classes=\[5, 5\] repeats 5.*e.g. dataset.classes=\[5,8\]"),
    ([5], r"selects 1 class; a classifier needs >= 2"),
    (5, r"dataset.classes=5 is not a list"),
    (["cat", 1], r"'cat' is not a class of dataset=digits"),
])
def test_bad_classes_fail_naming_the_key(classes, match):
    with pytest.raises(ValueError, match=match):
        build_data(dict(name="digits", image_size=8, classes=classes))


def test_classes_recorded_in_the_summary(tiny_cfg, tmp_path):
    import json

    from src.trainer import train

    train(tiny_cfg("dataset=digits", "dataset.classes=[5,8]", "dataset.n_train=100"), tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["classes"] == [5, 8] and summary["class_names"] == ["5", "8"]
    assert summary["n_train"] == 100


def test_classes_shape_checked_before_any_data_is_loaded(tiny_cfg):
    from src.validate import check_config

    with pytest.raises(ValueError, match=r"dataset.classes=\[5\] selects 1 class"):
        check_config(tiny_cfg("dataset.classes=[5]"))


def test_classes_of_a_csv_labelled_dataset_fail_before_any_data_is_loaded(tiny_cfg):
    from src.validate import check_config

    with pytest.raises(ValueError, match=r"dataset.classes=\[0, 1\] is not supported for dataset=dicom_folder"):
        check_config(tiny_cfg("dataset=dicom_folder", "dataset.classes=[0,1]"))


def test_test_size_keeps_the_same_stratified_test_images_for_every_seed():
    """dataset.test_size: a cheaper test evaluation for reduced-scale studies that still compares runs on
    the same images (a fixed seed, not the run's)."""
    cfg = {"name": "digits", "n_train": None, "val_size": 0, "test_size": 120, "image_size": None}
    a, b, full = build_data(cfg, seed=0), build_data(cfg, seed=5), build_data({**cfg, "test_size": None})
    assert len(a.y_test) == 120 and a.info["n_test"] == 120 and "n_test" not in full.info
    assert torch.equal(a.x_test, b.x_test) and torch.equal(a.y_test, b.y_test)
    counts = torch.bincount(a.y_test, minlength=10)
    assert counts.min() >= 11 and counts.max() <= 13  # class proportions kept
    rows = {tuple(r.flatten().tolist()) for r in full.x_test}
    assert all(tuple(r.flatten().tolist()) in rows for r in a.x_test)  # a subset of the test split
    with pytest.raises(ValueError, match=r"dataset.test_size=5000 must lie between 1 and the 360 test images"):
        build_data({**cfg, "test_size": 5000})


def test_digits_without_importing_sklearn_equal_sklearns_own_split(monkeypatch):
    """The embedded dataset is read from scikit-learn's bundled CSV with the stored split: the same arrays, in
    the same order, as load_digits + train_test_split(test_size=0.2, stratify, random_state=0); and the
    fallback (no CSV found) gives them too."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from src.data import sources

    d = load_digits()
    x = np.round(d.images * (255.0 / 16.0)).astype(np.uint8)
    x_tr, x_te, y_tr, y_te = train_test_split(x, d.target, test_size=0.2, stratify=d.target, random_state=0)
    fast = sources.load_digits_arrays()
    monkeypatch.setattr(sources.importlib.util, "find_spec", lambda name: None)
    fallback = sources.load_digits_arrays()
    for got in (fast, fallback):
        for key, want in (("x_train", x_tr), ("x_test", x_te), ("y_train", y_tr), ("y_test", y_te)):
            assert np.array_equal(got[key], want), key


def test_a_subset_archive_samples_the_test_split_by_class_unless_told_to_keep_its_order(tmp_path):
    """MNIST's test split is not in random order (its first 5,000 images are harder than its last: a 1-NN reference
    scored 6.1% against 2.8%), so its first M images are no fair test set; the MNIST pilots' 2,000 were such a
    prefix. The archive tool now takes a seeded, class-stratified sample of the test split; ``--test-sample prefix``
    rebuilds the committed pilots' archive."""
    from src.data.prefix import main, write_prefix

    y_test = np.repeat(np.arange(10), 100)  # sorted by class, as an ordered split can be
    src = tmp_path / "src.npz"
    np.savez(src, x_train=np.zeros((50, 1, 4, 4), np.uint8), y_train=np.arange(50) % 10,
             x_test=np.zeros((1000, 1, 4, 4), np.uint8),
             y_test=y_test)
    digest = write_prefix(src, tmp_path / "a.npz", 20, 200)
    with np.load(tmp_path / "a.npz") as d:
        assert len(d["y_train"]) == 20 and (d["y_train"] == np.arange(20) % 10).all()  # the training prefix
        assert np.bincount(d["y_test"], minlength=10).tolist() == [20] * 10
        assert (np.diff(d["y_test"]) >= 0).all()  # in the archive's (class-sorted) order
    assert write_prefix(src, tmp_path / "b.npz", 20, 200) == digest  # the same file on any machine
    main([str(src), str(tmp_path / "c.npz"), "--train", "20", "--test", "200", "--test-sample", "prefix"])
    with np.load(tmp_path / "c.npz") as d:
        assert (d["y_test"] == y_test[:200]).all()


def test_the_size_checks_name_the_key_at_fault_and_take_the_whole_test_split():
    """`dataset.n_train=0` was told "n_train=0 and val_size=0 must be positive" (val_size 0 is valid), and a
    test_size equal to the test split, inside the range its message gave, was refused."""
    with pytest.raises(ValueError, match=r"dataset.n_train=0 must be at least 1") as e:
        build_data({"name": "digits", "n_train": 0})
    assert "val_size" not in str(e.value)
    n_test = len(build_data({"name": "digits"}).y_test)
    assert len(build_data({"name": "digits", "test_size": n_test}).y_test) == n_test


DIGIT_NAMES = [str(i) for i in range(10)]  # the classes array of ../shared/data/mnist.npz


def _labelled_npz(path, classes, n=40, channels=1):
    x, _ = _arrays(n=n, channels=channels)
    np.savez(path, x_train=x, y_train=np.arange(n) % 10, x_test=x[:20], y_test=np.arange(20) % 10, classes=classes)
    return path


def test_an_archive_of_another_dataset_is_refused_naming_both_class_lists_and_the_fix(tmp_path):
    """Defect: ``dataset=fashion_mnist dataset.root=.../mnist.npz`` trained MNIST under the name fashion_mnist and
    finished as a normal run. The archive's ``classes`` array says which dataset it holds."""
    path = _labelled_npz(tmp_path / "digits.npz", DIGIT_NAMES)
    with pytest.raises(ValueError) as e:
        build_data(dict(name="fashion_mnist", root=str(path), image_size=None))
    msg = str(e.value)
    assert f"dataset.root={path}" in msg and "dataset=fashion_mnist" in msg
    assert "'0', '1', '2'" in msg and "'T-shirt/top', 'Trouser'" in msg and "10 in all" in msg  # both lists, cut short
    assert "dataset=mnist" in msg and "dataset.root=" in msg.split("Fix:")[1]  # the two ways out
    cifar = _labelled_npz(tmp_path / "cifar.npz", ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog",
                                                  "horse", "ship", "truck"], channels=3)
    with pytest.raises(ValueError, match=r"not those of dataset=mnist.*Fix: dataset=cifar10"):
        build_data(dict(name="mnist", root=str(cifar), image_size=None))


@pytest.mark.parametrize("names", [DIGIT_NAMES, [f"{i} - {w}" for i, w in enumerate(
    ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"])]])
def test_an_archive_naming_its_datasets_classes_loads(tmp_path, names):
    """The project's archives name MNIST's classes '0'..'9', torchvision '0 - zero'..: both are MNIST's."""
    path = _labelled_npz(tmp_path / "digits.npz", names)
    data = build_data(dict(name="mnist", root=str(path), image_size=None))
    assert data.classes == names and data.num_classes == 10


def test_the_known_class_names_are_torchvisions():
    import torchvision.datasets as tvd

    from src.data.sources import KNOWN_CLASSES

    assert list(KNOWN_CLASSES["mnist"]) == tvd.MNIST.classes
    assert list(KNOWN_CLASSES["fashion_mnist"]) == tvd.FashionMNIST.classes


def test_the_real_mnist_archive_is_refused_as_fashion_mnist():
    with pytest.raises(ValueError, match=r"mnist\.npz holds the classes .* not those of dataset=fashion_mnist"):
        build_data(dict(name="fashion_mnist", root=str(shared_npz("mnist")), image_size=None))


def _bad(case):
    """A 10-class archive's arrays with one defect the reviewer ran without an error."""
    g = np.random.default_rng(0)
    x, y = g.integers(0, 256, (40, 8, 8), dtype=np.uint8), np.arange(40) % 10
    a = {"x_train": x, "y_train": y, "x_test": x[:20], "y_test": y[:20]}
    if case == "labels from 1":  # was: 11 classes, label noise flipping into the empty class 0
        a["y_train"], a["y_test"] = y + 1, y[:20] + 1
    elif case == "a class missing":
        a["y_train"] = np.where(y == 4, 5, y)
    elif case == "test label unseen":
        a["y_test"] = np.where(y[:20] == 9, 10, y[:20])
    elif case == "more images than labels":  # was: the extra images dropped
        a["x_train"] = np.concatenate([x, x[:1]])
    elif case == "float pixels":  # was: cast to uint8 0/1
        a["x_train"] = x / 255.0
    elif case == "wide integers":  # was: 300 wrapped to 44
        a["x_train"] = x.astype(np.int64) + 45
    elif case == "channel first":  # was: read as 8 channels of 3x8 images
        a["x_train"] = np.repeat(x[:, None], 3, axis=1)
    elif case == "float labels":
        a["y_train"] = y.astype(np.float32)
    return a


@pytest.mark.parametrize(("case", "match"), [
    ("labels from 1", r"y_train holds the labels 1\.\.10 without 0.*0\.\.K-1.*np\.unique\(y_train, return_inverse"),
    ("a class missing", r"y_train holds the labels 0\.\.9 without 4"),
    ("test label unseen", r"y_test holds labels 0\.\.10, outside the 10 classes 0\.\.9 of y_train"),
    ("more images than labels", r"x_train holds 41 images but y_train 40 labels"),
    ("float pixels", r"x_train is float64 \(values 0\.0\.\.1\.0\), not uint8.*np\.round\(x \* 255\)\.astype"),
    ("wide integers", r"x_train is int64 \(values 45\.\.300\), not uint8"),
    ("channel first", r"x_train has shape \(40, 3, 8, 8\).*\(N, H, W, C\).*channel-first.*transpose\(0, 2, 3, 1\)"),
    ("float labels", r"y_train is float32.*integer"),
])
def test_a_malformed_archive_fails_before_training_naming_the_array_and_the_fix(tmp_path, monkeypatch, case, match):
    """Defect: each of these archives trained to a normal-looking finished run. They now fail at load, before a
    cache is written."""
    monkeypatch.setenv("VITSWEEP_CACHE", str(tmp_path / "cache"))
    np.savez(tmp_path / "bad.npz", **_bad(case))
    with pytest.raises(ValueError, match=match) as e:
        build_data(dict(name="mnist", root=str(tmp_path / "bad.npz"), image_size=None))
    assert f"dataset.root={tmp_path / 'bad.npz'}" in str(e.value)
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").iterdir())


def test_a_well_formed_archive_passes_the_checks(tmp_path):
    np.savez(tmp_path / "good.npz", **_bad("none"))
    data = build_data(dict(name="mnist", root=str(tmp_path / "good.npz"), image_size=None))
    assert data.num_classes == 10 and data.x_train.shape == (40, 1, 8, 8)


def _sklearn_subset(labels, size, seed, stratify):
    from sklearn.model_selection import train_test_split

    chosen, rest = train_test_split(np.arange(len(labels)), train_size=size, random_state=seed,
                                    stratify=labels if stratify else None)
    return np.sort(chosen), np.sort(rest)


@pytest.mark.parametrize(("labels", "size", "match"), [
    (np.repeat(np.arange(10), 20), 5, r"5 of 200 images \(195 left\).*each of the 10 classes"),
    (np.repeat(np.arange(10), 20), 195, r"195 of 200 images \(5 left\)"),
    (np.r_[np.repeat(np.arange(9), 20), 9], 50, r"the rarest has 1.*not class-stratified"),
])
def test_a_subset_too_small_to_stratify_warns_and_keeps_its_images(labels, size, match):
    """Defect: below one image per class on a side (or with a class of one image) the subset silently fell back to
    a plain random draw, though dataset.n_train promises a class-stratified one. It now says so; the images drawn
    stay those of the random draw, so no study's subset changes."""
    with pytest.warns(UserWarning, match=match):
        chosen, rest = stratified_subset(labels, size, seed=3)
    want = _sklearn_subset(labels, size, 3, stratify=False)
    assert np.array_equal(chosen, want[0]) and np.array_equal(rest, want[1])


def test_a_stratifiable_subset_is_sklearns_stratified_draw_without_a_warning():
    """The subsets the committed studies trained on: train_test_split's stratified draw, unchanged."""
    import warnings

    labels = np.random.default_rng(0).integers(0, 10, 3000)
    for size, seed in ((10, 0), (64, 1), (1000, 7), (2990, 2)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            chosen, rest = stratified_subset(labels, size, seed)
        want = _sklearn_subset(labels, size, seed, stratify=True)
        assert np.array_equal(chosen, want[0]) and np.array_equal(rest, want[1])


def test_the_warning_names_the_key_of_the_subset():
    with pytest.warns(UserWarning, match=r"dataset\.n_train=5: drawing 5 of 1437 images"):
        build_data(dict(name="digits", image_size=8, n_train=5))
    with pytest.warns(UserWarning, match=r"dataset\.val_size=4: drawing 1433 of 1437 images \(4 left\)"):
        build_data(dict(name="digits", image_size=8, val_size=4))
    with pytest.warns(UserWarning, match=r"dataset\.test_size=3: drawing 3 of 360"):
        build_data(dict(name="digits", image_size=8, test_size=3))
