"""The run directory: the contract between training and analysis (schema in the README).

``metrics.jsonl`` gets one JSON object per evaluation, ``summary.json`` is written once at the end
(atomically, so a file that exists is complete), ``checkpoint.pt`` holds the last model and
optimizer state (atomically too).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch


def _clean(value: Any) -> Any:
    """JSON-safe value: tensors to numbers, non-finite floats to None."""
    if torch.is_tensor(value):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def atomic_write_bytes(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


class RunRecorder:
    def __init__(self, run_dir: str | os.PathLike):
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        for stale in ("summary.json", "metrics.jsonl", "checkpoint.pt"):  # a rerun into the same dir starts clean
            (self.dir / stale).unlink(missing_ok=True)
        self.metrics_path = self.dir / "metrics.jsonl"
        self.metrics_path.touch()  # exists (maybe empty) from the start of every run

    def log(self, row: dict[str, Any]) -> None:
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n")

    def summary(self, summary: dict[str, Any]) -> None:
        text = json.dumps({k: _clean(v) for k, v in summary.items()}, indent=2)
        atomic_write_bytes(self.dir / "summary.json", lambda p: p.write_text(text + "\n"))

    def checkpoint(self, state: dict[str, Any]) -> None:
        atomic_write_bytes(self.dir / "checkpoint.pt", lambda p: torch.save(state, p))
