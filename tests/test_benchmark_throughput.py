"""The arithmetic behind benchmarks/throughput.py's and step_profile.py's figures: images counted as trained."""
import os
import subprocess
import sys
import time

import pytest
import torch

from benchmarks import throughput
from benchmarks.grid import tree_pids


class _FakePath:
    """A path whose batches hold ``size`` images, whatever the benchmark's --batch says."""

    device = torch.device("cpu")

    def __init__(self, size: int):
        self.size, self.steps = size, []

    def batches(self):
        while True:
            yield torch.zeros(self.size, 1), torch.zeros(self.size, dtype=torch.long)

    def step(self, xb, yb, step, total):
        self.steps.append(step)
        time.sleep(0.01)


def test_images_per_s_counts_the_images_the_timed_steps_trained():
    """step_profile.py --override trainer.batch_size=32 trained 32-image batches while the figure multiplied by --batch
    (128): 4x the images/s. The count is now the batches' own."""
    path = _FakePath(32)
    r = throughput.time_path(path, warmup=2, steps=5)
    assert path.steps == list(range(7))
    assert r["images_per_s"] == pytest.approx(5 * 32 / (5 * r["step_s"]))
    assert r["images"] == 5 * 32


def test_an_override_of_the_batch_size_is_the_batch_the_profile_times():
    from benchmarks.step_profile import parse_args

    args = parse_args(["--override", "trainer.batch_size=32"])
    assert throughput.compose(args)["trainer"]["batch_size"] == 32  # --batch (128) is overridden: count, not assume


def test_each_arms_peak_rss_is_its_own():
    """The baseline arm runs after vitsweep's in one process, and ru_maxrss never falls: the baseline's "peak RSS" was
    the larger of the two arms'. The peak is now reset between the arms (Linux's VmHWM)."""
    big = bytearray(128 * 2**20)
    big[::4096] = b"\x01" * len(range(0, len(big), 4096))  # every page resident
    high = throughput.peak_rss_mib()
    del big
    assert throughput.reset_peak_rss()
    assert throughput.peak_rss_mib() < high - 100


def test_the_workers_memory_is_that_of_the_live_workers():
    """The figure was RUSAGE_CHILDREN's: children that ended and were waited for, while the DataLoader's persistent
    workers are alive when the arm is read; what it printed ("+ workers 519 MiB") came from children that had ended
    (such as the `uname -p` that platform.processor() forks, whose peak holds this process's pages at the fork). A live
    child holding 96 MiB of its own now reads as such."""
    code = ("import sys; b = bytearray(96 * 2**20); b[::4096] = b'\\x01' * (len(b) // 4096);"
            " print('ready', flush=True); sys.stdin.read()")
    child = subprocess.Popen([sys.executable, "-c", code],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        assert child.pid in tree_pids(os.getpid())  # other tests' children may live on: measure this one
        assert 96 <= throughput.private_mib([child.pid]) < 96 + 64
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def test_the_figures_name_the_cpu(capsys, monkeypatch):
    """platform.processor() is empty on Linux: throughput.py's header read "x86_64" (docs/benchmarks/profile/
    cpu_speed_2026-11-26.txt) and precision_probe.py's "CPU: x86_64", not the CPU whose figures they were."""
    from src import probe_cache

    name = probe_cache.cpu_fields().get("model name")
    if not name:
        pytest.skip("no model name in /proc/cpuinfo")
    throughput.header(None, torch.device("cpu"))
    assert name in capsys.readouterr().out

    from benchmarks import precision_probe

    monkeypatch.setattr(precision_probe, "models", lambda: [])
    monkeypatch.setattr(sys, "argv", ["precision_probe.py"])
    precision_probe.main()
    assert name in capsys.readouterr().out


def test_the_precision_probe_times_each_precision_with_the_attention_path_a_run_would_pick(capsys, monkeypatch):
    """A run with model.attention=auto times each precision with the path its own attention probe picks (the bf16 of
    the double-descent ViT lost 2x with sdpa and won 1.7x with explicit); precision_probe.py timed the ViTs with the
    model's default path, so its "auto picks" column was not what a run picks."""
    from benchmarks import precision_probe
    from src.models.cnn import WidthCNN
    from src.models.vit import ViT

    calls = []

    def fake(model, shape, classes, batch, channels_last, prepare=None):
        calls.append((type(model).__name__, prepare))
        seconds = {"fp32": 0.002, "bf16": 0.001}
        return ("bf16", seconds, {"fp32": {"attention": "sdpa"}, "bf16": {"attention": "explicit"}}) if prepare \
            else ("bf16", seconds)

    vit = ViT(32, 1, 10, patch=4, dim=8, depth=1, heads=2, mlp_dim=16, dropout=0.0)
    monkeypatch.setattr(precision_probe, "models", lambda: [("cnn C1=1", WidthCNN(32, 1, 10, width=1)), ("vit", vit)])
    monkeypatch.setattr(precision_probe, "measure_precision", fake)
    monkeypatch.setattr(sys, "argv", ["precision_probe.py"])
    precision_probe.main()
    assert calls[0] == ("WidthCNN", None) and calls[1][0] == "ViT" and callable(calls[1][1])
    assert "explicit" in capsys.readouterr().out


def test_an_attention_probe_without_a_shape_measures_afresh(monkeypatch):
    """resolve_attention's shape is optional (no shape: nothing to reuse from the probe cache), but it built the cache
    key from it first: precision_probe.py's call without one raised TypeError."""
    from src.device_setup import resolve_attention
    from src.models import attention_probe
    from src.models.vit import ViT

    monkeypatch.setattr(attention_probe, "choose_attention",
                        lambda model, batch, autocast, bf16: ("explicit", {"explicit": 0.001}, "measured"))

    vit = ViT(32, 1, 10, patch=8, dim=8, depth=1, heads=2, mlp_dim=16, dropout=0.0)
    facts = resolve_attention(vit, 4, torch.device("cpu"), "fp32")
    assert facts["attention"] == "explicit" and "attention_probe_cached" not in facts
    assert vit.attention_path() == facts["attention"]
