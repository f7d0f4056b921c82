"""The sweep's worker processes: K copies of the same command, each pinned to its share of the cores (or given its
own GPU), watched by the main process, which reports a lost one and fails and retries its trials."""

import logging
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import optuna

from . import _liveness as liveness
from . import _protocol as protocol
from . import _storage as storages
from . import _study as studies
from . import _submitit

log = logging.getLogger(__name__)

# keys the sweep's main process sets for its workers (a worker's own command line drops the user's values)
WORKER_KEYS = ("hydra.sweeper.n_workers", "hydra.sweeper.worker_id", "hydra.sweeper.storage",
               "hydra.sweeper.study_name", "hydra.sweep.dir")


class WorkerProcesses:
    """Starting and watching the worker processes of `SweeperImpl` (a mixin: it reads the sweeper's settings)."""

    def _run_workers(self, study: optuna.Study, progress: studies.Progress) -> list[str]:
        """Start the workers and wait for them; a worker that dies is reported, its trial is failed and
        retried by the others (or at once here), and the rest go on. Returns the lost workers."""
        logs = Path(self.sweep_dir) / "workers"
        logs.mkdir(parents=True, exist_ok=True)
        procs, lost = [], []
        try:
            for i in range(1, self.n_workers + 1):
                cmd = self._worker_command(i)
                out = open(logs / f"worker-{i}.log", "w")
                # jobs on other machines (submitit_slurm) get their own resources: this machine's are not shared out
                remote = _submitit.is_remote(self.config)
                env = ({**os.environ, liveness.PARENT_ENV: str(os.getpid())} if remote
                       else _worker_env(i, self.n_workers))
                procs.append((subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                               preexec_fn=None if remote else _pin(i, self.n_workers)), out))
            log.info(f"Started {self.n_workers} workers; logs in {logs}; worker command: {shlex.join(cmd)}")
            reported = set()
            while any(p.poll() is None for p, _ in procs):
                time.sleep(1.0)
                for i, (p, _) in enumerate(procs, 1):
                    if p.poll() not in (None, 0) and i not in reported:
                        reported.add(i)
                        lost.append(self._lost_worker(study, i, p, logs))
                progress.poll()
            progress.poll()
        finally:
            for p, out in procs:
                if p.poll() is None:
                    p.terminate()
                    p.wait()
                out.close()
        for i, (p, _) in enumerate(procs, 1):
            if p.returncode not in (None, 0) and i not in reported:
                lost.append(self._lost_worker(study, i, p, logs))
        return lost

    def _lost_worker(self, study: optuna.Study, i: int, proc: subprocess.Popen, logs: Path) -> str:
        tail = (logs / f"worker-{i}.log").read_text(errors="replace").splitlines()[-15:]
        log.error(f"lost worker {i} (pid {proc.pid}, exit {proc.returncode}); the others go on. Its log ends:\n"
                  + "\n".join(tail))
        with storages.claim_lock(self.url, self.storage, studies.study_id(study)):
            self.reaper.reap(study)
        return f"worker {i} (exit {proc.returncode})"

    def _worker_command(self, worker_id: int) -> list[str]:
        argv = list(getattr(sys, "orig_argv", [sys.executable] + sys.argv))
        argv[0] = sys.executable
        keep = [a for a in argv if a.lstrip("+~").split("=", 1)[0] not in WORKER_KEYS]
        return keep + [
            "hydra.sweeper.n_workers=1",
            f"hydra.sweeper.worker_id={worker_id}",
            f"hydra.sweeper.storage={protocol.quote(self.url)}",
            f"hydra.sweeper.study_name={protocol.quote(self.name)}",
            f"hydra.sweep.dir={protocol.quote(str(Path(self.sweep_dir).absolute()))}",
        ]


def _machine_gpus() -> list[str]:
    """The GPUs of this machine the sweeper's workers may share out (CUDA_VISIBLE_DEVICES, else `nvidia-smi -L`),
    read without importing torch; the launcher's `_job_gpus` asks which ones the jobs will train on."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g for g in env.split(",") if g.strip() and g.strip() != "-1"]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


def _core_share(worker_id: int, n_workers: int) -> set[int]:
    """The CPU cores of worker i (1-based): every n_workers-th core, or one core when there are fewer."""
    cores = sorted(os.sched_getaffinity(0))
    return set(cores[worker_id - 1::n_workers]) or {cores[(worker_id - 1) % len(cores)]}


def _pin(worker_id: int, n_workers: int) -> Callable[[], None] | None:
    """Pin a CPU worker to its share of the cores, so that everything in it (its torch threads, a launcher's
    process pool sized by the cores it sees) splits that share and no more. None with GPUs (one each)."""
    if not hasattr(os, "sched_setaffinity") or len(_machine_gpus()) >= 2:
        return None
    share = _core_share(worker_id, n_workers)
    return lambda: os.sched_setaffinity(0, share)


def _worker_env(worker_id: int, n_workers: int) -> dict[str, str]:
    """Worker i gets GPU i (round robin) when there are GPUs, else an equal share of the CPU cores."""
    env = dict(os.environ)
    env[liveness.PARENT_ENV] = str(os.getpid())
    gpus = _machine_gpus()
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = gpus[(worker_id - 1) % len(gpus)]
    if len(gpus) < 2:
        threads = str(len(_core_share(worker_id, n_workers)))
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(var, threads)
    return env
