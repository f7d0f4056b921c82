"""The job configs a sweeper composed to validate a batch, kept for the launcher that runs the batch.

Hydra's sweepers call ``Sweeper.validate_batch_is_legal`` before each launch: it composes every job's config
(``load_sweep_config``) to fail early, and drops them; its docstring says it repeats the launcher's work, for a
launcher that composes in another process or machine. This launcher composes in the same process, so each job
was composed twice, about 0.08 s each on a 2-core CPU, in the launching process that competes with the workers
for the cores (18 jobs: about 1.5 s; docs/benchmarks/README.md, the launcher's start-up). Here the configs composed
for the check are kept and handed to the launcher once each; a config composed by any other caller is never kept,
so nothing a caller may change reaches a job. The name's underscore keeps Hydra's plugin scan, which re-runs every
other module of ``hydra_plugins``, from redefining the wrapper's class.
"""

import sys
from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig

KEEP = 1024  # configs kept at most (a larger batch composes the rest again, lazily, as before)
# the checks whose configs are kept: Hydra's sweepers', and the vitsweep sweeper's (`_claim_loop.job_compose_error`)
CHECKS = ("validate_batch_is_legal", "job_compose_error")


class ValidatedConfigs:
    """Wraps a config loader's ``load_sweep_config``; keeps what ``validate_batch_is_legal`` composed."""

    def __init__(self, load: Any) -> None:
        self._load = load
        self._kept: dict[tuple[str, ...], tuple[Any, DictConfig]] = {}

    def __call__(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        cfg = self._load(master_config, sweep_overrides)
        if sys._getframe(1).f_code.co_name in CHECKS and len(self._kept) < KEEP:
            self._kept[tuple(sweep_overrides)] = (master_config, cfg)  # the check drops its result
        return cfg

    def __reduce__(self):  # the launcher pickles its Hydra context (this loader) to the workers: no kept configs
        return ValidatedConfigs, (self._load,)

    def take(self, master_config: DictConfig, overrides: Sequence[str]) -> DictConfig | None:
        """The config composed for these overrides on this master config by the check, once; else None."""
        master, cfg = self._kept.pop(tuple(overrides), (None, None))
        return cfg if master is master_config else None


def install(config_loader: Any) -> ValidatedConfigs:
    """Wrap ``config_loader.load_sweep_config`` (the instance's, once) and return the wrapper."""
    current = config_loader.__dict__.get("load_sweep_config")
    if isinstance(current, ValidatedConfigs):
        return current
    wrapper = ValidatedConfigs(config_loader.load_sweep_config)
    config_loader.load_sweep_config = wrapper
    return wrapper
