"""The vectorized launcher's pool of worker processes (``_pool``), kept on the launcher across batches so that a
sweeper launching trial after trial pays the workers' start-up once. On CPU its workers fork from a fork server that
has imported torch once (``FORK_SERVER_PRELOAD``) and start at the launcher's set-up (``prestart``), while the jobs
are composed; on CUDA they are spawned at the first launch. Each worker starts with ``_worker._init_worker``; a
batch's run on the pool is ``_batch.py``.
"""

import multiprocessing as mp
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import cloudpickle
from hydra.core.singleton import Singleton

from ._worker import _init_worker
from .devices import _job_gpus


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


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
