"""Experiment trackers (``logger=tensorboard``, ``logger=mlflow``, or ``logger=[tensorboard,mlflow]``): every
evaluation row of ``metrics.jsonl``, the run's flattened config and its summary, sent to TensorBoard or MLflow
as well as to the run dir (which stays the record analysis reads). Details in ``docs/trackers.md``.

This module chooses and shields them; the trackers themselves are ``src.trackers_tensorboard`` and
``src.trackers_mlflow``, and what both send is taken from the run's records by ``src.trackers_payload``.
A tracker is ``start(run_dir, cfg, resume_step, tags)``, ``log_metrics(row)``, ``rewind(step, rows)``,
``log_summary(summary)`` and ``close(status, dropped=None)``. ``Trackers`` holds the chosen ones for one run and
shields the run from them: a tracker that fails (an unreachable server, an unwritable store) is dropped with one
warning naming it and the cause (and closed with that cause), and training goes on. A tracker's package loads
only when a run starts it, so ``logger=none`` imports neither; a package that is not installed is refused before
any training (``check_trackers``, from ``src.validate.check_config``).
"""
from __future__ import annotations

import contextlib
import importlib.util
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra.types import RunMode

from src.stop_signal import stop_in_flight
from src.trackers_mlflow import MLflowTracker
from src.trackers_tensorboard import TensorBoardTracker

log = logging.getLogger(__name__)

EXTRAS = {"tensorboard": "tensorboard", "mlflow": "mlflow"}  # tracker -> the package it imports (= its extra)


def chosen(cfg: Mapping[str, Any]) -> list[str]:
    """The trackers a composed config asks for: the keys of its ``logger`` node (none for ``logger=none``)."""
    return list(cfg.get("logger") or {})


def check_trackers(cfg: Mapping[str, Any]) -> None:
    """Refuse an unknown tracker, or one whose package is not installed, before any training."""
    for name in chosen(cfg):
        if name not in EXTRAS:
            raise ValueError(f"logger.{name} is not a tracker: choose logger=none, tensorboard, mlflow or "
                             "[tensorboard,mlflow]")
        if importlib.util.find_spec(EXTRAS[name]) is None:
            raise ValueError(f"logger={name} needs the {EXTRAS[name]} package, which is not installed: "
                             f"pip install 'vitsweep[{name}]' (or choose logger=none)")


def sweep_dir_of(hydra_cfg: Any) -> Path | None:
    """The sweep dir of a multirun job (its run dir less ``hydra.sweep.subdir``), None for a single run.
    ``hydra_cfg`` is ``HydraConfig.get()`` inside the job (where the subdir's interpolations resolve)."""
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return None
    depth = len(Path(str(hydra_cfg.sweep.subdir)).parts)
    return Path(hydra_cfg.runtime.output_dir).absolute().parents[depth - 1]


class Trackers:
    """The trackers of one run, each call shielded: the first exception of a tracker drops it with one warning
    naming the tracker and the cause, and the run goes on (its run dir stays complete)."""

    def __init__(self, trackers: list | None = None):
        self.active = list(trackers or [])

    def _each(self, method: str, *args: Any) -> None:
        for tracker in list(self.active):
            try:
                getattr(tracker, method)(*args)
            except Exception as e:
                self.active.remove(tracker)
                cause = f"{method} failed ({type(e).__name__}: {str(e).strip()[:500]})"
                log.warning(f"logger={tracker.name}: {cause}; nothing more is sent to {tracker.name} for this run, "
                            "which goes on and writes its run dir in full (docs/trackers.md)")
                with contextlib.suppress(Exception):  # the tracker's record was cut short, not the training
                    tracker.close("KILLED", dropped=cause)

    def start(self, run_dir: Path, cfg: Mapping[str, Any], resume_step: int, tags: Mapping[str, Any]) -> None:
        self._each("start", run_dir, cfg, resume_step, tags)

    def log_metrics(self, row: Mapping[str, Any]) -> None:
        self._each("log_metrics", row)

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        self._each("log_summary", summary)

    def rewind(self, step: int, rows: list[Mapping[str, Any]]) -> None:
        """``metrics.jsonl`` was rewritten from ``step`` on (an extended run's records drop an evaluation an
        uninterrupted run does not make, or its test metrics) and now holds ``rows`` there."""
        self._each("rewind", step, rows)

    def close(self, status: str = "FAILED") -> None:
        """End the trackers; ``status``: what an MLflow run without a summary ends as (``KILLED``: a stop)."""
        self._each("close", status)
        self.active = []


def open_trackers(cfg: Mapping[str, Any], run_dir: Path, resume_step: int, info: Mapping[str, Any],
                  sweep_dir: Path | None = None) -> Trackers:
    """Start the trackers ``cfg["logger"]`` names for the run in ``run_dir`` at ``resume_step`` (0: a fresh
    start); ``info`` is the summary's facts (the study and trial, in a sweep)."""
    options = cfg.get("logger") or {}
    made = []
    for name in chosen(cfg):
        kwargs = dict(options[name] or {})
        made.append(TensorBoardTracker(**kwargs) if name == "tensorboard" else MLflowTracker(**kwargs,
                                                                                            sweep_dir=sweep_dir))
    tags = {k: info[k] for k in ("study_name", "trial_number") if k in info}
    trackers = Trackers(made)
    try:
        trackers.start(Path(run_dir), cfg, resume_step, tags)
    except BaseException:  # a stop (Ctrl-C) during a start: a tracker's failure drops it instead (``Trackers``)
        trackers.close("KILLED" if stop_in_flight() else "FAILED")  # the runs the trackers began end with it
        raise
    return trackers
