"""The run directory: the contract between training and analysis (schema in docs/run_dir.md).

``metrics.jsonl`` gets one JSON object per evaluation, appended and flushed line by line;
``summary.json`` is written at the end (atomically, so a file that exists is complete), with ``config.json``;
checkpoints are written by ``src.checkpoint`` (atomically too). Nothing here deletes a run's files:
a resumed run cuts ``metrics.jsonl`` back to the rows its checkpoint had seen. Rows and the summary also go
to the run's experiment trackers (``src.trackers``, ``logger=``), which the summary closes.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch

from src.checkpoint import atomic_write, save_checkpoint
from src.trackers import Trackers


def _clean(value: Any) -> Any:
    """JSON-safe value: tensors to numbers, non-finite floats to None."""
    if torch.is_tensor(value):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def writable_run_dir(run_dir: str | os.PathLike) -> Path:
    """Create ``run_dir`` if needed and check that files can be written there."""
    path = Path(run_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create the run dir {path} ({e.strerror}): choose a writable hydra.run.dir "
                         "(or hydra.sweep.dir for -m)") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"the run dir {path} is not writable: choose a writable hydra.run.dir "
                         "(or hydra.sweep.dir for -m)")
    return path


class RunRecorder:
    def __init__(self, run_dir: str | os.PathLike):
        self.dir = writable_run_dir(run_dir)
        self.metrics_path = self.dir / "metrics.jsonl"
        self.metrics_path.touch()  # exists (maybe empty) from the start of every run
        self.rows = 0
        self.trackers = Trackers()  # none until the trainer starts the configured ones (``track``)

    def track(self, trackers: Trackers) -> None:
        """Send every row and the summary to ``trackers`` as well, from now on."""
        self.trackers = trackers

    def keep_rows(self, n: int) -> None:
        """Cut ``metrics.jsonl`` back to its first ``n`` rows (those a resumed checkpoint had seen)."""
        lines = self.metrics_path.read_text().splitlines(keepends=True)
        if len(lines) < n:
            raise ValueError(f"{self.metrics_path} has {len(lines)} rows but its checkpoint saw {n}: the run dir "
                             "was edited; use trainer.resume=never or a new run dir")
        if len(lines) > n or any(not line.endswith("\n") for line in lines):
            kept = "".join(line if line.endswith("\n") else line + "\n" for line in lines[:n])
            atomic_write(self.metrics_path, lambda f: f.write(kept.encode()))
        self.rows = n

    def log(self, row: dict[str, Any]) -> None:
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n")
            f.flush()
        self.rows += 1
        self.trackers.log_metrics(row)

    def summary(self, summary: dict[str, Any]) -> None:
        text = json.dumps({k: _clean(v) for k, v in summary.items()}, indent=2)
        atomic_write(self.dir / "summary.json", lambda f: f.write((text + "\n").encode()))
        self.trackers.log_summary(summary)  # the end of this start of the run: its tracker runs end too
        self.trackers.close()

    def config(self, cfg: dict[str, Any]) -> None:
        """``config.json``: the resolved config the run ended under, beside its summary (what says the run is done
        where its checkpoints are gone: ``src.trainer.finished_without_checkpoint``)."""
        text = json.dumps(cfg, indent=1)
        atomic_write(self.dir / "config.json", lambda f: f.write((text + "\n").encode()))

    def checkpoint(self, state: dict[str, Any]) -> None:
        save_checkpoint(self.dir, state)
