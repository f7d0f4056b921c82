"""Load on the sweeper's claim path: many trivial trials (each sleeps 0.1 s) pulled by several workers.

    python benchmarks/claim_load.py                       # SQLite x4, journal file x4, PostgreSQL x8
    python benchmarks/claim_load.py --only sqlite --trials 50
    VITSWEEP_TEST_POSTGRES_URL=postgresql+psycopg://user@host/db python benchmarks/claim_load.py

Each case runs the real sweeper (tests/sweeper_app, random sampler, Hydra's basic launcher) end to end
and checks the study: exactly N trials finished, trial numbers unique and 0..N-1, one run dir per
trial, no lock error in any worker log. It prints one markdown row per case (the README's table).
PostgreSQL is skipped when no URL is given (`source .ci/postgres.sh && start_postgres` starts one).
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import optuna
from optuna.trial import TrialState

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from hydra_plugins.vitsweep_sweeper.storage import open_storage, safe  # noqa: E402

APP = ROOT / "tests" / "sweeper_app" / "app.py"
LOCK_ERRORS = re.compile(r"database is locked|deadlock|LockNotAvailable|lock timeout|OperationalError", re.I)


def run_case(kind: str, url: str, workers: int, n_trials: int, sleep_s: float, out: Path) -> dict:
    name = f"load-{kind}-{uuid.uuid4().hex[:6]}"
    cmd = [sys.executable, str(APP), "-m", f"hydra.sweep.dir={out}", "x=interval(-1,1)", "y=interval(-1,1)",
           f"sleep_s={sleep_s}", "epochs=1", "hydra/sweeper/sampler=random", f"hydra.sweeper.n_trials={n_trials}",
           f"hydra.sweeper.n_workers={workers}", f"hydra.sweeper.storage='{url}'", f"hydra.sweeper.study_name={name}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=out, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    logs = proc.stdout + proc.stderr + "".join(p.read_text() for p in (out / "workers").glob("*.log"))
    study = optuna.load_study(study_name=name, storage=open_storage(url, existing=True))
    trials = study.get_trials(deepcopy=False)
    numbers = [t.number for t in trials]
    return {
        "storage": kind, "url": safe(url), "workers": workers, "wall_s": wall, "exit": proc.returncode,
        "finished": sum(t.state == TrialState.COMPLETE for t in trials), "trials": len(trials),
        "unique": len(set(numbers)) == len(numbers) and sorted(numbers) == list(range(len(numbers))),
        "run_dirs": sum(1 for p in out.iterdir() if p.name.isdigit()),
        "lock_errors": len(LOCK_ERRORS.findall(logs)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--sleep-s", type=float, default=0.1, help="seconds each trivial trial sleeps")
    ap.add_argument("--only", choices=["sqlite", "journal", "postgres"], action="append")
    ap.add_argument("--postgres-url", default=os.environ.get("VITSWEEP_TEST_POSTGRES_URL"))
    args = ap.parse_args()
    cases = [("sqlite", 4), ("journal", 4), ("postgres", 8)]
    print(f"{args.trials} trials of {args.sleep_s} s each; CPU: {_cpu()}, {os.cpu_count()} cores")
    print("| storage | workers | wall s | trials/s | finished | numbers unique | run dirs | lock errors |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    ok = True
    for kind, workers in cases:
        if args.only and kind not in args.only:
            continue
        with tempfile.TemporaryDirectory(prefix=f"claim-{kind}-") as tmp:
            out = Path(tmp)
            url = {"sqlite": f"sqlite:///{out}/optuna.db", "journal": f"journal://{out}/optuna.log",
                   "postgres": args.postgres_url}[kind]
            if url is None:
                print(f"| postgres | {workers} | skipped: no --postgres-url or VITSWEEP_TEST_POSTGRES_URL | | | | | |")
                continue
            r = run_case(kind, url, workers, args.trials, args.sleep_s, out)
        good = r["exit"] == 0 and r["finished"] == r["trials"] == args.trials and r["unique"] and not r["lock_errors"]
        ok &= good
        print(f"| {kind} | {workers} | {r['wall_s']:.1f} | {args.trials / r['wall_s']:.2f} | {r['finished']} | "
              f"{'yes' if r['unique'] else 'NO'} | {r['run_dirs']} | {r['lock_errors']} |", flush=True)
    return 0 if ok else 1


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
