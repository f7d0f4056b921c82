"""The tensor cache of file-backed datasets: a cache directory, never the data folder; racing builders all succeed."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from src.data import build_data
from src.data.sources import load_arrays
from tests.conftest import ROOT


def _npz(folder, n=60, size=8):
    g = np.random.default_rng(0)
    x, y = g.integers(0, 256, (n, size, size, 3), dtype=np.uint8), np.arange(n) % 3
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / "toy.npz", x_train=x, y_train=y, x_test=x[:12], y_test=y[:12])
    return folder / "toy.npz", x


def _listing(folder):
    return sorted(p.name for p in folder.rglob("*"))


def test_the_cache_goes_to_vitsweep_cache_and_nothing_next_to_the_data(tmp_path, monkeypatch):
    """Defect: the loader wrote .vitsweep-<name>-<hash>.pt (55-184 MB) into the user's dataset folder."""
    path, x = _npz(tmp_path / "data")
    listing = _listing(tmp_path / "data")
    monkeypatch.setenv("VITSWEEP_CACHE", str(tmp_path / "cache"))
    cfg = dict(name="cifar10", root=str(path), image_size=None)
    data = build_data(cfg)
    assert torch.equal(data.x_train[5], torch.from_numpy(x[5]).permute(2, 0, 1))
    assert _listing(tmp_path / "data") == listing
    (cache,) = (tmp_path / "cache").iterdir()
    assert cache.suffix == ".pt" and "cifar10" in cache.name
    stamp = cache.stat().st_mtime_ns
    again = build_data(cfg)  # read back from the cache, not rebuilt
    assert torch.equal(again.x_train, data.x_train) and cache.stat().st_mtime_ns == stamp


def test_a_read_only_data_folder_works_and_stays_untouched(tmp_path, monkeypatch):
    # as root a mode bit stops no write: the folder's listing is the check
    path, _ = _npz(tmp_path / "data")
    listing = _listing(tmp_path / "data")
    os.chmod(tmp_path / "data", 0o555)
    try:
        monkeypatch.setenv("VITSWEEP_CACHE", str(tmp_path / "cache"))
        assert load_arrays("cifar10", path)["x_train"].shape == (60, 8, 8, 3)
        assert _listing(tmp_path / "data") == listing and len(list((tmp_path / "cache").iterdir())) == 1
    finally:
        os.chmod(tmp_path / "data", 0o755)


def test_the_default_cache_is_the_user_cache_dir(tmp_path, monkeypatch):
    path, _ = _npz(tmp_path / "data")
    monkeypatch.delenv("VITSWEEP_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    load_arrays("cifar10", path)
    assert len(list((tmp_path / "xdg" / "vitsweep").glob("*.pt"))) == 1
    assert _listing(tmp_path / "data") == ["toy.npz"]


@pytest.mark.parametrize("where", ["a file", "a folder under a file"])
def test_an_unusable_vitsweep_cache_loads_without_a_cache_and_says_so(tmp_path, monkeypatch, caplog, where):
    path, x = _npz(tmp_path / "data")
    (tmp_path / "plain").write_text("not a folder")
    target = tmp_path / "plain" if where == "a file" else tmp_path / "plain" / "cache"
    monkeypatch.setenv("VITSWEEP_CACHE", str(target))
    with caplog.at_level(logging.WARNING):
        arrays = load_arrays("cifar10", path)
    assert np.array_equal(arrays["x_train"], x)
    assert f"VITSWEEP_CACHE={target}" in caplog.text and "without a cache" in caplog.text
    assert (tmp_path / "plain").read_text() == "not a folder" and _listing(tmp_path / "data") == ["toy.npz"]


BUILDER = """
import os, sys, time
from pathlib import Path
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.001)
from src.data.sources import load_arrays
print(load_arrays("cifar10", sys.argv[1])["x_train"].shape)
"""


def test_two_processes_building_one_cache_at_once_both_succeed(tmp_path):
    """Defect: two launcher workers wrote the same temporary name; one rename then failed with FileNotFoundError
    and the study lost a trial. Each builder now writes its own temporary file and renames it atomically."""
    path, _ = _npz(tmp_path / "data", n=20000, size=32)  # ~60 MB to save: the writes overlap
    env = {**os.environ, "VITSWEEP_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", BUILDER, str(path), str(go)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    time.sleep(2.0)  # both imported and waiting (a head start only; correctness does not depend on it)
    go.touch()
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert all("(20000, 32, 32, 3)" in out for out in outs), outs
    (cache,) = (tmp_path / "cache").iterdir()  # one cache, no temporary file left behind
    assert load_arrays("cifar10", path)["x_train"].shape == (20000, 32, 32, 3) and cache.suffix == ".pt"


def test_a_cache_written_before_the_class_check_is_checked_too(tmp_path, monkeypatch):
    """A run before the class-name check could cache MNIST under the name fashion_mnist; reading that cache back must
    be refused as the archive itself is, not trusted because it exists."""
    from src.data import sources

    monkeypatch.setenv("VITSWEEP_CACHE", str(tmp_path / "cache"))
    path, x = _npz(tmp_path / "data")
    arrays = {"x_train": x, "y_train": np.arange(60) % 3, "x_test": x[:12], "y_test": np.arange(12) % 3,
              "classes": np.array(["0", "1", "2"])}
    np.savez(path, **arrays)
    sources._write_cache(sources._cache_path(path, "fashion_mnist"), arrays)  # as the unchecked loader left it
    with pytest.raises(ValueError, match=r"not those of dataset=fashion_mnist"):
        load_arrays("fashion_mnist", path)


def _png_folder(root, n=12):
    from PIL import Image

    g = np.random.default_rng(0)
    for split in ("train", "test"):
        for i in range(n):
            d = root / split / f"class{i % 3}"
            d.mkdir(parents=True, exist_ok=True)
            Image.fromarray(g.integers(0, 256, (8, 8), dtype=np.uint8)).save(d / f"{i}.png")
    return root


def test_a_folders_cache_follows_files_moved_or_added_inside_its_class_folders(tmp_path, monkeypatch):
    """Defect: the cache key of a train/<class>/ folder was the root folder's own size and mtime, which moving or
    adding an image inside a class folder leaves alone: the stale arrays kept being served."""
    monkeypatch.setenv("VITSWEEP_CACHE", str(tmp_path / "cache"))
    root = _png_folder(tmp_path / "data")
    first = load_arrays("mnist", root)
    assert np.bincount(first["y_train"]).tolist() == [4, 4, 4]
    (cache,) = (tmp_path / "cache").iterdir()
    stamp = cache.stat().st_mtime_ns
    assert np.array_equal(load_arrays("mnist", root)["x_train"], first["x_train"])  # unchanged: read from the cache
    assert list((tmp_path / "cache").iterdir()) == [cache] and cache.stat().st_mtime_ns == stamp

    os.rename(root / "train" / "class0" / "0.png", root / "train" / "class1" / "0.png")  # relabelled
    moved = load_arrays("mnist", root)
    assert np.bincount(moved["y_train"]).tolist() == [3, 5, 4]
    from PIL import Image

    Image.fromarray(np.zeros((8, 8), np.uint8)).save(root / "train" / "class2" / "new.png")
    added = load_arrays("mnist", root)
    assert np.bincount(added["y_train"]).tolist() == [3, 5, 5] and not added["x_train"][-1].any()
