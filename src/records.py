"""The run directory: the contract between training and analysis (schema in docs/run_dir.md).

``metrics.jsonl`` gets one JSON object per evaluation, appended and flushed line by line;
``summary.json`` is written at the end (atomically, so a file that exists is complete), with ``config.json``;
checkpoints are written by ``src.checkpoint`` (atomically too). Nothing here deletes a run's files:
a resumed run cuts ``metrics.jsonl`` back to the rows its checkpoint had seen. Rows and the summary also go
to the run's experiment trackers (``src.trackers``, ``logger=``), which the summary closes.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from hydra_plugins.vitsweep_sweeper.protocol import file_lock
from src.checkpoint import atomic_write, save_checkpoint
from src.trackers import Trackers

log = logging.getLogger(__name__)


def _clean(value: Any) -> Any:
    """JSON-safe value: tensors to numbers, non-finite floats to None."""
    if torch.is_tensor(value):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


LOCK = ".lock"  # a run's process holds an exclusive flock on it while it trains (hold_run_dir)


@contextlib.contextmanager
def hold_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir`` for this process while it trains, waiting while another process holds it.

    A sweep retries a trial whose worker stopped answering in that trial's run dir; a worker that was only
    suspended (SIGSTOP, a Slurm suspend, a frozen VM) then wakes beside its retry. Unlocked, both wrote into one
    dir: the retry's completed summary was overwritten with the woken run's error, and its checkpoint lost. Held,
    the retry waits until the first process ends (its lock goes with its process, even under SIGKILL), then
    resumes from what that one left. The lock is ``protocol.file_lock`` on ``run_dir/.lock``, which is never moved
    aside. On NFS its reach is the mount's: across hosts with lock support, this host only under ``nolock`` or
    ``local_lock=flock``. A second hold of one dir in this process raises (it would wait on itself)."""
    key = os.path.realpath(run_dir)
    if key in _HELD:  # flock is per open file: a second hold in this process would wait on itself for ever
        raise RuntimeError(f"{run_dir} is already being trained by this process (two runs given one run dir?): "
                           "give each run its own dir (hydra.sweep.subdir must hold the job number)")
    _HELD.add(key)

    def waiting() -> None:
        log.warning("%s is in use by another process (a retried trial whose first worker is still alive?): waiting "
                    "for it to end, then resuming from what it leaves", run_dir)

    try:
        with file_lock(run_dir / LOCK, on_wait=waiting):
            yield
    finally:
        _HELD.discard(key)


_HELD: set[str] = set()  # the run dirs this process holds


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
        if len(lines) > n and self.trackers.active:  # trackers started on this run (an extended run dropping an
            try:  # evaluation) drop it too; at a resume's load none has started, and a killed write may be torn
                step = int(json.loads(lines[n])["step"])
            except (ValueError, KeyError, TypeError):
                return
            self.trackers.rewind(step, [])

    def drop_from_last_row(self, prefix: str) -> None:
        """Rewrite the last row of ``metrics.jsonl`` without its keys starting with ``prefix`` (a final evaluation's
        ``test_*`` metrics, which the run extended past it would not have scored there)."""
        lines = self.metrics_path.read_text().splitlines(keepends=True)[:self.rows]
        if not lines:
            return
        row = {k: v for k, v in json.loads(lines[-1]).items() if not k.startswith(prefix)}
        kept = "".join(lines[:-1]) + json.dumps(row) + "\n"
        atomic_write(self.metrics_path, lambda f: f.write(kept.encode()))
        self.trackers.rewind(int(row["step"]), [row])

    def log(self, row: dict[str, Any]) -> None:
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n")
            f.flush()
        self.rows += 1
        self.trackers.log_metrics(row)

    def summary(self, summary: dict[str, Any], cfg: dict[str, Any]) -> None:
        """``summary.json``, and first ``config.json``: the resolved config this start of the run ended under. The
        analysis reads that config for a run with a summary (Hydra rewrites ``.hydra/`` before a refused start's
        checks), and with checkpoints on it says the run is done where they are gone
        (``src.resume.finished_without_checkpoint``)."""
        text = json.dumps(cfg, indent=1)
        atomic_write(self.dir / "config.json", lambda f: f.write((text + "\n").encode()))
        text = json.dumps({k: _clean(v) for k, v in summary.items()}, indent=2)
        atomic_write(self.dir / "summary.json", lambda f: f.write((text + "\n").encode()))
        self.trackers.log_summary(summary)  # the end of this start of the run: its tracker runs end too
        self.trackers.close()

    def checkpoint(self, state: dict[str, Any]) -> None:
        save_checkpoint(self.dir, state)
