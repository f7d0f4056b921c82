"""Dataset building: raw arrays -> uint8 NCHW tensors, resize, seeded stratified subsets and splits."""
from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from src.data.sources import TORCHVISION, load_arrays, load_digits_arrays, synthetic_arrays
from src.data.splits import DataSplits

__all__ = ["DataSplits", "build_data", "select_classes", "stratified_subset", "DATASETS"]
DATASETS = ("digits", "synthetic", *TORCHVISION, "rsna_mammo", "dicom_folder")


def to_nchw(x: np.ndarray) -> torch.Tensor:
    """uint8 (N, H, W) or (N, H, W, C) -> contiguous uint8 tensor (N, C, H, W)."""
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.uint8))
    t = t.unsqueeze(1) if t.ndim == 3 else t.permute(0, 3, 1, 2)
    return t.contiguous()


def resize_uint8(x: torch.Tensor, size: int, chunk: int = 4096) -> torch.Tensor:
    """Bilinear (antialiased) resize of a uint8 NCHW tensor to size x size, in chunks to bound memory."""
    if x.shape[-2:] == (size, size):
        return x
    out = torch.empty((x.shape[0], x.shape[1], size, size), dtype=torch.uint8)
    for i in range(0, x.shape[0], chunk):
        y = F.interpolate(x[i:i + chunk].float(), size=(size, size), mode="bilinear", antialias=True,
                          align_corners=False)
        out[i:i + chunk] = y.round_().clamp_(0, 255).to(torch.uint8)
    return out


def channel_stats(x: torch.Tensor, max_images: int = 10_000) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std in [0, 1] units over (an evenly spaced subset of) uint8 NCHW images."""
    step = max(1, x.shape[0] // max_images)
    sample = x[::step].float() / 255.0
    return sample.mean(dim=(0, 2, 3)), sample.std(dim=(0, 2, 3)).clamp_min(1e-3)


def stratified_subset(labels: np.ndarray, size: int, seed: int, what: str = "a subset"
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Split indices of ``labels`` into (chosen ``size`` indices, rest), class-stratified and seeded.

    A stratified draw needs an image of every class on both sides and two images in every class; short of that the
    draw is a plain random one, as it always was (the images a seed draws must not change under existing studies),
    but with a warning naming ``what`` (the config key), since the configs promise a class-stratified subset."""
    from sklearn.model_selection import train_test_split  # imported here: it costs ~1.5 s and ~0.1 GiB

    idx = np.arange(len(labels))
    if size >= len(labels):
        return idx, idx[:0]
    counts = np.bincount(labels)
    present, rarest = (counts > 0).sum(), counts[counts > 0].min()
    can_stratify = size >= present and len(labels) - size >= present and rarest >= 2
    if not can_stratify:
        warnings.warn(f"{what}: drawing {size} of {len(labels)} images ({len(labels) - size} left) by class needs an "
                      f"image of each of the {present} classes on both sides and two images in every class (the "
                      f"rarest has {rarest}), so the subset is a plain random one, not class-stratified. Fix: at least "
                      f"{present} images on each side, or dataset.classes without a class of one image",
                      UserWarning, stacklevel=2)
    chosen, rest = train_test_split(idx, train_size=size, random_state=seed, stratify=labels if can_stratify else None)
    return np.sort(chosen), np.sort(rest)


CSV_LABELLED = ("rsna_mammo", "dicom_folder")  # labels come from a CSV: no class subsets


def check_classes(classes: Any, dataset: str) -> list[int | str] | None:
    """``dataset.classes`` as a list, or None; fails on anything but >= 2 distinct labels or names, and on
    a subset of a dataset labelled by its CSV."""
    if classes is None:
        return None
    if dataset in CSV_LABELLED:
        raise ValueError(f"dataset.classes={classes} is not supported for dataset={dataset} (labels come "
                         "from its CSV): set dataset.classes=null, or filter the CSV")
    fix = "list two or more distinct class labels, e.g. dataset.classes=[5,8], or null for every class"
    if isinstance(classes, str | int) or not all(isinstance(c, int | str) and not isinstance(c, bool) for c in classes):
        raise ValueError(f"dataset.classes={classes!r} is not a list of class labels (integers) or names: {fix}")
    classes = list(classes)
    if len(classes) < 2:
        raise ValueError(f"dataset.classes={classes} selects {len(classes)} class; a classifier needs >= 2: {fix}")
    if len(set(classes)) < len(classes):
        dup = sorted({str(c) for c in classes if classes.count(c) > 1})
        raise ValueError(f"dataset.classes={classes} repeats {', '.join(dup)}: {fix}")
    return classes


def select_classes(arrays: dict[str, np.ndarray], classes: list[int | str], dataset: str
                   ) -> tuple[dict[str, np.ndarray], list[int]]:
    """Keep the images of ``classes`` (labels or names) and relabel them 0..k-1 in the order given;
    returns the arrays and the original labels kept."""
    names = [str(c) for c in arrays.get("classes", [])]
    present = sorted(set(np.unique(arrays["y_train"]).tolist()) | set(np.unique(arrays["y_test"]).tolist()))
    labels = []
    for c in classes:
        label = c if isinstance(c, int) else (names.index(c) if c in names else None)
        if label is None or label not in present:
            known = f"labels {present[0]}..{present[-1]}" + (f" (names {names})" if names else "")
            raise ValueError(f"dataset.classes={classes}: {c!r} is not a class of dataset={dataset}, which has "
                             f"{known}: choose classes from those, or null for every class")
        labels.append(label)
    lut = np.full(max(present) + 1, -1)
    lut[labels] = np.arange(len(labels))
    out = dict(arrays)
    for split in ("train", "test"):
        y = np.asarray(arrays[f"y_{split}"])
        keep = lut[y] >= 0
        out[f"x_{split}"], out[f"y_{split}"] = np.asarray(arrays[f"x_{split}"])[keep], lut[y[keep]]
    out["classes"] = np.array([names[i] if i < len(names) else str(i) for i in labels])
    return out, labels


def _raw_arrays(cfg: Mapping[str, Any], seed: int) -> dict[str, np.ndarray]:
    name = cfg["name"]
    if name == "digits":
        return load_digits_arrays()
    if name == "synthetic":
        return synthetic_arrays(cfg["num_train"], cfg["num_test"], cfg["image_size"], cfg["channels"],
                                cfg["num_classes"], seed)
    if name in TORCHVISION:
        return load_arrays(name, cfg.get("root"), bool(cfg.get("download", False)))
    raise ValueError(f"dataset.name={name!r} is unknown: choose one of {list(DATASETS)}")


def build_data(cfg: Mapping[str, Any], seed: int = 0) -> DataSplits:
    """Build the train/val/test splits described by the ``dataset`` config group."""
    cfg = dict(cfg)
    classes = check_classes(cfg.get("classes"), cfg["name"])
    if cfg["name"] in CSV_LABELLED:
        from src.data import mammo  # optional extra: pydicom and its decoders

        loader = mammo.load_rsna if cfg["name"] == "rsna_mammo" else mammo.load_dicom_folder
        kwargs = {k: v for k, v in cfg.items() if k not in ("name", "augment", "classes")}
        return loader(**kwargs, seed=seed)

    arrays = _raw_arrays(cfg, seed)
    info = {}
    if classes is not None:  # before the n_train subset and the val split, which then stratify on these classes
        arrays, labels = select_classes(arrays, classes, cfg["name"])
        info = {"classes": labels, "class_names": arrays["classes"].tolist()}  # recorded in summary.json
    x_train, x_test = to_nchw(arrays["x_train"]), to_nchw(arrays["x_test"])
    y_train = torch.as_tensor(np.asarray(arrays["y_train"]), dtype=torch.int64)
    y_test = torch.as_tensor(np.asarray(arrays["y_test"]), dtype=torch.int64)
    num_classes = len(classes) if classes is not None else int(max(y_train.max(), y_test.max())) + 1
    test_size = cfg.get("test_size")
    if test_size is not None:  # the same class-stratified test images for every run and seed (seed 0)
        if not 0 < test_size <= len(y_test):
            raise ValueError(f"dataset.test_size={test_size} must lie between 1 and the {len(y_test)} test images "
                             f"of dataset={cfg['name']} (null = all of them)")
        if test_size < len(y_test):
            chosen = stratified_subset(y_test.numpy(), test_size, 0, f"dataset.test_size={test_size}")[0]
            keep = torch.from_numpy(np.sort(chosen))
            x_test, y_test = x_test[keep], y_test[keep]
        info["n_test"] = test_size  # recorded in summary.json

    n_total, n_train, val_size = len(y_train), cfg.get("n_train"), int(cfg.get("val_size") or 0)
    if n_train is not None and n_train < 1:
        raise ValueError(f"dataset.n_train={n_train} must be at least 1 (null = every training image)")
    if val_size < 0:
        raise ValueError(f"dataset.val_size={val_size} must be 0 (no validation split) or more")
    if (n_train or 0) + val_size > n_total or val_size >= n_total:
        raise ValueError(
            f"dataset.n_train={n_train} + dataset.val_size={val_size} exceeds the {n_total} training images of "
            f"dataset={cfg['name']}: lower one of them (n_train=null uses all images left after the val split)"
        )
    labels = y_train.numpy()
    rest, val_idx = np.arange(n_total), None
    if val_size:
        rest, val_idx = stratified_subset(labels, n_total - val_size, seed, f"dataset.val_size={val_size}")
    if n_train is not None:
        rest = rest[stratified_subset(labels[rest], n_train, seed, f"dataset.n_train={n_train}")[0]]

    size = cfg.get("image_size")
    if size is not None:
        x_train, x_test = resize_uint8(x_train, size), resize_uint8(x_test, size)
    x_tr = x_train[torch.from_numpy(rest)]
    mean, std = channel_stats(x_tr)
    splits = DataSplits(
        x_train=x_tr, y_train=y_train[torch.from_numpy(rest)], x_test=x_test, y_test=y_test,
        num_classes=num_classes, mean=tuple(mean.tolist()), std=tuple(std.tolist()),
        classes=[str(c) for c in arrays.get("classes", range(num_classes))], info=info,
    )
    if val_idx is not None:
        splits.x_val, splits.y_val = x_train[torch.from_numpy(val_idx)], y_train[torch.from_numpy(val_idx)]
    return splits
