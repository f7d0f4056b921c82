"""The running Optuna trial, as seen from a training job: a re-export of the sweeper's public protocol
(``hydra_plugins.vitsweep_sweeper.protocol``), so the trainer names one place.

``current_trial(run_dir)`` is the trial a job runs (set by the vitsweep sweeper through Hydra's
``hydra.job.env_set``, never through the job's config), or None outside a sweep; ``make_reporter(trial)``
turns it into ``report(value, epoch) -> prune?`` for the trainer.
"""

from hydra_plugins.vitsweep_sweeper.protocol import (
                                                     Reporter,
                                                     TrialIdentity,
                                                     current_trial,
                                                     make_reporter,
                                                     study_constant,
)

__all__ = ["Reporter", "TrialIdentity", "current_trial", "make_reporter", "study_constant"]
