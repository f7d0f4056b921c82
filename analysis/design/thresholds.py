"""Where a curve interpolates, the width its peak is tested at, and the per-seed contrast there."""
from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.design.grid import NOISE, SEED, curve_keys
from analysis.double_descent import width_column
from analysis.frames import completed_only, require_columns


def _flagged(df: pd.DataFrame) -> pd.Series:
    out = pd.Series(False, index=df.index)
    for f in ("stalled", "collapsed"):
        if f in df.columns:
            out |= df[f].fillna(False).astype(bool)
    return out


def seed_means(c: pd.DataFrame, width: str, col: str = "train_error") -> pd.Series:
    """Per width, the mean of ``col`` over its seeds, each seed's runs averaged first (a run without a seed counts
    as a seed of its own): a seed rerun at a width counts once, as ``spread`` counts it (review 2026-11-29,
    analysis: a rerun seed weighed twice in a pilot's threshold)."""
    if SEED not in c.columns:
        return c.groupby(width)[col].mean().sort_index()
    seed = c[SEED].astype(object).where(c[SEED].notna(), pd.Series([("run", i) for i in c.index], index=c.index))
    per_seed = c.groupby([c[width], seed.rename("_seed")])[col].mean()
    return per_seed.groupby(level=0).mean().sort_index()


def threshold(c: pd.DataFrame, width: str, tol: float, flagged: bool = False) -> float:
    """Smallest width whose mean final train error over the seeds of its unflagged runs (``flagged``: of all its
    runs; :func:`seed_means`) is at most ``tol`` (NaN if none)."""
    ok = c if flagged else c[~_flagged(c)]
    means = seed_means(ok, width)
    fits = means[means <= tol]
    return float(fits.index[0]) if len(fits) else np.nan


def thresholds(df: pd.DataFrame, width: str | None = None, tol: float = 0.01) -> pd.DataFrame:
    """Per curve (varying keys and noise): the threshold, the grid, and how many grid widths below it underfit."""
    width = width or width_column(df)
    require_columns(df, width, NOISE, "train_error")
    df = completed_only(df, "thresholds")
    keys = [*curve_keys(df), NOISE]
    rows = []
    for key, c in df.groupby(keys, dropna=False, sort=True):
        t = threshold(c, width, tol)
        grid = sorted(c[width].unique())
        means = seed_means(c[~_flagged(c)], width)
        below = [w for w in grid if np.isfinite(t) and w < t and means.get(w, 0.0) > tol]
        rows.append({**dict(zip(keys, np.atleast_1d(key), strict=True)), "threshold": t,
                     "underfit_below": len(below), "grid": ",".join(f"{w:g}" for w in grid),
                     "runs": len(c), "flagged": int(_flagged(c).sum())})
    return pd.DataFrame(rows)


def critical(c: pd.DataFrame, width: str, tol: float, flagged: bool = False) -> float:
    """The widest grid width below the threshold whose mean train error (over seeds, unflagged runs) is above
    ``tol``: the width that just fails to fit its labels (NaN without a threshold or with nothing below it)."""
    t = threshold(c, width, tol, flagged)
    below = [w for w in sorted(c[width].unique()) if np.isfinite(t) and w < t]
    return float(below[-1]) if below else np.nan


def center(c: pd.DataFrame, width: str, tol: float, rule: str, flagged: bool = False) -> float:
    """The width a peak is tested at: ``critical`` (the declared rule) or ``threshold`` (a sensitivity check);
    ``flagged``: with the collapsed and stalled runs' train errors counted (see ``deciding_flags``)."""
    if rule not in CENTERS:
        raise ValueError(f"center={rule!r}: choose one of {CENTERS}")
    return critical(c, width, tol, flagged) if rule == "critical" else threshold(c, width, tol, flagged)


def deciding_flags(c: pd.DataFrame, width: str, tol: float, rule: str) -> int:
    """Flagged (collapsed or stalled) runs that decide where the test is centred: the centre is read without them,
    so where counting their train errors would move it, they are counted (at the widths up to the threshold read
    without them); else 0. Three of four seeds collapsed at the threshold width left the fourth to place it."""
    t = center(c, width, tol, rule)
    if _same(t, center(c, width, tol, rule, flagged=True)):
        return 0
    upto = threshold(c, width, tol)
    return int(_flagged(c[c[width] <= upto] if np.isfinite(upto) else c).sum())


def _same(a: float, b: float) -> bool:
    return (np.isnan(a) and np.isnan(b)) or a == b


CENTERS = ("critical", "threshold")


def neighbours(grid: list[float], t: float, factor: float = 2.0) -> tuple[float | None, float | None]:
    """The nearest grid widths at most ``t / factor`` and at least ``t * factor``."""
    lo = [w for w in grid if w <= t / factor]
    hi = [w for w in grid if w >= t * factor]
    return (max(lo) if lo else None), (min(hi) if hi else None)


def peak_contrast(c: pd.DataFrame, width: str, t: float) -> tuple[pd.DataFrame, tuple]:
    """Per seed (rows): test error at width ``t`` minus that at its left and at its right neighbour (columns
    ``left``, ``right``); seeds missing a width are dropped."""
    lo, hi = neighbours(sorted(c[width].unique()), t)
    if lo is None or hi is None:
        return pd.DataFrame(columns=["left", "right"], dtype=float), (lo, t, hi)
    m = c.pivot_table(index=SEED, columns=width, values="test_error", aggfunc="mean", dropna=False)
    m = m.reindex(columns=sorted({*m.columns, lo, t, hi}))  # a width with no test error at all: NaN, not KeyError
    d = pd.DataFrame({"left": m[t] - m[lo], "right": m[t] - m[hi]})
    return d.dropna(), (lo, t, hi)
