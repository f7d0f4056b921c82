"""Whether a power law fits its own points: the curvature of each seed's log-log curve, tested over seeds.

A straight line in log-log through a curve that bends (an error flattening towards a floor, or steepening once a
model starts to generalise) can have an r2 near 1 and still miss its points, and its alpha then depends on the sizes
fitted. Each seed with a run at every size gets its own quadratic in centred ln x; the coefficient of (ln x)^2 is
that seed's curvature, one observation per seed, as the seed slopes are for the interval of alpha (a per-seed offset
cancels, and noise correlated across sizes within a seed, whose subsets are nested, stays in the spread).
``curved`` is true when the t-interval of the mean curvature over seeds excludes 0; positive curvature flattens with
x, negative steepens. ``max_miss`` is the largest distance of the geometric means from the fitted line, as a
fraction of the line (0.19: a mean 19% above or below it). With fewer than 2 seeds at every size there is no test (NaN).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.fit_slopes import _t_half


def curvature_check(logx: np.ndarray, table: pd.DataFrame, resid: np.ndarray, level: float = 0.95) -> dict:
    """``curvature`` (mean over seeds), its ``curvature_lo``/``curvature_hi`` interval, ``curved`` and ``max_miss``
    for one group: ``table`` holds ln y (seeds, sizes at ``logx``), ``resid`` the size means' ln distance from the
    fitted line."""
    out = {"max_miss": float(np.abs(np.expm1(resid)).max()), "curvature": np.nan, "curvature_lo": np.nan,
           "curvature_hi": np.nan, "curved": None}
    complete = table.dropna().to_numpy()
    if len(complete) < 2 or len(logx) < 3:
        return out
    xc = logx - logx.mean()
    design = np.stack([xc**2, xc, np.ones_like(xc)], axis=1)
    curv = np.linalg.lstsq(design, complete.T, rcond=None)[0][0]  # one per seed
    mean = float(curv.mean())
    half = float(_t_half(curv, level))
    out.update(curvature=mean, curvature_lo=mean - half, curvature_hi=mean + half,
               curved=bool(mean - half > 0 or mean + half < 0))
    return out
