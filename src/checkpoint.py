"""Checkpoint files of a run dir: atomic writes that keep the previous one, tolerant reads, config checks.

``checkpoint.pt`` is the newest state and ``checkpoint.prev.pt`` the one before. A write goes to a
temporary file, is fsynced and renamed over, so a kill at any moment leaves at least one complete file.
Files are read with ``torch.load(weights_only=True)``: they hold tensors, dicts, lists, numbers and
strings only.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import torch

from hydra_plugins.vitsweep_sweeper import protocol
from src.run_contract import RUNTIME_KEYS
from src.stop_rules import steps_in_run

log = logging.getLogger(__name__)

CHECKPOINT, PREVIOUS = "checkpoint.pt", "checkpoint.prev.pt"
REQUIRED = ("model", "optimizer", "config", "epoch", "step", "rng", "loader", "rules")
# a fresh start moves these aside, the tracker's files too (``src.trackers``: a fresh start is a new tracker run)
RECORD_FILES = ("metrics.jsonl", "summary.json", "summary.previous.json", "config.json", CHECKPOINT, PREVIOUS,
                "tracker.json", "tensorboard")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. platforms without directory handles
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[BinaryIO], Any], keep_previous: Path | None = None) -> None:
    """Write ``path`` so that a kill at any moment leaves the old file or the new one, whole: ``write`` fills
    a temporary file, which is fsynced and renamed over ``path`` (the old file first renamed to
    ``keep_previous`` when given)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    if keep_previous is not None and path.exists():
        os.replace(path, keep_previous)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def save_checkpoint(run_dir: str | Path, state: Mapping[str, Any]) -> Path:
    """Write ``state`` as the newest checkpoint; the one it replaces becomes ``checkpoint.prev.pt``."""
    path = Path(run_dir) / CHECKPOINT
    atomic_write(path, lambda f: torch.save(dict(state), f), keep_previous=path.with_name(PREVIOUS))
    return path


def load_checkpoint(path: str | Path) -> Any:
    """One checkpoint file on the CPU, plain tensors and containers only (no code is unpickled)."""
    return torch.load(path, map_location="cpu", weights_only=True)


def read_checkpoints(run_dir: str | Path) -> Iterator[tuple[Path, dict]]:
    """The readable checkpoints of ``run_dir``, newest first, each loaded only when the caller gets to it
    (a resume that takes the newest never reads the previous one). An unreadable one (truncated, not a
    checkpoint, missing keys) is skipped with a warning naming the file."""
    for name in (CHECKPOINT, PREVIOUS):
        path = Path(run_dir) / name
        if not path.is_file():
            continue
        try:
            ckpt = load_checkpoint(path)
            missing = [k for k in REQUIRED if not isinstance(ckpt, dict) or k not in ckpt]
            if missing:
                raise KeyError(f"no {missing} (not a resumable vitsweep checkpoint)")
        except Exception as e:  # any unreadable file is skipped: never a crash loop
            log.warning("checkpoint %s is unreadable (%s: %s): skipping it", path, type(e).__name__, e)
            continue
        yield path, ckpt


def config_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``key: saved -> current`` for every non-runtime key that differs between two composed configs."""
    return protocol.config_differences(saved, current, ignore=RUNTIME_KEYS)


def check_resumable(path: Path, saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    diff = config_differences(saved, current)
    if diff:
        raise ValueError(
            f"{path} was written by a run with a different config, so this start cannot resume it:\n  "
            + "\n  ".join(diff) + "\nfix: use a new run dir (hydra.run.dir=..., or hydra.sweep.dir=... for a -m "
            "sweep), or trainer.resume=never to move "
            "the old run's files aside and start over (only stop limits, threads and progress may change)")


def check_extension(path: Path, ckpt: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """Refuse to continue a run whose lr schedule depends on its length (cosine) under limits that change that
    length: the lr would re-anneal over the new horizon, so its records would no longer follow its config. Under
    ``scheduler=constant`` a raised limit continues the run; ``max_wall_s`` never sets the horizon."""
    if current["scheduler"]["name"] == "constant":
        return
    saved, now = ckpt["config"]["trainer"], current["trainer"]
    limits = ("max_epochs", "max_steps")
    per_epoch = ckpt.get("steps_per_epoch")  # absent in checkpoints older than this check: compare the limits
    if per_epoch:
        before, after = (steps_in_run(t.get("max_epochs"), t.get("max_steps"), int(per_epoch)) for t in (saved, now))
    else:
        before, after = (tuple(t.get(k) for k in limits) for t in (saved, now))
    if before == after:
        return
    changed = ", ".join(f"trainer.{k}: {saved.get(k)} -> {now.get(k)}" for k in limits if saved.get(k) != now.get(k))
    horizon = f" (from {before:g} to {after:g} steps)" if per_epoch else ""
    raise ValueError(
        f"{path} holds a run under scheduler={current['scheduler']['name']}, whose lr depends on the run length: "
        f"{changed} changes the schedule's horizon{horizon}, so continuing it would re-anneal the lr over the new "
        "length and its records would follow neither config. Fix: train the longer run from the start in a new run "
        "dir (hydra.run.dir=...) or with trainer.resume=never (moves this run's files aside); or use "
        "scheduler=constant, whose runs may be extended by raising trainer.max_epochs / max_steps")


def move_aside(run_dir: str | Path) -> Path | None:
    """Move the run-record files of ``run_dir`` into ``previous-<timestamp>/`` (never deleted)."""
    run_dir = Path(run_dir)
    present = [run_dir / n for n in RECORD_FILES if (run_dir / n).exists()]
    if not present:
        return None
    dest = run_dir / f"previous-{time.strftime('%Y%m%d-%H%M%S')}"
    n = 1
    while dest.exists():
        dest, n = run_dir / f"previous-{time.strftime('%Y%m%d-%H%M%S')}-{n}", n + 1
    dest.mkdir()
    for p in present:
        os.replace(p, dest / p.name)
    log.warning("moved the earlier run's files in %s to %s", run_dir, dest)
    return dest
