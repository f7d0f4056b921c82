"""The flat training loop over a ``RunState``: optimizer steps with the lr written into ``param_groups`` from a
pure function of the step, epochs, evaluations (``metrics.jsonl`` rows), the stop rules at each step, epoch
and evaluation, and checkpoints every ``trainer.checkpoint_every`` epochs."""
from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F

from src.metrics import batchnorm_start_share, evaluate, recompute_batchnorm
from src.run_state import RunState
from src.stop_rules import STEP_RULES
from src.stop_signal import StopSignal
from src.trial import Reporter

log = logging.getLogger(__name__)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
               autocast: contextlib.AbstractContextManager, xb: torch.Tensor, yb: torch.Tensor,
               class_weights: torch.Tensor | None = None, label_smoothing: float = 0.0,
               grad_clip: float | None = None) -> torch.Tensor:
    """One optimizer step on one batch. Returns the detached loss; never syncs with the device."""
    with autocast:
        loss = F.cross_entropy(model(xb), yb, weight=class_weights, label_smoothing=label_smoothing)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    if grad_clip:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


# above this share of their start value left in BatchNorm's running statistics (momentum 0.1: the first 43
# steps), an evaluation recomputes them from the scored train images (cnn_vgg after 12 steps: 17% -> 96% on digits)
BN_START_SHARE = 0.01


def test_due(state: RunState, final: bool) -> bool:
    """Whether this evaluation scores the test split: the final evaluation always does, the others every
    ``trainer.test_every`` epochs (null: none but the final one). Scoring 10,000 test images costs more than a
    small model's training epoch, and the studies' curves need only the final test error."""
    every = state.cfg["trainer"].get("test_every", 1)
    return final or (every is not None and state.epoch % int(every) == 0)


def score_splits(state: RunState, splits: Iterable[str]) -> dict[str, float]:
    """``{split}_{metric}`` of ``src.metrics.evaluate`` for each of ``splits`` (clean-label metrics on train)."""
    row = {}
    for split in splits:
        clean = state.train_eval_clean if split == "train" else (None, None)
        metrics = evaluate(state.step_model, state.eval_loaders[split], state.autocast, state.data.num_classes, *clean)
        row.update({f"{split}_{k}": v for k, v in metrics.items()})
    return row


def last_lr(state: RunState) -> float:
    """The lr of the last optimizer step taken (the schedule is a pure function of the step)."""
    return state.schedule(max(state.step - 1, 0))


def evaluation_row(state: RunState, epoch_images: int, epoch_time: float, final: bool = False) -> dict[str, Any]:
    """The per-evaluation row of ``metrics.jsonl`` (schema in docs/run_dir.md): train and val
    metrics at every evaluation, test metrics when ``test_due`` (``final``: the run stops after this one)."""
    row: dict[str, Any] = {"epoch": state.epoch, "step": state.step, "lr": last_lr(state)}
    share = batchnorm_start_share(state.model, state.step)
    if share > BN_START_SHARE:  # running statistics still near their start value: scoring with them is wrong
        log.info(f"BatchNorm running statistics still hold {share:.0%} of their start value after {state.step} "
                 "steps: recomputed from the scored train images before this evaluation")
        recompute_batchnorm(state.model, state.eval_loaders["train"], state.autocast)
        row["bn_recomputed"] = True
    row.update(score_splits(state, [s for s in state.eval_loaders if s != "test" or test_due(state, final)]))
    row["wall_s"] = state.wall_s()
    row["images_per_s"] = epoch_images / max(epoch_time, 1e-9)
    return row


def metric(state: RunState, name: str) -> float:
    return float(state.last_row[name] if name in state.last_row else state.best.get(name, math.nan))


def train_epoch(state: RunState, stop: StopSignal, pbar) -> tuple[str | None, int]:
    """Train until the epoch ends or a step-level rule fires; returns (stop reason or None, images)."""
    t, images, batches = state.cfg["trainer"], 0, 0
    begin_epoch(state)
    loss_sum = torch.zeros((), device=state.device)
    for xb, yb in state.train_loader:
        for group in state.optimizer.param_groups:
            group["lr"] = state.schedule(state.step)
        loss_sum += train_step(state.step_model, state.optimizer, state.scaler, state.autocast, xb, yb,
                               state.class_weights, t.get("label_smoothing", 0.0), t.get("grad_clip"))
        state.step, images, batches = state.step + 1, images + len(yb), batches + 1
        pbar.update()
        if state.step % int(t.get("log_every", 50)) == 0:  # the one sync point: progress and NaN check
            total = loss_sum.item()
            if not math.isfinite(total):
                return "nonfinite_loss", images
            pbar.set_postfix(epoch=state.epoch, loss=f"{total / batches:.3f}", refresh=False)
        reason = state.rules.after_step(state.step, state.wall_s()) or ("interrupted" if stop.signum else None)
        if reason:
            return reason, images
    state.epoch_done = True
    return (None if math.isfinite(loss_sum.item()) else "nonfinite_loss"), images


def record_evaluation(state: RunState, images: int, epoch_time: float, reporter: Reporter | None,
                      pbar, final: bool = False) -> str | None:
    """Evaluate, append the row, update the best metrics; returns ``converged`` / ``pruned`` or None.
    ``final``: the run stops after this evaluation (it scores the test split)."""
    if not state.epoch_done:  # a step rule stopped the run mid-epoch: what to restore if it is extended later
        state.before_partial = {"rows": state.recorder.rows, "last_row": dict(state.last_row), "best": dict(state.best)}
    row = evaluation_row(state, images, epoch_time, final)
    reason = state.rules.after_eval(state.epoch, row["train_error"])
    if final and state.epoch_done:  # a whole epoch's: what an uninterrupted run makes of it, if the run is extended
        state.before_final = {"rows": state.recorder.rows, "last_row": dict(state.last_row), "best": dict(state.best),
                              "due": state.rules.should_evaluate(state.epoch, False),
                              "test_due": test_due(state, False), "ends": reason}
    if reason and "test_error" not in row:  # this evaluation ends the run (converged/stalled): score the test split
        row.update(score_splits(state, ["test"]))
        row["wall_s"] = state.wall_s()
    state.recorder.log(row)
    state.last_row = row
    state.note_best(row)
    pbar.set_postfix(epoch=state.epoch, train_err=f"{row['train_error']:.3f}",
                     test_err=f"{row.get('test_error', math.nan):.3f}", img_s=f"{row['images_per_s']:.0f}")
    scored = state.objective_name.removeprefix("best_") in row  # the pruner sees only freshly scored objectives
    if reporter is not None and scored and reporter(metric(state, state.objective_name), state.epoch):
        reason = reason or "pruned"
    return reason


def replay_final_report(state: RunState, reporter: Reporter | None) -> str | None:
    """A run extended past a stop at the end of a whole epoch: keep of that epoch's final evaluation what an
    uninterrupted run records (``RunState.undo_final_evaluation``) and, where that run evaluated there, report the
    evaluation to the pruner as it did. A stopping run reports to none, so the extended run never told the pruner
    that epoch's value and trained on where the uninterrupted run was pruned (found 2026-11-29). Returns ``pruned``
    when the pruner stops the run there, else None."""
    if state.before_final is None or not state.undo_final_evaluation() or reporter is None:
        return None
    scored = state.objective_name.removeprefix("best_") in state.last_row
    return "pruned" if scored and reporter(metric(state, state.objective_name), state.epoch) else None


def begin_epoch(state: RunState) -> None:
    """Move on to the next epoch unless the one in progress was cut short (a resume mid-epoch: an evaluation of its
    half-trained model, made where a step rule stopped it, leaves the records as the epoch goes on; a run extended
    past a stop at an epoch's end keeps of that epoch's final evaluation what an uninterrupted run records)."""
    state.drop_partial_evaluation()
    state.undo_final_evaluation()
    if state.epoch_done:
        state.epoch, state.epoch_done = state.epoch + 1, False
    state.model.train()


def close_epoch(state: RunState, reason: str | None, images: int, started: float, reporter: Reporter | None,
                pbar) -> str | None:
    """The end of an epoch's steps (all of them, or cut short by ``reason``): count its time, apply the epoch
    rule and evaluate when due. Returns the stop reason, or None to go on."""
    if state.device.type == "cuda":
        torch.cuda.synchronize(state.device)
    epoch_time = state.wall_s() - started
    state.train_time += epoch_time
    if reason in ("nonfinite_loss", "interrupted"):
        return reason
    if reason and state.train_loader.pass_complete:
        # a step rule (max_steps, max_wall_s) fired on the epoch's last batch: the epoch was trained whole, and it is
        # evaluated below, so a run resumed under a higher limit goes on with the next epoch (not this one again)
        state.epoch_done = True
        state.train_loader.end_pass()
    if state.epoch_done:  # every step of the epoch ran: its cap applies (before a step rule fired on its last batch)
        reason = state.rules.after_epoch(state.epoch) or reason
    if state.rules.should_evaluate(state.epoch, reason is not None):  # no pruning or convergence once stopping
        later = record_evaluation(state, images, epoch_time, reporter if reason is None else None, pbar,
                                  final=reason is not None)
        due = state.rules.should_evaluate(state.epoch, False)  # an evaluation an uninterrupted run makes too
        if later and state.epoch_done and due and reason in (*STEP_RULES, "max_epochs"):
            # a whole epoch whose evaluation ends the run stops it as an uninterrupted run does: converging at the
            # cap's evaluation is converging, not "capped before converging" (analysis.load's ``capped``); an
            # evaluation only the stop made (off the eval_every grid) converges nothing
            return later
        reason = reason or later
    return reason


def checkpoint_due(state: RunState) -> bool:
    """Whether this epoch's end writes a checkpoint (``trainer.checkpoint_every``)."""
    t = state.cfg["trainer"]
    every = int(t.get("checkpoint_every", 1)) if t.get("checkpoint", True) else 0
    return bool(every) and state.epoch % every == 0


def until_stopped(reporter: Reporter | None, stop: StopSignal) -> Reporter | None:
    """The reporter, silent once a stop signal has come: a stopping run is not pruned, and the sweep hands a stopped
    run's trial back, after which a report to it would fail the run before it saves."""
    if reporter is None:
        return None
    return lambda value, epoch: stop.signum is None and reporter(value, epoch)


def run_loop(state: RunState, reporter: Reporter | None, stop: StopSignal, pbar) -> str:
    """Epochs until a stop rule fires; checkpoints as configured. Returns the stop reason."""
    reporter = until_stopped(reporter, stop)
    pruned = replay_final_report(state, reporter)
    if pruned:
        return pruned
    while True:
        started = state.wall_s()
        reason, images = train_epoch(state, stop, pbar)
        reason = close_epoch(state, reason, images, started, reporter, pbar)
        reason = reason or ("interrupted" if stop.signum else None)
        if reason:
            return reason
        if checkpoint_due(state):
            state.recorder.checkpoint(state.state_dict())
