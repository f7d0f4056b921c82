"""Grid mode: one study grid through Hydra's basic launcher and through `hydra/launcher=vectorized`.

    python benchmarks/grid.py                                   # the CPU target: 36 cnn runs on MNIST
    python benchmarks/grid.py --grid model.width=1,2 label_noise=none,p10 seed=0,1 --epochs 3
    python benchmarks/grid.py --modes basic vectorized stacked  # stacked = stack=always

Each mode runs the same multirun (`python -m src.train -m ...`, progress bars off) in its own sweep dir
under ``--out``, one mode after the other. Printed per mode: wall time, summed training images/s (all
runs' training images / wall time), the ratio of wall times against the basic launcher, peak memory of the
whole process tree, sampled every 0.5 s (its summed resident sets, which count a page n processes share n times, and
PSS, which counts it once: the memory the tree takes), the largest difference of every run's
final test error and train loss from the basic launcher's run of the same config, and the efficiency: the
runs' own wall times spread over the workers (the ideal) against the grid's wall time, with the per-job and
pool overheads that make up the gap.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRID = ["model=cnn", "model.width=1,2,4,8", "label_noise=none,p10,p20", "seed=0,1,2"]
DATA = ["dataset=mnist", f"dataset.root={ROOT.parent / 'shared' / 'data' / 'mnist.npz'}", "dataset.n_train=4096"]
MODES = {"basic": [], "vectorized": ["hydra/launcher=vectorized"],
         "stacked": ["hydra/launcher=vectorized", "hydra.launcher.stack=always"]}


def tree_pids(root: int) -> set[int]:
    """``root`` and all its descendants (from /proc)."""
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(f"/proc/{entry.name}/stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, frontier = {root}, [root]
    while frontier:
        kids = [p for p, pp in parents.items() if pp in frontier and p not in tree]
        tree.update(kids)
        frontier = kids
    return tree


def tree_memory(root: int) -> dict[str, int]:
    """Bytes of ``root`` and all its descendants: ``rss``, the sum of their resident sets (a page shared by n processes,
    such as torch's in forked workers and the fork server, or a shared library's, counts n times), and ``pss``, the
    sum of their proportional sets (each such page counted once over the tree: the memory the tree takes)."""
    rss = pss = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for pid in tree_pids(root):
        try:
            rss += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
            pss += next(int(line.split()[1]) for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
                        if line.startswith("Pss:")) * 1024
        except (OSError, IndexError, ValueError, StopIteration):
            continue
    return {"rss": rss, "pss": pss}


def run_mode(name: str, args: argparse.Namespace) -> dict:
    out = Path(args.out) / name
    cmd = [sys.executable, "-m", "src.train", "-m", *args.grid, *args.data, f"trainer.max_epochs={args.epochs}",
           "trainer.progress=false", f"trainer.device={args.device}", "trainer.checkpoint=false",
           f"hydra.sweep.dir={out}", *MODES[name], *args.extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    start, peaks = time.perf_counter(), [{"rss": 0, "pss": 0}]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log: list[str] = []
    reader = threading.Thread(target=lambda: log.extend(proc.stdout), daemon=True)
    reader.start()

    def sample() -> None:  # every 0.5 s: scanning /proc costs CPU the grid would otherwise use
        while proc.poll() is None:
            peaks.append(tree_memory(proc.pid))
            time.sleep(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    proc.wait()  # the wall ends at the exit (a poll between sleeps added up to 0.5 s to it, 0.25 s on average)
    wall = time.perf_counter() - start
    reader.join()
    sampler.join()
    peak, peak_pss = max(m["rss"] for m in peaks), max(m["pss"] for m in peaks)
    if proc.returncode:
        sys.exit(f"{name}: exit {proc.returncode}\n{''.join(log[-40:])}")
    runs, by_job, images = read_runs(out, args.batch)
    jobs = launcher_jobs(log, by_job)
    gpu = max((s.get("peak_gpu_mem_gib", 0.0) for s in runs.values()), default=0.0)
    per_run = sorted(s["train_images_per_s"] for s in runs.values())
    workers = max(1, len({w for _, w in jobs})) if jobs else 1
    return {"name": name, "wall": wall, "runs": runs, "images_per_s": images / wall, "peak": peak,
            "peak_pss": peak_pss, "gpu": gpu,
            "run_images_per_s": per_run[len(per_run) // 2], "jobs": jobs, "workers": workers,
            "run_s": own_seconds(runs.values())}


def run_batch(run_dir: Path, default: int) -> int:
    """``trainer.batch_size`` of one run, from the config Hydra saved in its run dir (``default`` where unreadable)."""
    import yaml

    try:
        return int(yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())["trainer"]["batch_size"])
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
        return default


def read_runs(out: Path, default_batch: int) -> tuple[dict, dict, int]:
    """The finished runs of a sweep dir, by their overrides and by their job number (a sweep's run dir is named by it),
    and the training images they took: each run's steps at its own batch (the train loader drops a last partial
    batch, so a step is a whole batch)."""
    runs, by_job, images = {}, {}, 0
    for d in sorted(out.iterdir()):
        if (d / "summary.json").is_file():
            s = json.loads((d / "summary.json").read_text())
            key = (d / ".hydra" / "overrides.yaml").read_text()
            runs[key] = by_job[d.name] = s
            images += s["steps"] * run_batch(d, default_batch)
    return runs, by_job, images


def share(summary: dict) -> float:
    """A run's share of the time its summary reports: a stacked member's ``wall_s`` (and its job's time) is its
    whole group's, shared with ``stacked_members - 1`` others (stacking is on CUDA by default, anywhere with
    ``stack=always``), so summing members' times counted each group once per member (2026-11-28, an H200:
    "efficiency 331%"). Exact where a group's members end together, as in this benchmark's fixed epoch budget;
    under a stop rule a member's ``wall_s`` ends at its own stop, so the shares sum to the members' mean time, not
    the group's longest, and a group the launcher cut into parts run one after another times each later part's
    jobs from the group's start: there the ideal reads low and the busiest worker high."""
    return 1.0 / max(1, int(summary.get("stacked_members") or 1))


def own_seconds(summaries) -> float:
    """The runs' own time (training, evaluations, checkpoints after set-up), a stacked group counted once."""
    return sum(s["wall_s"] * share(s) for s in summaries)


def launcher_jobs(log: list[str], by_job: dict[str, dict]) -> list[tuple[float, int]]:
    """(seconds, worker) per finished job from the launcher's own line, "[k/n] #idx objective ... in 3.2 s (worker
    1) ...", a stacked member's seconds by its share of its group."""
    jobs = []
    for line in log:
        if m := re.search(r"\] #(\d+) .* in ([\d.]+) s \(worker (-?\d+)\)", line):
            summary = by_job.get(m.group(1), {})
            jobs.append((float(m.group(2)) * share(summary), int(m.group(3))))
    return jobs


def efficiency(r: dict) -> str:
    """The grid's wall time against the ideal: its runs' own wall times (``summary.json``'s ``wall_s``: the
    training, evaluations and checkpoints of a run, after its set-up) spread evenly over the workers; and where
    the rest goes: per-job overhead (the launcher's time for a job beyond the run's own: Hydra's job set-up,
    data and model set-up, the precision probe) and the pool's (start-up, imports, the uneven tail)."""
    ideal = r["run_s"] / r["workers"]
    text = (f"ideal {ideal:.1f} s = runs' own {r['run_s']:.1f} s over {r['workers']} worker(s) | "
            f"efficiency {ideal / r['wall']:.0%}")
    if r["jobs"]:
        job_s = sum(s for s, _ in r["jobs"])
        busiest = max(sum(s for s, w in r["jobs"] if w == k) for k in {w for _, w in r["jobs"]})
        text += (f" | per-job overhead {(job_s - r['run_s']) / len(r['jobs']):.2f} s/job | "
                 f"busiest worker {busiest:.1f} s, the rest of the wall {r['wall'] - busiest:.1f} s "
                 "(launch, start-up, tail)")
    return text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", nargs="+", default=GRID, help="sweep overrides (the grid)")
    p.add_argument("--data", nargs="+", default=DATA, help="dataset overrides")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=128,
                   help="trainer.batch_size for images/s where a run dir holds no .hydra/config.yaml")
    p.add_argument("--modes", nargs="+", default=["basic", "vectorized"], choices=list(MODES))
    p.add_argument("--extra", nargs="*", default=[], help="more overrides for every mode")
    p.add_argument("--device", default="cpu", help="trainer.device of every run (cpu, cuda)")
    p.add_argument("--out", default=str(ROOT / "outputs" / "bench_grid"))
    args = p.parse_args()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(f"{cpu}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start")
    print(f"grid: {' '.join(args.grid)} | {' '.join(args.data)} | {args.epochs} epochs {' '.join(args.extra)}")
    results = [run_mode(m, args) for m in args.modes]
    base = results[0]
    for r in results:
        diffs = [max(abs(s["test_error"] - base["runs"][k]["test_error"]),
                     abs(s["train_loss"] - base["runs"][k]["train_loss"])) for k, s in r["runs"].items()]
        print(f"{r['name']:>10}: {len(r['runs'])} runs in {r['wall']:7.1f} s | {r['images_per_s']:8.0f} train images/s"
              f" | {base['wall'] / r['wall']:5.2f}x {base['name']} | peak RSS {r['peak'] / 2**30:5.2f} GiB"
              f" (PSS {r['peak_pss'] / 2**30:5.2f} GiB)"
              f" | max |diff| vs {base['name']} (test error, train loss) {max(diffs):.2e}")
        print(f"{'':>10}  {efficiency(r)}")
        print(f"{'':>10}  median train images/s of one run (a stacked member's own) {r['run_images_per_s']:8.0f}"
              + (f" | peak GPU memory of one process {r['gpu']:.2f} GiB" if r["gpu"] else ""))
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
