"""The measured choices of a run's start (``trainer.precision=auto``, ``model.attention=auto``), kept per machine.

A choice measured by timing is noisy where two options are close: two runs of one config on one machine, started a
few minutes apart, took different attention paths (sdpa 74.9 against explicit 78.8 ms in one, explicit 68.4 against
sdpa 83.3 ms in the other) and so trained different numbers (the tune_vit rerun, docs/studies/tune_vit). A sweep's
runs of one shape should take one path, and a rerun on the same machine should repeat the run. So the first run of a
shape measures, and every later run of that shape on that machine (same CPU or GPU, torch, threads) reuses the
measurement, which also saves its cost (minutes for patch 2 at 257 tokens on one core).

The measurements live in ``<cache dir>/probes/`` (``$VITSWEEP_CACHE`` or the user cache dir, never beside a
dataset), one JSON file per measured shape, written under a lock, so concurrent sweep workers wait for the one
that measures and then read its answer. ``VITSWEEP_PROBE_CACHE=off`` measures at every start instead; deleting the
folder makes the next runs measure again (e.g. after a hardware change the key does not see).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from hydra_plugins.vitsweep_sweeper.protocol import file_lock
from src.data.sources import cache_dir

ENV = "VITSWEEP_PROBE_CACHE"


def enabled() -> bool:
    return os.environ.get(ENV, "on").strip().lower() not in ("off", "0", "false", "no")


@functools.cache
def cpu_fields() -> dict[str, str]:
    """The first processor's ``model name``, ``cpu family`` and ``model`` from /proc/cpuinfo (empty where there is
    none), read once a process."""
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "cpu family", "model") and key.strip() not in fields:
                fields[key.strip()] = value.strip()
    return fields


def machine(device: torch.device) -> dict[str, Any]:
    """What makes a timing belong to this machine: the processor (or GPU), torch, and the CPU threads."""
    cpu = cpu_fields().get("model name") or platform.processor() or platform.machine()
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {"cpu": cpu, "gpu": gpu, "torch": torch.__version__, "threads": torch.get_num_threads()}


def cached(kind: str, key: Mapping[str, Any], device: torch.device,
           measure: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], Path | None]:
    """``measure()``'s answer for ``key`` on this machine: the stored one if this machine measured it before,
    else measured now and stored. Returns the answer and the file it was read from, relative to the cache dir (a
    run's records name no machine path), or None when measured now."""
    if not enabled():
        return measure(), None
    full = {"kind": kind, **machine(device), **key}
    digest = hashlib.sha1(json.dumps(full, sort_keys=True, default=str).encode()).hexdigest()[:16]
    folder = cache_dir() / "probes"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{kind}-{digest}.json"
    with file_lock(folder / f"{kind}-{digest}.lock"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            saved = json.loads(path.read_text())
            if saved["key"] == json.loads(json.dumps(full, default=str)):
                return saved["value"], path.relative_to(cache_dir())
        value = measure()
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": full, "value": value, "measured": time.strftime("%Y-%m-%dT%H:%M:%S")},
                                  indent=1, default=str))
        os.replace(tmp, path)
        return value, None
