"""benchmarks/epoch_costs.py's split of an epoch: training steps, the rest, and the overhead per step."""
import pytest

from benchmarks import epoch_costs


def test_the_epoch_is_split_by_the_images_and_steps_it_trained():
    """The split took n_train / images/s as the training seconds and ceil(n_train / 128) as the steps: the train loader
    drops a last partial batch and a study may train at another batch (mnist_vit: 64), so at n_train 2000 the steps'
    seconds read 4% high, and at batch 64 the overhead per step was spread over half the steps."""
    rows = [{"epoch": 1, "step": 15, "wall_s": 1.0, "images_per_s": 1920 / 0.5},
            {"epoch": 2, "step": 30, "wall_s": 2.0, "images_per_s": 1920 / 0.6},
            {"epoch": 3, "step": 45, "wall_s": 3.1, "images_per_s": 1920 / 0.7}]
    split = epoch_costs.epoch_split(rows, batch=128)
    assert split["epoch_s"] == pytest.approx(1.05) and split["train_s"] == pytest.approx(0.65)
    assert split["steps"] == 15 and split["images"] == 1920
    rows64 = [{**r, "step": 2 * r["step"]} for r in rows]
    assert epoch_costs.epoch_split(rows64, batch=64)["steps"] == 30
