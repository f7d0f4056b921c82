"""Log-log slopes of seeds and the interval of alpha: over seeds' slopes, within seeds, or one seed's residuals."""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
from scipy import stats


def _loglog_lines(logx: np.ndarray, logy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares slope and intercept of every row of ``logy`` (..., n) against ``logx`` (n,)."""
    xc = logx - logx.mean()
    slope = (logy - logy.mean(-1, keepdims=True)) @ xc / (xc @ xc)
    return slope, logy.mean(-1) - slope * logx.mean()


def seed_slope_interval(logx: np.ndarray, logy: np.ndarray, level: float = 0.95
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean slope and its t-interval over seeds: ``logy`` (..., seeds, sizes) against ``logx`` (sizes,).

    Each seed's least-squares slope is one observation; returns (mean, lo, hi) over the last-but-one
    axis with ``seeds - 1`` degrees of freedom. Vectorised over leading axes (one per simulated study)."""
    slopes, _ = _loglog_lines(logx, logy)  # (..., seeds)
    s = slopes.shape[-1]
    if s < 2:
        raise ValueError(f"a t-interval over seeds needs >= 2 seeds, got {s}")
    mean = slopes.mean(-1)
    half = _t_half(slopes, level)
    return mean, mean - half, mean + half


def _t_half(slopes: np.ndarray, level: float) -> np.ndarray:
    """Half-width of the t-interval of the mean over the last axis (one slope per seed)."""
    s = slopes.shape[-1]
    return stats.t.ppf(0.5 + level / 2, s - 1) * slopes.std(-1, ddof=1) / np.sqrt(s)


def _residual_interval(logx: np.ndarray, logm: np.ndarray, slope: float, level: float = 0.95) -> tuple[float, float]:
    """t-interval of an OLS slope from its own residuals (``len(logx) - 2`` degrees of freedom)."""
    dof = len(logx) - 2
    resid = logm - logm.mean() - slope * (logx - logx.mean())
    se = np.sqrt((resid**2).sum() / dof / ((logx - logx.mean()) ** 2).sum())
    half = stats.t.ppf(0.5 + level / 2, dof) * se
    return slope - half, slope + half


def _within_seed_slope(logx: np.ndarray, logy: np.ndarray) -> float | None:
    """The least-squares slope of ``logy`` (seeds, sizes; NaN where a seed lacks a size) against ``logx`` with an
    intercept per seed. With every size present it is the slope of the size means; with a cell missing it still
    cancels a seed that sits uniformly above or below the others, which the slope of the size means does not (the
    missing cell moves one size's mean by that seed's offset). None when no seed holds two sizes."""
    num = den = 0.0
    for row in logy:
        ok = np.isfinite(row)
        if ok.sum() < 2:
            continue
        xd = logx[ok] - logx[ok].mean()
        num += float(xd @ (row[ok] - row[ok].mean()))
        den += float(xd @ xd)
    return num / den if den > 0 else None


def _own_size_slopes(logx: np.ndarray, logy: np.ndarray, min_sizes: int = 3) -> pd.Series:
    """Each seed's least-squares slope on the sizes it has (``logy``: seeds, sizes; NaN where a seed lacks a size),
    for the seeds with at least ``min_sizes`` sizes; indexed by the row."""
    slopes = {}
    for i, row in enumerate(logy):
        ok = np.isfinite(row)
        if ok.sum() >= min_sizes:
            slopes[i] = float(_loglog_lines(logx[ok], row[ok])[0])
    return pd.Series(slopes, dtype=float)


def _alpha_interval(sizes: np.ndarray, logm: np.ndarray, slope: float, table: pd.DataFrame, label: str,
                    level: float = 0.95) -> dict:
    """The interval of ``alpha`` (centred on ``slope``, the group's estimate) and the ``ci_method`` that made it.

    Seeds are the repeats, so the width comes from how their slopes differ: over the seeds with every size when 2 or
    more have it; else over each seed's slope on its own sizes (seeds with >= 3), which keeps a per-seed slope and
    noise correlated across n (a seed's subsets are nested) in the width. The scatter of the size means around the
    line sees neither (a "95%" interval covered 0.65-0.71 at a per-seed slope sd of 0.03; review 2026-11-29, F1): it is
    used only for a single seed, where there is no seed spread to see, and says so."""
    logx = np.log(sizes)
    complete = table.dropna()
    if len(complete) < len(table) and len(complete) >= 2:
        missing = [str(s) for s in table.index.difference(complete.index)]
        warnings.warn(f"{label}: seeds {', '.join(missing)} lack a run at some size and are left out of the "
                      "alpha interval", stacklevel=4)
    if len(complete) >= 2:
        _, lo, hi = seed_slope_interval(logx, complete.to_numpy(), level)
        centre = slope - float(_loglog_lines(logx, complete.to_numpy().mean(0))[0])  # 0 when no seed is missing
        # (slope is then the within-seed slope of every seed: the interval's width is the complete seeds')
        return {"alpha_lo": float(lo) + centre, "alpha_hi": float(hi) + centre, "n_seeds_ci": len(complete),
                "ci_method": "t over seed slopes"}
    if len(table) == 1:
        warnings.warn(f"{label}: one seed; the alpha interval comes from the scatter of its points around the line "
                      "(assumes the same, independent noise at every size) and cannot see how seeds differ: run "
                      "more seeds for an interval over seeds", stacklevel=4)
        lo, hi = _residual_interval(logx, logm, slope, level)
        return {"alpha_lo": lo, "alpha_hi": hi, "n_seeds_ci": 0,
                "ci_method": "t over size-mean residuals (one seed: ignores seed spread)"}
    own = _own_size_slopes(logx, table.to_numpy())
    if len(own) >= 2:
        left = [str(s) for s in table.index[np.setdiff1d(np.arange(len(table)), own.index)]]
        warnings.warn(f"{label}: fewer than 2 seeds have a run at every size; the alpha interval is the t-interval "
                      f"over the slopes of {len(own)} seeds, each on its own sizes (>= 3)"
                      + (f"; seeds {', '.join(left)} with fewer sizes are left out of it" if left else ""),
                      stacklevel=4)
        half = float(_t_half(own.to_numpy(), level))
        return {"alpha_lo": slope - half, "alpha_hi": slope + half, "n_seeds_ci": len(own),
                "ci_method": "t over seed slopes, each on its own sizes"}
    warnings.warn(f"{label}: {len(own)} of {len(table)} seeds have runs at >= 3 sizes; no alpha interval (the "
                  "scatter of the size means would ignore how seeds differ): run 2 or more seeds at 3 or more sizes",
                  stacklevel=4)
    return {"alpha_lo": np.nan, "alpha_hi": np.nan, "n_seeds_ci": 0,
            "ci_method": "none: fewer than 2 seeds with 3 sizes"}
