"""DICOM preprocessing throughput: decode + crop + flip + resize into the memory-mapped cache.

By default writes N synthetic mammograms (2048 x 1664, 12 bit, JPEG 2000 lossless -- the syntax of
most RSNA files besides JPEG Lossless SV1) with scanner-like noise, then builds the cache at 512 px:

    .venv/bin/python benchmarks/dicom_preprocess.py --n 32 --workers 2
    .venv/bin/python benchmarks/dicom_preprocess.py --folder /data/rsna/train_images --n 200

Prints images/s for the decode alone and for the whole cache build, and the cache bytes per image.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from src.data import mammo  # noqa: E402
from src.data.dicom import read_dicom  # noqa: E402
from src.data.synthetic_dicom import phantom, write_dicom  # noqa: E402
from src.run_setup import machine_name  # noqa: E402


def synthetic_tree(folder: Path, n: int, shape: tuple[int, int], syntax: str, seed: int = 0) -> list[Path]:
    rng = np.random.default_rng(seed)
    base = phantom(*shape)
    paths = []
    for i in range(n):
        noise = rng.normal(0.0, 0.01, shape) * (base > 0)  # quantum noise in the tissue, ~40 levels of 4095
        img = np.clip(base * rng.uniform(0.8, 1.0) + noise, 0.0, 1.0)
        paths.append(write_dicom(folder / f"p{i // 4}" / f"{i}.dcm", img, bits=12, laterality="LR"[i % 2],
                                 photometric=("MONOCHROME2", "MONOCHROME1")[i % 3 == 0], syntax=syntax))
    return paths


def decode_seconds(paths: list, k: int, read=read_dicom) -> tuple[float, int]:
    """Mean seconds to decode one file over up to ``k`` files, after one untimed read: the first read of a process
    loads the decoder (0.65 s against 0.43 s for the next J2K reads, measured), which the cache build's forked workers
    inherit. Returns (seconds, files timed); with one file, that file again."""
    read(paths[0])
    timed = paths[1:1 + k] or paths[:1]
    t0 = time.perf_counter()
    for p in timed:
        read(p)
    return (time.perf_counter() - t0) / len(timed), len(timed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=32, help="images to make (or the first n of --folder)")
    ap.add_argument("--folder", type=Path, help="use the .dcm files under this folder instead of synthetic ones")
    ap.add_argument("--image-size", type=int, default=512, help="output pixels")
    ap.add_argument("--workers", type=int, default=2, help="decoding processes")
    ap.add_argument("--height", type=int, default=2048)
    ap.add_argument("--width", type=int, default=1664)
    ap.add_argument("--syntax", default="j2k", help="raw | rle | j2k | j2k_lossy | jpegls | jpeg_sv1")
    args = ap.parse_args()
    print(f"CPU: {machine_name(torch.device('cpu'))}, {os.cpu_count()} CPUs")

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.folder:
            paths = sorted(args.folder.rglob("*.dcm"))[: args.n]
        else:
            t0 = time.perf_counter()
            paths = synthetic_tree(tmp / "dicom", args.n, (args.height, args.width), args.syntax)
            print(f"wrote {len(paths)} {args.height}x{args.width} 12-bit {args.syntax} DICOMs in "
                  f"{time.perf_counter() - t0:.1f} s, {np.mean([p.stat().st_size for p in paths]) / 1e6:.2f} MB each")
        rows = pd.DataFrame({"path": [str(p) for p in paths], "label": np.arange(len(paths)) % 2,
                             "patient": [p.parent.name for p in paths], "laterality": ""})

        decode_s, k = decode_seconds(paths, 4)
        print(f"decode only (1 process, {k} images after one untimed): {1 / decode_s:.2f} images/s "
              f"({decode_s * 1e3:.0f} ms/image)")

        out = tmp / "cache"
        t0 = time.perf_counter()
        meta = mammo.build_cache(rows, out, args.image_size, crop=True, flip=True, workers=args.workers,
                                 progress=False)
        seconds = time.perf_counter() - t0
        size = sum(f.stat().st_size for f in out.iterdir())
        print(f"cache build at {args.image_size}px, {args.workers} workers, {os.cpu_count()} CPUs: "
              f"{meta['n_images']} images in {seconds:.1f} s = {meta['n_images'] / seconds:.2f} images/s "
              f"(skipped {meta['n_skipped']})")
        print(f"cache: {size / max(meta['n_images'], 1):,.0f} bytes/image on disk "
              f"({(out / 'images.npy').stat().st_size / max(meta['n_images'], 1):,.0f} of them pixels)")


if __name__ == "__main__":
    main()
