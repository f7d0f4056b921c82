"""The public protocol between the vitsweep sweeper and the jobs it runs: a trial's identity, its reporter,
its storage. The sweeper, the launcher, the trainer (``src.trial``) and the analysis import this module and
nothing else of this package.

A job learns which Optuna trial it runs from three environment variables that the sweeper sets through
Hydra (``hydra.job.env_set.VITSWEEP_TRIAL_*``: a Hydra override, so it is neither in the job's config nor in
``hydra.job.override_dirname``); Hydra exports them while the task runs, with the basic launcher, the
vectorized launcher's worker processes and submitit alike. A job whose jobs train together in one process
(stacked members) reads them from each member's Hydra config or run dir instead (``trial_of_run_dir``).
"""
# The implementation lives in _protocol.py: Hydra's plugin scan re-executes every module of hydra_plugins
# whose name has no leading underscore (hydra/core/plugins.py), which would redefine its classes and reset its
# state each time; re-executing this re-export only binds the same objects again.
from ._protocol import *  # noqa: F401,F403
from ._protocol import __all__  # noqa: F401
