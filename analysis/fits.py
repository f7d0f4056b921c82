"""Learning-curve power laws: error ~ prefactor * n^alpha (+ offset), fitted per group on seed means.

The point estimate is least squares in log-log on the mean over seeds at each size. The 95%
interval comes from a bootstrap over seeds: at every size the seeds are resampled with replacement,
the means recomputed and the line refitted.
"""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
from scipy.optimize import curve_fit

from analysis.load import completed_only, require_columns


def curve_points(df: pd.DataFrame, x: str, y: str, by: list[str], seed_col: str | None = "seed") -> pd.DataFrame:
    """Mean, std and number of seeds of ``y`` per group and size (the points a fit uses)."""
    require_columns(df, x, y, *by)
    cols = [*by, x]
    g = df.dropna(subset=[y]).groupby(cols, dropna=False)[y]
    return g.agg(mean="mean", std="std", n_seeds="count").reset_index()


def _loglog_lines(logx: np.ndarray, logy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares slope and intercept of every row of ``logy`` (..., n) against ``logx`` (n,)."""
    xc = logx - logx.mean()
    slope = (logy - logy.mean(-1, keepdims=True)) @ xc / (xc @ xc)
    return slope, logy.mean(-1) - slope * logx.mean()


def _power_offset(n, a, alpha, c):
    return a * n**alpha + c


def _fit_offset(n: np.ndarray, m: np.ndarray, p0: tuple[float, float]) -> tuple[float, float, float]:
    """a, alpha, c of m = a * n^alpha + c with c >= 0; n is scaled by its geometric mean for conditioning."""
    ref = np.exp(np.log(n).mean())
    a0, alpha0 = p0
    (a, alpha, c), _ = curve_fit(
        _power_offset, n / ref, m, p0=(a0 * ref**alpha0, alpha0, 0.0),
        bounds=([0.0, -10.0, 0.0], [np.inf, 10.0, np.inf]), maxfev=5000,
    )
    return a * ref**-alpha, alpha, c


def _group_fit(sizes: np.ndarray, values: list[np.ndarray], n_boot: int, offset: bool,
               rng: np.random.Generator, label: str) -> dict:
    means = np.array([v.mean() for v in values])
    logx = np.log(sizes)
    slope, intercept = _loglog_lines(logx, np.log(means))
    resid = np.log(means) - (intercept + slope * logx)
    ss_tot = ((np.log(means) - np.log(means).mean()) ** 2).sum()
    out = {
        "alpha": slope, "prefactor": float(np.exp(intercept)),
        "r2": float(1 - (resid**2).sum() / ss_tot) if ss_tot > 0 else np.nan,
        "n_points": len(sizes), "n_seeds": min(len(v) for v in values),
        "x_min": sizes.min(), "x_max": sizes.max(),
        "alpha_lo": np.nan, "alpha_hi": np.nan,
    }
    boot = None
    if max(len(v) for v in values) < 2:
        warnings.warn(f"{label}: one seed per size, no bootstrap interval", stacklevel=3)
    elif n_boot > 0:
        # (n_boot, n_sizes): resample the seeds within each size, then average
        boot = np.stack([v[rng.integers(0, len(v), (n_boot, len(v)))].mean(1) for v in values], axis=1)
        b_slope, _ = _loglog_lines(logx, np.log(boot))
        out["alpha_lo"], out["alpha_hi"] = np.percentile(b_slope, [2.5, 97.5])
    if offset:
        out.update(_offset_fit(sizes, means, boot, (out["prefactor"], slope), label))
    return out


def _offset_fit(sizes, means, boot, p0, label) -> dict:
    out = dict.fromkeys(["offset_prefactor", "offset_alpha", "offset", "offset_alpha_lo",
                         "offset_alpha_hi", "offset_lo", "offset_hi"], np.nan)
    if len(sizes) < 4:
        warnings.warn(f"{label}: the offset model has 3 parameters and needs >= 4 sizes", stacklevel=4)
        return out
    try:
        out["offset_prefactor"], out["offset_alpha"], out["offset"] = _fit_offset(sizes, means, p0)
    except RuntimeError as e:
        warnings.warn(f"{label}: offset fit did not converge ({e})", stacklevel=4)
        return out
    if boot is None:
        return out
    fits = []
    for row in boot:
        try:
            fits.append(_fit_offset(sizes, row, (out["offset_prefactor"], out["offset_alpha"])))
        except RuntimeError:
            continue
    if len(fits) < 0.9 * len(boot):
        warnings.warn(f"{label}: offset fit failed on {len(boot) - len(fits)} of {len(boot)} bootstrap samples",
                      stacklevel=4)
    if fits:
        fits = np.array(fits)
        out["offset_alpha_lo"], out["offset_alpha_hi"] = np.percentile(fits[:, 1], [2.5, 97.5])
        out["offset_lo"], out["offset_hi"] = np.percentile(fits[:, 2], [2.5, 97.5])
    return out


def fit_learning_curve(df: pd.DataFrame, x: str = "dataset.n_train", y: str = "test_error",
                       by: list[str] | str | None = None, seed_col: str | None = "seed", n_boot: int = 1000,
                       offset: bool = False, status: str | None = "completed", seed: int = 0,
                       errors: str = "raise") -> pd.DataFrame:
    """Fit ``y = prefactor * x^alpha`` per group of ``by`` on the means over seeds.

    Returns one row per group: the ``by`` columns, ``alpha``, ``alpha_lo``, ``alpha_hi`` (95%
    bootstrap CI over seeds), ``prefactor``, ``r2`` (log-log), ``n_points`` (distinct sizes),
    ``n_seeds`` (fewest seeds at any size), ``x_min``, ``x_max``; with ``offset=True`` also the fit
    of ``y = offset_prefactor * x^offset_alpha + offset`` and its CIs (``offset_lo``, ``offset_hi``,
    ``offset_alpha_lo``, ``offset_alpha_hi``). Rows whose status is not ``status`` are excluded
    (pass None to keep all). A group with fewer than 3 sizes raises ValueError, or with
    ``errors="skip"`` is left out with a warning. Each run at a size counts as one seed; runs repeating a
    (size, ``seed_col``) pair are averaged first.
    """
    by = [by] if isinstance(by, str) else list(by or [])
    require_columns(df, x, y, *by, seed_col)
    df = completed_only(df, "fit_learning_curve", status)
    df = df.dropna(subset=[x, y])
    rng = np.random.default_rng(seed)
    rows = []
    groups = df.groupby(by, dropna=False) if by else [((), df)]
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        label = ", ".join(f"{k}={v}" for k, v in zip(by, key)) or "all runs"
        nonpos = g[g[y] <= 0]
        if len(nonpos):
            warnings.warn(f"{label}: dropped {len(nonpos)} runs with {y} <= 0 (log undefined)", stacklevel=2)
            g = g[g[y] > 0]
        if seed_col is not None and g.duplicated([x, seed_col]).any():
            warnings.warn(f"{label}: several runs share a ({x}, {seed_col}); they are averaged first", stacklevel=2)
            g = g.groupby([x, seed_col], as_index=False)[y].mean()
        per_size = {n: grp[y].to_numpy(float) for n, grp in g.groupby(x)}
        if len(per_size) < 3:
            msg = f"{label}: a power-law fit needs >= 3 distinct values of {x}, got {len(per_size)} ({sorted(per_size)})"
            if errors == "skip":
                warnings.warn(msg + "; group skipped", stacklevel=2)
                continue
            raise ValueError(msg)
        sizes = np.array(sorted(per_size), dtype=float)
        fit = _group_fit(sizes, [per_size[n] for n in sorted(per_size)], n_boot, offset, rng, label)
        rows.append({**dict(zip(by, key)), **fit})
    order = ["alpha", "alpha_lo", "alpha_hi", "prefactor", "r2", "n_points", "n_seeds", "x_min", "x_max"]
    if not rows:
        raise ValueError(f"no group has >= 3 distinct values of {x}")
    out = pd.DataFrame(rows)
    out = out[[*by, *order, *[c for c in out.columns if c not in order and c not in by]]]
    out.attrs.update(x=x, y=y, by=by)
    return out
