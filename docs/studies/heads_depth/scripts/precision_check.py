"""The precision check of heads_depth: the test declared in ``sweeps/scales/heads_depth/cpu_precision.yaml`` before
any of its runs, on the runs of that scale.

    python docs/studies/heads_depth/scripts/precision_check.py docs/studies/heads_depth/records/precision \
        docs/studies/heads_depth/analysis/precision_check.md --main docs/studies/heads_depth/records/main

Why: the main run's ``trainer.precision=auto`` took bf16 for 23 of 24 h1_d1 runs and fp32 for 21 of 24 h4_d1 runs,
so its "4 heads help" compared precisions as well as head counts. The check trains h1_d1 and h4_d1 at both precisions,
n_train 1024 and 2048, seeds 0-3, on one machine, and tests:

1. the precision effect: test error at bf16 minus at fp32, paired by (arch, n_train, seed); the mean over the 16
   pairs with a 95% t-interval, and per arch;
2. the heads ordering within one precision: mean test error of h1_d1 minus h4_d1, averaged over the two sizes, with a
   95% Welch interval (and per size).

Verdict rule (declared): "4 heads help" stands, unconfounded, when at each precision h4_d1 is below h1_d1 (2's interval
above 0); it is "confounded with precision" when the ordering is not resolved at a precision while 1's interval
excludes 0; otherwise it is not resolved at that precision, with no sign of a precision effect.
With ``--main``, the main run's gaps at the same cells are printed beside it (observations, not the test).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from analysis import load_runs, to_markdown

sys.path.insert(0, str(Path(__file__).resolve().parent))
from orderings import arch_of  # noqa: E402  the study's architecture names, as its orderings read them

ARCHS = ("h1_d1", "h4_d1")
PRECISIONS = ("bf16", "fp32")
SIZES = (1024, 2048)
SEEDS = (0, 1, 2, 3)


def read(path: str) -> pd.DataFrame:
    """The check's completed runs, one per (arch, precision, n_train, seed); refuses a run whose summary's precision
    is not the one its config pinned, or a cell given twice."""
    runs = load_runs([path])
    runs = runs[runs["status"] == "completed"].copy()
    runs["arch"] = runs.apply(arch_of, axis=1)
    pinned = runs["trainer.precision"].astype(str)
    if (pinned != runs["precision"].astype(str)).any():
        raise SystemExit("precision_check: a run trained at another precision than its config pinned")
    runs["prec"] = pinned
    keys = ["arch", "prec", "dataset.n_train", "seed"]
    if runs.duplicated(keys).any():
        raise SystemExit(f"precision_check: a cell is given twice: {runs[runs.duplicated(keys)][keys].values.tolist()}")
    design = {(a, p, n, s) for a in ARCHS for p in PRECISIONS for n in SIZES for s in SEEDS}
    outside = sorted(set(map(tuple, runs[keys].values.tolist())) - design)
    if outside:
        raise SystemExit(f"precision_check: runs outside the declared design (arch, precision, n_train, seed): "
                         f"{outside}")
    if "machines" in runs:
        machines = {tuple(m) for m in runs["machines"].dropna()}
        if len(machines) > 1 or any(len(m) > 1 for m in machines):
            raise SystemExit(f"precision_check: the check was declared on one machine; these runs trained on "
                             f"{machines}")
    return runs


def t_interval(values: np.ndarray) -> tuple[float, float, float, float]:
    """Mean, its 95% t-interval and the sd of ``values``."""
    m, sd = float(values.mean()), float(values.std(ddof=1))
    half = float(stats.t.ppf(0.975, len(values) - 1)) * sd / np.sqrt(len(values))
    return m, m - half, m + half, sd


def welch_over_sizes(a: list[np.ndarray], b: list[np.ndarray]) -> tuple[float, float, float, float]:
    """The mean over sizes of (mean a - mean b), its 95% Welch interval (Satterthwaite's dof) and the dof."""
    n = len(a)
    est = float(np.mean([x.mean() - y.mean() for x, y in zip(a, b, strict=True)]))
    terms = [v.var(ddof=1) / len(v) / n**2 for pair in zip(a, b, strict=True) for v in pair]
    sizes = [len(v) for pair in zip(a, b, strict=True) for v in pair]
    var = sum(terms)
    dof = var**2 / sum(t**2 / (k - 1) for t, k in zip(terms, sizes, strict=True))
    half = float(stats.t.ppf(0.975, dof)) * np.sqrt(var)
    return est, est - half, est + half, dof


def errors(runs: pd.DataFrame, arch: str, prec: str | None, n: int) -> np.ndarray:
    sel = (runs["arch"] == arch) & (runs["dataset.n_train"] == n)
    if prec is not None:
        sel &= runs["prec"] == prec
    return runs.loc[sel].sort_values("seed")["test_error"].to_numpy(float)


def fmt(m: float, lo: float, hi: float) -> str:
    return f"{100 * m:+.2f} [{100 * lo:+.2f}, {100 * hi:+.2f}]"


def report(runs: pd.DataFrame, main: pd.DataFrame | None) -> str:
    expected = len(ARCHS) * len(PRECISIONS) * len(SIZES) * len(SEEDS)
    lines = ["# heads_depth: the precision check", "",
             "The test declared in `sweeps/scales/heads_depth/cpu_precision.yaml` before its runs; output of "
             "`docs/studies/heads_depth/scripts/precision_check.py`. Test errors in percentage points.", ""]
    machines = sorted({m for ms in runs.get("machines", pd.Series(dtype=object)).dropna() for m in ms})
    wall = runs["wall_s"].sum() / 60
    lines += [f"Runs: {len(runs)} of {expected} completed; {wall:.0f} min of run wall time"
              + (f"; trained on: {', '.join(machines)}" if machines else "") + ".", ""]
    if len(runs) < expected:
        lines += [f"**Not yet tested**: {expected - len(runs)} runs missing.", ""]
        return "\n".join(lines) + "\n"

    cells = []
    for arch in ARCHS:
        for prec in PRECISIONS:
            for n in SIZES:
                e = errors(runs, arch, prec, n)
                cells.append({"arch": arch, "precision": prec, "n_train": n, "seeds": len(e),
                              "test error mean": round(100 * e.mean(), 2), "sd": round(100 * e.std(ddof=1), 2)})
    lines += ["## Test error per cell", "", to_markdown(pd.DataFrame(cells)), ""]

    # 1. the precision effect, paired by (arch, n_train, seed)
    rows, every = [], []
    for arch in ARCHS:
        d = np.concatenate([errors(runs, arch, "bf16", n) - errors(runs, arch, "fp32", n) for n in SIZES])
        every.append(d)
        m, lo, hi, sd = t_interval(d)
        rows.append({"pairs": f"{arch} ({len(d)})", "bf16 - fp32": fmt(m, lo, hi), "sd": f"{100 * sd:.2f}"})
    d = np.concatenate(every)
    pm, plo, phi, psd = t_interval(d)
    rows.append({"pairs": f"all ({len(d)})", "bf16 - fp32": fmt(pm, plo, phi), "sd": f"{100 * psd:.2f}"})
    lines += ["## 1. The precision effect (bf16 minus fp32, paired by arch, n_train and seed; 95% t-interval)", "",
              to_markdown(pd.DataFrame(rows)), ""]

    # 2. the heads ordering within one precision
    rows, held = [], {}
    for prec in PRECISIONS:
        a = [errors(runs, "h1_d1", prec, n) for n in SIZES]
        b = [errors(runs, "h4_d1", prec, n) for n in SIZES]
        m, lo, hi, dof = welch_over_sizes(a, b)
        held[prec] = lo > 0
        per = []
        for n, x, y in zip(SIZES, a, b, strict=True):
            ci = stats.ttest_ind(x, y, equal_var=False).confidence_interval(0.95)
            per.append(f"n {n}: {fmt(x.mean() - y.mean(), ci.low, ci.high)}")
        rows.append({"precision": prec, "h1_d1 - h4_d1, mean over sizes": fmt(m, lo, hi), "Welch dof": f"{dof:.1f}",
                     "per size": "; ".join(per), "4 heads below 1": "resolved" if lo > 0 else "not resolved"})
    lines += ["## 2. The heads ordering within one precision (h1_d1 minus h4_d1; 95% Welch intervals)", "",
              to_markdown(pd.DataFrame(rows)), ""]

    effect = plo > 0 or phi < 0
    if all(held.values()):
        verdict = ("**stands, unconfounded**: at each precision h4_d1 is below h1_d1 (both intervals above 0)")
    elif effect:
        verdict = ("**confounded with precision**: the ordering is not resolved at "
                   + ", ".join(p for p, h in held.items() if not h) + " while the precision effect's interval "
                   "excludes 0")
    else:
        verdict = ("**not resolved at " + ", ".join(p for p, h in held.items() if not h) + "**, with no sign of a "
                   "precision effect (its interval includes 0)")
    lines += ["## Verdict (the declared rule)", "", f"The main run's \"4 heads help\" {verdict}.", ""]

    if main is not None:
        def cell(arch: str, n: int) -> tuple[float, str]:
            c = main[(main["arch"] == arch) & (main["dataset.n_train"] == n)]
            counts = ", ".join(f"{k} {v}" for k, v in c["precision"].value_counts().items())
            return float(c["test_error"].mean()), f"{100 * c['test_error'].mean():.2f} ({counts})"

        rows = []
        for n in SIZES:
            (ea, a), (eb, b) = cell("h1_d1", n), cell("h4_d1", n)
            rows.append({"n_train": n, "h1_d1 (precisions)": a, "h4_d1 (precisions)": b,
                         "gap": f"{100 * (ea - eb):+.2f}"})
        lines += ["## Beside it: the main run's gap at these cells (observations, another machine: the Zen 4)", "",
                  to_markdown(pd.DataFrame(rows)), ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records")
    ap.add_argument("out")
    ap.add_argument("--main", default=None, help="the main run's records, for its gaps at the same cells")
    a = ap.parse_args(argv)
    runs = read(a.records)
    main_runs = None
    if a.main:
        main_runs = load_runs([a.main])
        main_runs = main_runs[main_runs["status"] == "completed"].copy()
        main_runs = main_runs[main_runs["model._target_"].astype(str).str.endswith("ViT")]
        main_runs["arch"] = main_runs.apply(arch_of, axis=1)
    text = report(runs, main_runs)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
