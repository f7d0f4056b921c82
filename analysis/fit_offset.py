"""The offset model a * n^alpha + c: its fit, its bootstrap ranges, and whether its floor describes its points."""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from analysis.frames import one_run_per_seed, require_columns

_ALPHAS = np.linspace(-10.0, 10.0, 401)  # the exponent's bounds in steps of 0.05: each fit's search starts on this grid
_GOLD = (np.sqrt(5.0) - 1) / 2
_CHUNK = 500  # rows fitted at once: the grid search holds (rows, 401, sizes) arrays


def _scale_and_floor(u: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """a, c >= 0 minimising the sum of (a * u + c - m)^2 over the last axis, and that sum: the unconstrained solution
    when it is feasible, else the better of the two faces (c = 0, a = 0), each clamped at 0."""
    k = m.shape[-1]
    su, sm = u.sum(-1), m.sum(-1)
    du, dm = u - su[..., None] / k, m - sm[..., None] / k
    with np.errstate(invalid="ignore", divide="ignore"):
        a = (du * dm).sum(-1) / (du * du).sum(-1)
        c = (sm - a * su) / k
        a0 = np.maximum((u * m).sum(-1) / (u * u).sum(-1), 0.0)  # on the face c = 0
    c1 = np.maximum(sm / k, 0.0)  # on the face a = 0
    inside = np.isfinite(a) & (a >= 0) & (c >= 0)
    a, c = np.where(inside, a, 0.0), np.where(inside, c, 0.0)

    def sse(a, c):
        return ((a[..., None] * u + c[..., None] - m) ** 2).sum(-1)

    s_in, s0, s1 = sse(a, c), sse(a0, np.zeros_like(a0)), sse(np.zeros_like(c1), c1)
    face0 = s0 <= s1
    return (np.where(inside, a, np.where(face0, a0, 0.0)), np.where(inside, c, np.where(face0, 0.0, c1)),
            np.where(inside, s_in, np.minimum(s0, s1)))


def _fit_offsets(n: np.ndarray, m: np.ndarray) -> np.ndarray:
    """(a, alpha, c) of m = a * n^alpha + c for each row of ``m`` (rows, sizes), all rows at once: least squares with
    a >= 0, c >= 0 and |alpha| <= 10. For a given alpha the model is linear in (a, c), solved exactly; the alpha whose
    solution leaves the smallest sum of squares is found on a grid of step 0.05 and then by golden section between
    the best grid point's neighbours, to 1e-13. n is scaled by its geometric mean for conditioning. (scipy's
    curve_fit, one row at a time from the point fit, reached the same minima on heads_depth's resamples, alpha within
    7e-6 and sums of squares within 1e-6, some 10-20 times slower; a floor it left at 1e-15 here is exactly 0.)"""
    m = np.atleast_2d(np.asarray(m, float))
    if len(m) > _CHUNK:
        return np.concatenate([_fit_offsets(n, m[i:i + _CHUNK]) for i in range(0, len(m), _CHUNK)])
    ref = np.exp(np.log(n).mean())
    logx = np.log(np.asarray(n, float) / ref)

    def sse(alpha):
        return _scale_and_floor(np.exp(alpha[:, None] * logx), m)[2]

    grid = _scale_and_floor(np.exp(_ALPHAS[:, None] * logx)[None], m[:, None, :])[2]  # (rows, grid)
    best = np.argmin(grid, axis=1)
    lo, hi = _ALPHAS[np.maximum(best - 1, 0)], _ALPHAS[np.minimum(best + 1, len(_ALPHAS) - 1)]
    p, q = hi - _GOLD * (hi - lo), lo + _GOLD * (hi - lo)
    fp, fq = sse(p), sse(q)
    for _ in range(60):  # golden section: the bracket shrinks from 0.1 to 0.1 * 0.618^60, 3e-14
        left = fp <= fq  # the minimum lies in [lo, q], else in [p, hi]
        lo, hi = np.where(left, lo, p), np.where(left, q, hi)
        kept, f_kept = np.where(left, p, q), np.where(left, fp, fq)
        new = np.where(left, hi - _GOLD * (hi - lo), lo + _GOLD * (hi - lo))
        f_new = sse(new)
        p, fp = np.where(left, new, kept), np.where(left, f_new, f_kept)
        q, fq = np.where(left, kept, new), np.where(left, f_kept, f_new)
    alpha = (lo + hi) / 2
    a, c, _ = _scale_and_floor(np.exp(alpha[:, None] * logx), m)
    return np.column_stack([a * ref**-alpha, alpha, c])


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


def _offset_fit(sizes, means, boot, label) -> dict:
    out = dict.fromkeys(["offset_prefactor", "offset_alpha", "offset", "offset_alpha_lo",
                         "offset_alpha_hi", "offset_lo", "offset_hi"], np.nan)
    out["offset_ok"], out["offset_note"] = False, "no offset fit"
    if len(sizes) < 4:
        warnings.warn(f"{label}: the offset model has 3 parameters and needs >= 4 sizes", stacklevel=4)
        return out
    fit = _fit_offsets(sizes, means)[0]
    if not np.isfinite(fit).all():
        warnings.warn(f"{label}: no offset fit (means {means})", stacklevel=4)
        return out
    out["offset_prefactor"], out["offset_alpha"], out["offset"] = (float(v) for v in fit)
    out["offset_ok"], out["offset_note"] = offset_verdict(out["offset"], sizes, means)
    if boot is None:
        return out
    rows = boot[np.isfinite(boot).all(axis=1)]  # a resample that drew no seed with a run at some size is skipped
    if len(rows) < 0.9 * len(boot):
        warnings.warn(f"{label}: {len(boot) - len(rows)} of {len(boot)} bootstrap resamples drew no seed with a run at "
                      "some size and were skipped", stacklevel=4)
    if len(rows):
        fits = _fit_offsets(sizes, rows)
        out["offset_alpha_lo"], out["offset_alpha_hi"] = np.percentile(fits[:, 1], [2.5, 97.5])
        out["offset_lo"], out["offset_hi"] = np.percentile(fits[:, 2], [2.5, 97.5])
    return out
