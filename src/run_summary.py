"""A stopped run's summary: its ``summary.json`` dict (status, stop reason, last and best metrics, the stall
and low-lr flags), the warnings a reader needs, and the final checkpoint written with it."""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import torch

from src.loop import last_lr, metric
from src.run_state import RunState
from src.stop_rules import COLLAPSE_RISE, StopRules
from src.validate import objective_metrics

log = logging.getLogger(__name__)
# A stalled run (train error stuck at chance) is a result, not a failure: it stays in the curves, flagged
# ``stalled``; only a loss that went non-finite (or an exception) fails a run.
STATUS = {"max_epochs": "completed", "max_steps": "completed", "converged": "completed", "stalled": "completed",
          "max_wall": "stopped",
          "pruned": "stopped", "interrupted": "stopped", "nonfinite_loss": "failed", "error": "failed"}


MOTIONLESS = ("converged", "stalled")  # stop rules that mean "the train error stopped moving"
LOW_LR_SHARE = 0.1  # such a stop under an lr below this share of the peak is flagged ``low_lr_stop``


def summarise(state: RunState, reason: str, error: str | None = None) -> dict[str, Any]:
    """The summary.json dict of a run that stopped for ``reason``."""
    row = state.last_row
    summary = {"status": STATUS[reason], "stop_reason": reason, **state.info, "epochs": state.epoch,
               "steps": state.step, "wall_s": state.wall_s(),
               "train_images_per_s": state.step * state.train_loader.batch_size / max(state.train_time, 1e-9)}
    if state.device.type == "cuda":  # the peak since the run's set-up (a stacked group's members share one)
        summary["peak_gpu_mem_gib"] = torch.cuda.max_memory_allocated(state.device) / 2**30
    known = set(objective_metrics())  # every metric of the last evaluation (row also holds epoch, lr, timings)
    summary.update({k: v for k, v in row.items() if k in known})
    summary.update(state.best)
    summary["objective"] = math.nan if reason == "nonfinite_loss" else metric(state, state.objective_name)
    rules = state.rules  # its history holds every evaluation's train error, across resumes
    if rules.history:
        summary["best_train_error"] = rules.lowest_error()
    # a finished run that did not end as a learned model: the stall rule fired, it ended within the margin of chance
    # for another reason (e.g. at its epoch cap, an error moving by a few images never held still long enough), or it
    # collapsed from far lower (seen on CIFAR-10 near the interpolation threshold, ending a few points below chance);
    # analysis.load.result_flags applies the same tests to the records
    finished = STATUS[reason] == "completed" and "train_error" in row
    summary["collapsed"] = finished and rules.collapsed()
    summary["stalled"] = (reason == "stalled" or summary["collapsed"]
                          or (finished and rules.at_chance(row["train_error"])))
    summary.update(lr_record(state, reason))
    if error:
        summary["error"] = error
    return summary


def lr_record(state: RunState, reason: str) -> dict[str, Any]:
    """``base_lr`` (the schedule's peak), ``lr_at_stop`` (the lr of the last optimizer step) and ``low_lr_stop``:
    the run stopped as converged or stalled while that lr was below ``LOW_LR_SHARE`` of the peak, so the train
    error may have stopped moving because the schedule annealed the lr, not because the model converged."""
    base, lr = state.schedule.base_lr, last_lr(state)
    return {"base_lr": base, "lr_at_stop": lr, "low_lr_stop": reason in MOTIONLESS and lr < LOW_LR_SHARE * base}


def warn_about_stop(summary: Mapping[str, Any], rules: StopRules) -> None:
    """The two stops that are results but need a reader's attention: stalled at chance, and motionless at a low lr."""
    if summary.get("collapsed"):
        log.warning(f"collapsed: train error {summary['train_error']:.3f} at the end ({summary['stop_reason']}), "
                    f"{COLLAPSE_RISE} or more above the {summary['best_train_error']:.3f} it reached: the model lost "
                    "what it had learned (e.g. a loss spike killed its ReLUs). Recorded as a result (stalled: true, "
                    "collapsed: true); a lower optimizer.lr or trainer.grad_clip may train it stably")
    elif summary["stalled"]:
        how = (f"unchanged over {rules.converge_epochs} epochs" if summary["stop_reason"] == "stalled"
               else f"at the end ({summary['stop_reason']})")
        log.warning(f"stalled: train error {summary.get('train_error', math.nan):.3f} {how}, at or above "
                    f"{rules.chance_error - rules.stalled_margin:.3f} (the error of always predicting the commonest "
                    f"label, {rules.chance_error:.3f}, less trainer.stalled_margin {rules.stalled_margin}): the model "
                    "did not learn. Recorded as a result (stalled: true); "
                    "try another optimizer.lr, scheduler.warmup_epochs or seed (trainer.stalled_margin=null turns "
                    "this check off)")
    if summary["low_lr_stop"]:
        log.warning(f"{summary['stop_reason']} at lr {summary['lr_at_stop']:.3g}, below {LOW_LR_SHARE:.0%} of its base "
                    f"{summary['base_lr']:.3g}: the train error may have stopped moving because the schedule annealed "
                    "the lr (recorded as low_lr_stop: true); scheduler=constant makes a convergence stop mean that "
                    "the model stopped learning")


def finish(state: RunState, reason: str, checkpoint: bool = True) -> dict[str, Any]:
    """Write the final checkpoint (a run that can continue) and summary.json; returns the summary.
    ``checkpoint=False`` for a state that was just loaded from its final checkpoint (keep the previous one)."""
    state.stop_reason = reason
    if not checkpoint and state.machines_before is not None:  # finished here without training: not this machine's
        state.info["machines"] = list(state.machines_before)
    if checkpoint and state.cfg["trainer"].get("checkpoint", True) and reason not in ("nonfinite_loss", "error"):
        state.recorder.checkpoint(state.state_dict())
    summary = summarise(state, reason)
    state.recorder.summary(summary, state.cfg)
    warn_about_stop(summary, state.rules)
    return summary
