"""``python -m src.data.prefix SRC.npz OUT.npz --train N --test M``: the first N training and M test images of a
dataset archive (the ``.npz`` layout of ``../shared/data``), for a machine that cannot hold the whole file (a
lent GPU takes 64 MiB of files per call).

A prefix is a fair sample where the archive's order is already random (CIFAR-10 and Fashion-MNIST there were
shuffled once with a fixed seed; MNIST keeps its official order, whose prefix mixes writers and classes). A run on
the prefix file is the same run on any machine that builds it with the same command; the printed SHA-256 names it.
"""
from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import numpy as np


def write_prefix(src: str | Path, out: str | Path, n_train: int, n_test: int) -> str:
    with np.load(src) as d:
        for split, n in (("train", n_train), ("test", n_test)):
            if n > len(d[f"y_{split}"]):
                raise SystemExit(f"--{split} {n} exceeds the {len(d[f'y_{split}'])} {split} images of {src}")
        arrays = {k: d[k] for k in d.files}
    for split, n in (("train", n_train), ("test", n_test)):
        arrays[f"x_{split}"], arrays[f"y_{split}"] = arrays[f"x_{split}"][:n], arrays[f"y_{split}"][:n]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, **arrays)
    return hashlib.sha256(Path(out).read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m src.data.prefix", description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--train", type=int, required=True)
    ap.add_argument("--test", type=int, required=True)
    a = ap.parse_args(argv)
    print(f"{a.out}: first {a.train} train, {a.test} test images of {a.src}; sha256 "
          f"{write_prefix(a.src, a.out, a.train, a.test)}")


if __name__ == "__main__":
    main()
