"""When a run stops: step, epoch and wall-time limits and convergence of the train error, in one small object.

The trainer asks after every step, after every epoch and after every evaluation; each question returns
a stop reason (``max_steps``, ``max_wall``, ``max_epochs``, ``converged``, ``stalled``) or None. Pruning, a
non-finite loss and interruption are the trainer's own reasons. The convergence history is part of the
run's checkpoint (``state_dict``), so a resumed run converges exactly when an uninterrupted one would.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from src import run_contract
from src.run_contract import COLLAPSE_RISE, MIN_CHANCE_ERROR, STALLED_MARGIN  # noqa: F401 (re-exported)

FINAL_REASONS = ("converged", "stalled", "pruned", "nonfinite_loss")  # a run that stopped for these is never continued
STEP_RULES = ("max_steps", "max_wall")  # the reasons after_step gives: they can fire on any batch


@dataclass
class StopRules:
    """Stop rules of one run (``trainer.max_epochs, max_steps, max_wall_s, converge_epochs, converge_tol,
    eval_every``; None = off).

    Convergence: at an evaluation at epoch E, take the evaluations from the last one at or before epoch
    E - converge_epochs through E; the run has converged when there is such an opening evaluation and
    their train errors span at most ``converge_tol``. So the error is seen unchanged over at least
    ``converge_epochs`` epochs whatever ``eval_every`` is, which needs at least
    ceil(converge_epochs / eval_every) + 1 evaluations: with eval_every=1 the earliest stop is at epoch
    converge_epochs + 1, with (eval_every, converge_epochs) = (2, 3) at epoch 6, (5, 12) at epoch 20.

    Stalled: a train error that stops moving within ``stalled_margin`` of ``chance_error`` (the error of
    always predicting the commonest training label) is a model that did not learn, not one that converged:
    the reason is then ``stalled``. The trainer records it as a result (status ``completed``, ``stalled: true``,
    its real objective): a sweep counts it as a complete trial and the analysis keeps it in the curves, flagged,
    since dropping the runs that did not learn would bias the small-model and small-n ends of a curve.
    """

    max_epochs: int | None = None
    max_steps: int | None = None
    max_wall_s: float | None = None
    converge_epochs: int | None = None
    converge_tol: float = 0.0
    eval_every: int = 1
    chance_error: float | None = None  # train error of always predicting the commonest training label
    stalled_margin: float | None = STALLED_MARGIN  # None: never call a run stalled at chance (a collapse still is)
    history: list[tuple[int, float]] = field(default_factory=list)  # (epoch, train error) per evaluation

    @classmethod
    def from_config(cls, t: Mapping[str, Any], chance_error: float | None = None) -> StopRules:
        margin = t.get("stalled_margin", STALLED_MARGIN)
        return cls(max_epochs=t.get("max_epochs"), max_steps=t.get("max_steps"), max_wall_s=t.get("max_wall_s"),
                   converge_epochs=t.get("converge_epochs"), converge_tol=float(t.get("converge_tol") or 0.0),
                   eval_every=int(t.get("eval_every") or 1), chance_error=chance_error,
                   stalled_margin=None if margin is None else float(margin))

    def after_step(self, step: int, wall_s: float) -> str | None:
        if self.max_steps and step >= self.max_steps:
            return "max_steps"
        if self.max_wall_s and wall_s >= self.max_wall_s:
            return "max_wall"
        return None

    def after_epoch(self, epoch: int) -> str | None:
        return "max_epochs" if self.max_epochs and epoch >= self.max_epochs else None

    def should_evaluate(self, epoch: int, stopping: bool) -> bool:
        """Every ``eval_every`` epochs, and always at the last one."""
        return stopping or epoch % self.eval_every == 0

    def after_eval(self, epoch: int, train_error: float) -> str | None:
        self.history.append((epoch, float(train_error)))
        if not self.converged():
            return None
        return "stalled" if self.at_chance(train_error) else "converged"

    def chance_rules_apply(self) -> bool:
        """Whether chance means "did not learn" here: always predicting the commonest label is wrong at least
        ``MIN_CHANCE_ERROR`` of the time (not on a set where one class is a majority)."""
        return self.chance_error is not None and bool(run_contract.chance_rules_apply(self.chance_error))

    def at_chance(self, train_error: float) -> bool:
        """True when ``train_error`` is within ``stalled_margin`` of always predicting the commonest label (never
        where that label is a majority: ``chance_rules_apply``)."""
        if self.chance_error is None or self.stalled_margin is None:
            return False
        return bool(run_contract.at_chance(train_error, self.chance_error, self.stalled_margin))

    def lowest_error(self) -> float | None:
        """The lowest train error of the run's evaluations so far (None before the first)."""
        return min((err for _, err in self.history), default=None)

    def collapsed(self) -> bool:
        """The latest train error is ``COLLAPSE_RISE`` or more above the lowest the run reached: it lost what it had
        learned (e.g. a loss spike killed its ReLUs). Not where one class is a majority (``chance_rules_apply``)."""
        return (self.chance_error is not None and bool(self.history)
                and bool(run_contract.collapsed(self.history[-1][1], self.lowest_error(), self.chance_error)))

    def converged(self) -> bool:
        if not self.converge_epochs or not self.history:
            return False
        start = self.history[-1][0] - self.converge_epochs
        opening = [i for i, (e, _) in enumerate(self.history) if e <= start]
        if not opening:  # not yet evaluated converge_epochs epochs ago
            return False
        errs = [err for _, err in self.history[opening[-1]:]]
        return max(errs) - min(errs) <= self.converge_tol

    def still_stops(self, reason: str | None, epochs: int, steps: int, wall_s: float) -> bool:
        """Whether a run that ended for ``reason`` after ``epochs, steps, wall_s`` is finished under these
        limits (False when a limit was raised, so the run may continue)."""
        if reason in FINAL_REASONS:
            return True
        limit = {"max_epochs": (self.max_epochs, epochs), "max_steps": (self.max_steps, steps),
                 "max_wall": (self.max_wall_s, wall_s)}.get(reason or "")
        return limit is not None and bool(limit[0]) and limit[1] >= limit[0]

    def state_dict(self) -> dict[str, Any]:
        return {"history": [[e, err] for e, err in self.history]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.history = [(int(e), float(err)) for e, err in state["history"]]


def steps_in_run(max_epochs: int | None, max_steps: int | None, steps_per_epoch: int) -> float:
    """The schedule's length in steps: the smaller of the epoch and step limits (inf with neither)."""
    return min(max_epochs * steps_per_epoch if max_epochs else math.inf, max_steps or math.inf)
