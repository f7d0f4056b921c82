"""Where a small study run's epoch goes: the real trainer for a few epochs, against its FLOP limit.

    python benchmarks/epoch_costs.py --study double_descent_cnn --model cnn --width 4 --root ../shared/data/mnist.npz
    python benchmarks/epoch_costs.py --study double_descent_vit --model vit --dim 32 --root ../shared/data/mnist.npz
    python benchmarks/epoch_costs.py --study double_descent_vit --model vit --dim 32 --override trainer.precision=fp32

One run of the study's recipe (``python -m src.train +sweeps=STUDY``, its own process, as a sweep runs it) at
``--n-train`` images for ``--epochs`` epochs; its ``metrics.jsonl`` gives each epoch's wall time and training
throughput. Printed per run: seconds per epoch (median over the epochs after the first), of which training steps
(the epoch's images, its steps x the run's batch, over its training images/s) and the rest (evaluation of the train
split, test scoring every ``trainer.test_every`` epochs, the epoch's bookkeeping); the FLOP limit of the training steps
(the model's forward + backward FLOPs per image x the epoch's images / the matmul peak measured in this run for the
run's precision); and the per-step time that is neither (per-step Python and framework overhead), as
``step time - limit``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import yaml  # noqa: E402

from benchmarks.step_profile import machine  # noqa: E402
from benchmarks.throughput import VitsweepPath, compose, flops_per_image, load, matmul_peak  # noqa: E402


def run_epochs(args, size: list[str], run_dir: Path) -> tuple[list[dict], dict, int]:
    cmd = [sys.executable, "-m", "src.train", "--config-dir", str(ROOT), f"+sweeps={args.study}", *size,
           f"dataset.root={Path(args.root).resolve()}", f"dataset.n_train={args.n_train}",
           f"trainer.max_epochs={args.epochs}", "trainer.converge_epochs=null", "trainer.progress=false",
           "trainer.checkpoint=false", f"trainer.num_threads={args.threads}", f"hydra.run.dir={run_dir}",
           *args.override]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    batch = int(yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())["trainer"]["batch_size"])
    return rows, json.loads((run_dir / "summary.json").read_text()), batch


def epoch_split(rows: list[dict], batch: int) -> dict:
    """Median seconds per epoch over the epochs after the first, and of them the training steps': an epoch's images
    (its steps at the run's batch: the train loader drops a last partial batch) over its training images/s."""
    epochs = [r for r in rows if "images_per_s" in r]
    walls = [b["wall_s"] - a["wall_s"] for a, b in zip(epochs, epochs[1:], strict=False)]  # epochs 2..
    steps = [b["step"] - a["step"] for a, b in zip(epochs, epochs[1:], strict=False)]
    train = [n * batch / r["images_per_s"] for n, r in zip(steps, epochs[1:], strict=True)]
    n = int(statistics.median(steps))
    return {"epoch_s": statistics.median(walls), "train_s": statistics.median(train), "steps": n, "images": n * batch}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--study", default="double_descent_cnn")
    p.add_argument("--model", default="cnn")
    p.add_argument("--width", type=int)
    p.add_argument("--dim", type=int)
    p.add_argument("--root", default=str(ROOT.parent / "shared" / "data" / "mnist.npz"))
    p.add_argument("--n-train", type=int, default=2048)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--threads", type=int, default=1, help="torch threads (a sweep worker's share of the cores)")
    p.add_argument("--override", action="append", default=[], help="a Hydra override of the run (repeatable), "
                   "e.g. trainer.precision=fp32")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    size = [f"model.width={args.width}"] if args.width else []
    size += [f"model.dim={args.dim}", f"model.mlp_dim={2 * args.dim}"] if args.dim else []
    label = f"{args.study} {' '.join(size + args.override)}"
    with tempfile.TemporaryDirectory() as tmp:
        rows, summary, batch = run_epochs(args, size, Path(tmp) / "run")
    split = epoch_split(rows, batch)
    epoch_s, train_s, steps = split["epoch_s"], split["train_s"], split["steps"]
    # the model's FLOPs and the peak of the run's precision, measured here (same threads)
    ns = argparse.Namespace(model=args.model, batch=128, lr=0.05, device="cpu", seed=0, threads=args.threads,
                            npz=None, synthetic_n=256, augment=None, override=[f"+sweeps={args.study}",
                            f"dataset.root={Path(args.root).resolve()}", "dataset.n_train=256", *size],
                            **dict.fromkeys(("patch", "dim", "depth", "heads", "mlp_dim", "width", "dropout")))
    path = VitsweepPath(compose(ns), summary["precision"], False)
    xb, yb = next(iter(path.loader))
    flops = flops_per_image(path.model, xb, yb)
    dtype = torch.bfloat16 if summary["precision"] == "bf16" else torch.float32
    peak = matmul_peak(torch.device("cpu"), dtype)[0]
    limit = flops * split["images"] / (peak * 1e9)
    print(f"| {label} | {summary['precision']} | {epoch_s:.3f} | {train_s:.3f} ({train_s / epoch_s:.0%}) | "
          f"{epoch_s - train_s:.3f} ({(epoch_s - train_s) / epoch_s:.0%}) | {limit:.4f} | "
          f"{1e3 * (train_s - limit) / steps:.2f} | {flops / 1e6:.2f} | {peak:.0f} |")
    print(f"<!-- {machine()}; {args.threads} thread(s); n_train {args.n_train}, {args.epochs} epochs, "
          f"median over epochs 2-{args.epochs}; {load()} -->")


if __name__ == "__main__":
    main()
