"""Double descent: train and test error against model width, one curve per label-noise level.

The interpolation threshold is the smallest width whose mean train error is below ``tol``; the
test-error peak is the highest interior local maximum of the mean test-error curve (a width whose
mean exceeds both neighbours), so the underfitting end of the curve never counts as the peak.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.load import completed_only, require_columns

WIDTH_KEYS = ("model.width", "model.dim", "model.embed_dim", "model.channels")


def width_column(df: pd.DataFrame) -> str:
    """The first width-like config column present that takes more than one value."""
    for key in WIDTH_KEYS:
        if key in df.columns and df[key].nunique() > 1:
            return key
    require_columns(df, WIDTH_KEYS[0])  # raises, naming the close columns
    raise ValueError(f"{WIDTH_KEYS[0]} takes a single value; double descent needs several widths")


def descent_curves(df: pd.DataFrame, width: str | None = None, noise: str = "label_noise.p",
                   train: str = "train_error", test: str = "test_error", by: list[str] | None = None,
                   status: str | None = "completed") -> pd.DataFrame:
    """Mean, std and seed count of train and test error per (by..., noise, width), sorted by width."""
    width = width or width_column(df)
    by = list(by or [])
    require_columns(df, width, noise, train, test, *by)
    df = completed_only(df, "descent_curves", status)
    keys = [*by, noise, width]
    g = df.groupby(keys, dropna=False)
    out = g[[train, test]].agg(["mean", "std"])
    out.columns = ["train_mean", "train_std", "test_mean", "test_std"]
    out["n_seeds"] = g.size()
    out = out.reset_index().sort_values(keys, ignore_index=True)
    out.attrs.update(width=width, noise=noise, by=by)
    return out


def _interior_peak(test: np.ndarray) -> int | None:
    """Index of the highest strict interior local maximum, or None for a curve without one."""
    peaks = [i for i in range(1, len(test) - 1) if test[i] > test[i - 1] and test[i] > test[i + 1]]
    return max(peaks, key=lambda i: test[i]) if peaks else None


def descent_summary(curves: pd.DataFrame, tol: float = 0.01) -> pd.DataFrame:
    """Per noise level: interpolation threshold, test-error peak and the errors around it.

    Columns: the group keys, ``interpolation_width`` (NaN when no width interpolates),
    ``peak_width`` and ``peak_test_error`` (NaN without an interior peak), ``min_test_error_before_peak``,
    ``final_test_error`` (at the largest width), ``best_width`` and ``best_test_error``.
    """
    width, noise, by = curves.attrs["width"], curves.attrs["noise"], curves.attrs["by"]
    rows = []
    for key, c in curves.groupby([*by, noise], dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        c = c.sort_values(width)
        w, test = c[width].to_numpy(), c["test_mean"].to_numpy()
        fits = c["train_mean"].to_numpy() < tol
        peak = _interior_peak(test)
        best = int(np.argmin(test))
        rows.append({
            **dict(zip([*by, noise], key)),
            "interpolation_width": w[fits.argmax()] if fits.any() else np.nan,
            "peak_width": w[peak] if peak is not None else np.nan,
            "peak_test_error": test[peak] if peak is not None else np.nan,
            "min_test_error_before_peak": test[:peak].min() if peak is not None else np.nan,
            "final_test_error": test[-1],
            "best_width": w[best], "best_test_error": test[best],
        })
    return pd.DataFrame(rows)
