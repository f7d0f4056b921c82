"""What ``trainer.precision=auto`` would choose on this CPU, per model of the EPFL studies.

    python benchmarks/precision_probe.py                 # the double-descent CNNs and ViTs, heads_depth's ViTs
    python benchmarks/precision_probe.py --threads 1     # as the vectorized launcher runs them (one thread each)

For each model it runs ``src.run_setup.measure_precision`` (the probe ``auto`` runs at a run's start: median
forward + backward seconds of a 128-image batch in fp32 and in bf16; a ViT's each with the attention path its own
probe picks under that precision, as a run with ``model.attention=auto`` does) and prints both times, with the ViTs'
paths, their ratio and the choice. On a CPU without native bf16 ``auto`` is fp32 without measuring; the table is
printed anyway.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from src.device_setup import resolve_attention  # noqa: E402
from src.models.cnn import WidthCNN  # noqa: E402
from src.models.vit import ViT  # noqa: E402
from src.run_setup import machine_name, measure_precision  # noqa: E402
from src.validate import cpu_has_fast_bf16  # noqa: E402

SHAPE = (1, 32, 32)  # MNIST at 32 px, as in the EPFL studies


def models() -> list[tuple[str, torch.nn.Module]]:
    out = [(f"cnn C1={w}", WidthCNN(32, 1, 10, width=w)) for w in (1, 4, 8, 16, 32, 64)]
    out += [(f"vit dim={d} h4 d3", ViT(32, 1, 10, patch=4, dim=d, depth=3, heads=4, mlp_dim=2 * d, dropout=0.0))
            for d in (8, 16, 32, 64)]
    out += [(f"vit dim=128 h{h} d{L}", ViT(32, 1, 10, patch=4, dim=128, depth=L, heads=h, mlp_dim=256, dropout=0.0))
            for h, L in ((1, 1), (4, 1), (1, 3), (4, 3))]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--batch", type=int, default=128)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"CPU: {machine_name(torch.device('cpu'))}; native bf16: {cpu_has_fast_bf16()}; "
          f"threads: {torch.get_num_threads()}; batch {args.batch}")
    print("| model | fp32 ms | bf16 ms | fp32 / bf16 | auto picks |")
    print("|---|---|---|---|---|")
    cpu = torch.device("cpu")
    for name, model in models():
        cnn = name.startswith("cnn")
        # as a run's set-up does: with model.attention=auto each precision is timed with the path its own attention
        # probe picks (src.run_setup.setup), not with the model's default path
        pick = ((lambda m, p: resolve_attention(m, args.batch, cpu, p, f" under {p}"))
                if getattr(model, "attention", None) == "auto" else None)
        chosen, s, *paths = measure_precision(model.to(memory_format=torch.channels_last) if cnn else model,
                                              SHAPE, 10, args.batch, cnn, pick)  # CNNs train channels_last
        chosen = chosen if cpu_has_fast_bf16() else "fp32"
        timed = {p: f" ({f['attention']})" for p, f in paths[0].items() if "attention" in f} if paths else {}
        print(f"| {name} | {1e3 * s['fp32']:.1f}{timed.get('fp32', '')} | {1e3 * s['bf16']:.1f}{timed.get('bf16', '')} "
              f"| {s['fp32'] / s['bf16']:.2f} | {chosen} |", flush=True)

if __name__ == "__main__":
    main()
