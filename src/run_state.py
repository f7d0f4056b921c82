"""A run's whole state as one object: ``RunState`` and the learning-rate ``Schedule`` it holds.

``RunState`` is everything one run is, what the set-up built (``src.run_setup.setup``) plus its progress;
``state_dict()`` / ``load_state_dict()`` make checkpointing and resuming it one call each, and a checkpoint of other
data is refused (``OtherDataError``). The trainer (``src.trainer``, ``src.loop``) runs the loop on it.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from src.data import DataSplits
from src.data.loader import Loader
from src.device_setup import autocast_for
from src.records import RunRecorder
from src.schedule import lr_at
from src.stop_rules import StopRules


@dataclass
class Schedule:
    """The learning rate as a pure function of the step (``src.schedule.lr_at``) for one run."""

    base_lr: float
    total_steps: float  # inf with a wall-time limit alone (constant schedule only)
    warmup_steps: int
    name: str
    min_lr_ratio: float = 0.0

    def __call__(self, step: int) -> float:
        total = int(self.total_steps) if math.isfinite(self.total_steps) else step + 1
        return lr_at(step, self.base_lr, total, self.warmup_steps, self.name, self.min_lr_ratio)


@dataclass
class RunState:
    """Everything one run is: what ``setup`` built plus its progress (the part ``state_dict`` saves).

    Reproducing one run's start outside ``setup`` (e.g. a launcher stacking several runs into one
    model) means consuming the random streams in this order: ``torch.manual_seed(seed)``;
    ``build_data(cfg.dataset, seed)``; label noise with ``apply_label_noise(y_train, p, num_classes,
    torch.Generator().manual_seed(seed + 1))``; ``build_model`` (initial weights from the global torch
    generator, right after the data); the training loader's own generator seeded with ``seed`` (batch
    order, then the augmentation draws of each batch, epoch after epoch); the scored train-eval subset
    from ``torch.Generator().manual_seed(seed + 2)``. Dropout draws from the global torch generator as
    training goes, continuing from its state right after ``build_model``. Neighbouring seeds share streams
    (seed s's label noise uses the integer seed that seed s + 1's initialisation uses): see docs/config.md.
    """

    cfg: dict
    device: torch.device
    data: DataSplits
    model: torch.nn.Module
    model_cfg: dict
    step_model: torch.nn.Module  # the model, or its torch.compile wrapper
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    autocast: contextlib.AbstractContextManager
    train_loader: Loader
    eval_loaders: dict[str, Loader]
    train_eval_clean: tuple[torch.Tensor, torch.Tensor]  # original labels and flipped mask of the scored train images
    schedule: Schedule
    rules: StopRules
    recorder: RunRecorder | None
    objective_name: str
    info: dict  # facts of the run that go into summary.json unchanged
    class_weights: torch.Tensor | None = None
    epoch: int = 0  # the epoch in progress, or the last one finished when ``epoch_done``
    epoch_done: bool = True
    step: int = 0
    train_time: float = 0.0  # seconds spent in training steps, over all starts of the run
    wall_before: float = 0.0  # wall seconds spent by earlier starts of the run
    last_row: dict = field(default_factory=dict)  # the latest evaluation
    best: dict = field(default_factory=dict)  # best_test_error, best_val_error so far
    stop_reason: str | None = None  # set by the final checkpoint of a run
    started: float = field(default_factory=time.perf_counter)
    machines_before: list | None = None  # the machines a resumed run's checkpoint names (None: not resumed)
    # rows seen, last row and best metrics before an evaluation of a half-trained epoch (a step rule stopped the run
    # mid-epoch): a run extended past that stop drops the evaluation, as an uninterrupted run never made it
    before_partial: dict | None = None
    # the same before the evaluation of a whole epoch made final by a stop (max_epochs, or a step rule on its last
    # batch), with whether an uninterrupted run makes it (``due``), scores the test split there (``test_due``) and
    # stops there (``ends``: converged, stalled): a run extended past that stop keeps only what that run records
    before_final: dict | None = None

    def drop_partial_evaluation(self) -> None:
        """A run extended past a step rule that stopped it mid-epoch: its evaluation of the half-trained epoch leaves
        ``metrics.jsonl``, the last row and the best metrics (as it left the stop rules' history on load), so the
        extended run's records equal an uninterrupted run's: one row per epoch, and no best value of a model that run
        never evaluated (found 2026-11-29: best_val_error 0.045 against the uninterrupted 0.05). Checkpoints written
        before 2026-11-29 do not hold what to restore, and keep the row."""
        bp, self.before_partial = self.before_partial, None
        if bp is None:
            return
        self.last_row, self.best = dict(bp["last_row"]), dict(bp["best"])
        if self.recorder is not None:
            self.recorder.keep_rows(int(bp["rows"]))

    def undo_final_evaluation(self) -> bool:
        """A run extended past a stop at the end of a whole epoch (its epoch cap, or a step rule on the epoch's last
        batch): that epoch's evaluation was final, so it was made though ``eval_every`` said none was due and it
        scored the test split though ``test_every`` did not. What an uninterrupted run does not record leaves the
        records (found 2026-11-29: eval_every=2, 3 then 6 epochs recorded epochs 2, 3, 4, 6 against 2, 4, 6): an
        evaluation not due leaves ``metrics.jsonl``, the last row, the best metrics and the convergence history, as a
        half-trained epoch's does; a due one loses its ``test_*`` metrics where only the stop scored them (and
        ``best_test_error`` its value). Checkpoints written before 2026-11-29 do not say, and keep the evaluation.
        Returns True when the evaluation stays as one an uninterrupted run makes (``src.loop.replay_final_report``
        then reports it to the pruner, as that run did)."""
        bf, self.before_final = self.before_final, None
        if bf is None:
            return False
        if not bf["due"]:
            if self.rules.history and self.rules.history[-1][0] == self.epoch:
                self.rules.history.pop()
            self.last_row, self.best = dict(bf["last_row"]), dict(bf["best"])
            if self.recorder is not None:
                self.recorder.keep_rows(int(bf["rows"]))
        elif not bf["test_due"]:
            self.last_row = {k: v for k, v in self.last_row.items() if not k.startswith("test_")}
            self.best = dict(bf["best"])
            self.note_best(self.last_row)
            if self.recorder is not None:
                self.recorder.drop_from_last_row("test_")
        return bool(bf["due"])

    def note_best(self, row: Mapping[str, Any]) -> None:
        """Take the test and val errors of evaluation ``row`` into the best metrics."""
        for k in ("test_error", "val_error"):
            if k in row:
                self.best[f"best_{k}"] = min(self.best.get(f"best_{k}", math.inf), row[k])

    def wall_s(self) -> float:
        """Wall time of the run so far, counted across resumes."""
        return self.wall_before + time.perf_counter() - self.started

    def state_dict(self) -> dict[str, Any]:
        """Plain tensors, dicts, lists, numbers and strings only (``torch.load(weights_only=True)`` reads it)."""
        cuda = torch.cuda.get_rng_state_all() if self.device.type == "cuda" else []
        return {
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(), "model_cfg": self.model_cfg, "config": self.cfg,
            "data": dict(self.data_record),
            "epoch": self.epoch, "epoch_done": self.epoch_done, "step": self.step, "train_time": self.train_time,
            "wall_s": self.wall_s(), "rows": self.recorder.rows if self.recorder else 0,
            "last_row": dict(self.last_row), "best": dict(self.best), "rules": self.rules.state_dict(),
            "before_partial": self.before_partial, "before_final": self.before_final,
            "stop_reason": self.stop_reason,
            "rng": {"torch": torch.get_rng_state(), "cuda": list(cuda)}, "loader": self.train_loader.state_dict(),
            "steps_per_epoch": len(self.train_loader),  # the schedule's horizon under other limits (check_extension)
            "precision": self.info["precision"],  # what `auto` chose: a resumed run keeps it
            "attention": self.info.get("attention"),  # likewise model.attention=auto's path
            "machines": self.info["machines"],  # every machine this run has trained on, in order
        }

    @functools.cached_property
    def data_record(self) -> dict[str, Any]:
        """What the checkpoint keeps of the data it trained on: the training images' statistics and shape, the class
        count and digests of the training labels as trained (label noise applied) and of the test labels. The data
        never changes within a run, so it is computed once, not at every checkpoint."""
        def digest(y: torch.Tensor) -> str:
            return hashlib.sha256(y.detach().cpu().contiguous().numpy().tobytes()).hexdigest()

        return {"mean": list(self.data.mean), "std": list(self.data.std), "image_shape": list(self.data.image_shape),
                "num_classes": self.data.num_classes, "labels_sha256": digest(self.data.y_train),
                "test_labels_sha256": digest(self.data.y_test)}

    def check_same_data(self, saved: Mapping[str, Any] | None) -> None:
        """Raise :class:`OtherDataError` when a checkpoint trained on other data than this run's: ``dataset.root``
        may move between starts (another machine's copy of a file), but continuing on other content (another file,
        other noisy labels, another test set) would finish one run on two datasets. It is an error, not a checkpoint
        to fall back from: starting afresh would throw the run's training away for what is likely a wrong path. The
        statistics are compared to a relative 1e-6 (their sums may round differently on another CPU); a checkpoint
        written before the label digests has none to compare."""
        if not saved:
            return
        now = self.data_record
        differ = [k for k in ("image_shape", "num_classes") if saved[k] != now[k]]
        differ += [k for k in ("mean", "std")
                   if not all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
                              for a, b in zip(saved[k], now[k], strict=True))]
        for key, what in (("labels_sha256", "training labels"), ("test_labels_sha256", "test labels")):
            if saved.get(key) not in (None, now[key]):
                differ.append(what)
        if differ:
            raise OtherDataError(f"the checkpoint trained on other data ({', '.join(differ)} differ): the data behind "
                                 "dataset.root or the label noise changed since. Fix: point dataset.root back at the "
                                 "run's data, or trainer.resume=never to move this run's files aside and train it "
                                 "afresh on the new data")

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``; raises (RuntimeError, ValueError, KeyError) on one that does not fit."""
        self.check_same_data(state.get("data"))
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.rules.load_state_dict(state["rules"])
        self.train_loader.load_state_dict(state["loader"])
        torch.set_rng_state(state["rng"]["torch"])
        if self.device.type == "cuda" and state["rng"]["cuda"]:
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        self.epoch, self.epoch_done, self.step = int(state["epoch"]), bool(state["epoch_done"]), int(state["step"])
        history = self.rules.history
        if not self.epoch_done and history and history[-1][0] == self.epoch:
            # a step rule stopped the run inside this epoch and evaluated the half-trained model: that value leaves
            # the convergence history (the epoch is evaluated when done, as in a run never stopped), else the
            # window would hold two values for one epoch and could converge later than the uninterrupted run
            history.pop()
            self.before_partial = state.get("before_partial")  # dropped from the records if the run goes on
        self.train_time, self.wall_before = float(state["train_time"]), float(state["wall_s"])
        self.last_row, self.best = dict(state["last_row"]), dict(state["best"])
        self.stop_reason = state.get("stop_reason")
        self.before_final = state.get("before_final")  # undone if the run goes on (written before 2026-11-29: none)
        if state.get("precision", self.info["precision"]) != self.info["precision"]:  # auto chose otherwise now
            self.info["precision"] = state["precision"]
            self.autocast = autocast_for(self.device, state["precision"])
        if state.get("attention") and state["attention"] != self.info.get("attention"):  # auto chose otherwise now
            self.info["attention"] = state["attention"]
            self.model.set_attention_path(state["attention"])
        # a checkpoint written before machines were recorded (2026-11-27) trained on a machine nobody named
        before = list(state["machines"]) if "machines" in state else ["not recorded"]
        self.machines_before = before
        self.info["machines"] = before + [m for m in self.info["machines"] if m not in before]
        if self.recorder is not None:
            self.recorder.keep_rows(int(state["rows"]))


class OtherDataError(Exception):
    """A checkpoint of this run dir trained on other data than this start would: not resumed, and not replaced."""
