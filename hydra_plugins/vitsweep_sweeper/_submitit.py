"""The sweeper's batches on hydra-submitit-launcher (`hydra/launcher=submitit_local` or `submitit_slurm`).

Submitit's own `launch()` returns when every job of a batch has ended, and raises at the first job that left no
result (killed, preempted without requeue, out of memory), dropping the results of the batch's other jobs. That
breaks two promises of the sweeper: a trial whose job died is retried (its result would be lost with the batch's
worker), and a retry runs under its original's job number (so in its run dir, from its checkpoint). So the
sweeper submits a batch through the launcher's own executor and callable (the jobs are the very jobs submitit's
`launch` would submit, `checkpoint()` and requeue included) and collects the jobs one by one, as they end:

- a job that returned is told at once (as the vectorized launcher reports its jobs);
- a job that left no result becomes a `JobDied` return, and the sweeper fails its trial as interrupted and
  enqueues a retry with the same parameters and job number (counted against `hydra.sweeper.max_retries`);
- a job whose config Hydra cannot compose (checked here, as Hydra's sweepers check a batch before its launch) is
  not submitted: its trial fails with the error (on SLURM it would fail at its start, after its wait in the queue);
- a job that raised outside its task (Hydra could not compose its overrides, a callback) or left a result this
  process cannot load becomes a `JobError` return: its trial fails with the error, as for the task's own
  exception, and is not retried (the same job would fail the same way); so does a task's own `sys.exit(n)`, which
  each job returns as its result (`ExitAsResult`) but for a stop's exit code (128 + a signal's number);
- a sweeper stopped mid-batch (Ctrl-C, SIGTERM) cancels the batch's unfinished jobs before it hands their
  trials back, so no job keeps writing into a run dir that a retry will use.
"""

import copy
import logging
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from omegaconf import OmegaConf

log = logging.getLogger(__name__)

SUBMITIT_PREFIX = "hydra_plugins.hydra_submitit_launcher."


class JobDied(RuntimeError):
    """A submitit job that ended without a result: the sweeper fails its trial as interrupted and retries it."""


class JobError(RuntimeError):
    """A submitit job that raised outside its task, or left a result that cannot be loaded: its trial fails, as for
    an exception of the task, and is not retried (the same job would fail the same way)."""


TIME_OUT_ERROR = "submitit.core.utils.UncompletedJobError: "  # raised by submitit's handler of a time-out signal


def is_submitit(launcher: Any) -> bool:
    """`launcher` (an instance or a class) is hydra-submitit-launcher's, or a subclass of one."""
    cls = launcher if isinstance(launcher, type) else type(launcher)
    return any(c.__module__.startswith(SUBMITIT_PREFIX) for c in cls.__mro__)


def is_remote(config: Any) -> bool:
    """The jobs run on other machines (SLURM), not as children of this process: the launcher's class, read from
    `hydra.launcher._target_`, is a submitit launcher (a site's subclass too, under any module) whose executor is
    not submitit's local one."""
    target = OmegaConf.select(config, "hydra.launcher._target_", default="") or ""
    if not target:
        return False
    from hydra.utils import get_class

    cls = get_class(str(target))
    return is_submitit(cls) and getattr(cls, "_EXECUTOR", "local") != "local"


INIT_KEYS = {"max_num_timeout", "submitit_folder"}  # given to submitit's executor when it is built, not as parameters


def check(launcher: Any) -> None:
    """Refuse what would break a promise of the sweeper, or what submitit would refuse at the first batch, before
    any trial."""
    params = launcher.params
    unknown = sorted(_unknown_keys(launcher._EXECUTOR, params))
    if unknown:
        raise ValueError(
            f"hydra.launcher.{', hydra.launcher.'.join(unknown)}: not a setting of submitit's '{launcher._EXECUTOR}' "
            f"executor (hydra/launcher=submitit_{launcher._EXECUTOR}); submitit would refuse it at the first batch. "
            f"Its settings: {', '.join(sorted(_valid_keys(launcher._EXECUTOR)))}")
    visible, wanted = _visible_gpus(), int(params.get("gpus_per_node") or 0)
    if launcher._EXECUTOR == "local" and visible and wanted > len(visible):
        raise ValueError(f"hydra.launcher.gpus_per_node={wanted}, but this process has {len(visible)} GPU(s) "
                         f"(CUDA_VISIBLE_DEVICES={','.join(map(str, visible))}): submitit_local jobs train on this "
                         "process's GPUs (a sweeper worker's share)")
    # SLURM's own names win: submitit's ntasks_per_node over tasks_per_node, and sbatch's additional_parameters
    extra = {str(k).replace("-", "_"): v for k, v in (params.get("additional_parameters") or {}).items()}
    per_node = extra.get("ntasks_per_node") or params.get("ntasks_per_node") or params.get("tasks_per_node") or 1
    tasks = max(int(per_node) * int(extra.get("nodes") or params.get("nodes") or 1), int(extra.get("ntasks") or 1))
    if tasks > 1:
        own = "".join(f", hydra.launcher.{k}={params[k]}" for k in ("ntasks_per_node",) if params.get(k) is not None)
        own += f", hydra.launcher.additional_parameters={params['additional_parameters']}" if extra else ""
        raise ValueError(
            f"hydra.launcher.tasks_per_node={params.get('tasks_per_node')} and hydra.launcher.nodes="
            f"{params.get('nodes')}{own}: submitit would run each trial's job {tasks} times, in one run dir, each copy "
            "reporting to the same trial, so a grid point would not run once and the budget would not count trials. "
            "The vitsweep trainer is one process per run: keep tasks_per_node=1 and nodes=1 and run trials in "
            "parallel with hydra.sweeper.n_jobs (trials per batch) and hydra.sweeper.n_workers (docs/slurm.md)")


def _valid_keys(kind: str) -> set[str]:
    """The hydra.launcher keys submitit's AutoExecutor takes for executor `kind` (its generic parameters, under
    their own names, and the executor's own, which the launcher prefixes with `kind`)."""
    from submitit import AutoExecutor
    from submitit.core import plugins

    return AutoExecutor._valid_parameters() | plugins.get_executors()[kind]._valid_parameters() | INIT_KEYS


def _unknown_keys(kind: str, params: dict) -> list[str]:
    """The keys submitit's `update_parameters` would refuse (it ignores those set to None)."""
    valid = _valid_keys(kind)
    return [k for k, v in params.items() if v is not None and k not in valid]


class SubmititBatches:
    """Runs the sweeper's batches on a hydra-submitit-launcher launcher, under given job numbers
    (`job_numbers`), reporting each job as it ends (`on_job_done`)."""

    def __init__(self, launcher: Any, poll_s: float = 1.0) -> None:
        check(launcher)
        self.launcher = launcher
        self.poll_s = poll_s
        self.job_numbers: Sequence[int] | None = None
        self.on_job_done: Callable[[int, JobReturn], None] | None = None

    def _executor(self) -> Any:
        """The executor `BaseSubmititLauncher.launch` builds (hydra-submitit-launcher 1.2), from the same keys."""
        import submitit

        from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

        launcher, kind = self.launcher, self.launcher._EXECUTOR
        init_keys = {"max_num_timeout"}
        executor = submitit.AutoExecutor(cluster=kind, folder=launcher.params["submitit_folder"],
                                         **{f"{kind}_{k}": v for k, v in launcher.params.items() if k in init_keys})
        base = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in base else f"{kind}_{k}": v for k, v in launcher.params.items()
                                      if k not in init_keys | {"submitit_folder"}})
        if kind == "local" and (visible := _visible_gpus()):  # not an AutoExecutor key: the LocalExecutor's own
            executor._executor.update_parameters(visible_gpus=visible)
        return executor

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[JobReturn]:
        import submitit

        config = self.launcher.config
        numbers = list(self.job_numbers or range(initial_job_idx, initial_job_idx + len(job_overrides)))
        executor = self._executor()
        log.info(f"Submitit '{self.launcher._EXECUTOR}' sweep output dir : {config.hydra.sweep.dir}")
        params, returns = [], {}
        for n, overrides in zip(numbers, job_overrides, strict=True):
            log.info(f"\t#{n} : {' '.join(filter_overrides(overrides))}")
            failed = self._compose_error(list(overrides), n)
            if failed is not None:  # as Hydra's sweepers' validate_batch_is_legal, per job: the others still run
                returns[n] = failed
                if self.on_job_done is not None:
                    self.on_job_done(n, failed)
                continue
            params.append((list(overrides), "hydra.sweep.dir", n, f"job_id_for_{n}", Singleton.get_state()))
        submitted = time.time()
        jobs = executor.map_array(ExitAsResult(self.launcher), *zip(*params, strict=True)) if params else []
        for job in jobs if self.launcher._EXECUTOR == "local" else ():  # a local job's folder is named by its pid
            _move_stale_result(job, submitted)
        number = {id(j): p[2] for j, p in zip(jobs, params, strict=True)}
        try:
            for job in submitit.helpers.as_completed(jobs, poll_frequency=self.poll_s):
                n = number[id(job)]
                returns[n] = self._result(job, n)
                if self.on_job_done is not None:
                    self.on_job_done(n, returns[n])
        except BaseException:  # the sweeper is stopping: its running jobs must not outlive their trials
            for job in jobs:
                if number[id(job)] not in returns:
                    try:
                        job.cancel(check=False)
                    except Exception as e:  # noqa: BLE001 - a job that ended meanwhile
                        log.debug(f"cancel {job.job_id}: {e}")
            raise
        return [returns[n] for n in numbers]

    def _compose_error(self, overrides: list[str], n: int) -> JobReturn | None:
        """A failed return when Hydra cannot compose the job's config here (the job would fail at its start, on
        SLURM after its wait in the queue), else None."""
        launcher = self.launcher
        try:
            launcher.hydra_context.config_loader.load_sweep_config(launcher.config, overrides)
        except Exception as e:  # noqa: BLE001 - any composition error: the job's own, found before it is submitted
            return _failed(JobError(f"{type(e).__name__}: {e}\n(Hydra job #{n}'s config does not compose; no "
                                    "submitit job was submitted)"))
        return None

    def _result(self, job: Any, n: int) -> JobReturn:
        from submitit.core.utils import FailedJobError, UncompletedJobError

        try:
            ret = job.results()[0]
        except FailedJobError as e:  # the job's own code raised outside the task (Hydra's composition, a callback)
            raised = _raised(str(e))
            if raised.startswith(TIME_OUT_ERROR):  # submitit's time-out handler, between tasks: not requeued
                return _died(f"submitit job {job.job_id} (Hydra job #{n}) was stopped by submitit and not requeued "
                             f"({raised}); its output: {job.paths.stdout}")
            return _failed(JobError(f"{raised}\n(raised by submitit job {job.job_id} (Hydra job #{n}) outside its "
                                    f"task; its traceback: {job.paths.stderr})"))
        except (UncompletedJobError, OSError) as e:  # killed, preempted and not requeued, out of memory, node failure
            return _died(f"submitit job {job.job_id} (Hydra job #{n}) ended without a result (state {job.state}, "
                         f"{type(e).__name__}); its output: {job.paths.stdout}")
        except Exception as e:  # noqa: BLE001 - a result this process cannot load: the same again on a retry
            return _failed(JobError(
                f"submitit job {job.job_id} (Hydra job #{n}) left a result this process cannot load "
                f"({type(e).__name__}: {e}), most often an exception of the task that does not unpickle (one whose "
                f"__init__ takes other arguments than its message); its output: {job.paths.stdout}"))

        stopped = getattr(ret, "_return_value", None)  # a failed JobReturn raises its exception on .return_value
        if ret.status == JobStatus.FAILED and type(stopped) is UncompletedJobError:
            # submitit's time-out handler raised inside the task (a time-out beyond max_num_timeout, not requeued)
            # and Hydra's run_job returned it as the job's failure: a job that died, to retry, not a failed trial
            return _died(f"submitit job {job.job_id} (Hydra job #{n}) was stopped by submitit and not requeued "
                         f"({stopped}); its output: {job.paths.stdout}", ret)
        return ret


class ExitAsResult:
    """The launcher's callable as each job runs it, but for a task's own ``sys.exit(n)``: that left no result, as a
    killed job does (submitit's state is FINISHED for any exit code, a stopped run's included), so its trial was
    retried. It is returned as the task's failure, naming the code. Not a stop's exit, code 128 + a signal's number
    (the trainer's ``RunInterrupted`` after SIGTERM or SIGINT: it dies, to be retried from its checkpoint), nor
    submitit's own (its requeue after a time-out or preemption exits from its signal handler): those go on out."""

    def __init__(self, launcher: Any) -> None:
        self.launcher = launcher

    def __call__(self, *args: Any) -> JobReturn:
        try:
            return self.launcher(*args)
        except SystemExit as e:
            if _stop_code(e.code) or _raised_by_submitit(e):
                raise
            return _failed(JobError(f"the task called sys.exit({e.code!r}): it ended without a result, and its "
                                    "trial fails with this exit (not retried: the same job would exit the same way)"))

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """Resubmit the job as submitit's launcher does (``BaseSubmititLauncher.checkpoint``), through this wrapper."""
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def _stop_code(code: Any) -> bool:
    """An exit code 128 + a signal's number: a process stopped by that signal (a stopped run's ``RunInterrupted``)."""
    import signal

    return isinstance(code, int) and code > 128 and (code - 128) in {s.value for s in signal.Signals}


def _raised_by_submitit(e: BaseException) -> bool:
    """Whether ``e`` was raised in submitit's own code (its signal handlers' exits, run inside the task's frames)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and str(tb.tb_frame.f_globals.get("__name__", "")).startswith("submitit.")


def _visible_gpus() -> tuple[int, ...]:
    """The GPUs of this process (CUDA_VISIBLE_DEVICES) for its submitit_local jobs: submitit's LocalExecutor gives
    each job CUDA_VISIBLE_DEVICES=0..gpus_per_node-1 whatever this process's own (a sweeper worker's GPU, the
    user's choice) unless told its `visible_gpus`, and then takes the first gpus_per_node of them."""
    import os

    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [g.strip() for g in (env or "").split(",") if g.strip()]
    if not all(g.isdigit() for g in ids):
        log.warning(f"CUDA_VISIBLE_DEVICES={env!r} does not name GPUs by index: submitit_local jobs get GPUs "
                    "0..hydra.launcher.gpus_per_node-1")
        return ()
    return tuple(int(g) for g in ids)


def _move_stale_result(job: Any, submitted: float) -> None:
    """Move aside a result file that predates the job's submission, left in the job's folder by an earlier job with
    the same id (a submitit_local job's id is its controller's pid: pids wrap, and restart at each boot, while a
    sweep dir lives on): submitit would return it as this job's result when this job ends without one (killed).
    Only for submitit_local: SLURM's job ids do not recur, and a compute node's clock may lag this machine's."""
    path = job.paths.result_pickle
    try:
        mtime = path.stat().st_mtime
        if mtime < submitted:
            aside = path.with_name(f"{path.name}.stale-{int(mtime)}")
            path.rename(aside)
            log.warning(f"moved {path} to {aside.name}: a result left by an earlier submitit job with the id "
                        f"{job.job_id}")
    except FileNotFoundError:
        pass


def _raised(message: str) -> str:
    """The exception lines ("module.Error: message", and the message's further lines) of the traceback in a
    FailedJobError's message; the whole message when it holds none."""
    sep = "----------------------"
    trace = message.split(sep)[1] if message.count(sep) >= 2 else message
    lines = trace.strip().splitlines()
    heads = [i for i, line in enumerate(lines) if re.match(r"[A-Za-z_][\w.]*(:\s|:?$)", line)
             and not line.startswith("Traceback")]
    return "\n".join(lines[heads[-1]:]).strip() if heads else message


def _failed(exc: Exception) -> JobReturn:
    ret = JobReturn()
    ret.status, ret.return_value = JobStatus.FAILED, exc
    return ret


def _died(why: str, ret: JobReturn | None = None) -> JobReturn:
    """A failed return whose value is ``JobDied(why)``; the job's own return's config, overrides and run dir are
    kept where there is one (the sweeper records the trial's run dir from it)."""
    died = copy.copy(ret) if ret is not None else JobReturn()
    died.status = JobStatus.FAILED
    died.return_value = JobDied(why)
    return died
