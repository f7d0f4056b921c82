"""Training-step time of the default ViT with ``model.lean`` on and off, interleaved, one thread (patch_size report).

    taskset -c 1 python docs/studies/patch_size/scripts/lean_probe.py bf16 2 128   # precision, patch, batch

Random CIFAR-sized images; 6 steps per variant, the first left out, the median of the other 5 printed.
"""
import contextlib
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from src.models.vit import ViT  # noqa: E402


def main(precision: str, patch: int, batch: int, steps: int = 6) -> None:
    torch.set_num_threads(1)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    runs = {}
    for lean in (True, False):
        torch.manual_seed(0)
        model = ViT(image_size=32, in_channels=3, num_classes=10, patch=patch, lean=lean)
        runs[lean] = (model, torch.optim.AdamW(model.parameters(), 3e-4), [])
    for step in range(steps):
        for model, opt, times in runs.values():  # interleaved, so drift in the machine's load hits both
            start = time.perf_counter()
            ctx = torch.autocast("cpu", torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
            with ctx:
                loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if step:
                times.append(time.perf_counter() - start)
    for lean, (_, _, times) in runs.items():
        median = sorted(times)[len(times) // 2]
        print(f"{precision} patch {patch} batch {batch} lean={lean}: median step {median:.3f} s, "
              f"{batch / median:.1f} img/s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
