"""Where a training step's time goes: one model through vitsweep's trainer path, profiled.

    python benchmarks/step_profile.py                                   # the default ViT (conf/model/vit.yaml)
    python benchmarks/step_profile.py --model cnn --width 4 --npz ../shared/data/cifar10.npz
    python benchmarks/step_profile.py --override model.attention=math   # any Hydra override of the config
    python benchmarks/step_profile.py --model cnn --width 4 --override +sweeps=double_descent_cnn \
        --override dataset.root=../shared/data/mnist.npz --override dataset.n_train=2048   # a study's run
    python benchmarks/step_profile.py --out docs/benchmarks/profile     # also writes <out>/<model>_<device>.md

The model, data, optimizer and step are the trainer's own (``benchmarks/throughput.py``'s ``VitsweepPath``,
built by ``src.run_setup.setup``). Printed, in this order and in one run:
- the machine: CPU model and flags (or the GPU), torch, threads, load average;
- the dense matmul peak measured now, fp32 and bf16 (``throughput.matmul_peak``);
- images/s over ``--steps`` timed steps (no profiler attached), model FLOPs per image (forward + backward,
  ``FlopCounterMode``) and the achieved GFLOP/s as a share of both peaks;
- a ``torch.profiler`` run of ``--profile-steps`` steps: the top ops by self time (CPU time on CPU, device
  time on CUDA) and the time shares grouped as matmul, attention, elementwise and norm, optimizer, data, other.
  An op's group is its enclosing scope first (``Optimizer.step``, the loop's ``data`` scope), then its name;
- where the gap to the bf16 peak goes: the ceiling the FLOP-doing ops alone allow (``flop_op_ceiling``),
  so a gap the other groups cannot close (small matmuls on a CPU whose bf16 matmul is very fast) shows as such.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if __name__ == "__main__":  # the same glibc malloc settings as `python -m src.train` (see src/malloc.py)
    from src.malloc import restart_with_lean_malloc

    restart_with_lean_malloc()

import torch  # noqa: E402

from benchmarks.throughput import VitsweepPath, flops_per_image, load, matmul_peak, sync, time_path  # noqa: E402
from src.device_setup import setup_device  # noqa: E402
from src.validate import resolve_precision, select_device  # noqa: E402

GROUPS = ("matmul", "attention", "elementwise and norm", "optimizer", "data", "other")
# op name -> group, first match wins (names as the profiler shows them: aten ops, mkldnn/cuDNN/cuBLAS kernels)
_RULES = (
    ("attention", r"scaled_dot_product|flash|attention|efficient_attention|softmax|fmha"),
    ("matmul", r"aten::(mm|addmm|bmm|baddbmm|matmul|linear|conv|_convolution|mkldnn_conv|mkldnn_linear|"
               r"_mkldnn|convolution)|gemm|cublas|cutlass|sm\d+_xmma|cudnn|conv|wgrad|dgrad|mkldnn_matmul"),
    ("optimizer", r"adam|_foreach|sgd|lerp|addcdiv|addcmul"),
    ("elementwise and norm", r"aten::|elementwise|vectorized|reduce|norm|gelu|relu|dropout|copy|cast|fill|"
                             r"cat|add|mul|where|bernoulli|random|index|gather|scatter|arange|cross_entropy|"
                             r"nll|log_softmax|kernel"),
)


def group_of(name: str, scopes: tuple[str, ...]) -> str:
    """The group of one profiled op: its enclosing scope (optimizer step, data) first, then its name."""
    if any(s.startswith("Optimizer.step") or s.startswith("Optimizer.zero_grad") for s in scopes):
        return "optimizer"
    if "data" in scopes:
        return "data"
    lower = name.lower()
    for group, pattern in _RULES:
        if re.search(pattern, lower):
            return group
    return "other"


# the attention group's ops that do FLOPs (the fused SDPA kernels, which FlopCounterMode counts); its other ops
# (softmax, on the explicit path) are element-wise
FUSED_ATTENTION = r"scaled_dot_product|flash|efficient_attention|fmha|cudnn_attention"


def flop_op_ceiling(flops_per_image: float, batch: float, per_op: dict[tuple[str, str], list], steps: int,
                    peak_gflops: float) -> dict[str, float]:
    """The step's ceiling if every op but the FLOP-doing ones took no time: the matmul group and the fused
    attention kernels (``FUSED_ATTENTION``; not the softmax of the explicit path, which is element-wise work).

    ``per_op`` is :func:`tally`'s [calls, microseconds] per (op name, group) over ``steps`` profiled steps. Returns
    the FLOP ops' ms per step, the images/s they alone allow, and the GFLOP/s they run the model's FLOPs at with
    its share of ``peak_gflops``: what the matmul library reaches at this model's shapes. When that share is near
    or below a target, removing element-wise work cannot reach the target; only larger matmuls or a faster
    library can.
    """
    us = sum(t for (name, group), (_, t) in per_op.items()
             if group == "matmul" or (group == "attention" and re.search(FUSED_ATTENTION, name.lower())))
    ms = us / 1e3 / steps
    images_per_s = batch / (ms / 1e3) if ms > 0 else float("inf")
    gflops = flops_per_image * images_per_s / 1e9
    return {"ms_per_step": ms, "images_per_s": images_per_s, "gflops": gflops, "share_of_peak": gflops / peak_gflops}


def machine() -> str:
    """The CPU as lscpu names it, with its family/model and the bf16 flags, or the GPU."""
    cpu = "unknown CPU"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        flags = fields.get("Flags", "").split()
        bf16 = [f for f in flags if f in ("avx512_bf16", "amx_bf16", "avx512f", "avx2")]
        cpu = (f"{fields.get('Model name', cpu)} (family {fields.get('CPU family', '?')} model "
               f"{fields.get('Model', '?')}, {fields.get('CPU(s)', '?')} CPUs, {' '.join(bf16) or 'no avx512'})")
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return cpu


def profile_steps(path: VitsweepPath, steps: int, device: torch.device) -> tuple[list, float]:
    """Profile ``steps`` training steps (after the timing's warm-up); returns (events, wall seconds)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    it = path.batches()
    path.step(*next(it), 0, steps + 1)
    sync(device)
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for i in range(steps):
            with record_function("data"):
                xb, yb = next(it)
            path.step(xb, yb, i + 1, steps + 1)
        sync(device)
        wall = time.perf_counter() - t0
    return prof.events(), wall


def _scopes(event) -> tuple[str, ...]:
    names, parent = [], event.cpu_parent
    while parent is not None:
        names.append(parent.name)
        parent = parent.cpu_parent
    return tuple(names)


def tally(events, device: torch.device) -> tuple[dict[tuple[str, str], list], dict[str, float], float]:
    """Self time per (op name, group) as [calls, microseconds] and per group, in the device's time.

    On CUDA a kernel appears twice in the events: in its launching op's kernel list (the op's self device time) and
    as an event of its own, with no CPU parent. Each kernel is counted once, under its launching op (which knows its
    scope: optimizer step, data); device time no op claims (a kernel whose link the trace lacks) is one row of
    ``other``. The GPU spans of ``record_function`` scopes are not kernels and are not counted."""
    per_op: dict[tuple[str, str], list] = defaultdict(lambda: [0, 0.0])
    groups: dict[str, float] = dict.fromkeys(GROUPS, 0.0)
    cuda = device.type == "cuda"
    kernels_us = claimed_us = 0.0
    for e in events:
        if cuda and getattr(e.device_type, "name", "CPU") != "CPU":  # a kernel, memcpy or a scope's GPU span
            if not getattr(e, "is_user_annotation", False) and not e.name.startswith(("data", "Optimizer.",
                                                                                       "ProfilerStep")):
                kernels_us += e.time_range.elapsed_us()
            continue
        t = sum(k.duration for k in e.kernels) if cuda else e.self_cpu_time_total
        if not t or e.name in ("data",) or e.name.startswith(("Optimizer.", "ProfilerStep")):
            continue
        claimed_us += t if cuda else 0.0
        g = group_of(e.name, _scopes(e))
        row = per_op[e.name, g]
        row[0] += 1
        row[1] += t
        groups[g] += t
    if cuda and kernels_us - claimed_us > 0.5:
        row = per_op["(device time of kernels no op launched)", "other"]
        row[0] += 1
        row[1] += kernels_us - claimed_us
        groups["other"] += kernels_us - claimed_us
    return per_op, groups, sum(groups.values())


def report(args) -> str:
    from benchmarks.throughput import compose

    device = select_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = compose(args)
    setup_device(device, cfg["trainer"])  # the run's settings (TF32 on CUDA) before the peaks, as throughput.py does
    precision = resolve_precision(args.precision, device)
    compile_model = device.type == "cuda" if args.compile == "auto" else args.compile == "on"
    if args.fallback_random:
        from torch._inductor import config as inductor_config

        inductor_config.fallback_random = True
    lines = []

    def out(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    dev = torch.cuda.get_device_name(device) if device.type == "cuda" else machine()
    out(f"# Profile: `{args.model}` on {device.type}")
    out()
    out(f"- machine: {dev}; torch {torch.__version__}, {torch.get_num_threads()} threads; {load()} at start")
    peaks = {name: matmul_peak(device, dt) for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
    tf32 = " (TF32 allowed)" if device.type == "cuda" else ""
    out("- dense matmul peak measured in this run: " + ", ".join(
        f"{k} {v:.1f} GFLOP/s (n={n}){tf32 if k == 'fp32' else ''}" for k, (v, n) in peaks.items()))
    path = VitsweepPath(cfg, precision, compile_model)
    m = cfg["model"]
    sizes = ", ".join(f"{k} {m[k]}" for k in m if k != "_target_")
    out(f"- model `{args.model}` ({m['_target_'].rsplit('.', 1)[-1]}: {sizes}); batch {cfg['trainer']['batch_size']}; "
        f"data {cfg['dataset']['name']} {tuple(path.data.image_shape)}, augment {cfg['dataset']['augment']}; "
        f"{type(path.optimizer).__name__} lr {args.lr}; precision {precision}, compile "
        f"{'on' if compile_model else 'off'}{' (fallback_random)' if args.fallback_random else ''}")
    if "attention" in getattr(path, "info", {}):
        why = path.info.get("attention_reason", "set in the config")
        out(f"- attention path: **{path.info['attention']}** ({why})")
    xb, yb = next(iter(path.loader))
    flops = flops_per_image(path.model, xb, yb)
    r = time_path(path, args.warmup + (2 if compile_model else 0), args.steps)
    gflops = flops * r["images_per_s"] / 1e9
    out(f"- **{r['images_per_s']:.1f} images/s** ({r['step_s'] * 1e3:.1f} ms/step over {args.steps} steps, "
        f"no profiler); {flops / 1e9:.4f} GFLOP per image (forward + backward); **{gflops:.1f} GFLOP/s = "
        f"{gflops / peaks['fp32'][0]:.0%} of the fp32 peak, {gflops / peaks['bf16'][0]:.0%} of the bf16 peak**; "
        f"data wait {r['data_wait']:.1%}")
    events, wall = profile_steps(path, args.profile_steps, device)
    per_op, groups, total = tally(events, device)
    unit = "device" if device.type == "cuda" else "CPU"
    out(f"- profiled {args.profile_steps} steps: {wall * 1e3 / args.profile_steps:.1f} ms/step wall with the "
        f"profiler, self {unit} time {total / 1e3 / args.profile_steps:.1f} ms/step")
    out()
    out(f"| group | self {unit} ms/step | share |")
    out("|---|---|---|")
    for g in GROUPS:
        out(f"| {g} | {groups[g] / 1e3 / args.profile_steps:.2f} | {groups[g] / max(total, 1e-9):.1%} |")
    out()
    c = flop_op_ceiling(flops, r["images"] / args.steps, per_op, args.profile_steps, peaks["bf16"][0])
    out(f"- **where the gap to the bf16 peak goes**: the ops that do the FLOPs (matmuls, and fused attention "
        f"kernels where SDPA runs) take {c['ms_per_step']:.1f} ms/step (profiled), running the model's FLOPs at "
        f"{c['gflops']:.0f} GFLOP/s = **{c['share_of_peak']:.0%} of the bf16 peak**: the step's ceiling at this "
        f"model's shapes, reached only if every other op took no time ({c['images_per_s']:.0f} images/s); the "
        f"rest of the gap is the other ops' time")
    out()
    out(f"| top op (self {unit} time) | group | calls/step | ms/step | share |")
    out("|---|---|---|---|---|")
    for (name, g), (calls, t) in sorted(per_op.items(), key=lambda kv: -kv[1][1])[:args.top]:
        out(f"| `{name[:70]}` | {g} | {calls / args.profile_steps:.0f} | {t / 1e3 / args.profile_steps:.2f} | "
            f"{t / max(total, 1e-9):.1%} |")
    out()
    out(f"{load()} at the end")
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    from benchmarks.throughput import add_model_args

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--override", action="append", default=[], metavar="OVERRIDE",
                   help="a Hydra override for the composition, e.g. model.attention=math, +sweeps=double_descent_cnn "
                        "(repeatable; naming dataset= replaces the synthetic/--npz data)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--steps", type=int, default=10, help="timed steps (no profiler)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--precision", default="auto")
    p.add_argument("--compile", default="off", choices=("auto", "on", "off"),
                   help="off by default: a compiled step's ops are inductor kernels the groups cannot name")
    p.add_argument("--fallback-random", action="store_true",
                   help="compiled: draw random numbers with aten's ops, not inductor's per-element Philox "
                        "(torch._inductor.config.fallback_random; docs/benchmarks/README.md)")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--synthetic-n", type=int, default=2048)
    p.add_argument("--out", help="folder: also write the report to <out>/<model>_<device>[_<tag>].md")
    p.add_argument("--tag", default="", help="suffix of the report's file name")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    text = report(args)
    if args.out:
        device = select_device(args.device).type
        name = f"{args.model}_{device}{'_' + args.tag if args.tag else ''}.md"
        (Path(args.out) / name).parent.mkdir(parents=True, exist_ok=True)
        (Path(args.out) / name).write_text(text)
        print(f"written: {Path(args.out) / name}")


if __name__ == "__main__":
    main()
