"""Raw image sources: each returns uint8 arrays (N, H, W) or (N, H, W, C) and int labels.

Accepted layouts for ``dataset.root`` (mnist, fashion_mnist, cifar10):
  1. an ``.npz`` file with ``x_train, y_train, x_test, y_test`` (uint8, HWC or HW) and optionally ``classes``, the
     label names, which must be classes of the dataset named (``KNOWN_CLASSES``): another dataset's archive is refused,
  2. a folder tree ``train/<class>/*.png|jpg`` and ``test/<class>/*.png|jpg``,
  3. torchvision's own layout under ``root`` (``download=true`` fetches it; needs internet).
The first load of 1-2 writes a uint8 tensor cache (``vitsweep-<name>-<key>.pt``, keyed by the archive's or every
image file's path, size and mtime) into the cache directory, so later runs load in about a second:
``$VITSWEEP_CACHE``, else the platform's user cache dir (``platformdirs`` when installed, else
``$XDG_CACHE_HOME/vitsweep`` or ``~/.cache/vitsweep``). Nothing is ever written next to the data, so a shared or
read-only dataset folder works. Processes that build one cache at once all succeed: each writes its own temporary
file and renames it over the cache atomically. A cache directory that cannot be written (``VITSWEEP_CACHE`` naming
a file, say) means loading without a cache, with a warning.
"""
from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp"}
TORCHVISION = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST", "cifar10": "CIFAR10"}
# torchvision's class names, in label order (``torchvision.datasets.MNIST.classes``, ``FashionMNIST.classes``;
# CIFAR-10's are read from its batches.meta file): written out so that checking an archive imports no torchvision
KNOWN_CLASSES = {
    "mnist": ("0 - zero", "1 - one", "2 - two", "3 - three", "4 - four", "5 - five", "6 - six", "7 - seven",
              "8 - eight", "9 - nine"),
    "fashion_mnist": ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                      "Ankle boot"),
    "cifar10": ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"),
}
Arrays = dict[str, np.ndarray]
log = logging.getLogger(__name__)


DIGITS_SPLIT = Path(__file__).with_name("digits_split.npz")  # train/test image order of the split below


def load_digits_arrays() -> Arrays:
    """scikit-learn's bundled 8x8 digits (values 0..16) as uint8 0..255, fixed stratified 80/20 split:
    ``train_test_split(..., test_size=0.2, stratify=target, random_state=0)``.

    The images come from the CSV that scikit-learn ships (``sklearn/datasets/data/digits.csv.gz``, what
    ``load_digits`` reads) and the split's image order from ``digits_split.npz``, so a run does not import
    scikit-learn: that import took 1.75 s of each fresh process's first run on a 2-core CPU, a third of a small
    sweep job (docs/benchmarks/README.md). ``tests/test_data.py`` checks both against scikit-learn's own calls;
    without the CSV (another layout) this falls back to them."""
    spec = importlib.util.find_spec("sklearn")  # locates the package without importing it
    csv = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz" if spec else None
    if csv is not None and csv.is_file():
        raw = np.loadtxt(csv, delimiter=",", dtype=np.float64)
        images, target = raw[:, :-1].reshape(-1, 8, 8), raw[:, -1].astype(np.int64)
        with np.load(DIGITS_SPLIT) as split:
            train, test = split["train"].astype(np.int64), split["test"].astype(np.int64)
    else:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        d = load_digits()
        images, target = d.images, d.target
        train, test = train_test_split(np.arange(len(target)), test_size=0.2, stratify=target, random_state=0)
    x = np.round(images * (255.0 / 16.0)).astype(np.uint8)
    return {"x_train": x[train], "y_train": target[train], "x_test": x[test], "y_test": target[test],
            "classes": np.array([str(i) for i in range(10)])}


def synthetic_arrays(num_train: int, num_test: int, image_size: int, channels: int, num_classes: int,
                     seed: int = 0) -> Arrays:
    g = np.random.default_rng(seed)
    shape = (image_size, image_size, channels)
    return {"x_train": g.integers(0, 256, (num_train, *shape), dtype=np.uint8),
            "y_train": g.integers(0, num_classes, num_train),
            "x_test": g.integers(0, 256, (num_test, *shape), dtype=np.uint8),
            "y_test": g.integers(0, num_classes, num_test), "classes": np.array([str(i) for i in range(num_classes)])}


def _from_npz(path: Path) -> Arrays:
    with np.load(path, allow_pickle=False) as z:
        missing = {"x_train", "y_train", "x_test", "y_test"} - set(z.files)
        if missing:
            raise ValueError(f"dataset.root={path} lacks arrays {sorted(missing)}: an .npz needs x_train, y_train, "
                             "x_test, y_test")
        out = {k: z[k] for k in z.files}
    return out


def _class_key(name: object) -> str:
    """A class name as compared: case and outer spaces ignored, and torchvision's MNIST name '3 - three' read as
    '3', the name the project's own archives (../shared/data) use."""
    return str(name).split(" - ")[0].strip().lower()


def _abbreviated(names: object, shown: int = 4) -> str:
    names = [str(n) for n in names]
    more = ", ..." if len(names) > shown else ""
    return f"[{', '.join(map(repr, names[:shown]))}{more}] ({len(names)} in all)"


def check_class_names(arrays: Arrays, name: str, path: Path) -> None:
    """Refuse an archive whose ``classes`` array names a class that dataset ``name`` does not have: any .npz used to
    train under any dataset name (MNIST ran, and was recorded, as fashion_mnist). The names may be some of the
    dataset's classes, in any order: the labels index the archive's own list, and an archive of a few classes is
    still that dataset. An archive without ``classes`` (the tests' fixtures) is taken on trust."""
    if "classes" not in arrays or name not in KNOWN_CLASSES:
        return
    got = {_class_key(c) for c in arrays["classes"]}
    if got <= {_class_key(c) for c in KNOWN_CLASSES[name]}:
        return
    owners = [other for other, names in KNOWN_CLASSES.items() if got <= {_class_key(c) for c in names}]
    fix = f"dataset={owners[0]} if the archive is right, or " if owners else ""
    raise ValueError(f"dataset.root={path} holds the classes {_abbreviated(arrays['classes'])}, not those of "
                     f"dataset={name} {_abbreviated(KNOWN_CLASSES[name])}: it is another dataset's archive. Fix: "
                     f"{fix}dataset.root=<a {name} archive> (e.g. ../shared/data/{name}.npz) if the name is right")


def check_arrays(arrays: Arrays, source: str) -> None:
    """Refuse arrays that would train without an error but not as meant: images without labels (dropped), pixels
    that are not uint8 (floats in [0, 1] became 0/1, int64 300 wrapped to 44), channel-first images (read as 28
    channels), labels not numbering the classes 0..K-1 from the training split (labels 1..10 made 11 classes, and
    label noise flipped into the empty class 0). Run on every file-backed load, a cache hit included; ``source``
    names the data in the message. Pixels must be uint8 rather than whole values in 0..255 of any type: every
    archive, cache and loader here already gives uint8, and the rule needs no pass over the pixels. The datasets
    built in code (digits, synthetic) are not checked: their pixels are uint8 by construction, and synthetic's
    random labels may leave a class out of a tiny training split (the config tests draw 8 images of 10 classes)."""
    for split in ("train", "test"):
        x, y = np.asarray(arrays[f"x_{split}"]), np.asarray(arrays[f"y_{split}"])
        if y.ndim != 1 or y.dtype.kind not in "iu":
            raise ValueError(f"{source}: y_{split} is {y.dtype} of shape {y.shape}; labels must be a 1-D integer "
                             f"array: convert with y_{split}.astype(np.int64) when they are whole numbers")
        if len(x) != len(y) or not len(y):
            raise ValueError(f"{source}: x_{split} holds {len(x)} images but y_{split} {len(y)} labels: every image "
                             "needs one label (and a split at least one image); rebuild the data with matching arrays")
        if not (x.ndim == 3 or x.ndim == 4 and x.shape[-1] in (1, 3)):
            hint = (": it looks channel-first, convert with x.transpose(0, 2, 3, 1)"
                    if x.ndim == 4 and x.shape[1] in (1, 3) else "")
            raise ValueError(f"{source}: x_{split} has shape {x.shape}; images must be (N, H, W) or (N, H, W, C) with "
                             f"C = 1 or 3 channels last{hint}")
        if x.dtype != np.uint8:
            raise ValueError(f"{source}: x_{split} is {x.dtype} (values {x.min()}..{x.max()}), not uint8 pixels "
                             "0..255: convert with np.round(x * 255).astype(np.uint8) for floats in [0, 1], or "
                             "x.astype(np.uint8) for whole numbers in 0..255, rescaled first when wider (16 bits: "
                             "x >> 8); an image folder: 8-bit grey or RGB files")
    present = np.unique(arrays["y_train"])
    k = int(present[-1]) + 1
    if present[0] < 0 or len(present) != k:
        missing = sorted(set(range(k)) - set(present.tolist()))
        gap = f" without {', '.join(map(str, missing[:5]))}{', ...' if len(missing) > 5 else ''}" if missing else ""
        raise ValueError(f"{source}: y_train holds the labels {present[0]}..{present[-1]}{gap}; labels must number "
                         "the classes 0..K-1, each with training images (K = the largest label + 1 is the number of "
                         "classes, and label noise flips into each): relabel with "
                         "np.unique(y_train, return_inverse=True)[1], and y_test alike (labels from 1: y - 1)")
    y_test = np.asarray(arrays["y_test"])
    if y_test.min() < 0 or y_test.max() >= k:
        raise ValueError(f"{source}: y_test holds labels {y_test.min()}..{y_test.max()}, outside the {k} classes "
                         f"0..{k - 1} of y_train: the test split has a class training never saw; correct its labels")


def _from_folder(root: Path) -> Arrays:
    from PIL import Image

    classes = sorted(p.name for p in (root / "train").iterdir() if p.is_dir())
    out: Arrays = {"classes": np.array(classes)}
    for split in ("train", "test"):
        xs, ys = [], []
        for label, cls in enumerate(classes):
            for f in sorted((root / split / cls).glob("*")):
                if f.suffix.lower() in IMAGE_SUFFIXES:
                    xs.append(np.asarray(Image.open(f)))
                    ys.append(label)
        if not xs:
            raise ValueError(f"dataset.root={root}: no images under {root / split}/<class>/")
        out[f"x_{split}"], out[f"y_{split}"] = np.stack(xs), np.array(ys)
    return out


def _from_torchvision(name: str, root: Path, download: bool) -> Arrays:
    import torchvision.datasets as tvd

    cls = getattr(tvd, TORCHVISION[name])
    out: Arrays = {}
    for split, train in (("train", True), ("test", False)):
        ds = cls(str(root), train=train, download=download)
        data = ds.data.numpy() if torch.is_tensor(ds.data) else np.asarray(ds.data)
        out[f"x_{split}"], out[f"y_{split}"] = data.astype(np.uint8), np.asarray(ds.targets)
    out["classes"] = np.array(ds.classes)
    return out


def _layout_error(name: str, root: Path) -> FileNotFoundError:
    return FileNotFoundError(
        f"dataset.root={root} holds no {name} data. Accepted: an .npz file with x_train/y_train/x_test/y_test "
        f"(e.g. dataset.root=../shared/data/{name}.npz), a folder with train/<class>/*.png and test/<class>/*.png, "
        f"or torchvision's {TORCHVISION[name]} layout. dataset.download=true fetches the latter, which needs internet."
    )


def default_cache_dir() -> Path:
    """The platform's user cache dir for vitsweep (``platformdirs``; without it the XDG rule Linux follows)."""
    try:
        import platformdirs
    except ImportError:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        return Path(base) / "vitsweep"
    return Path(platformdirs.user_cache_dir("vitsweep"))


def cache_dir() -> Path:
    """``$VITSWEEP_CACHE`` when set, else ``default_cache_dir()``."""
    env = os.environ.get("VITSWEEP_CACHE")
    return Path(env).expanduser() if env else default_cache_dir()


def _fingerprint(source: Path) -> str:
    """What the cache key hashes besides the path: an archive's size and mtime; for a folder tree, every folder and
    file under train/ and test/ with each file's size and mtime. Moving or adding an image inside a class folder
    leaves the root folder's own size and mtime alone, so keying on those served stale arrays. One stat per file
    took 0.7 s for 60,000 files on a busy 2-core machine, against minutes to decode them."""
    if source.is_file():
        st = source.stat()
        return f"{st.st_size}|{st.st_mtime_ns}"  # the key archives' caches had before, so they stay valid
    entries = []
    for split in ("train", "test"):
        for folder, subfolders, files in os.walk(source / split):
            subfolders.sort()
            rel = Path(folder).relative_to(source)
            entries.append(f"{rel}/")  # an empty class folder is still a class: it shifts the labels after it
            for f in sorted(files):
                st = os.stat(os.path.join(folder, f))
                entries.append(f"{rel / f}|{st.st_size}|{st.st_mtime_ns}")
    return hashlib.sha1("\n".join(entries).encode()).hexdigest()


def _cache_path(source: Path, name: str) -> Path:
    key = hashlib.sha1(f"{source.resolve()}|{_fingerprint(source)}".encode()).hexdigest()[:12]
    return cache_dir() / f"vitsweep-{name}-{key}.pt"


def _write_cache(cache: Path, arrays: Arrays) -> None:
    """Save ``arrays`` as ``cache``: a temporary file of this process's own in the cache dir, renamed over the
    cache atomically (a racing builder's rename just replaces one whole file by an equal one)."""
    tensors = {k: list(map(str, v)) if v.dtype.kind in "US" else torch.from_numpy(np.ascontiguousarray(v))
               for k, v in arrays.items()}
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache.parent, prefix=f".{cache.stem}-", suffix=".tmp")
    except OSError as e:
        env = os.environ.get("VITSWEEP_CACHE")
        where = f"VITSWEEP_CACHE={env}" if env else f"the user cache dir {cache.parent} (VITSWEEP_CACHE unset)"
        log.warning(f"{where} is not a writable folder ({type(e).__name__}: {e}): loading without a cache, so every "
                    "run decodes the dataset again. Fix: point VITSWEEP_CACHE at a writable folder")
        return
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(tensors, f)
        os.replace(tmp, cache)
    except OSError as e:  # e.g. a full disk: the run goes on without a cache
        log.warning(f"could not write the dataset cache {cache} ({type(e).__name__}: {e}): loading without a cache")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_arrays(name: str, root: str | os.PathLike | None, download: bool = False) -> Arrays:
    """Load one of the file-backed datasets from any accepted layout, through the tensor cache."""
    if root is None:
        raise ValueError(f"dataset.root is required for dataset={name}")
    root = Path(root).expanduser()
    if root.is_dir() and (root / "train").is_dir():
        loader = lambda: _from_folder(root)  # noqa: E731
    elif root.is_file() and root.suffix == ".npz":
        loader = lambda: _from_npz(root)  # noqa: E731
    elif root.is_file():
        raise _layout_error(name, root)
    else:
        if not root.exists() and not download:
            raise _layout_error(name, root)
        try:
            arrays = _from_torchvision(name, root, download)
        except RuntimeError as e:  # torchvision: "Dataset not found. You can use download=True"
            raise _layout_error(name, root) from e
        check_arrays(arrays, f"dataset.root={root}")
        return arrays
    cache = _cache_path(root, name)
    fresh = not cache.is_file()
    if fresh:
        arrays = loader()
    else:
        cached = torch.load(cache, weights_only=True, mmap=True)
        arrays = {k: v.numpy() if torch.is_tensor(v) else np.array(v) for k, v in cached.items()}
    if root.is_file():  # checked on a cache hit too: a cache may predate the checks
        check_class_names(arrays, name, root)
    check_arrays(arrays, f"dataset.root={root}")
    if fresh:
        _write_cache(cache, arrays)
    return arrays
