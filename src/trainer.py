"""One flat training loop over a ``RunState``: steps with a pure-function LR schedule, evaluation, stop
rules, checkpoints every ``trainer.checkpoint_every`` epochs, resume, and clean stops on SIGTERM/SIGINT.

``train(cfg, run_dir)`` returns the run's summary dict (its ``objective`` is the sweep objective).

The pieces, one module each: ``src.loop`` (steps, epochs, evaluation), ``src.run_summary`` (summary.json),
``src.resume`` (a finished run, the checkpoint to continue from) and ``src.stop_signal`` (SIGTERM/SIGINT).
"""
from __future__ import annotations

import json
import logging
import math
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from tqdm.auto import tqdm

from hydra_plugins.vitsweep_sweeper.protocol import TrialTakenOver
from src.loop import run_loop
from src.records import hold_run_dir, writable_run_dir
from src.resume import already_stopped, prepare_resume, resume
from src.run_setup import plain_config
from src.run_state import RunState
from src.run_summary import finish, summarise
from src.stop_signal import RunInterrupted, StopSignal, stop_in_flight
from src.trackers import open_trackers
from src.trial import Reporter
from src.validate import check_config

log = logging.getLogger(__name__)


def start_tracking(state: RunState, sweep_dir: Path | None = None) -> None:
    """Start the experiment trackers of ``logger=`` for this start of the run (a resumed one continues its tracker
    run from its step); rows and the summary reach them through the recorder. ``sweep_dir``: a multirun's, where
    trackers keep a store shared by its runs (``src.trackers.sweep_dir_of``)."""
    state.recorder.track(open_trackers(state.cfg, state.recorder.dir, state.step, state.info, sweep_dir))


def _progress(state: RunState):
    t = state.cfg["trainer"]
    total = state.schedule.total_steps
    return tqdm(total=int(total) if math.isfinite(total) else None, initial=state.step,
                desc=f"{state.info['model']} {state.info['dataset']}", unit="step",
                disable=not t.get("progress", True), dynamic_ncols=True, leave=False,
                mininterval=0.5 if sys.stderr.isatty() else 30.0)  # logs and CI get a line every 30 s


def train(cfg: DictConfig | Mapping[str, Any], run_dir: str | Path, reporter: Reporter | None = None,
          sweep_dir: str | Path | None = None) -> dict:
    """Train one model as configured (or continue it from its run dir) and write its run directory (and send it
    to the ``logger=`` trackers; ``sweep_dir``: the multirun's, None for a single run). Returns the summary dict;
    raises ``RunInterrupted`` (a SystemExit) after SIGTERM/SIGINT."""
    cfg = plain_config(cfg)
    check_config(cfg)
    run_dir = writable_run_dir(run_dir)
    with hold_run_dir(run_dir):  # one process at a time trains in a run dir (a retried trial waits for its first)
        return _train(cfg, run_dir, reporter, sweep_dir)


def _train(cfg: dict[str, Any], run_dir: Path, reporter: Reporter | None, sweep_dir: str | Path | None) -> dict:
    found, done = prepare_resume(cfg, run_dir)
    if done is not None:
        print(f"{run_dir} holds a finished run ({done['stop_reason']}): not retraining\n"
              + json.dumps(done, indent=2), flush=True)
        return done
    state = resume(cfg, run_dir, found)
    try:
        stop = StopSignal()
        with stop.installed():  # from the trackers' start until the final checkpoint and summary are written
            # (StopSignal): a SIGTERM while they start stops the run after its first step, their runs KILLED
            start_tracking(state, None if sweep_dir is None else Path(sweep_dir))
            if already_stopped(state):  # killed after its final checkpoint, or extended past a cap where it converged
                return finish(state, state.stop_reason, checkpoint=False)
            state.started = time.perf_counter()
            with _progress(state) as pbar:
                try:
                    reason = run_loop(state, reporter, stop, pbar)
                except BaseException as e:  # mid-step: keep the last checkpoint, record why the run ended
                    # a trial taken over by its retry (this worker was failed as not answering) stops as after
                    # SIGTERM: its retry, waiting for this run dir, resumes from the last checkpoint
                    taken = isinstance(e, TrialTakenOver)
                    reason = "interrupted" if isinstance(e, KeyboardInterrupt) or taken else "error"
                    state.recorder.summary(summarise(state, reason, None if reason == "interrupted" and not taken
                                                     else f"{type(e).__name__}: {e}"), state.cfg)
                    raise
            summary = finish(state, reason)
            if reason == "interrupted" and stop.signum is not None:
                log.warning("stopped by %s at epoch %d, step %d: checkpoint and summary written to %s; the same "
                            "command continues the run", signal.Signals(stop.signum).name, state.epoch, state.step,
                            run_dir)
                raise RunInterrupted(stop.signum, summary)
    finally:  # the summary closed them; this closes them after an exception that came before it (KILLED for a
        state.recorder.trackers.close("KILLED" if stop_in_flight() else "FAILED")  # stop, as an interrupted summary)
    return summary
