"""`hydra/launcher=vectorized`: run a batch of jobs from any sweeper on a pool of worker processes.

This module is what Hydra's plugin scan imports; the pool (``pool.py``) loads only when a multirun
launches jobs through it. Keys are checked here, when Hydra builds the launcher, before any job runs.
"""

import os
import signal
from collections.abc import Callable, Sequence
from typing import Any

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

STACK_MODES = ("auto", "always", "never")


class VectorizedLauncher(Launcher):
    def __init__(self, n_procs: int | None = None, stack: str = "auto", max_members: int = 16) -> None:
        if n_procs is not None and (not isinstance(n_procs, int) or n_procs < 1):
            raise ValueError(f"hydra.launcher.n_procs={n_procs!r} must be an integer >= 1, or null for one "
                             "worker per CPU core (per GPU on CUDA)")
        if stack not in STACK_MODES:
            raise ValueError(f"hydra.launcher.stack={stack!r} must be one of {', '.join(STACK_MODES)}")
        if not isinstance(max_members, int) or max_members < 1:
            raise ValueError(f"hydra.launcher.max_members={max_members!r} must be an integer >= 1 "
                             "(1 turns stacking off)")
        self.n_procs, self.stack, self.max_members = n_procs, stack, max_members
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None
        self.pool: tuple | None = None  # (key, workers, ProcessPoolExecutor), kept across batches
        # set by a sweeper that records each job's result as it ends (vitsweep's tells its trial then), rather
        # than when launch() returns the whole batch: fn(job number, JobReturn)
        self.on_job_done: Callable[[int, JobReturn], None] | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """One ``JobReturn`` per job, in job order; a failed job carries its exception (status FAILED)."""
        from .pool import launch

        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        try:
            return launch(self, job_overrides, initial_job_idx)
        except BaseException:
            if self.pool is not None:  # a broken or interrupted pool is not reused
                _stop_workers(self.pool[2])
                self.pool[2].shutdown(cancel_futures=True)
                self.pool = None
            raise


def _stop_workers(pool: Any) -> None:
    """SIGTERM to the pool's live workers, so that a running job saves its checkpoint and stops now (a run's
    handler, `trainer.resume`) instead of training on while shutdown() waits for it: the launching process was
    interrupted (SIGTERM, Ctrl-C at it alone) or failed. ProcessPoolExecutor has no public list of its workers."""
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        if proc.is_alive():
            try:
                os.kill(proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
