"""Training throughput: vitsweep's trainer path against the tutorial-style baseline, in one process.

    python benchmarks/throughput.py [--npz ../shared/data/cifar10.npz]      # seed-report ViT
    python benchmarks/throughput.py --model cnn --width 4                  # width-parametrised CNN
    python benchmarks/throughput.py --model resnet18                       # any conf/model/*.yaml
    python benchmarks/throughput.py --check --npz ...                      # bf16 vs fp32 loss curves
    python benchmarks/throughput.py --scaling --npz ...                    # epoch time vs n_train

Both paths train the same model sizes with the same optimizer, lr and batch for the same number of
steps. (a) The baseline is what the seed reports ran: a ViT of ``nn.MultiheadAttention`` blocks with
reshape/permute patches and an ``nn.Linear`` embedding (other models: the same vitsweep module), a
``DataLoader`` over a map-style dataset of ``PIL.Image`` objects through torchvision transforms, fp32
AdamW. (b) vitsweep: ``src.models`` through the config, ``src.data.loader.Loader`` (uint8 data on the
device, batch augmentation), ``src.optim.build_optimizer`` and ``src.loop.train_step`` with the
device's best settings (precision ``auto``, channels_last and fused AdamW on CUDA, compile on CUDA).

Printed: images/s of each and their ratio; model FLOPs per image (forward + backward, counted by
``FlopCounterMode``), achieved GFLOP/s and its fraction of the dense matmul peak measured in this run
(fp32 and bf16); the share of step time spent waiting for data; each arm's own peak RSS (reset between
the arms) and CUDA max allocated; the baseline's DataLoader workers' private memory.
"""
from __future__ import annotations

import argparse
import gc
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if __name__ == "__main__":  # the same glibc malloc settings as `python -m src.train` (see src/malloc.py)
    from src.malloc import restart_with_lean_malloc

    restart_with_lean_malloc()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from src.data import DataSplits, build_data  # noqa: E402
from src.device_setup import setup_device  # noqa: E402
from src.loop import train_step  # noqa: E402
from src.run_setup import build_model, machine_name, setup  # noqa: E402
from src.schedule import lr_at  # noqa: E402
from src.validate import cpu_has_fast_bf16, resolve_precision, select_device  # noqa: E402

VIT_KEYS = ("patch", "dim", "depth", "heads", "mlp_dim")


# ----------------------------------------------------------------------------- the baseline
class TutorialBlock(nn.Module):
    """Pre-norm block as in the tutorials: ``nn.MultiheadAttention`` + GELU MLP."""

    def __init__(self, dim: int, heads: int, mlp_dim: int, dropout: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Dropout(dropout),
                                 nn.Linear(mlp_dim, dim), nn.Dropout(dropout))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h)[0]  # need_weights defaults to True, as in the tutorials
        return x + self.mlp(self.norm2(x))


class TutorialViT(nn.Module):
    """Patches cut with reshape/permute and embedded by ``nn.Linear``; CLS token, learned positions."""

    def __init__(self, image_size: int, in_channels: int, num_classes: int, patch: int = 4, dim: int = 256,
                 depth: int = 6, heads: int = 8, mlp_dim: int = 512, dropout: float = 0.0):
        super().__init__()
        self.patch = patch
        n = (image_size // patch) ** 2
        self.embed = nn.Linear(in_channels * patch * patch, dim)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*[TutorialBlock(dim, heads, mlp_dim, dropout) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        B, C, H, W = x.shape
        p = self.patch
        x = x.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5).reshape(B, -1, C * p * p)
        x = self.embed(x)
        x = self.drop(torch.cat([self.cls.expand(B, -1, -1), x], 1) + self.pos)
        return self.head(self.norm(self.blocks(x)[:, 0]))


class PILDataset(torch.utils.data.Dataset):
    """Map-style dataset returning ``PIL.Image`` objects through torchvision transforms."""

    def __init__(self, x_nchw: torch.Tensor, y: torch.Tensor, transform):
        self.x = np.ascontiguousarray(x_nchw.permute(0, 2, 3, 1).numpy())  # (N, H, W, C) like torchvision's CIFAR10
        self.y = y.tolist()
        self.transform = transform

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        from PIL import Image

        img = self.x[i]
        img = Image.fromarray(img[..., 0] if img.shape[-1] == 1 else img)
        return self.transform(img), self.y[i]


def tutorial_transform(augment: str, size: int, mean, std):
    from torchvision import transforms as T

    aug = {"none": [], "flip_crop": [T.RandomCrop(size, padding=4), T.RandomHorizontalFlip()],
           "resized_crop": [T.RandomHorizontalFlip(), T.RandomResizedCrop(size)],
           "translate": [T.RandomAffine(0, translate=(0.05, 0.05))]}[augment]
    return T.Compose([*aug, T.ToTensor(), T.Normalize(list(mean), list(std))])


def baseline_model(model_cfg: dict, data: DataSplits) -> nn.Module:
    """The tutorial ViT for ``ViT`` configs; any other model is the same vitsweep module."""
    if model_cfg["_target_"].endswith(".ViT"):
        c, h, _ = data.image_shape
        return TutorialViT(h, c, data.num_classes, dropout=model_cfg.get("dropout", 0.0),
                           **{k: model_cfg[k] for k in VIT_KEYS})
    return build_model(model_cfg, data)[0]


# ----------------------------------------------------------------------------- measurements
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak(device: torch.device, dtype: torch.dtype, budget_s: float = 3.0) -> tuple[float, int]:
    """Best dense square-matmul GFLOP/s over growing sizes; a size whose estimated cost (8x the last
    product) would overrun ``budget_s`` is skipped, so an emulated dtype stays cheap to measure."""
    sizes = (1024, 2048, 4096, 8192) if device.type == "cuda" else (256, 512, 1024, 2048)
    best, best_n, t_end, per_product = 0.0, 0, time.perf_counter() + budget_s, 0.0
    for n in sizes:
        if per_product * 8 * 3 > t_end - time.perf_counter():
            break
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        a @ b
        sync(device)
        reps, t0 = 0, time.perf_counter()
        while True:
            a @ b
            reps += 1
            sync(device)
            dt = time.perf_counter() - t0
            if dt > 0.2 or reps >= 50:
                break
        per_product = dt / reps
        if 2 * n**3 / per_product / 1e9 > best:
            best, best_n = 2 * n**3 / per_product / 1e9, n
    return best, best_n


def flops_per_image(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Forward + backward FLOPs per image, counted by ``torch.utils.flop_counter.FlopCounterMode``."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        F.cross_entropy(model(x), y).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / len(x)


def _status_kib(pid: int | str, key: str) -> int | None:
    """One ``kB`` field of /proc/<pid>/status (None where there is no /proc or no such field)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def reset_peak_rss() -> bool:
    """Start this process's peak resident set afresh (Linux >= 4.0: writing 5 to /proc/self/clear_refs resets VmHWM to
    the current RSS), so the next arm's peak is its own and not the larger of both arms'. False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mib() -> float:
    """This process's peak resident set since the last :func:`reset_peak_rss` (VmHWM); ``ru_maxrss``, the peak since
    the process started, where /proc is absent."""
    kib = _status_kib("self", "VmHWM")
    return (kib if kib is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024  # KiB on Linux


def private_mib(pids) -> float | None:
    """Memory the processes ``pids`` hold on their own now: their private pages (/proc/<pid>/smaps_rollup), so pages a
    forked DataLoader worker still shares with this process are not counted again. (``RUSAGE_CHILDREN`` counts only
    children that ended and were waited for; the persistent workers are alive when an arm is read.) None where /proc
    has no such figures."""
    total, seen = 0, False
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    total, seen = total + int(line.split()[1]), True
        except (OSError, ValueError, IndexError):
            continue
    return total / 1024 if seen else None


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} threads"


def _cuda_peak_mib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def _adamw_kind(optimizer: torch.optim.Optimizer) -> str:
    return next((k for k in ("fused", "foreach") if optimizer.defaults.get(k)), "default")


def load() -> str:
    try:
        return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except OSError:
        return "load n/a"


# ----------------------------------------------------------------------------- config and data
def compose(args, n_train: int | None = None) -> dict:
    """The real config through Hydra's compose API, with the benchmark's sizes."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    extra = list(getattr(args, "override", None) or [])  # step_profile.py's --override (Hydra overrides)
    study = any(o.startswith("+sweeps") for o in extra)
    # a named study brings its own model group (a command-line model=... would replace it: the double-descent
    # ViT's vit_epfl, dropout 0, became the default vit with dropout 0.2)
    over = [] if study and not any(o.startswith("model=") for o in extra) else [f"model={args.model}"]
    over += [f"trainer.batch_size={args.batch}", f"optimizer.lr={args.lr}",
             f"trainer.device={args.device}", f"seed={args.seed}", f"trainer.num_threads={args.threads or 'null'}"]
    if any(o.startswith(("dataset=", "+sweeps=")) for o in extra):
        pass  # the caller names the dataset (or a study that does)
    elif args.npz:
        over += ["dataset=cifar10", f"dataset.root={Path(args.npz).resolve()}"]
        if n_train:
            over.append(f"dataset.n_train={n_train}")
    else:
        over += ["dataset=synthetic", f"dataset.num_train={n_train or args.synthetic_n}", "dataset.num_test=256"]
    if study:  # the sweep files live at the repository root
        over.append(f"hydra.searchpath=[file://{ROOT}]")
    over += extra
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_container(hydra_compose("config", overrides=over), resolve=True)
    m = cfg["model"]
    for key in (*VIT_KEYS, "width", "dropout"):
        value = getattr(args, key)
        if value is None:
            continue
        if key not in m:
            raise SystemExit(f"--{key.replace('_', '-')} does not apply to model={args.model} (its keys: {sorted(m)})")
        m[key] = value
    if args.augment or not extra:  # with --override the composed config's augment stands unless --augment
        cfg["dataset"]["augment"] = args.augment or ("resized_crop" if m["_target_"].endswith("ViT") else "flip_crop")
    return cfg


class VitsweepPath:
    """vitsweep's trainer path for one config, built by the trainer's own set-up (``src.run_setup.setup``):
    model, optimizer, Loader and ``train_step``."""

    def __init__(self, cfg: dict, precision: str, compile_model: bool):
        cfg = {**cfg, "trainer": {**cfg["trainer"], "precision": precision, "compile": compile_model}}
        state = setup(cfg, run_dir=None)
        self.device, self.data = state.device, state.data
        self.channels_last = state.train_loader.channels_last
        self.model, self.step_model, self.optimizer = state.model, state.step_model, state.optimizer
        self.autocast, self.scaler, self.loader = state.autocast, state.scaler, state.train_loader
        self.base_lr = state.schedule.base_lr
        self.info = state.info  # the run's resolved facts (precision, attention path and why)

    def batches(self):
        while True:
            yield from self.loader

    def step(self, xb, yb, step: int, total: int) -> torch.Tensor:
        for group in self.optimizer.param_groups:  # the trainer's schedule (constant here, like the baseline)
            group["lr"] = lr_at(step, self.base_lr, total, 0, "constant")
        return train_step(self.step_model, self.optimizer, self.scaler, self.autocast, xb, yb)


class BaselinePath:
    """The tutorial loop: DataLoader of PIL images, fp32, ``loss.item()`` every step."""

    def __init__(self, cfg: dict, data: DataSplits, device: torch.device, workers: int):
        self.device = device
        torch.manual_seed(cfg["seed"])
        self.model = baseline_model(cfg["model"], data).to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg["optimizer"]["lr"],
                                           weight_decay=cfg["optimizer"]["weight_decay"])
        ds = PILDataset(data.x_train, data.y_train,
                        tutorial_transform(cfg["dataset"]["augment"], data.image_shape[-1], data.mean, data.std))
        self.loader = torch.utils.data.DataLoader(ds, batch_size=int(cfg["trainer"]["batch_size"]), shuffle=True,
                                                  num_workers=workers, drop_last=True,
                                                  pin_memory=device.type == "cuda", persistent_workers=workers > 0)
        self.running_loss = 0.0

    def worker_pids(self) -> list[int]:
        """The DataLoader's (persistent) worker processes, not other children (inductor's compile workers)."""
        return [w.pid for w in getattr(self.loader._iterator, "_workers", None) or []]

    def batches(self):
        while True:
            for xb, yb in self.loader:
                yield xb.to(self.device), yb.to(self.device)

    def step(self, xb, yb, step: int, total: int) -> torch.Tensor:
        loss = F.cross_entropy(self.model(xb), yb)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.running_loss += loss.item()
        return loss


def time_path(path, warmup: int, steps: int) -> dict:
    """Run ``warmup`` untimed steps, then ``steps`` timed ones; data wait = time spent getting batches. Images are
    counted as the timed batches hold them (an ``--override trainer.batch_size=...`` makes them other than --batch)."""
    it = path.batches()
    t0 = time.perf_counter()
    for i in range(warmup):
        path.step(*next(it), i, warmup + steps)
    sync(path.device)
    warm_s = time.perf_counter() - t0
    wait, images, t0 = 0.0, 0, time.perf_counter()
    for i in range(steps):
        tw = time.perf_counter()
        xb, yb = next(it)
        wait += time.perf_counter() - tw
        images += len(yb)
        path.step(xb, yb, warmup + i, warmup + steps)
    sync(path.device)
    dt = time.perf_counter() - t0
    return {"images_per_s": images / dt, "images": images, "step_s": dt / steps, "data_wait": wait / dt,
            "warmup_s": warm_s}


# ----------------------------------------------------------------------------- modes
def header(args, device: torch.device) -> None:
    print(f"# vitsweep throughput | torch {torch.__version__} | {machine_name(torch.device('cpu'))} | "
          f"device {device} ({_device_name(device)})"
          f" | {load()}")
    if device.type == "cpu":
        print(f"# CPU native bf16 (AVX512-BF16/AMX): {cpu_has_fast_bf16()}")


def prepare(args) -> tuple[torch.device, dict]:
    """Device and composed config for one benchmark mode; prints the header."""
    device = select_device(args.device)
    cfg = compose(args)
    setup_device(device, cfg["trainer"])
    header(args, device)
    return device, cfg


def compile_setting(args, device: torch.device) -> bool:
    return device.type == "cuda" if args.compile == "auto" else args.compile == "on"


def throughput(args) -> dict:
    device, cfg = prepare(args)
    precision = resolve_precision(args.precision, device)
    compile_model = compile_setting(args, device)
    m = cfg["model"]
    sizes = ", ".join(f"{k} {m[k]}" for k in m if k != "_target_")
    print(f"model {args.model} ({m['_target_'].rsplit('.', 1)[-1]}: {sizes}) | batch {args.batch} | "
          f"data {cfg['dataset']['name']} | augment {cfg['dataset']['augment']} | AdamW lr {args.lr}")

    peaks = {name: matmul_peak(device, dt) for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
    tf32 = " (TF32 allowed)" if device.type == "cuda" else ""
    print("measured dense matmul peak: " + ", ".join(f"{k} {v:.1f} GFLOP/s at n={n}" + (tf32 if k == "fp32" else "")
                                                       for k, (v, n) in peaks.items()))

    results = {}
    reset_peak_rss()
    ours = VitsweepPath(cfg, precision, compile_model)
    print(f"data: {len(ours.data.y_train)} training images {tuple(ours.data.image_shape)}")
    xb, yb = next(iter(ours.loader))
    flops = flops_per_image(ours.model, xb, yb)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    r = time_path(ours, args.warmup + (2 if compile_model else 0), args.steps)
    r.update(rss=peak_rss_mib(), cuda=_cuda_peak_mib(device))
    results["vitsweep"] = r
    settings = (f"precision {precision}, compile {'on' if compile_model else 'off'}, channels_last "
                f"{'on' if ours.channels_last else 'off'}, AdamW {_adamw_kind(ours.optimizer)}")
    del ours
    gc.collect()

    reset = reset_peak_rss()  # the baseline's own peak, not the larger of both arms' (what vitsweep left is counted)
    data = build_data(cfg["dataset"], args.seed)  # host copies for the tutorial's PIL dataset
    base = BaselinePath(cfg, data, device, args.workers)
    base_flops = flops_per_image(base.model, xb.contiguous(), yb)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    r = time_path(base, args.warmup, args.steps)
    r.update(rss=peak_rss_mib(), cuda=_cuda_peak_mib(device), workers_mib=private_mib(base.worker_pids()),
             rss_reset=reset)
    results["baseline"] = r
    del base

    print(f"model FLOPs per image (forward + backward): vitsweep {flops / 1e9:.4f} GFLOP, "
          f"baseline {base_flops / 1e9:.4f} GFLOP | timed {args.steps} steps after {args.warmup} warm-up")
    for name, label in (("baseline", f"baseline (tutorial: DataLoader+PIL, {args.workers} workers, fp32 AdamW)"),
                        ("vitsweep", f"vitsweep ({settings})")):
        r = results[name]
        f = base_flops if name == "baseline" else flops
        gflops = f * r["images_per_s"] / 1e9
        mem = f"peak RSS {r['rss']:.0f} MiB"
        if name == "baseline" and not r["rss_reset"]:
            mem += " (the process's peak: both arms)"
        if name == "baseline" and args.workers and r["workers_mib"] is not None:
            mem += f" (+ workers' private memory {r['workers_mib']:.0f} MiB at the end)"
        if r["cuda"] is not None:
            mem += f", CUDA max allocated {r['cuda']:.0f} MiB"
        print(f"{label}: {r['images_per_s']:8.1f} images/s | {r['step_s'] * 1e3:7.1f} ms/step | "
              f"{gflops:6.1f} GFLOP/s = "
              f"{gflops / peaks['fp32'][0]:.0%} of fp32 peak, {gflops / peaks['bf16'][0]:.0%} of bf16 peak | "
              f"data wait {r['data_wait']:.1%} of step time | {mem}")
    ratio = results["vitsweep"]["images_per_s"] / results["baseline"]["images_per_s"]
    print(f"speed-up vitsweep / baseline: {ratio:.2f}x | {load()}")
    results["ratio"] = ratio
    return results


def check(args) -> dict:
    """Same init, same batches: the bf16 loss curve against fp32 over ``--check-steps`` steps."""
    device, cfg = prepare(args)
    curves = {}
    for precision in ("fp32", "bf16"):
        path = VitsweepPath(cfg, precision, compile_model=False)
        data = path.data
        it, losses, t0 = path.batches(), [], time.perf_counter()
        for i in range(args.check_steps):
            losses.append(path.step(*next(it), i, args.check_steps))
        curves[precision] = torch.stack(losses).float().cpu()  # one sync, after the loop
        print(f"{precision}: {args.check_steps} steps in {time.perf_counter() - t0:.1f} s")
    w = max(1, min(50, args.check_steps // 6))  # mean over a window: single-batch losses are noisy
    print(f"model {args.model} | data {cfg['dataset']['name']} {len(data.y_train)} | batch {args.batch} | "
          f"loss = mean over {w} steps ending at the step")
    print("  step    fp32    bf16   rel diff")
    for s in sorted({*range(w, args.check_steps + 1, max(w, args.check_steps // 6)), args.check_steps}):
        a, b = (curves[p][s - w:s].mean().item() for p in ("fp32", "bf16"))
        print(f"{s:6d} {a:7.4f} {b:7.4f} {abs(b - a) / a:9.2%}")
    a, b = (curves[p][-w:].mean().item() for p in ("fp32", "bf16"))
    rel = abs(b - a) / a
    print(f"final loss fp32 {a:.4f} bf16 {b:.4f}: relative difference {rel:.2%} "
          f"({'within' if rel <= 0.02 else 'OUTSIDE'} the 2% target) | {load()}")
    return {"fp32": a, "bf16": b, "rel": rel}


def scaling(args) -> dict:
    """Epoch time against n_train with a least-squares line and its R^2."""
    device = select_device(args.device)
    header(args, device)
    precision = resolve_precision(args.precision, device)
    compile_model = compile_setting(args, device)
    rows = []
    print(f"model {args.model} | batch {args.batch} | precision {precision} | "
          "one epoch per size, after 3 warm-up steps")
    print("  n_train  epoch_s  images/s")
    for n in args.sizes:
        cfg = compose(args, n_train=n)
        path = VitsweepPath(cfg, precision, compile_model)
        data = path.data
        steps = len(path.loader)
        it = iter(path.loader)
        for i in range(min(3, steps)):
            path.step(*next(it), i, steps)
        sync(device)
        t0 = time.perf_counter()
        for i, (xb, yb) in enumerate(path.loader):  # one full epoch
            path.step(xb, yb, i, steps)
        sync(device)
        dt = time.perf_counter() - t0
        rows.append((len(data.y_train), dt))
        print(f"{len(data.y_train):9d} {dt:8.2f} {steps * path.loader.batch_size / dt:9.1f}")
    x, y = np.array(rows, dtype=float).T
    slope, intercept = np.polyfit(x, y, 1)
    r2 = 1 - ((y - (slope * x + intercept)) ** 2).sum() / ((y - y.mean()) ** 2).sum()
    print(f"fit: epoch_s = {slope * 1e3:.3f} ms/image * n_train + {intercept:.2f} s | R^2 = {r2:.4f} "
          f"({'>=' if r2 >= 0.98 else '<'} 0.98) | {load()}")
    return {"rows": rows, "r2": r2}


def add_model_args(p: argparse.ArgumentParser) -> None:
    """The model and data arguments ``compose`` reads (shared with ``benchmarks/step_profile.py``)."""
    p.add_argument("--model", default="vit", help="any conf/model/NAME.yaml (vit, cnn, cnn_vgg, resnet18, hybrid_vit)")
    p.add_argument("--npz", help="CIFAR-10 .npz (x_train, y_train, ...); synthetic images when omitted")
    for key in VIT_KEYS:
        p.add_argument(f"--{key.replace('_', '-')}", type=int, help=f"ViT {key} (default: conf/model)")
    p.add_argument("--width", type=int, help="cnn width C1 (default: conf/model/cnn.yaml)")
    p.add_argument("--dropout", type=float, help="model dropout (default: conf/model)")
    p.add_argument("--augment",
                   help="none | flip_crop | resized_crop | translate (default: resized_crop for ViTs, else flip_crop)")
    p.add_argument("--batch", type=int, default=128)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--steps", type=int, default=10, help="timed steps per path")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per path (compiled paths add 2)")
    p.add_argument("--workers", type=int, default=2, help="baseline DataLoader workers (the PyTorch tutorial's 2)")
    p.add_argument("--precision", default="auto", help="vitsweep precision: auto | fp32 | bf16 | fp16")
    p.add_argument("--compile", default="auto", choices=("auto", "on", "off"), help="auto: on for CUDA")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, help="torch intra-op threads (trainer.num_threads; default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--synthetic-n", type=int, default=4096, help="synthetic training images")
    p.add_argument("--check", action="store_true", help="bf16 vs fp32 loss curves")
    p.add_argument("--check-steps", type=int, default=300)
    p.add_argument("--scaling", action="store_true", help="epoch time vs n_train with a linear fit")
    p.add_argument("--sizes", type=lambda s: [int(v) for v in s.split(",")],
                   default=[1000, 2000, 5000, 10000, 20000, 50000])
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.scaling:
        return scaling(args)
    if args.check:
        return check(args)
    return throughput(args)


if __name__ == "__main__":
    main()
