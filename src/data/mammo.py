"""DICOM datasets: the RSNA Screening Mammography layout and a general DICOM tree with a label CSV.

The first load decodes every image once (``src.data.dicom.preprocess``, parallel workers, a tqdm
bar) into a cache folder named by a hash of the preprocessing settings and the CSV rows:

    <cache_dir>/<name>-<image_size>px-<hash>/
        images.npy     uint8 (N, 1, S, S), opened memory-mapped: training streams from disk
        labels.npy     int64 (N,)            patients.npy  str (N,)      paths.npy  str (N,)
        pixel_sums.npy float64 (N, 2)        per-image sum and sum of squares (mean/std of any split)
        skipped.csv    path, reason          files left out: missing, corrupt, no decoder installed
        meta.json      settings, counts, build time

Rows are stored grouped by patient, patients in a fixed order (a hash of the patient id) with each
class spread evenly along it. Any contiguous block of patients is then stratified by label, so the
splits are slices -- memory-mapped views, never copies: [train | val | test] with test the last
``test_fraction`` of patients, val the ``val_size`` images before it, and ``n_train`` the first
images of train. The split is fixed across training seeds (the cache does not depend on the seed).
"""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from hydra_plugins.vitsweep_sweeper.parent_watch import watch_parent
from src.data import sources
from src.data.dicom import DicomError, preprocess
from src.data.splits import DataSplits

CACHE_VERSION = 2  # bump when preprocessing changes in a way the settings do not capture
RSNA_COLUMNS = ("patient_id", "image_id", "laterality", "cancer")
BALANCE = ("none", "pos_weight", "sampler")


def read_table(csv: str | Path, required: tuple[str, ...]) -> pd.DataFrame:
    """Read a CSV and fail naming every missing required column."""
    csv = Path(csv)
    if not csv.is_file():
        raise FileNotFoundError(f"label CSV {csv} not found (set dataset.root / dataset.csv)")
    table = pd.read_csv(csv)
    missing = [c for c in required if c not in table.columns]
    if missing:
        raise ValueError(f"{csv} lacks required column(s) {missing}; it has {list(table.columns)}")
    return table


def load_rsna(root: str | Path, image_size: int = 512, n_train: int | None = None, val_size: int = 0,
              test_fraction: float = 0.2, balance: str = "none", crop: bool = True, flip: bool = True,
              max_skip_fraction: float = 0.01, cache_dir: str | Path | None = None, workers: int = 2,
              seed: int = 0, download: bool = False, csv: str = "train.csv", images: str = "train_images",
              **kw) -> DataSplits:
    """RSNA Screening Mammography: ROOT/train.csv + ROOT/train_images/<patient_id>/<image_id>.dcm, label `cancer`.

    ``seed`` is accepted for the common loader signature; the split does not depend on it (see module doc).
    Unknown keyword arguments (other config keys) are ignored.
    """
    if download:
        raise ValueError("dataset.download=true: the RSNA data cannot be downloaded here; fetch it from "
                         "kaggle.com/competitions/rsna-breast-cancer-detection and set dataset.root")
    root = Path(root).expanduser().absolute()  # absolute paths: one cache whatever the cwd
    table = read_table(root / csv, RSNA_COLUMNS)
    labels = _binary_labels(table["cancer"], "cancer")
    rows = pd.DataFrame({
        "path": [os.path.join(root, images, str(p), f"{i}.dcm")
                 for p, i in zip(table["patient_id"], table["image_id"], strict=True)],
        "label": labels,
        "patient": table["patient_id"].astype(str),
        "laterality": table["laterality"].fillna("").astype(str).str.upper(),
    })
    return _load_rows(rows, "rsna_mammo", ["no_cancer", "cancer"], image_size, n_train, val_size, test_fraction,
                      balance, crop, flip, max_skip_fraction, cache_dir, workers)


def load_dicom_folder(root: str | Path, csv: str, file_column: str, label_column: str,
                      patient_column: str | None = None, laterality_column: str | None = None,
                      image_size: int = 512, n_train: int | None = None, val_size: int = 0,
                      test_fraction: float = 0.2, balance: str = "none", crop: bool = False, flip: bool = False,
                      max_skip_fraction: float = 0.01, cache_dir: str | Path | None = None, workers: int = 2,
                      seed: int = 0, download: bool = False, **kw) -> DataSplits:
    """Any DICOM tree plus a CSV (relative to ``root`` unless absolute) mapping ``file_column`` (path
    relative to ``root``) to ``label_column`` (integers 0..K-1 or class names). Without
    ``patient_column`` every file is its own group for the split."""
    if download:
        raise ValueError("dataset.download=true: a DICOM folder cannot be downloaded; set dataset.root")
    root = Path(root).expanduser().absolute()  # absolute paths: one cache whatever the cwd
    required = tuple(c for c in (file_column, label_column, patient_column, laterality_column) if c)
    table = read_table(csv if Path(csv).is_absolute() else root / csv, required)
    values = table[label_column]
    if pd.api.types.is_integer_dtype(values) and values.min() >= 0:
        labels, classes = values.to_numpy(np.int64), [str(c) for c in range(int(values.max()) + 1)]
    else:
        classes = sorted(values.astype(str).unique())
        labels = values.astype(str).map({c: i for i, c in enumerate(classes)}).to_numpy(np.int64)
    rows = pd.DataFrame({
        "path": [os.path.join(root, str(f)) for f in table[file_column]],
        "label": labels,
        "patient": table[patient_column].astype(str) if patient_column else table[file_column].astype(str),
        "laterality": table[laterality_column].fillna("").astype(str).str.upper() if laterality_column else "",
    })
    return _load_rows(rows, "dicom_folder", classes, image_size, n_train, val_size, test_fraction, balance,
                      crop, flip, max_skip_fraction, cache_dir, workers)


def _binary_labels(col: pd.Series, name: str) -> np.ndarray:
    bad = ~col.isin([0, 1])
    if bad.any():
        raise ValueError(f"column {name!r} must be 0/1; found {sorted(col[bad].astype(str).unique())[:5]}")
    return col.to_numpy(np.int64)


# ---------------------------------------------------------------------------------------------- order
def _unit_hash(text: str) -> float:
    return int.from_bytes(hashlib.sha1(text.encode()).digest()[:8], "big") / 2.0**64


def patient_order(patients: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Row order: grouped by patient, patients in hash order within their stratum (highest label),
    strata interleaved so every contiguous block of patients holds each class in proportion."""
    uniq, inv = np.unique(patients, return_inverse=True)
    stratum = np.zeros(len(uniq), np.int64)
    np.maximum.at(stratum, inv, labels)
    h = np.array([_unit_hash(p) for p in uniq])
    position = np.empty(len(uniq))
    for s in np.unique(stratum):
        members = np.flatnonzero(stratum == s)
        ranks = np.argsort(np.argsort(h[members]))
        position[members] = (ranks + 1.0) / len(members)  # each stratum ends at 1: test holds every class
    patient_rank = np.empty(len(uniq), np.int64)
    patient_rank[np.lexsort((h, position))] = np.arange(len(uniq))
    return np.lexsort((np.arange(len(patients)), patient_rank[inv]))


# ---------------------------------------------------------------------------------------------- cache
def cache_key(rows: pd.DataFrame, image_size: int, crop: bool, flip: bool) -> str:
    digest = hashlib.sha256(json.dumps({"version": CACHE_VERSION, "image_size": int(image_size),
                                        "crop": bool(crop), "flip": bool(flip)}).encode())
    digest.update(pd.util.hash_pandas_object(rows, index=False).to_numpy().tobytes())
    return digest.hexdigest()[:16]


def _work(task: tuple[int, str, str], image_size: int, crop: bool, flip: bool):
    i, path, laterality = task
    try:
        img = preprocess(path, image_size, crop, flip, laterality or None)
    except DicomError as err:
        return i, None, str(err)
    except Exception as err:  # a decoder crash on a damaged stream: skip it, keep the message
        return i, None, f"{type(err).__name__}: {err}"
    return i, img, None


def _decode_pool(workers: int) -> ProcessPoolExecutor:
    """``workers`` decode processes: forked where the OS has it (they inherit the imported modules; spawn re-imports
    torch, ~10 s each). Each ends itself once the process that started it is gone (killed while building a cache):
    a forked worker holds the write end of the pool's queue too, so it would otherwise wait on it for ever."""
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method),
                               initializer=_watch_parent, initargs=(os.getpid(),))


def _watch_parent(parent: int) -> None:
    """End this decode worker once ``parent`` is gone: it has nothing to save."""
    watch_parent(parent, name="vitsweep-decode-parent-watch")


def build_cache(rows: pd.DataFrame, out: Path, image_size: int, crop: bool, flip: bool, workers: int = 2,
                progress: bool = True) -> dict:
    """Decode ``rows`` (path, label, patient, laterality; already in storage order) into cache folder ``out``."""
    from tqdm.auto import tqdm

    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    start = time.perf_counter()
    exists = np.array([os.path.isfile(p) for p in rows["path"]])
    skipped = [(p, "file not found") for p in rows["path"][~exists]]
    tasks = [(int(i), rows["path"].iat[i], rows["laterality"].iat[i]) for i in np.flatnonzero(exists)]
    images = np.lib.format.open_memmap(tmp / "images.npy", "w+", np.uint8, (len(tasks), 1, image_size, image_size))
    kept, sums = [], []
    work = partial(_work, image_size=image_size, crop=crop, flip=flip)
    bar = tqdm(total=len(tasks), desc=f"preprocess DICOM -> {image_size}px", unit="img", disable=not progress)
    pool = _decode_pool(workers) if workers > 1 and len(tasks) > 1 else None
    results = pool.map(work, tasks, chunksize=4) if pool else map(work, tasks)
    try:
        for i, img, reason in results:
            if img is None:
                skipped.append((rows["path"].iat[i], reason))
            else:
                images[len(kept), 0] = img
                flat = img.astype(np.float64).ravel()
                kept.append(i)
                sums.append((flat.sum(), flat @ flat))
            bar.update()
    finally:
        bar.close()
        if pool:
            pool.shutdown(cancel_futures=True)
    images.flush()
    del images
    if len(kept) < len(tasks):  # decode failures: shrink the array to the kept rows
        _truncate_npy(tmp / "images.npy", len(kept))
    kept = np.array(kept, np.int64)
    np.save(tmp / "labels.npy", rows["label"].to_numpy(np.int64)[kept])
    np.save(tmp / "patients.npy", rows["patient"].to_numpy(str)[kept])
    np.save(tmp / "paths.npy", rows["path"].to_numpy(str)[kept])
    np.save(tmp / "pixel_sums.npy", np.array(sums, np.float64).reshape(-1, 2))
    pd.DataFrame(skipped, columns=["path", "reason"]).to_csv(tmp / "skipped.csv", index=False)
    seconds = time.perf_counter() - start
    meta = {"version": CACHE_VERSION, "image_size": image_size, "crop": crop, "flip": flip, "workers": workers,
            "n_rows": len(rows), "n_images": len(kept), "n_skipped": len(skipped), "build_s": round(seconds, 2),
            "images_per_s": round(len(tasks) / max(seconds, 1e-9), 2), "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    try:
        os.replace(tmp, out)  # atomic: a concurrent build of the same key keeps the first finished
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return meta


def _truncate_npy(path: Path, n: int, chunk: int = 512) -> None:
    src = np.load(path, mmap_mode="r")
    dst_path = path.with_name("images.part.npy")
    dst = np.lib.format.open_memmap(dst_path, "w+", src.dtype, (n, *src.shape[1:]))
    for i in range(0, n, chunk):
        dst[i:i + chunk] = src[i:min(i + chunk, n)]
    dst.flush()
    del src, dst
    os.replace(dst_path, path)


# ---------------------------------------------------------------------------------------------- splits
def split_bounds(patients: np.ndarray, test_fraction: float, val_size: int) -> tuple[int, int]:
    """Row indices (val_start, test_start) cutting patient-grouped rows into [train | val | test]."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"dataset.test_fraction={test_fraction} must be in (0, 1)")
    starts = np.flatnonzero(np.r_[True, patients[1:] != patients[:-1]])
    n_test = min(max(1, round(test_fraction * len(starts))), len(starts) - 1)
    if n_test < 1:
        raise ValueError(f"only {len(starts)} patient(s): at least 2 are needed for a train/test split")
    test_start = int(starts[len(starts) - n_test])
    val_start = test_start
    if val_size:
        fits = starts[(starts > 0) & (test_start - starts >= val_size)]
        if len(fits) == 0:
            raise ValueError(f"dataset.val_size={val_size} images leaves no training patients "
                             f"({test_start} images before the test split): lower it")
        val_start = int(fits[-1])
    return val_start, test_start


def _class_ratio(y: np.ndarray, k: int) -> list[float]:
    return (np.bincount(y, minlength=k) / max(len(y), 1)).round(5).tolist()


def _load_rows(rows: pd.DataFrame, name: str, classes: list[str], image_size: int, n_train: int | None,
               val_size: int, test_fraction: float, balance: str, crop: bool, flip: bool,
               max_skip_fraction: float, cache_dir: str | Path | None, workers: int) -> DataSplits:
    if balance not in BALANCE:
        raise ValueError(f"dataset.balance={balance!r} is unknown: choose one of {list(BALANCE)}")
    if image_size is None or int(image_size) < 8:
        raise ValueError(f"dataset.image_size={image_size} pixels is too small")
    if (n_train is not None and n_train < 1) or (val_size or 0) < 0:
        raise ValueError(f"dataset.n_train={n_train} and dataset.val_size={val_size} must be positive")
    rows = rows.iloc[patient_order(rows["patient"].to_numpy(str), rows["label"].to_numpy())].reset_index(drop=True)
    base = Path(cache_dir) if cache_dir else sources.cache_dir() / "dicom"  # VITSWEEP_CACHE or the user cache dir
    out = base / f"{name}-{image_size}px-{cache_key(rows, image_size, crop, flip)}"
    reused = (out / "meta.json").is_file()
    if reused:
        meta = json.loads((out / "meta.json").read_text())
    else:
        meta = build_cache(rows, out, int(image_size), bool(crop), bool(flip), int(workers))
    n_rows, n_skipped = meta["n_rows"], meta["n_skipped"]
    if n_skipped > max_skip_fraction * n_rows or meta["n_images"] < 2:
        reasons = pd.read_csv(out / "skipped.csv")["reason"].str.slice(0, 120).value_counts().head(3)
        raise RuntimeError(
            f"{n_skipped} of {n_rows} DICOM images ({n_skipped / max(n_rows, 1):.1%}) were skipped, more than "
            f"dataset.max_skip_fraction={max_skip_fraction}; the list is in {out / 'skipped.csv'}. Most common "
            f"reasons: " + "; ".join(f"{n}x {r}" for r, n in reasons.items()))

    x = torch.from_numpy(np.load(out / "images.npy", mmap_mode="c"))  # copy-on-write map: never written back
    y = torch.from_numpy(np.load(out / "labels.npy"))
    patients = np.load(out / "patients.npy")
    val_start, test_start = split_bounds(patients, test_fraction, int(val_size or 0))
    train_end = val_start if n_train is None else min(int(n_train), val_start)
    if n_train is not None and n_train > val_start:
        raise ValueError(f"dataset.n_train={n_train} exceeds the {val_start} training images: lower it or set null")

    k = len(classes)
    y_tr = y[:train_end].numpy()
    counts = np.bincount(y_tr, minlength=k)
    sums = np.load(out / "pixel_sums.npy")[:train_end].sum(axis=0)
    n_pix = train_end * image_size * image_size
    mean = sums[0] / n_pix
    std = max(np.sqrt(max(sums[1] / n_pix - mean**2, 0.0)), 1e-3 * 255)
    splits = DataSplits(
        x_train=x[:train_end], y_train=y[:train_end], x_test=x[test_start:], y_test=y[test_start:], num_classes=k,
        mean=(float(mean / 255.0),), std=(float(std / 255.0),), classes=list(classes),
    )
    if val_start < test_start:
        splits.x_val, splits.y_val = x[val_start:test_start], y[val_start:test_start]
    if balance != "none" and (counts == 0).any():
        raise ValueError(f"dataset.balance={balance}: class(es) {np.flatnonzero(counts == 0).tolist()} "
                         f"have no training images")
    if balance == "pos_weight":  # loss weight per class: majority count / class count (binary: [1, neg/pos])
        splits.class_weights = torch.tensor(counts.max() / counts, dtype=torch.float32)
    elif balance == "sampler":  # each class drawn equally often; mean weight 1
        splits.sample_weights = torch.from_numpy(train_end / (k * counts[y_tr])).float()
    n_patients = lambda a, b: len(np.unique(patients[a:b]))  # noqa: E731
    splits.info = {
        "cache_dir": str(out), "cache_reused": reused, "rows_in_csv": n_rows,
        "skipped": n_skipped, "skipped_csv": str(out / "skipped.csv"), "preprocess_images_per_s": meta["images_per_s"],
        "split": "fixed patient-level split stratified by label (independent of seed)",
        "patients_train": n_patients(0, train_end), "patients_val": n_patients(val_start, test_start),
        "patients_test": n_patients(test_start, None),
        "class_ratio_train": _class_ratio(y_tr, k), "class_ratio_test": _class_ratio(y[test_start:].numpy(), k),
        "balance": balance,
    }
    if val_start < test_start:
        splits.info["class_ratio_val"] = _class_ratio(y[val_start:test_start].numpy(), k)
    return splits
