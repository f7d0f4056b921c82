"""The vectorized launcher's GPU per worker for `trainer.device` (`cuda`, `cuda:N`), on a mocked CUDA: `cuda:N`
counts the devices the launching process sees, as torch does, and a worker pinned to that one GPU opens it."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from hydra_plugins.vitsweep_launcher import devices, pool
from src.validate import select_device


@pytest.fixture
def cuda(monkeypatch):
    """A machine whose CUDA shows ``count`` devices to this process, under ``CUDA_VISIBLE_DEVICES=visible`` (None:
    unset). No device files are needed: only ``trainer.device=auto`` looks for them."""
    def set_up(visible: str | None, count: int) -> None:
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)

    monkeypatch.delenv("VITSWEEP_LAUNCHER_DEVICE", raising=False)  # the launching process is no pool worker
    return set_up


def gpus(device: str) -> list[str]:
    return devices._job_gpus(OmegaConf.create({"trainer": {"device": device}}))


def worker(monkeypatch, gpu_ids: list[str], slot: int, device: str) -> dict[str, str]:
    """The environment a pool worker of this slot sets for itself (``_init_worker``), applied here."""
    env = devices._worker_gpu_env(gpu_ids, slot, 1, device)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(env["CUDA_VISIBLE_DEVICES"].split(",")))
    return env


def test_cuda_n_is_the_launching_processes_nth_visible_gpu_and_the_worker_opens_it(cuda, monkeypatch):
    """Reported: under CUDA_VISIBLE_DEVICES=2,3 `cuda:0` pinned its worker to physical GPU 0 (outside the allotment)
    and `cuda:1` to GPU 1, where the job then opened cuda:1 among one visible device: every job failed."""
    cuda("2,3", 2)
    assert gpus("cuda:1") == ["3"] and gpus("cuda:0") == ["2"]
    assert gpus("cuda") == ["2", "3"]  # plain cuda: the workers take the allotment round robin, as before
    for device, physical in [("cuda:1", "3"), ("cuda:0", "2")]:
        cuda("2,3", 2)
        env = worker(monkeypatch, gpus(device), 0, device)
        assert env["CUDA_VISIBLE_DEVICES"] == physical
        opened = select_device(device)  # what the job trains on, in the worker
        assert opened.type == "cuda" and opened.index in (None, 0), opened  # its one visible device
        assert torch.cuda.device_count() == 1


def test_plain_cuda_keeps_its_round_robin(cuda, monkeypatch):
    cuda("2,3", 2)
    assert [worker(monkeypatch, ["2", "3"], slot, "cuda")["CUDA_VISIBLE_DEVICES"] for slot in range(4)] \
        == ["2", "3", "2", "3"]
    assert select_device("cuda") == torch.device("cuda")


def test_without_cuda_visible_devices_cuda_n_is_physical_gpu_n(cuda):
    cuda(None, 4)
    assert gpus("cuda:2") == ["2"] and gpus("cuda:0") == ["0"]
    assert gpus("cuda") == ["0", "1", "2", "3"]


@pytest.mark.parametrize("visible, count, device, valid", [("2,3", 2, "cuda:2", "cuda:0 to cuda:1"),
                                                            ("3", 1, "cuda:1", "cuda:0"),
                                                            (None, 2, "cuda:7", "cuda:0 to cuda:1")])
def test_a_cuda_n_past_the_visible_gpus_fails_before_any_work_naming_the_setting_and_fix(cuda, visible, count,
                                                                                          device, valid):
    """`_job_gpus` runs at the launcher's set-up (``prestart``) and at each launch, before any worker starts; a
    sweeper worker pinned to one GPU (``_worker_env``) sees one device, so `cuda:1` there fails the same way."""
    cuda(visible, count)
    for check in (gpus, select_device):  # the launcher, and a run on its own
        with pytest.raises(ValueError) as err:
            check(device)
        text = str(err.value)
        assert f"trainer.device={device}" in text and valid in text and "trainer.device=cuda " in text, text
        assert f"{count} CUDA device" in text, text


def test_a_worker_pinned_for_one_cuda_n_refuses_a_job_of_another(cuda, monkeypatch):
    """A batch's workers are pinned by its first job's `trainer.device`: a job asking for another GPU fails naming
    both, rather than training on the wrong one."""
    cuda("2,3", 2)
    worker(monkeypatch, gpus("cuda:1"), 0, "cuda:1")
    with pytest.raises(ValueError, match=r"trainer.device=cuda:0: .*trainer.device=cuda:1"):
        select_device("cuda:0")


def test_cuda_n_must_be_a_device_number(cuda):
    cuda("2,3", 2)
    for check in (gpus, select_device):
        with pytest.raises(ValueError, match="trainer.device=cuda:x is not a CUDA device"):
            check("cuda:x")


def test_the_pool_hands_its_workers_the_setting_they_are_pinned_for(tmp_path):
    """``launch`` passes the jobs' `cuda:N` to ``_pool``, whose workers' initializer gets it (a pool kept for `cuda`
    jobs on the same GPU is not reused for them)."""
    import types

    launcher = types.SimpleNamespace(hydra_context=None, task_function=print, pool=None)
    first = pool._pool(launcher, 1, 1, ["3"], str(tmp_path), "cuda:1")
    try:
        assert first._initargs[-1] == "cuda:1"
        assert pool._pool(launcher, 1, 1, ["3"], str(tmp_path), "cuda:1") is first
        assert pool._pool(launcher, 1, 1, ["3"], str(tmp_path)) is not first
    finally:
        launcher.pool[2].shutdown()
