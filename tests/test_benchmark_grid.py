"""benchmarks/grid.py's accounting: the launcher's efficiency against the ideal is a figure the docs quote."""
import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def grid():
    spec = importlib.util.spec_from_file_location("bench_grid", ROOT / "benchmarks" / "grid.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_stacked_group_counts_once_in_the_ideal_and_the_per_job_overhead(grid):
    """Found on an H200 (2026-11-28): 16 runs stacked 4 to a group in one worker printed "ideal 312.8 s ... efficiency
    331%" for a 94-s grid, since each member's wall_s and job time is its whole group's. Two groups of 4 members,
    10 s of own time each and 11 s per job, in one worker with a 23-s wall: the ideal is 20 s (87%), not 80 s."""
    members = {str(i): {"wall_s": 10.0, "stacked_members": 4} for i in range(8)}
    log = [f"[{i + 1}/8] #{i} objective 0.5 in 11.0 s (worker 0) model.width={1 + i // 4}\n" for i in range(8)]
    jobs = grid.launcher_jobs(log, members)
    r = {"wall": 23.0, "workers": 1, "jobs": jobs, "run_s": grid.own_seconds(members.values())}
    assert r["run_s"] == pytest.approx(20.0) and sum(s for s, _ in jobs) == pytest.approx(22.0)
    text = grid.efficiency(r)
    assert "ideal 20.0 s" in text and "efficiency 87%" in text and "per-job overhead 0.25 s/job" in text
    assert "busiest worker 22.0 s" in text


def test_runs_that_are_not_stacked_count_whole(grid):
    runs = {"0": {"wall_s": 3.0}, "1": {"wall_s": 5.0, "stacked_members": None}, "2": {"wall_s": 2.0,
                                                                                    "stacked_members": 1}}
    assert grid.own_seconds(runs.values()) == pytest.approx(10.0)
    log = ["[1/3] #0 objective 0.1 in 4.0 s (worker 1) a\n", "noise\n",
           "[2/3] #1 objective 0.1 in 6.0 s (worker 0) b\n"]
    assert grid.launcher_jobs(log, runs) == [(4.0, 1), (6.0, 0)]


def _run_dir(root: Path, job: int, batch: int, steps: int, overrides: str) -> None:
    d = root / str(job)
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text(overrides)
    (d / ".hydra" / "config.yaml").write_text(f"trainer:\n  max_epochs: 3\n  batch_size: {batch}\n")
    (d / "summary.json").write_text(f'{{"steps": {steps}, "wall_s": 1.0, "train_images_per_s": 1.0}}')


def test_the_summed_images_are_each_runs_steps_at_its_own_batch(grid, tmp_path):
    """The sum multiplied every run's steps by --batch (128), which nothing ties to the grid: `--extra
    trainer.batch_size=64` (or a grid over the batch) printed twice the images/s. Each run's batch is its config's."""
    _run_dir(tmp_path, 0, 64, 96, "- trainer.batch_size=64\n")
    _run_dir(tmp_path, 1, 128, 48, "- trainer.batch_size=128\n")
    runs, by_job, images = grid.read_runs(tmp_path, default_batch=128)
    assert images == 96 * 64 + 48 * 128
    assert set(by_job) == {"0", "1"} and len(runs) == 2


def test_the_trees_memory_counts_shared_pages_once(grid):
    """The tree's figure summed each process's RSS, so pages a forked worker shares with its parent (the launcher's
    fork server holds torch for every worker) counted once per process. A parent holding 128 MiB and a forked child
    that shares them: about 256 MiB of RSS, 128 MiB of memory (PSS)."""
    import subprocess
    import sys

    code = ("import os, sys, time; b = bytearray(128 * 2**20); b[::4096] = b'\\x01' * (len(b) // 4096)\n"
            "if os.fork() == 0:\n    time.sleep(60); os._exit(0)\n"
            "print('ready', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        mem = grid.tree_memory(proc.pid)
        assert mem["rss"] > 2 * 128 * 2**20
        assert 128 * 2**20 < mem["pss"] < (128 + 48) * 2**20
    finally:
        for pid in grid.tree_pids(proc.pid) - {proc.pid}:
            os.kill(pid, 9)
        proc.stdin.close()
        proc.wait(timeout=30)
