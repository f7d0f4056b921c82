"""The run directory's contract: the flag rules every reader of a run's records shares (docs/run_dir.md has the
files' schema).

A finished run is flagged ``stalled`` when its train error ended at chance (within ``STALLED_MARGIN`` of always
predicting the commonest label) and ``collapsed`` (also stalled) when it ended ``COLLAPSE_RISE`` or more above the
lowest train error it reached; neither chance rule applies where one class is a majority (chance error below
``MIN_CHANCE_ERROR``). The trainer (``src.stop_rules``) and the analysis (``analysis.load.result_flags``) both call
these functions; this module imports nothing heavy, so it is the one part of ``src`` that ``analysis`` may import.
The predicates take floats or pandas/numpy arrays alike (NaN compares false).

It also holds what a run's config means to others: which way its objective goes (``objective_direction``) and which
keys a resumed start may change (``RUNTIME_KEYS``). ``src.train`` tells the sweeper both
(``hydra_plugins.vitsweep_sweeper.protocol.declare_app``) without loading torch.
"""
from __future__ import annotations

from typing import Any

STALLED_MARGIN = 0.01  # the default trainer.stalled_margin: a train error this close to chance is "at chance"
# a finished run whose train error ended this far or more above the lowest it reached collapsed: it did not end as a
# learned model (e.g. a loss spike killed its head's ReLUs); an unstable run that still learned rises less (CIFAR-10
# C1 = 3 at 20% noise: 0.32)
COLLAPSE_RISE = 0.5
# A finished run ended inside a loss spike when its final train error lies SPIKE_RISE or more above the median of its
# last SPIKE_WINDOW train-error readings (its recent train error): a transient, not the model it had been (MNIST ViTs
# under AdamW fit their labels for hundreds of epochs, then spike for a few: one read 0% from epoch 155 to 498, 52% at
# 499, 37.9% at 500). Its final errors read the spike; it is not collapsed (it rose less than COLLAPSE_RISE).
SPIKE_WINDOW = 20
SPIKE_RISE = 0.05
# the chance rules hold where always predicting the commonest label is wrong at least this often: on a 2%-positive
# binary set "chance" is a 0.02 train error, which a weighted model that learned exceeds
MIN_CHANCE_ERROR = 0.5

BINARY_METRICS = ("auc", "pf1", "sensitivity", "specificity", "balanced_acc")  # two-class datasets only
MAXIMISED = ("acc", *BINARY_METRICS)  # an objective ending in one of these is maximised, any other minimised

LIMITS = ("max_epochs", "max_steps", "max_wall_s")  # trainer keys: may be raised on resume to train longer
# Keys that may differ between a checkpoint's config and a resumed start: stop limits (raise them to
# train longer) and keys that change how a run is executed or reported, not what it computes.
RUNTIME_KEYS = (*(f"trainer.{k}" for k in LIMITS), "trainer.num_threads", "trainer.progress",
                "trainer.log_every", "trainer.resume", "trainer.checkpoint",
                "trainer.checkpoint_every", "hydra",
                "logger",  # where the evaluations are sent as well (a tracker added or dropped on resume)
                # how often and in what batches the evaluation scores the splits, not what training computes
                "trainer.eval_batch_size", "trainer.test_every",
                # the trial identity that sweeps before the protocol module put into configs (old checkpoints)
                "trial.study_name", "trial.number", "trial.storage")
# What a resumed *study* may change: not the stop limits. A run may be extended by raising them, but a study's
# finished trials keep the budget they ran under, so a study resumed with another limit mixed two budgets in one
# grid and ranked them together, without a word (found 2026-11-29: max_epochs 40 -> 15 after two of six points).
STUDY_RUNTIME_KEYS = tuple(k for k in RUNTIME_KEYS if k not in {f"trainer.{k}" for k in LIMITS})


def objective_direction(name: str) -> str:
    """``maximize`` for accuracies and the binary-task scores, ``minimize`` for errors and losses."""
    return "maximize" if name.endswith(MAXIMISED) else "minimize"


def chance_rules_apply(chance_error: Any) -> Any:
    """Whether the stalled and collapsed rules apply on a training set with this chance error."""
    return chance_error >= MIN_CHANCE_ERROR


def at_chance(train_error: Any, chance_error: Any, margin: Any = STALLED_MARGIN) -> Any:
    """The train error is within ``margin`` of chance, on a set where the chance rules apply."""
    return chance_rules_apply(chance_error) & (train_error >= chance_error - margin)


def ended_in_spike(final_error: Any, recent_error: Any) -> Any:
    """The run's final train error lies ``SPIKE_RISE`` or more above its recent one (the median of its last
    ``SPIKE_WINDOW`` readings)."""
    return final_error - recent_error >= SPIKE_RISE


def collapsed(final_error: Any, lowest_error: Any, chance_error: Any) -> Any:
    """The run ended ``COLLAPSE_RISE`` or more above the lowest train error it reached, where the rules apply."""
    return chance_rules_apply(chance_error) & (final_error - lowest_error >= COLLAPSE_RISE)
