"""The arithmetic behind benchmarks/throughput.py's and step_profile.py's figures: images counted as trained."""
import time

import pytest
import torch

from benchmarks import throughput


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
