"""The vectorized launcher's GPUs: which CUDA devices a batch's jobs train on (``trainer.device``: ``cuda`` is every
device the launching process sees, its workers take them round robin; ``cuda:N`` its N-th, checked by ``cuda_index``),
what each CUDA worker sets in its environment (``_worker_gpu_env``: its one GPU, how many workers share it, and for
``cuda:N`` jobs ``LAUNCHER_DEVICE_ENV``, which ``src.validate.select_device`` reads), and the warning when workers
share a GPU with no NVIDIA MPS daemon. ``_job_gpus`` imports torch only where the jobs may train on CUDA (not for
``trainer.device=cpu``, nor for ``auto`` on a machine without NVIDIA device files).
"""

import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf


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


def thread_oversubscription_note(n_procs: int, num_threads: int | None, cores: int) -> str | None:
    """The warning for jobs whose ``trainer.num_threads`` replaces the cores // workers torch threads each of the
    ``n_procs`` workers takes, with more threads in all than the ``cores`` this process may use; None otherwise."""
    if not num_threads or n_procs * int(num_threads) <= cores:
        return None
    return (f"trainer.num_threads={num_threads} x {n_procs} worker processes (hydra.launcher.n_procs) = "
            f"{n_procs * int(num_threads)} torch threads on the {cores} cores this process may use "
            "(os.sched_getaffinity): the cores are oversubscribed, which slows small models most; set "
            f"trainer.num_threads=null (each worker then takes cores // workers = {max(1, cores // n_procs)}) or "
            f"at most {max(1, cores // n_procs)}, or fewer hydra.launcher.n_procs")
