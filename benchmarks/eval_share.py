"""Evaluation's share of a small-model run's wall time, before and after.

    python benchmarks/eval_share.py --root ../shared/data/mnist.npz              # widths 4, 16, 32
    python benchmarks/eval_share.py --widths 16 --precisions fp32,bf16 --epochs 3

The model is the double-descent study's: ``model=cnn optimizer=sgd scheduler=constant``, MNIST at 32 x 32,
``n_train`` 1024, 20% label noise, batch 128 (sweeps/double_descent_cnn.yaml); without ``--root`` synthetic
images of MNIST's shape (1 x 32 x 32, 10 classes, 10,000 test images) stand in. It runs the trainer's own
``train_epoch`` and ``src.metrics.evaluate`` and, after every epoch, times the training epoch, the scoring of
the train split (1024 images, clean-label metrics included) and of the test split (10,000 images), each at
the old (256) and the new (1024) ``trainer.eval_batch_size``. The first epoch is a warm-up and not counted;
the printed figures are medians over the other epochs, in wall seconds and in process CPU seconds (the
latter moves less when other processes load the machine).

Shares, evaluation / (training + evaluation), for a run of ``--run-epochs`` epochs at ``eval_every=1``:
  before: train and test split scored every epoch at eval batch 256 (the earlier defaults);
  batch:  the same at eval batch 1024 (the new default);
  after:  eval batch 1024, the train split every epoch, the test split every ``--test-every`` epochs and at
          the final evaluation (``trainer.test_every``), i.e. ceil(run_epochs / test_every) test scorings;
  final:  the same with ``trainer.test_every=null``: the test split scored at the final evaluation only.
"""
from __future__ import annotations

import argparse
import datetime
import math
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

from src.loop import train_epoch  # noqa: E402
from src.metrics import evaluate  # noqa: E402
from src.run_setup import setup  # noqa: E402
from src.stop_signal import StopSignal  # noqa: E402
from src.validate import cpu_has_fast_bf16  # noqa: E402

BEFORE_BATCH, AFTER_BATCH = 256, 1024  # trainer.eval_batch_size before and after the change


def cpu_model() -> str:
    """lscpu's model name (platform's processor string where lscpu is absent)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "unknown"


def config(width: int, precision: str, root: str | None, threads: int, n_test: int = 10_000):
    data = ([f"dataset.root={root}"] if root else
            ["dataset=synthetic", "dataset.channels=1", "dataset.num_train=1024", f"dataset.num_test={n_test}"])
    overrides = ["model=cnn", f"model.width={width}", "optimizer=sgd", "optimizer.lr=0.05", "optimizer.momentum=0.9",
                 "scheduler=constant", "label_noise=p20", "dataset.n_train=1024", "dataset.image_size=32",
                 "trainer.batch_size=128", "trainer.max_epochs=1000", "trainer.device=cpu",
                 f"trainer.precision={precision}", f"trainer.num_threads={threads}", "trainer.progress=false",
                 "trainer.checkpoint=false", *data]
    if root:
        overrides.insert(0, "dataset=mnist")
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


class _NoBar:
    def update(self, *a):
        pass

    def set_postfix(self, **k):
        pass


def timed(fn) -> tuple[float, float]:
    """(wall s, process CPU s) of ``fn()``."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def measure(width: int, precision: str, args) -> dict[str, tuple[float, float]]:
    """Median (wall, cpu) seconds per epoch of training and of each split's scoring at each eval batch."""
    state = setup(config(width, precision, args.root, args.threads, args.n_test), None)
    state.started = time.perf_counter()
    times: dict[str, list[tuple[float, float]]] = {}
    for epoch in range(args.epochs + 1):
        parts = {"train_epoch": lambda: train_epoch(state, StopSignal(), _NoBar())}
        for split in ("train", "test"):
            loader = state.eval_loaders[split]
            clean = state.train_eval_clean if split == "train" else (None, None)
            for bs in (BEFORE_BATCH, AFTER_BATCH) if epoch % 2 else (AFTER_BATCH, BEFORE_BATCH):  # alternate order
                def score(loader=loader, bs=bs, clean=clean):
                    loader.batch_size = bs
                    evaluate(state.step_model, loader, state.autocast, state.data.num_classes, *clean)
                parts[f"{split}@{bs}"] = score
        for name, fn in parts.items():
            t = timed(fn)
            if epoch:  # epoch 0 warms up oneDNN's kernels
                times.setdefault(name, []).append(t)
    return {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in times.items()}


def shares(m: dict[str, tuple[float, float]], run_epochs: int, test_every: int, i: int) -> dict[str, float]:
    """Evaluation's share of the run's time (i = 0 wall, 1 cpu) for each setting of the module docstring."""
    train, tests = m["train_epoch"][i], math.ceil(run_epochs / test_every)
    out = {}
    for name, bs, n_test in (("before", BEFORE_BATCH, run_epochs), ("batch", AFTER_BATCH, run_epochs),
                             ("after", AFTER_BATCH, tests), ("final", AFTER_BATCH, 1)):
        ev = run_epochs * m[f"train@{bs}"][i] + n_test * m[f"test@{bs}"][i]
        out[name] = ev / (run_epochs * train + ev)
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", help="MNIST .npz (x_train/y_train/x_test/y_test); default: synthetic at MNIST shape")
    p.add_argument("--widths", default="4,16,32", help="C1 values, comma-separated")
    p.add_argument("--precisions", default="fp32,bf16", help="trainer.precision values, comma-separated")
    p.add_argument("--epochs", type=int, default=4, help="timed epochs per model (after one warm-up epoch)")
    p.add_argument("--run-epochs", type=int, default=100, help="run length the shares are given for")
    p.add_argument("--test-every", type=int, default=20, help="trainer.test_every of the 'after' setting")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--n-test", type=int, default=10_000, help="synthetic test images (without --root; tests)")
    args = p.parse_args(argv)
    print(f"# eval_share  {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC  CPU: {cpu_model()} "
          f"({torch.get_num_threads()} torch threads -> {args.threads}; native bf16: {cpu_has_fast_bf16()})")
    tests = "the .npz's test images" if args.root else f"{args.n_test:,} test images"
    print(f"# data: {args.root or 'synthetic 1x32x32'}; n_train 1024, {tests}; batch 128; "
          f"medians over {args.epochs} epochs after a warm-up; shares for a {args.run_epochs}-epoch run at "
          f"eval_every=1 (after: test_every={args.test_every})")
    head = (f"{'C1':>3} {'prec':>5} | {'train s/ep':>10} | {'score train 256/1024':>20} | "
            f"{'score test 256/1024':>19} | {'share before':>12} {'batch':>6} {'after':>6} {'final':>6} | "
            f"{'cpu: before':>11} {'after':>6} {'final':>6}")
    print(head + "\n" + "-" * len(head))
    rows = []
    for width in (int(w) for w in args.widths.split(",")):
        for precision in args.precisions.split(","):
            m = measure(width, precision, args)
            wall, cpu = shares(m, args.run_epochs, args.test_every, 0), shares(m, args.run_epochs, args.test_every, 1)
            rows.append({"width": width, "precision": precision, "times": m, "wall": wall, "cpu": cpu})
            print(f"{width:>3} {precision:>5} | {m['train_epoch'][0]:>10.3f} | "
                  f"{m[f'train@{BEFORE_BATCH}'][0]:>9.3f} {m[f'train@{AFTER_BATCH}'][0]:>10.3f} | "
                  f"{m[f'test@{BEFORE_BATCH}'][0]:>9.3f} {m[f'test@{AFTER_BATCH}'][0]:>9.3f} | "
                  f"{wall['before']:>12.0%} {wall['batch']:>6.0%} {wall['after']:>6.0%} {wall['final']:>6.0%} | "
                  f"{cpu['before']:>11.0%} {cpu['after']:>6.0%} {cpu['final']:>6.0%}", flush=True)
    return rows


if __name__ == "__main__":
    main()
