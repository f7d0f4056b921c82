"""One batch of the vectorized launcher (``VectorizedLauncher.launch``): its jobs' configs, each composed on first use
(``JobConfigs``), cut into units (``units.py``: one job, or a group of jobs trained as one stacked model by the app's
stacker: ``protocol.declare_app(stacker=...)``, vitsweep's ``src.stacked``), handed to the pool's workers as they
free up (``pool.py``, ``_worker.py``), and each job reported as it ends (``Ended``: the launching process prints one
line per finished run and tells the sweeper). Units lost with a dead worker run again on a fresh pool, then each alone.
Each worker writes everything it prints to ``<sweep dir>/.launcher/worker-<k>.log``.

The underscore keeps Hydra's plugin scan from importing this module: it imports ``devices``, ``pool`` and ``units``,
and the scan, reaching them after it, would run each of them a second time.
"""

import logging
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from omegaconf import DictConfig, OmegaConf, open_dict

from hydra_plugins.vitsweep_sweeper import protocol
from hydra_plugins.vitsweep_sweeper.protocol import job_exception

from ._worker import _run_unit
from .devices import _device_setting, _job_gpus, gpu_sharing_note, thread_oversubscription_note
from .pool import _cpu_count, _drop, _pool
from .units import plan_units, stacks

log = logging.getLogger(__name__)


def launch(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[JobReturn]:
    setup_globals()
    config = launcher.config
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    sweep_dir = Path(str(config.hydra.sweep.dir))
    log_dir = sweep_dir / ".launcher"
    log_dir.mkdir(parents=True, exist_ok=True)
    numbers = list(getattr(launcher, "job_numbers", None)
                   or range(initial_job_idx, initial_job_idx + len(job_overrides)))
    if len(numbers) != len(job_overrides) or len(set(numbers)) != len(numbers):
        raise ValueError(f"vectorized launcher: job_numbers {numbers} must be {len(job_overrides)} distinct numbers")
    configs = JobConfigs(launcher, numbers, job_overrides)
    gpus = _job_gpus(configs[0])
    pinned = _device_setting(configs[0]) if gpus else ""  # `cuda:N`: each worker opens the one GPU it is pinned to
    device = "cuda" if gpus else "cpu"
    stacker = protocol.stacker()  # a module path: the pool's workers import it themselves
    if stacks(launcher.stack, launcher.max_members, device, len(configs)):  # grouping reads every config first
        units = plan_units(list(configs), launcher.stack, launcher.max_members, device, stacker)
    else:  # one job a unit: each config is composed just before its job is handed out, while the first ones run
        units = [[i] for i in range(len(configs))]
    cores = _cpu_count()  # the cores this process may use (a vitsweep sweeper worker is pinned to its share)
    n_procs = min(launcher.n_procs or (len(gpus) if gpus else cores), len(units))
    # GPU workers too: each would otherwise start a torch thread per core, n_procs x cores threads competing for the
    # cores that launch the kernels (torchrun sets OMP_NUM_THREADS=1 for the same reason)
    threads = max(1, cores // n_procs)
    stacked = sum(len(u) for u in units if len(u) > 1)
    log.info(f"Launching {len(configs)} jobs on {n_procs} worker process(es) "
             + (f"({-(-n_procs // len(gpus))} per GPU, " if gpus else "(") + f"{threads} torch thread(s) each)"
             + (f", {stacked} of them stacked in {sum(len(u) > 1 for u in units)} group(s)" if stacked else "")
             + f"; worker logs in {log_dir}")
    note = gpu_sharing_note(n_procs, gpus)
    if note:
        log.warning(note)
    # the jobs' own threads replace the workers' share: said once per launcher (a sweeper launches batch after batch)
    note = thread_oversubscription_note(n_procs, OmegaConf.select(configs[0], "trainer.num_threads"), cores)
    if note and not getattr(launcher, "threads_warned", False):
        launcher.threads_warned = True
        log.warning(note)
    results: dict[int, JobReturn] = {}
    notify = getattr(launcher, "on_job_done", None)  # a sweeper's hook: it records each result as it comes
    # members of stacked groups that end before their group: the launcher's stop path tells them too (launcher.py)
    launcher.ended = Ended(configs, numbers, results, notify)
    broken = _run_pool(_pool(launcher, n_procs, threads, gpus, str(log_dir), pinned), units, configs,
                       launcher.ended, threads=threads, stacker=stacker)
    if broken:  # a worker died, and the pool with it: every unit not yet done runs again on a fresh pool
        _drop(launcher)
        broken = _run_pool(_pool(launcher, n_procs, threads, gpus, str(log_dir), pinned), broken, configs,
                           launcher.ended, threads=threads, stacker=stacker)
    # lost twice: each job again alone (a stacked group's too), so only the job that kills its worker fails
    for i in [i for unit in broken for i in unit]:
        _drop(launcher)
        _run_pool(_pool(launcher, 1, threads, gpus, str(log_dir), pinned), [[i]], configs, launcher.ended,
                  final=True, threads=threads, stacker=stacker)
    launcher.ended = None
    return [results[num] for num in numbers]


class Ended:
    """The batch's jobs as they end: each is logged and told to the sweeper (``notify(job number, JobReturn)``)
    once. A stacked group's unit returns when its last member ends; a member that ends before (converged, stalled,
    pruned) is reported at once by its worker through the pool's ``ended`` pipe (``_member_ended``), so a stop of
    the sweep hands back only the members still training (found on a lent H100: 11 converged members of a group
    whose 12th was stopped were handed back, and trained again)."""

    def __init__(self, configs: "JobConfigs", numbers: list[int], results: dict[int, JobReturn], notify: Any):
        self.configs, self.results, self.notify = configs, results, notify
        self.position = {num: i for i, num in enumerate(numbers)}
        self.early: set[int] = set()  # job numbers reported before their unit returned
        self.told: set[int] = set()  # job numbers whose notify returned (a stop signal can cut one short)

    def job(self, idx: int, ret: JobReturn, seconds: float, slot: int) -> None:
        """A job of a unit that returned (or failed with its worker)."""
        self.results[idx] = ret
        if idx not in self.early:
            self._tell(idx, ret, seconds, slot)

    def drain(self, pool: ProcessPoolExecutor) -> None:
        """Report the members that the pool's workers have said ended, each as a job of its own."""
        reader = getattr(pool, "vitsweep_ended", None)
        while reader is not None and reader.poll():
            idx, value, run_dir, seconds, slot = reader.recv()
            if idx in self.results or idx not in self.position:
                continue
            cfg = self.configs[self.position[idx]]
            ret = JobReturn(overrides=list(cfg.hydra.overrides.task), working_dir=run_dir, task_name=cfg.hydra.job.name,
                            hydra_cfg=OmegaConf.create({"hydra": {"runtime": {"output_dir": run_dir}}}))
            ret.return_value = value
            ret.status = JobStatus.FAILED if isinstance(value, BaseException) else JobStatus.COMPLETED
            self.early.add(idx)
            self.results[idx] = ret
            self._tell(idx, ret, seconds, slot)

    def on_stop(self, pool: ProcessPoolExecutor) -> None:
        """The launch is stopping (a signal, or a failure): tell what ended and is not told yet, before the sweeper
        hands the batch's trials back. Never raises: the stop itself must reach the sweeper."""
        try:
            self.drain(pool)
        except Exception as e:  # noqa: BLE001 - an unreadable entry: that member is handed back, and its retry resumes
            log.warning(f"reading the stacked members that ended failed ({type(e).__name__}: {e})")
        for idx in sorted(self.early - self.told):  # read, but a signal cut its tell short
            try:
                self.notify is not None and self.notify(idx, self.results[idx])
                self.told.add(idx)
            except Exception as e:  # noqa: BLE001
                log.warning(f"telling job #{idx} failed ({type(e).__name__}: {e}); it is handed back")

    def _tell(self, idx: int, ret: JobReturn, seconds: float, slot: int) -> None:
        _log_finished(ret, idx, seconds, slot, len(self.results), len(self.configs))
        if self.notify is not None:
            self.notify(idx, ret)
        self.told.add(idx)


class JobConfigs:
    """The batch's job configs, each composed on first use and kept (Hydra's ``load_sweep_config`` takes
    about 0.2 s a job on a 2-core CPU: composed up front, 18 jobs kept both workers idle for 3.5 s), or taken from
    the sweeper's check of the batch (``_validated``: Hydra's sweepers and, since 2026-11-30, the vitsweep sweeper
    compose every job before the launch, so under them the composing is up front). Logs each job's overrides as it
    is first used."""

    def __init__(self, launcher: Any, numbers: list[int], job_overrides: Sequence[Sequence[str]]):
        self._launcher, self._numbers, self._overrides = launcher, numbers, job_overrides
        self._done: dict[int, DictConfig] = {}

    def __len__(self) -> int:
        return len(self._numbers)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __getitem__(self, i: int) -> DictConfig:
        if i not in self._done:
            launcher, overrides = self._launcher, list(self._overrides[i])
            cfg = launcher.validated.take(launcher.config, overrides)  # composed by the sweeper's check (setup)
            if cfg is None:
                cfg = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, overrides)
            with open_dict(cfg):
                cfg.hydra.job.id = cfg.hydra.job.num = self._numbers[i]
            log.info(f"\t#{self._numbers[i]} : {' '.join(filter_overrides(overrides))}")
            self._done[i] = cfg
        return self._done[i]


def _run_pool(pool: ProcessPoolExecutor, units: list[list[int]], configs: Sequence[DictConfig], ended: Ended,
              final: bool = False,
              threads: int = 0, stacker: str | None = None) -> list[list[int]]:
    """Run the units, reporting each job to ``ended`` (which fills the batch's results) as it ends (not when
    the whole batch has; a stacked member when it ends, not when its group does); returns the units lost to a dead
    worker (their jobs fail with that error when ``final``)."""
    broken = []
    reader = getattr(pool, "vitsweep_ended", None)
    while reader is not None and reader.poll():  # a kept pool's: nothing of this batch has run yet, so nothing stands
        reader.recv()
    futures = {pool.submit(_run_unit, [configs[i] for i in unit], threads, stacker): unit for unit in units}
    pending = set(futures)
    while pending:
        finished, pending = wait(pending, timeout=ENDED_POLL_S, return_when=FIRST_COMPLETED)
        ended.drain(pool)
        for fut in finished:
            try:
                done = fut.result()
            except Exception as e:  # a worker died (killed, out of memory), or the unit failed outside its jobs
                if isinstance(e, BrokenProcessPool) and not final:
                    broken.append([i for i in futures[fut] if configs[i].hydra.job.num not in ended.early])
                    continue
                exc = RuntimeError(f"worker process died: {e}") if isinstance(e, BrokenProcessPool) else e
                done = [(configs[i].hydra.job.num, _failed(exc), 0.0, -1) for i in futures[fut]]
            for idx, ret, seconds, slot in done:
                if idx in ended.early and ret.status == JobStatus.FAILED:
                    continue  # it ended before its group failed: its result stands
                ended.job(idx, ret, seconds, slot)
    return [unit for unit in broken if unit]


ENDED_POLL_S = 0.5  # how often the launching process looks for stacked members that ended before their group


def _log_finished(ret: JobReturn, idx: int, seconds: float, slot: int, n_done: int, n_all: int) -> None:
    if ret.status == JobStatus.COMPLETED:
        value = ret.return_value
        outcome = f"objective {value:.4g}" if isinstance(value, float) else f"returned {value!r}"
    else:
        exc = job_exception(ret)
        outcome = f"FAILED {type(exc).__name__}: {str(exc)[:200]}"
    overrides = " ".join(filter_overrides(ret.overrides or []))
    log.info(f"[{n_done}/{n_all}] #{idx} {outcome} in {seconds:.1f} s (worker {slot}) {overrides}")


def _failed(exc: BaseException) -> JobReturn:
    ret = JobReturn()
    ret.return_value, ret.status = exc, JobStatus.FAILED
    return ret
