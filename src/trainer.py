"""One flat training loop over a ``RunState``: steps with a pure-function LR schedule, evaluation, stop
rules, checkpoints every ``trainer.checkpoint_every`` epochs, resume, and clean stops on SIGTERM/SIGINT.

``train(cfg, run_dir)`` returns the run's summary dict (its ``objective`` is the sweep objective).
"""
from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from tqdm.auto import tqdm

from hydra_plugins.vitsweep_sweeper.protocol import TrialTakenOver, config_differences
from src.checkpoint import check_extension, check_resumable, move_aside, read_checkpoints
from src.metrics import batchnorm_start_share, evaluate, recompute_batchnorm
from src.records import hold_run_dir, writable_run_dir
from src.run_contract import RUNTIME_KEYS
from src.run_state import RunState, plain_config, setup
from src.stop_rules import COLLAPSE_RISE, STEP_RULES, StopRules
from src.trackers import open_trackers
from src.trial import Reporter
from src.validate import check_config, objective_metrics

log = logging.getLogger(__name__)
# A stalled run (train error stuck at chance) is a result, not a failure: it stays in the curves, flagged
# ``stalled``; only a loss that went non-finite (or an exception) fails a run.
STATUS = {"max_epochs": "completed", "max_steps": "completed", "converged": "completed", "stalled": "completed",
          "max_wall": "stopped",
          "pruned": "stopped", "interrupted": "stopped", "nonfinite_loss": "failed", "error": "failed"}


MOTIONLESS = ("converged", "stalled")  # stop rules that mean "the train error stopped moving"
LOW_LR_SHARE = 0.1  # such a stop under an lr below this share of the peak is flagged ``low_lr_stop``


class RunInterrupted(SystemExit):
    """SIGTERM or SIGINT stopped the run after a checkpoint and its ``interrupted`` summary were written.
    A ``SystemExit`` with code 128 + signal number, so a job process exits non-zero; ``summary`` holds it."""

    def __init__(self, signum: int, summary: dict[str, Any]):
        super().__init__(128 + signum)
        self.signum, self.summary = signum, summary

    def __reduce__(self):  # a pool worker sends it back pickled; the default would call __init__(code) alone
        return type(self), (self.signum, self.summary)


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


class StopSignal:
    """SIGTERM/SIGINT handlers that ask the loop to stop after the current step (a second SIGINT raises
    KeyboardInterrupt at once). Installed only in the main thread; elsewhere the default handlers stay.

    They stay installed until the run's final checkpoint and summary are written: a second SIGTERM there (a sweep's
    launcher hands a stop on to its workers, which the signal has often reached already) met the default handler
    and ended the process mid-save. A signal the run did not stop for (it came as the run ended for another
    reason) is handed on to the handler that was there before, once the block ends without an exception: the
    process was asked to stop, and a worker must not start its next job. A sweep's retry of such a run finds it
    done under ``trainer.checkpoint=true`` (every study's setting); without checkpoints it trains again, as any
    stopped run without checkpoints does."""

    def __init__(self):
        self.signum: int | None = None

    def _handle(self, signum, frame):  # only sets a flag: the loop logs and stops at the next step's end
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopSignal]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        old = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield self
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
        if self.signum is not None:  # the block ended normally: its run did not stop for the signal
            log.warning("%s came as the run ended: its records are whole; the signal goes on to this process",
                        signal.Signals(self.signum).name)
            signal.raise_signal(self.signum)


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
    if reason and "test_error" not in row:  # this evaluation ends the run (converged/stalled): score the test split
        row.update(score_splits(state, ["test"]))
        row["wall_s"] = state.wall_s()
    state.recorder.log(row)
    state.last_row = row
    for k in ("test_error", "val_error"):
        if k in row:
            state.best[f"best_{k}"] = min(state.best.get(f"best_{k}", math.inf), row[k])
    pbar.set_postfix(epoch=state.epoch, train_err=f"{row['train_error']:.3f}",
                     test_err=f"{row.get('test_error', math.nan):.3f}", img_s=f"{row['images_per_s']:.0f}")
    scored = state.objective_name.removeprefix("best_") in row  # the pruner sees only freshly scored objectives
    if reporter is not None and scored and reporter(metric(state, state.objective_name), state.epoch):
        reason = reason or "pruned"
    return reason


def begin_epoch(state: RunState) -> None:
    """Move on to the next epoch unless the one in progress was cut short (a resume mid-epoch: an evaluation of its
    half-trained model, made where a step rule stopped it, leaves the records as the epoch goes on)."""
    state.drop_partial_evaluation()
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
        if later and state.epoch_done and reason in STEP_RULES:
            return later  # a whole epoch whose evaluation ends the run stops it as an uninterrupted run does
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
    while True:
        started = state.wall_s()
        reason, images = train_epoch(state, stop, pbar)
        reason = close_epoch(state, reason, images, started, reporter, pbar)
        reason = reason or ("interrupted" if stop.signum else None)
        if reason:
            return reason
        if checkpoint_due(state):
            state.recorder.checkpoint(state.state_dict())


def summarise(state: RunState, reason: str, error: str | None = None) -> dict[str, Any]:
    """The summary.json dict of a run that stopped for ``reason``."""
    row = state.last_row
    summary = {"status": STATUS[reason], "stop_reason": reason, **state.info, "epochs": state.epoch,
               "steps": state.step, "wall_s": state.wall_s(),
               "train_images_per_s": state.step * state.train_loader.batch_size / max(state.train_time, 1e-9)}
    if state.device.type == "cuda":  # the process's peak (a stacked group's members share one)
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


def finished_summary(run_dir: Path, rules: StopRules) -> dict[str, Any] | None:
    """The summary of a run in ``run_dir`` that has ended and would not continue under ``rules``."""
    path = run_dir / "summary.json"
    if not path.is_file():
        return None
    s = json.loads(path.read_text())
    done = rules.still_stops(s.get("stop_reason"), s.get("epochs") or 0, s.get("steps") or 0, s.get("wall_s") or 0)
    return s if done else None


# runtime keys a finished run may differ in and still be this config's result: not its length (under a cosine
# schedule another length is another run from step 0; under any, a cap below where the run went is another run)
SAME_RUN_RUNTIME_KEYS = tuple(k for k in RUNTIME_KEYS if k not in ("trainer.max_epochs", "trainer.max_steps"))


def finished_without_checkpoint(cfg: dict[str, Any], run_dir: Path) -> dict[str, Any] | None:
    """The summary of a finished run whose checkpoints are gone (records copied without them, space freed), where
    the config it ended under (``config.json``) is this one but for runtime keys and its stop still holds: done, as
    with its final checkpoint (found on a lent H100: 11 converged runs came back from checkpoint-free records and
    trained again). Only under ``trainer.checkpoint=true``: a run without checkpoints trains again on a rerun."""
    path = run_dir / "config.json"
    if not cfg["trainer"].get("checkpoint", True) or not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict):
        return None
    # stricter than a checkpoint's check: every key present in both, and the run length unchanged
    diff = config_differences(saved, cfg, ignore=SAME_RUN_RUNTIME_KEYS, strict=True)
    if diff:
        log.warning("%s holds a finished run under another config, and no checkpoint: its files are moved aside and "
                    "the run trains again (%s)", run_dir, "; ".join(diff[:5]))
        return None
    return finished_summary(run_dir, StopRules.from_config(cfg["trainer"]))


def prepare_resume(cfg: dict[str, Any], run_dir: Path) -> tuple[Iterator[tuple[Path, dict]], dict | None]:
    """(checkpoints to try, newest first; the summary of a finished run or None). Fails before any work
    when the newest readable checkpoint comes from a different config, or when changed limits would continue it
    under another lr-schedule horizon (``check_extension``); moves unusable files aside."""
    if cfg["trainer"].get("resume", "auto") == "never":
        move_aside(run_dir)
        return iter(()), None
    found = read_checkpoints(run_dir)
    newest = next(found, None)
    if newest is None:
        done = finished_without_checkpoint(cfg, run_dir)
        if done is None:
            move_aside(run_dir)  # records of a run that cannot be continued (none, or no readable checkpoint)
        return iter(()), done
    check_resumable(newest[0], newest[1]["config"], cfg)
    check_not_past(newest[0], newest[1], cfg)
    # finished or not, only under the lr schedule it ran with: a finished cosine run under another horizon is another
    # run from step 0, and its summary is not this config's result
    check_extension(newest[0], newest[1], cfg)
    done = finished_summary(run_dir, StopRules.from_config(cfg["trainer"]))
    return itertools.chain([newest], found), done


def check_not_past(path: Path, ckpt: Mapping[str, Any], cfg: Mapping[str, Any]) -> None:
    """Refuse a start whose epoch or step limit lies below where the run in ``path`` already went: a lower limit
    cannot shorten a run, and its records (a finished run's summary included) would not be this config's."""
    t = cfg["trainer"]
    epoch, step = int(ckpt.get("epoch") or 0), int(ckpt.get("step") or 0)
    past = [f"trainer.{k}={t[k]}" for k, ran in (("max_epochs", epoch), ("max_steps", step)) if t.get(k) and ran > t[k]]
    if past:
        raise ValueError(f"{path} holds a run that trained {epoch} epochs ({step} steps), past {' and '.join(past)}: a "
                         "lower limit cannot shorten it. Fix: a new run dir (hydra.run.dir=...) or "
                         "trainer.resume=never (moves this run's files aside and trains the shorter run)")


def resume(cfg: dict[str, Any], run_dir: Path, found: Iterable[tuple[Path, dict]]) -> RunState:
    """A fresh ``setup`` continued from the first checkpoint that loads (or a fresh start, with a warning).
    Each try gets its own ``setup``: a checkpoint that fails half-way leaves the state it touched unusable."""
    tried = False
    for path, ckpt in found:
        tried, state = True, setup(cfg, run_dir)
        try:
            state.load_state_dict(ckpt)
        except (RuntimeError, ValueError, KeyError, TypeError) as e:
            log.warning("checkpoint %s does not fit this run (%s: %s): trying the previous one", path,
                        type(e).__name__, str(e).splitlines()[0])
            continue
        stale = run_dir / "summary.json"  # the previous start's (interrupted) summary, superseded by this run
        if stale.exists():
            stale.replace(run_dir / "summary.previous.json")
        log.info("resuming %s from %s (epoch %d, step %d)", run_dir, path.name, state.epoch, state.step)
        return state
    if tried:
        log.warning("no checkpoint in %s fits this run: starting afresh", run_dir)
        move_aside(run_dir)
    return setup(cfg, run_dir)


def start_tracking(state: RunState, sweep_dir: Path | None = None) -> None:
    """Start the experiment trackers of ``logger=`` for this start of the run (a resumed one continues its tracker
    run from its step); rows and the summary reach them through the recorder. ``sweep_dir``: a multirun's, where
    trackers keep a store shared by its runs (``src.trackers.sweep_dir_of``)."""
    state.recorder.track(open_trackers(state.cfg, state.recorder.dir, state.step, state.info, sweep_dir))


def already_stopped(state: RunState) -> bool:
    """True when ``state`` resumed from a run's final checkpoint and no stop limit was raised since."""
    return state.rules.still_stops(state.stop_reason, state.epoch, state.step, state.wall_before)


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
    start_tracking(state, None if sweep_dir is None else Path(sweep_dir))
    try:
        stop = StopSignal()
        with stop.installed():  # until the final checkpoint and summary are written (StopSignal)
            if already_stopped(state):  # killed after its final checkpoint, before its summary
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
    finally:  # the summary closed them; this closes them after an exception that came before it
        state.recorder.trackers.close()
    return summary
