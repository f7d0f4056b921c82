"""A worker process of the vectorized launcher's pool: its start (``_init_worker``, the pool's initializer: its slot,
its GPU, its log file ``<sweep dir>/.launcher/worker-<k>.log`` that takes everything it prints, its torch threads, the
launcher's Hydra context and task, and a watch that stops it when the launching process is gone), the run of one
unit (``_run_unit``: one job through Hydra's ``run_job``, as the basic launcher does, or a stacked group through
``members.py``), the note to the launching process of a stacked member that ended before its group
(``_member_ended``), and its exit without the interpreter's teardown (``exit_without_teardown``).

The underscore keeps Hydra's plugin scan from running this module: the scan runs every other module of
``hydra_plugins``, again where one was imported before (in the launching process after ``pool`` imported it, in each
worker at ``Singleton.set_state``), and a second run would empty ``_WORKER`` and replace the functions that the pool
pickles by name (``_init_worker``, ``_run_unit``: pickling fails for a function its module no longer holds).
"""

import atexit
import gc
import logging
import multiprocessing.util as mp_util
import os
import pickle
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import cloudpickle
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides, run_job, setup_globals
from omegaconf import DictConfig

from hydra_plugins.vitsweep_sweeper.parent_watch import watch_parent, watch_process
from hydra_plugins.vitsweep_sweeper.protocol import job_exception

from .devices import LAUNCHER_DEVICE_ENV, _worker_gpu_env

_WORKER: dict[str, Any] = {}  # per worker process: its slot, Hydra context and task function


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
