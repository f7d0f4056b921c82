"""The vectorized launcher's pool: worker processes that pull units of work as they free up (on CPU, forked
from a fork server that has imported torch once; on CUDA, spawned). A unit is one job (run through Hydra's
``run_job``, as the basic launcher does) or a group of jobs trained as one stacked model (by the app's stacker:
``protocol.declare_app(stacker=...)``, vitsweep's ``src.stacked``). Each worker writes everything it prints to
``<sweep dir>/.launcher/worker-<k>.log``; the launching process prints one line per finished run.
"""

import atexit
import gc
import importlib
import logging
import multiprocessing as mp
import multiprocessing.util as mp_util
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import cloudpickle
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from omegaconf import DictConfig, OmegaConf, open_dict

from hydra_plugins.vitsweep_sweeper import protocol
from hydra_plugins.vitsweep_sweeper.parent_watch import watch_parent, watch_process
from hydra_plugins.vitsweep_sweeper.protocol import job_exception

log = logging.getLogger(__name__)
_WORKER: dict[str, Any] = {}  # per worker process: its slot, Hydra context and task function


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
    for unit in broken:  # lost twice: each again alone, so only the job that kills its worker fails
        _drop(launcher)
        _run_pool(_pool(launcher, 1, threads, gpus, str(log_dir), pinned), [unit], configs, launcher.ended,
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
    the sweeper's check of the batch (``_validated``). Logs each job's overrides as it is first used."""

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


def prestart(launcher: Any) -> None:
    """Start a CPU pool's workers at the launcher's set-up, one per core (or ``n_procs``, if fewer), while the
    launching process is still composing. They fork from a fork server that imports torch and ``torch._dynamo``
    (which ``torch.optim`` loads at the first optimizer) once: spawned, each worker imported both itself, 2.3 s
    of CPU a worker, with the launching process competing for the same 2 cores (docs/benchmarks/README.md, the
    launcher's efficiency). A batch smaller than the pool uses the pool as it is, its jobs with the threads of
    the cores they may use. CUDA pools start at ``launch``, once the stacking plan fixes their size."""
    config = launcher.config
    if launcher.stack == "always" or _job_gpus(config):
        return
    log_dir = Path(str(config.hydra.sweep.dir)) / ".launcher"
    log_dir.mkdir(parents=True, exist_ok=True)
    n_procs = min(launcher.n_procs or _cpu_count(), _cpu_count())  # more than the cores only if a batch needs them
    pool = _pool(launcher, n_procs, max(1, _cpu_count() // n_procs), [], str(log_dir))

    def start() -> None:  # a pool starts one process per task it cannot hand to an idle one
        try:
            for _ in range(n_procs):
                pool.submit(_warm)
        except RuntimeError:  # the launch replaced this pool (a larger batch) before its workers were up
            pass

    # in a thread: a forked worker's start waits for the fork server's imports (about 2 s), and the launching
    # process composes the jobs meanwhile (in line, a two-worker sweeper test took 20 s against 16 s spawned; 17 s so)
    threading.Thread(target=start, name="vitsweep-pool-start", daemon=True).start()


def _warm() -> None:
    import torch._dynamo  # noqa: F401  (a spawned worker's import; a forked one has it from the fork server)


# what a CPU pool's fork server imports once for all its workers (a module that fails to import is skipped)
FORK_SERVER_PRELOAD = ["hydra_plugins.vitsweep_launcher._preload_first", "torch", "torch._dynamo", "hydra.core.utils",
                       "omegaconf", "cloudpickle", "hydra_plugins.vitsweep_launcher.fork_server"]


def start_method(gpus: list[str], requested: str = "auto") -> str:
    """How a pool's workers start (``hydra.launcher.start_method``): on CPU, ``auto`` is ``forkserver`` where
    the platform has it. CUDA pools keep ``spawn``: the fork server was measured on CPU only, and a worker forked
    after torch's import sets its ``CUDA_VISIBLE_DEVICES`` in a process no GPU test has run."""
    if gpus:
        return "spawn"
    if requested == "auto":
        return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    return requested


def _drop(launcher: Any) -> None:
    """Shut the launcher's (broken) pool down; the next ``_pool`` starts a fresh one."""
    launcher.pool[2].shutdown()
    launcher.pool = None


def gpu_sharing_note(n_procs: int, gpus: list[str]) -> str | None:
    """A warning when several workers share a GPU with no NVIDIA MPS daemon running (its control pipe is in
    CUDA_MPS_PIPE_DIRECTORY, default /tmp/nvidia-mps). Without MPS the GPU time-slices between the processes'
    contexts and a small model's step waits out the others' slices: on a lent H200, 16 processes ran a stacked
    CNN step in about 47 ms; under MPS, 4 processes ran the same stacks about 4x faster (docs/sweeper.md)."""
    if not gpus or n_procs <= len(gpus):
        return None
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")) / "control"
    if pipe.exists():
        return None
    return (f"vectorized launcher: {n_procs} worker processes share {len(gpus)} GPU(s) and no NVIDIA MPS daemon "
            f"is running ({pipe} is absent), so the GPU time-slices between them; start it with "
            "`nvidia-cuda-mps-control -d`, or set hydra.launcher.n_procs to the number of GPUs")


def _pool(launcher: Any, n_procs: int, threads: int, gpus: list[str], log_dir: str,
          pinned: str = "") -> ProcessPoolExecutor:
    """The launcher's worker pool, kept across batches (a sweeper launching trial after trial pays the
    workers' start-up once) unless it has fewer workers than this batch needs. ``pinned``: the jobs'
    ``trainer.device=cuda:N``, whose one GPU each worker is pinned to (``_worker_gpu_env``), else empty."""
    key = (tuple(gpus), log_dir, pinned)
    old = getattr(launcher, "pool", None)
    if old is not None and old[0] == key and old[1] >= n_procs and not getattr(old[2], "_broken", False):
        return old[2]  # (a pool whose last job killed its worker is broken: never reused)
    if old is not None:
        old[2].shutdown()
    method = start_method(gpus, getattr(launcher, "start_method", "auto"))
    ctx = mp.get_context(method)
    if method == "forkserver":  # takes effect when this process starts its fork server (at its first pool)
        ctx.set_forkserver_preload(FORK_SERVER_PRELOAD)
    slots = ctx.Queue()
    for k in range(n_procs):
        slots.put(k)
    # members of stacked groups that ended before their group (``Ended``): small messages that each worker writes at
    # once, in one write below the pipe's atomic size, so no lock (that a worker killed mid-write would keep) and no
    # feeder thread (that a worker's ``os._exit`` would cut short)
    reader, writer = ctx.Pipe(duplex=False)
    payload = cloudpickle.dumps((launcher.hydra_context, launcher.task_function, Singleton.get_state()))
    pool = ProcessPoolExecutor(n_procs, mp_context=ctx, initializer=_init_worker,
                               initargs=(os.getpid(), method, slots, payload, threads, gpus, log_dir,
                                         -(-n_procs // max(1, len(gpus))), writer, pinned))
    pool.vitsweep_ended = reader
    launcher.pool = (key, n_procs, pool)
    return pool


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


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _device_setting(cfg: DictConfig) -> str:
    return str(OmegaConf.select(cfg, "trainer.device", default="auto"))


def _job_gpus(cfg: DictConfig) -> list[str]:
    """CUDA device ids the jobs train on, as a worker's ``CUDA_VISIBLE_DEVICES`` names them (empty when they train
    on CPU): from `trainer.device`. ``cuda``: every device this process sees (its workers take them round robin);
    ``cuda:N``: the N-th of them, as torch numbers them in this process (under ``CUDA_VISIBLE_DEVICES=2,3``,
    ``cuda:1`` is physical GPU 3; unset, GPU N). An N past the visible devices fails here, before any work."""
    device = _device_setting(cfg)
    if device == "cpu" or (device == "auto" and not any(Path("/dev").glob("nvidia*"))):
        return []  # no NVIDIA device files: no CUDA, and no torch import (1.7 s) in the launching process
    import torch

    if not torch.cuda.is_available():
        return []
    count = torch.cuda.device_count()
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d.strip() for d in env.split(",") if d.strip()] if env else []
    visible = ids[:count] or [str(i) for i in range(count)]
    if device.startswith("cuda:"):
        return [visible[cuda_index(device, len(visible), "vectorized launcher: the launching process",
                                   "trainer.device=cuda to spread the jobs over all of them")]]
    return visible


def cuda_index(device: str, count: int, who: str, spread: str) -> int:
    """N of ``trainer.device=cuda:N``, checked against the ``count`` CUDA devices that ``who`` sees; the error names
    the setting, what is visible, and the fix (``spread``: what plain ``cuda`` does there)."""
    number = device.split(":", 1)[1]
    if not number.isdigit():
        raise ValueError(f"trainer.device={device} is not a CUDA device: use cuda, or cuda:N with N a device number")
    if int(number) >= count:
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = "CUDA_VISIBLE_DEVICES unset" if env is None else f"CUDA_VISIBLE_DEVICES={env}"
        valid = "only cuda:0 is" if count == 1 else f"cuda:0 to cuda:{count - 1} are"
        raise ValueError(f"trainer.device={device}: {who} sees {count} CUDA device(s) ({where}), numbered as torch "
                         f"numbers them, so {valid} valid; use one of those, or {spread}")
    return int(number)


def stacks(stack: str, max_members: int, device: str, n_jobs: int) -> bool:
    """Whether a batch may train jobs as stacked groups (``hydra.launcher.stack``)."""
    return not (stack == "never" or max_members == 1 or (stack == "auto" and device != "cuda") or n_jobs < 2)


def plan_units(configs: list[DictConfig], stack: str, max_members: int, device: str,
               stacker: str | None) -> list[list[int]]:
    """Positions of the jobs to run together: one list per unit, in job order of their first member. ``stacker``:
    the app's stacked training (``protocol.stacker()``); without one every job is a unit of its own."""
    if stacker is None and stack == "always" and max_members > 1 and len(configs) > 1:
        raise ValueError("hydra.launcher.stack=always: this app declares no stacked training "
                         "(hydra_plugins.vitsweep_sweeper.protocol.declare_app(stacker=...)); use stack=auto or never")
    if stacker is None or not stacks(stack, max_members, device, len(configs)):
        return [[i] for i in range(len(configs))]
    plan_groups = importlib.import_module(stacker).plan_groups
    return plan_groups([_task_cfg(c) for c in configs], max_members, strict=stack == "always")


def _task_cfg(cfg: DictConfig) -> dict:
    """The job's config without the hydra node, unresolved (grouping compares the keys as written)."""
    out = OmegaConf.to_container(cfg, resolve=False)
    out.pop("hydra", None)
    return out


# ---------------------------------------------------------------------------------------- worker side
def exit_without_teardown() -> None:
    """Register, first, the handler that ends this worker: exit handlers run last-registered first, so it runs
    after every other one (those that jobs, torch and trackers register), flushes logging and the standard
    streams, then ends the process with ``os._exit``, skipping the interpreter's teardown of the loaded modules.
    With torch loaded that teardown takes about 0.85 s a process, and the launching process waits for its workers
    to end at the end of every grid (docs/benchmarks/README.md, the launcher's efficiency)."""
    import atexit

    def _end() -> None:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    atexit.register(_end)


def _orphaned() -> None:
    """The launching process is gone (killed, even with SIGKILL): the watch then sends SIGTERM, so a running job
    writes its checkpoint and ``interrupted`` summary and stops, instead of training on as an orphan that a rerun
    of the same command would race for the same run dir."""
    print("the launching process is gone: stopping this worker", flush=True)
    _WORKER["orphaned"] = True  # no further job starts (the pool may have queued some)


def _init_worker(parent: int, method: str, slots: Any, payload: bytes, threads: int, gpus: list[str],
                 log_dir: str, share: int, ended: Any = None, pinned: str = "") -> None:
    exit_without_teardown()
    if method == "forkserver":
        # a forked worker ends with os._exit after its last task, skipping exit handlers: run them then, as a
        # spawned worker's interpreter does at its exit (a job's tracker flushes there), the lowest-priority
        # finalizer of the process's end (``multiprocessing.util._exit_function``)
        mp_util.Finalize(None, atexit._run_exitfuncs, exitpriority=-(2**31))
    # time for the job to save; a worker still alive then (no job ran, or it hung) is ended. A forked worker's
    # parent is the fork server, which lives as long as any worker does (each holds its pipe): it watches the
    # launching process itself
    (watch_process if method == "forkserver" else watch_parent)(parent, grace_s=300.0, on_gone=_orphaned)
    slot = slots.get()
    os.environ.pop(LAUNCHER_DEVICE_ENV, None)  # (inherited from a launching process that is itself a worker)
    if gpus:
        os.environ.update(_worker_gpu_env(gpus, slot, share, pinned))
    fd = os.open(Path(log_dir) / f"worker-{slot}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)  # everything this process prints (job logs, progress bars) goes to its own file
    os.dup2(fd, 2)
    os.close(fd)
    if threads:
        import torch

        torch.set_num_threads(threads)
    hydra_context, task_function, state = cloudpickle.loads(payload)
    setup_globals()
    Singleton.set_state(state)
    _WORKER.update(slot=slot, hydra_context=hydra_context, task_function=task_function, ended=ended)
    gc.freeze()  # what the worker loaded lives as long as it does: its jobs' collections skip it (fork_server.py)
    print(f"worker {slot} (pid {os.getpid()}): {threads or 'default'} torch thread(s)"
          + (f", CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']}" if gpus else ""), flush=True)


# set in a worker pinned to the GPU of ``trainer.device=cuda:N`` (that value, as the launching process numbers its
# devices): its jobs' ``cuda:N`` opens the worker's one visible device (``src.validate.select_device``)
LAUNCHER_DEVICE_ENV = "VITSWEEP_LAUNCHER_DEVICE"


def _worker_gpu_env(gpus: list[str], slot: int, share: int, pinned: str) -> dict[str, str]:
    """What a CUDA worker sets in its environment: its one GPU (``gpus`` round robin by slot; ``_job_gpus``), the
    number of workers sharing it (``VITSWEEP_GPU_SHARE``: ``src.stacked`` splits its memory), and for ``cuda:N``
    jobs (``pinned``) the setting the GPU was chosen for: in the worker it is the only device, ``cuda:0``."""
    env = {"CUDA_VISIBLE_DEVICES": gpus[slot % len(gpus)], "VITSWEEP_GPU_SHARE": str(share)}
    if pinned.startswith("cuda:"):
        env[LAUNCHER_DEVICE_ENV] = pinned
    return env


def _run_unit(configs: list[DictConfig], threads: int = 0,
              stacker: str | None = None) -> list[tuple[int, JobReturn, float, int]]:
    # a job the pool queued to this worker before its launching process died, or before a stop signal ended
    # its last job: the pool hands each worker its next job early, and that job would train on after the stop
    _exit_if("orphaned", "stopped")
    if threads:  # the batch's share of the cores (a pool started for more workers than this batch uses)
        import torch

        torch.set_num_threads(threads)
    try:
        start = time.perf_counter()
        if len(configs) == 1:
            rets = [_run_job(configs[0], _WORKER["task_function"])]
        else:
            from .members import run_member_jobs

            print(f"stacked group: jobs {[int(c.hydra.job.num) for c in configs]}", flush=True)
            rets = run_member_jobs(configs, _WORKER["hydra_context"], stacker,
                                   on_member_done=lambda idx, value, run_dir: _member_ended(idx, value, run_dir, start))
        seconds = time.perf_counter() - start
        out = []
        for cfg, ret in zip(configs, rets, strict=True):
            if ret.status == JobStatus.FAILED:
                exc = job_exception(ret)
                print(f"job #{cfg.hydra.job.num} failed:\n" + "".join(traceback.format_exception(exc)), flush=True)
                ret.return_value = _picklable(exc)
            out.append((int(cfg.hydra.job.num), ret, seconds, _WORKER["slot"]))
        return out
    except (SystemExit, KeyboardInterrupt):  # SIGTERM/SIGINT stopped the run (`RunInterrupted`, a second Ctrl-C)
        _WORKER["stopped"] = True  # the stop goes back to the launcher (pickled); no further job starts here
        raise
    finally:
        _exit_if("orphaned")  # the running job has saved and stopped: end before another starts


ATOMIC_BYTES = 4096  # a pipe write of at most PIPE_BUF bytes (4096 on Linux) is never interleaved with another's


def _member_ended(idx: int, value: Any, run_dir: str, start: float) -> None:
    """Tell the launching process that stacked job ``idx`` ended (``value``: what it returns, or its exception), while
    its group trains on. Never fails the group: what is not told now (a message too long for one atomic write, a
    launching process gone) the group's own result reports at its end."""
    writer = _WORKER.get("ended")
    if writer is None:
        return
    try:
        message = pickle.dumps((idx, _picklable(value) if isinstance(value, BaseException) else value, run_dir,
                                time.perf_counter() - start, _WORKER["slot"]))
        if len(message) + 8 <= ATOMIC_BYTES:  # + the connection's length header, sent in the same write
            writer.send_bytes(message)
    except Exception as e:  # noqa: BLE001 - the group's own result still reports this member
        print(f"job #{idx} ended; telling the launching process failed ({type(e).__name__}: {e})", flush=True)


def _exit_if(*flags: str) -> None:
    """End this worker at once if any of ``flags`` is set: ``orphaned`` (its launching process is gone),
    ``stopped`` (a stop signal ended its last job)."""
    if any(_WORKER.get(flag) for flag in flags):
        os._exit(128 + signal.SIGTERM)


def _run_job(cfg: DictConfig, task_function: Any) -> JobReturn:
    print(f"job #{cfg.hydra.job.num}: {' '.join(filter_overrides(cfg.hydra.overrides.task))}", flush=True)
    return run_job(hydra_context=_WORKER["hydra_context"], task_function=task_function, config=cfg,
                   job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")


def _picklable(exc: BaseException) -> BaseException:
    """The job's exception if it survives pickling (so sweepers see e.g. optuna.TrialPruned), else a
    RuntimeError carrying its type, message and traceback."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        text = "".join(traceback.format_exception(exc))
        return RuntimeError(f"{type(exc).__name__}: {exc}\n{text}")
