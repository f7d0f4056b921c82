"""The offset model a * n^alpha + c: its fit, its bootstrap ranges, and whether its floor describes its points."""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
from scipy.optimize import curve_fit

from analysis.frames import one_run_per_seed, require_columns


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


FLOOR_AT_ZERO = 1e-6  # an offset below this share of the smallest mean error is no floor: the plain power law


def offset_verdict(offset: float, sizes: np.ndarray, means: np.ndarray) -> tuple[bool, str]:
    """Whether an offset fit describes its own points: its floor ``offset`` must lie below every measured mean (a
    floor above a point misses it) and above ``FLOOR_AT_ZERO`` of the smallest (else the model degenerates to the
    plain power law, and its alpha is not the asymptotic slope it claims to be)."""
    if not np.isfinite(offset):
        return False, "no offset fit"
    i = int(np.argmin(means))
    if offset >= means[i]:
        return False, f"floor {offset:.3g} above the measured mean {means[i]:.3g} at {sizes[i]:g}"
    if offset < FLOOR_AT_ZERO * means[i]:
        return False, f"floor {offset:.2g} at zero: the offset model reduces to the plain power law"
    return True, ""


def check_offset(fits: pd.DataFrame, df: pd.DataFrame, x: str | None = None, y: str | None = None,
                 by: list[str] | None = None) -> pd.DataFrame:
    """``fits`` (from :func:`fit_learning_curve` with ``offset=True``) with ``offset_ok`` and ``offset_note`` set
    again from the runs in ``df``, each row against its own group's means taken as the fit takes them (completed
    runs with ``y > 0``, repeated seeds averaged): use it after editing a fit, or on fits read back from a table.

    ``x``, ``y`` and ``by`` default to the fit's own (``fits.attrs``); a table read back from a file has none, so
    pass them (a guess would judge every row against the wrong runs)."""
    attrs = fits.attrs
    if (x is None or y is None or by is None) and not {"x", "y", "by"} <= set(attrs):
        raise ValueError("check_offset: these fits carry no attrs (read back from a file?): pass x, y and by as "
                         "fit_learning_curve was given them, e.g. x='dataset.n_train', y='test_error', by=['arch']")
    x = attrs["x"] if x is None else x
    y = attrs["y"] if y is None else y
    by = list(attrs["by"] if by is None else ([by] if isinstance(by, str) else by))
    require_columns(df, x, y, *by)
    missing = [k for k in by if k not in fits.columns]
    if missing:
        raise ValueError(f"check_offset: the fits have no column {missing} to match runs by")
    runs = df[df["status"] == "completed"] if "status" in df else df
    runs = runs.dropna(subset=[x, y])
    runs = runs[runs[y] > 0]
    out = fits.copy()
    for i, row in out.iterrows():
        g = runs
        for k in by:
            g = g[g[k].isna()] if pd.isna(row[k]) else g[g[k] == row[k]]
        if "seed" in g:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the fit warned about the repeats already
                g = one_run_per_seed(g, [x], [y], "check_offset")
        means = g.groupby(x)[y].mean()
        out.loc[i, ["offset_ok", "offset_note"]] = offset_verdict(row["offset"], means.index.to_numpy(float),
                                                                   means.to_numpy(float))
    out["offset_ok"] = out["offset_ok"].astype(bool)
    return out


def _offset_fit(sizes, means, boot, p0, label) -> dict:
    out = dict.fromkeys(["offset_prefactor", "offset_alpha", "offset", "offset_alpha_lo",
                         "offset_alpha_hi", "offset_lo", "offset_hi"], np.nan)
    out["offset_ok"], out["offset_note"] = False, "no offset fit"
    if len(sizes) < 4:
        warnings.warn(f"{label}: the offset model has 3 parameters and needs >= 4 sizes", stacklevel=4)
        return out
    try:
        out["offset_prefactor"], out["offset_alpha"], out["offset"] = _fit_offset(sizes, means, p0)
    except RuntimeError as e:
        warnings.warn(f"{label}: offset fit did not converge ({e})", stacklevel=4)
        return out
    out["offset_ok"], out["offset_note"] = offset_verdict(out["offset"], sizes, means)
    if boot is None:
        return out
    fits = []
    for row in boot:
        if not np.isfinite(row).all():  # a resample that drew no seed with a run at some size: counted as failed
            continue
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
