"""`hydra/launcher=vectorized`: run a batch of jobs from any sweeper on a pool of worker processes.

This module is what Hydra's plugin scan imports; a batch (``_batch.py``) runs on the pool (``pool.py``) only when a
multirun launches jobs through it. Keys are checked here, when Hydra builds the launcher, before any job runs.
"""

import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait as mp_wait
from typing import Any

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

STACK_MODES = ("auto", "always", "never")
START_METHODS = ("auto", "forkserver", "spawn")
log = logging.getLogger(__name__)


class VectorizedLauncher(Launcher):
    def __init__(self, n_procs: int | None = None, stack: str = "auto", max_members: int = 16,
                 start_method: str = "auto") -> None:
        if n_procs is not None and (not isinstance(n_procs, int) or n_procs < 1):
            raise ValueError(f"hydra.launcher.n_procs={n_procs!r} must be an integer >= 1, or null for one "
                             "worker per CPU core (per GPU on CUDA)")
        if stack not in STACK_MODES:
            raise ValueError(f"hydra.launcher.stack={stack!r} must be one of {', '.join(STACK_MODES)}")
        if not isinstance(max_members, int) or max_members < 1:
            raise ValueError(f"hydra.launcher.max_members={max_members!r} must be an integer >= 1 "
                             "(1 turns stacking off)")
        if start_method not in START_METHODS:
            raise ValueError(f"hydra.launcher.start_method={start_method!r} must be one of {', '.join(START_METHODS)}")
        if start_method == "forkserver" and "forkserver" not in multiprocessing.get_all_start_methods():
            raise ValueError("hydra.launcher.start_method=forkserver: this platform has no fork server; "
                             "use auto or spawn")
        self.n_procs, self.stack, self.max_members = n_procs, stack, max_members
        self.start_method = start_method
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None
        self.pool: tuple | None = None  # (key, workers, ProcessPoolExecutor), kept across batches
        self.validated: Any = None  # set up: the configs the sweeper's batch check composed (_validated.py)
        # set by a sweeper that records each job's result as it ends (vitsweep's tells its trial then), rather
        # than when launch() returns the whole batch: fn(job number, JobReturn)
        self.on_job_done: Callable[[int, JobReturn], None] | None = None
        # set by a sweeper that runs a batch under given Hydra job numbers (vitsweep's retries keep their original
        # trials' numbers, so their run dirs, and need not be consecutive); None: initial_job_idx + i
        self.job_numbers: list[int] | None = None
        self.ended: Any = None  # during a launch: its jobs as they end (_batch.Ended)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        from . import _validated as validated
        from .pool import prestart

        # the sweeper's check composes each job once for both: its configs, kept here, are the jobs'
        self.validated = validated.install(hydra_context.config_loader)

        prestart(self)  # CPU workers start and import torch while the sweeper plans and the jobs are composed

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """One ``JobReturn`` per job, in job order; a failed job carries its exception (status FAILED)."""
        from ._batch import launch

        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        try:
            return launch(self, job_overrides, initial_job_idx)
        except BaseException:
            pool, self.pool = self.pool, None  # a broken or interrupted pool is not reused
            if pool is not None:
                # stacked members that ended before the stop are told, not handed back: before the workers' wait (a
                # second Ctrl-C may cut it short) and after it (a member that ended in the step the signal came)
                if self.ended is not None:
                    self.ended.on_stop(pool[2])
                _stop_pool(pool[2])
                if self.ended is not None:
                    self.ended.on_stop(pool[2])
            raise
        finally:
            self.ended = None


STOP_GRACE_S = 60.0  # seconds a stopped pool's workers get to save their runs and exit before SIGKILL


def _stop_pool(pool: Any, grace_s: float = STOP_GRACE_S) -> None:
    """Stop the pool of an interrupted (SIGTERM, Ctrl-C) or failed launch: SIGTERM to its live workers, so that
    a running job saves its checkpoint and stops after its step (a run's handler, `trainer.resume`) instead of
    training on; then wait for them to exit, and SIGKILL those still alive after `grace_s` (measured: a worker
    whose job stopped could block for ever sending its result while the executor, broken by another worker's
    exit, joined it; its checkpoint was written long before). ProcessPoolExecutor has no public list of its
    workers, hence `_processes`."""
    procs = [p for p in list((getattr(pool, "_processes", None) or {}).values()) if p.is_alive()]
    for proc in procs:
        try:
            os.kill(proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    pool.shutdown(wait=False, cancel_futures=True)
    pending = {proc.sentinel: proc for proc in procs}  # ready once the process ends, whichever thread reaps it
    deadline = time.monotonic() + grace_s
    while pending and (left := deadline - time.monotonic()) > 0:
        for sentinel in mp_wait(list(pending), timeout=left):
            pending.pop(sentinel)
    for proc in pending.values():
        log.warning(f"launcher worker pid {proc.pid} did not exit {grace_s:.0f} s after SIGTERM: killed")
        proc.kill()
