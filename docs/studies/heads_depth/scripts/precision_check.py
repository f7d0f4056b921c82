"""The precision check of heads_depth: the test declared in ``sweeps/scales/heads_depth/cpu_precision.yaml`` before
any of its runs, on the runs of that scale.

    python docs/studies/heads_depth/scripts/precision_check.py docs/studies/heads_depth/records/precision \
        docs/studies/heads_depth/analysis/precision_check.md --main docs/studies/heads_depth/records/main

Why: the main run's ``trainer.precision=auto`` took bf16 for 23 of 24 h1_d1 runs and fp32 for 21 of 24 h4_d1 runs,
so its "4 heads help" compared precisions as well as head counts. The check trains h1_d1 and h4_d1 at both precisions,
n_train 1024 and 2048, seeds 0-3, on one machine, and tests:

1. the precision effect: test error at bf16 minus at fp32, paired by (arch, n_train, seed), with a 95% t-interval
   over all of them and per arch;
2. the heads ordering within one precision: mean test error of h1_d1 minus h4_d1, averaged over the two sizes, with a
   95% interval (and per size).

Verdict rule (declared): "4 heads help" stands, unconfounded, when at each precision h4_d1 is below h1_d1 (2's interval
above 0); it is "confounded with precision" when the ordering is not resolved at a precision while 1's interval
excludes 0; otherwise it is not resolved at that precision, with no sign of a precision effect.

Correction to the declared statistic (2026-11-29, review): the unit is the seed, not the run. Seed s's n_train 1024
subset is nested in its 2048 one (``stratified_subset``), and within an arch a seed's errors at the two sizes correlate
0.49-0.70 on these records, so the two sizes of a seed are not two independent runs. As declared, 1 took its 16 pairs
(4 seeds x 2 archs x 2 sizes) as 16 units (15 dof) and 2 pooled the two sizes as 8 runs a side in a Welch interval
(about 11 dof); in simulation at that correlation the latter covered 0.88-0.91, not 0.95. Both now average within a
seed first and take a t-interval over the 4 seeds (3 dof): 1 the per-seed mean of bf16 minus fp32 (over archs and sizes,
or over sizes per arch), 2 the per-seed mean over sizes of h1_d1 minus h4_d1, paired by seed, because at a seed both
archs train on the same subset (the declaration: pairing by seed shares the data, the labels and the batch order). So
the arms are not independent, which a Welch interval assumes: here the two archs' per-seed means correlate -0.45
(bf16) and -0.53 (fp32), so Welch on per-seed means would be too narrow, while the t over the 4 per-seed differences
holds whatever their correlation. The per-size intervals (Welch as first computed) pair by seed the same way. The
rule's decisions are unchanged; the output shows each interval as first computed beside the corrected one, and the
verdict the first computation gave.
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


def over_seeds(d: np.ndarray) -> tuple[float, float, float, float]:
    """Mean, 95% t-interval and sd of the per-seed means of ``d``: seeds on its last axis, every other axis (sizes,
    archs) averaged within a seed first, so the interval has (seeds - 1) dof whatever the seeds' sizes share."""
    return t_interval(d.reshape(-1, d.shape[-1]).mean(axis=0))


def welch_over_sizes(a: list[np.ndarray], b: list[np.ndarray]) -> tuple[float, float, float, float]:
    """As first computed (superseded by ``over_seeds``, 2026-11-29): the mean over sizes of (mean a - mean b), its 95%
    Welch interval (Satterthwaite's dof) and the dof, which takes each size's runs as independent units."""
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


def decide(held: dict[str, bool], effect: bool) -> str:
    """The declared rule, from whether the ordering is resolved at each precision and whether the precision effect's
    interval excludes 0."""
    if all(held.values()):
        return "**stands, unconfounded**: at each precision h4_d1 is below h1_d1 (both intervals above 0)"
    unresolved = ", ".join(p for p, h in held.items() if not h)
    if effect:
        return (f"**confounded with precision**: the ordering is not resolved at {unresolved} while the precision "
                "effect's interval excludes 0")
    return f"**not resolved at {unresolved}**, with no sign of a precision effect (its interval includes 0)"


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

    lines += ["Correction to the declared statistic (2026-11-29, review): the unit is the seed, not the run. A seed's "
              "n_train 1024 subset is nested in its 2048 one and both archs train on it, so both tests now average "
              "within a seed and take a t-interval over the 4 seeds (3 dof), the heads ordering (and its per-size "
              "intervals, Welch as first computed) paired by seed; as "
              "declared they took each (arch, n_train, seed) pair (test 1, 15 dof) or each size's runs (test 2, "
              "pooled Welch, about 11 dof) as independent units, which made the intervals too narrow. Those figures "
              "are kept beside, as first computed; the rule's decisions are unchanged.", ""]

    # 1. the precision effect, bf16 - fp32 per (arch, n_train, seed), averaged within a seed
    diff = np.array([[errors(runs, arch, "bf16", n) - errors(runs, arch, "fp32", n) for n in SIZES]
                     for arch in ARCHS])  # (arch, size, seed)
    rows = []
    for name, d in [*zip(ARCHS, diff, strict=True), ("all", diff)]:
        m, lo, hi, sd = over_seeds(d)
        fm, flo, fhi, _ = t_interval(d.ravel())
        rows.append({"arch": name, "bf16 - fp32, per-seed mean": fmt(m, lo, hi), "sd over seeds": f"{100 * sd:.2f}",
                     "as first computed (pairs as units)": f"{fmt(fm, flo, fhi)} ({d.size} pairs)"})
    pm, plo, phi, _ = over_seeds(diff)
    _, flo, fhi, _ = t_interval(diff.ravel())
    lines += ["## 1. The precision effect (bf16 minus fp32 per arch, n_train and seed, averaged within a seed; 95% "
              "t-interval over the 4 seeds)", "", to_markdown(pd.DataFrame(rows)), ""]

    # 2. the heads ordering within one precision, paired by seed
    rows, held, first = [], {}, {}
    for prec in PRECISIONS:
        a = np.array([errors(runs, "h1_d1", prec, n) for n in SIZES])  # (size, seed)
        b = np.array([errors(runs, "h4_d1", prec, n) for n in SIZES])
        m, lo, hi, _ = over_seeds(a - b)
        held[prec] = lo > 0
        fm, flo, fhi, dof = welch_over_sizes(list(a), list(b))
        first[prec] = flo > 0
        per = []
        for n, x, y in zip(SIZES, a, b, strict=True):
            pm_, plo_, phi_, _ = t_interval(x - y)
            per.append(f"n {n}: {fmt(pm_, plo_, phi_)}")
        rows.append({"precision": prec, "h1_d1 - h4_d1, per-seed mean over sizes": fmt(m, lo, hi),
                     "per size": "; ".join(per), "4 heads below 1": "resolved" if lo > 0 else "not resolved",
                     "as first computed (pooled Welch, runs as units)": f"{fmt(fm, flo, fhi)} (dof {dof:.1f}, "
                     + ("resolved" if flo > 0 else "not resolved") + ")"})
    lines += ["## 2. The heads ordering within one precision (h1_d1 minus h4_d1, paired by seed; 95% t-intervals "
              "over the 4 seeds)", "", to_markdown(pd.DataFrame(rows)), ""]

    verdict = decide(held, plo > 0 or phi < 0)
    lines += ["## Verdict (the declared rule)", "", f"The main run's \"4 heads help\" {verdict}.", ""]
    if decide(first, flo > 0 or fhi < 0) != verdict:
        lines += [f"As first computed (runs as units) it read {decide(first, flo > 0 or fhi < 0)}; corrected "
                  "2026-11-29 (review), above.", ""]

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
