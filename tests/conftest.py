"""Shared fixtures: compose the real config through Hydra's compose API with small overrides."""
from __future__ import annotations

import copy
import functools
import os
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
SHARED_DATA = ROOT.parent / "shared" / "data"

# A tiny, fast setting for end-to-end runs on 2 CPU cores.
# model.attention=sdpa: auto picks a path by timing, so two runs of one config may differ in the last bits
TINY = ["model.dim=32", "model.depth=1", "model.heads=2", "model.mlp_dim=64", "model.attention=sdpa",
        "dataset.n_train=200", "trainer.max_epochs=1", "trainer.batch_size=50", "trainer.precision=fp32",
        "trainer.progress=false", "trainer.device=cpu", "trainer.checkpoint=false"]

# `make test` runs the suite in 2 processes (pytest-xdist, `-n 2`), which share the 2 cores: one thread each there
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, os.cpu_count() or 1))


@pytest.fixture(autouse=True, scope="session")
def _test_cache_dir(tmp_path_factory):
    """Dataset caches built by the tests go to one throwaway folder, not the user's cache dir (subprocesses
    started by the tests inherit the variable); a test that sets VITSWEEP_CACHE itself overrides it."""
    old = os.environ.get("VITSWEEP_CACHE")
    os.environ["VITSWEEP_CACHE"] = str(tmp_path_factory.mktemp("vitsweep-cache"))
    yield
    if old is None:
        os.environ.pop("VITSWEEP_CACHE", None)
    else:
        os.environ["VITSWEEP_CACHE"] = old


def compose_cfg(overrides: list[str] | None = None) -> DictConfig:
    """The default config with ``overrides``, composed once per session and handed out as a fresh copy (a test may
    change its own)."""
    return copy.deepcopy(_composed(tuple(overrides or ())))


@functools.cache
def _composed(overrides: tuple[str, ...]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.fixture
def tiny_cfg():
    """Return a function composing the default config with TINY and extra overrides (TINY's ViT
    sizes are dropped when another model is chosen)."""
    def make(*extra: str) -> DictConfig:
        other_model = any(e.startswith("model=") and e != "model=vit" for e in extra)
        base = [o for o in TINY if not (other_model and o.startswith("model."))]
        return compose_cfg([*base, *extra])
    return make


def shared_npz(name: str) -> Path:
    path = SHARED_DATA / f"{name}.npz"
    if not path.is_file():
        pytest.skip(f"{path} is absent (real datasets live in ../shared/data beside the checkout)")
    return path
