"""Double descent: train and test error against model width, one curve per label-noise level.

Interpolation threshold: the smallest width whose mean train error (against the labels the model was
trained on, noisy ones included) is at most ``tol``.

Peak: the highest strict local maximum of the mean test-error curve among the widths from the critical width
(the widest grid width below the interpolation threshold, the model that just fails to fit its labels: where
``analysis.design``'s declared test and Nakkiran et al. place the peak) up to a factor ``window`` (default 4: two
steps of a doubling grid) above the threshold, compared with its neighbours on the whole curve. Without an
interpolating width no peak is searched: a curve that never interpolates cannot show the second descent. A bump in
the under-fitting end of the curve, below the critical width, is therefore never the peak (the window reached down
to threshold / 4 until 2026-11-29, and named MNIST's under-fitting maximum at a third of the threshold a peak).

Height over the seed spread: ``peak_height`` is the peak's prominence (``scipy.signal.peak_prominences``:
its mean test error minus the higher of the lowest points on either side before the curve rises above
it again); ``peak_z`` divides it by the standard error of a difference of two seed means,
``pooled_sd * sqrt(2 / n_seeds)``, with ``pooled_sd`` the test-error standard deviation over seeds pooled
over every width of the curve. ``peak_significant`` is ``peak_z`` above the two-sided 5% point of a t
distribution with the pooled degrees of freedom. It is **post hoc**, a description and not a test: the peak is
the highest of the window's local maxima and its base the lowest points beside it, both chosen after looking, and
its standard error is unpaired. On flat curves with independent seed noise it fires about 23% of the time at 3-8
seeds (review of 2026-11-29). The declared test of a peak is ``python -m analysis.design test`` (a paired contrast
at a width fixed by train errors alone, with its power). A curve with one seed per
width has no spread and never gets a significant peak. Nor does a peak with a stalled seed at its width
(``peak_stalled_seeds``: runs whose train error ended at chance or collapsed towards it,
``analysis.load.result_flags``): a model
that never fit its training set is a failed training, not the peak of a model that barely interpolates
(seen on CIFAR-10, where C1 = 4 runs collapsed to 90% test error between learned widths at 72% and 62%).

Runs that record them (the trainer's ``train_error_clean``: error on the training images against their
true labels, and ``train_error_noisy_subset``: error on the flipped images against their noisy labels)
add ``train_clean_*`` and ``train_noisy_subset_*`` columns; older runs without them just lack those columns.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import signal, stats

from analysis.frames import completed_only, one_run_per_seed, require_columns, require_one_recipe
from analysis.tables import FLAGS

WIDTH_KEYS = ("model.width", "model.dim", "model.embed_dim", "model.channels")
# optional train metrics: summary key -> column prefix in descent_curves
EXTRA_TRAIN = {"train_error_clean": "train_clean", "train_error_noisy_subset": "train_noisy_subset"}


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
    """Mean, std and seed count of train and test error per (by..., noise, width), sorted by width (runs repeating
    a seed are averaged first and count once).

    Columns ``train_mean/std``, ``test_mean/std``, ``n_seeds``, plus ``train_clean_mean/std`` and
    ``train_noisy_subset_mean/std`` when the runs recorded ``train_error_clean`` / ``train_error_noisy_subset``, and
    ``n_stalled`` / ``n_low_lr_stop`` / ``n_capped`` / ``n_ended_in_spike`` (seeds with that flag, see
    ``analysis.load.result_flags``; capped: at the epoch cap before a convergence rule fired; ended in a spike: read
    at final errors inside a loss spike) when the runs carry the flags. Stalled and spiked runs are results and are
    in the means; pass ``df[~df['stalled']]`` for the curve without the stalled ones. Runs of one point that differ in
    a recipe key (``analysis.frames.require_one_recipe``: weight decay 0 on some seeds, 0.01 on others) are refused:
    add the key to ``by``."""
    width = width or width_column(df)
    by = list(by or [])
    require_columns(df, width, noise, train, test, *by)
    df = completed_only(df, "descent_curves", status)
    keys = [*by, noise, width]
    metrics = {train: "train", test: "test"}
    metrics.update({k: v for k, v in EXTRA_TRAIN.items() if k in df.columns and df[k].notna().any()})
    flags = [f for f in FLAGS if f in df.columns]
    df = df.assign(**{f: df[f].astype(float) for f in flags})
    require_one_recipe(df, keys, "descent_curves", by=by)  # seeds 0-2 at one recipe, 3-5 at another: two curves
    df = one_run_per_seed(df, keys, [*metrics, *flags], "descent_curves")
    g = df.groupby(keys, dropna=False)
    out = g[list(metrics)].agg(["mean", "std"])
    out.columns = [f"{metrics[m]}_{stat}" for m, stat in out.columns]
    out["n_seeds"] = g[test].count()
    for f in flags:
        out[f"n_{f}"] = g[f].agg(lambda v: int((v > 0).sum()))
    out = out.reset_index().sort_values(keys, ignore_index=True)
    out.attrs.update(width=width, noise=noise, by=by)
    return out


def _pooled_sd(c: pd.DataFrame) -> tuple[float, int]:
    """Test-error standard deviation over seeds pooled over the widths of one curve, and its dof."""
    dof = (c["n_seeds"] - 1).clip(lower=0)
    ok = dof > 0
    total = int(dof[ok].sum())
    if total == 0:
        return np.nan, 0
    return float(np.sqrt((dof[ok] * c.loc[ok, "test_std"] ** 2).sum() / total)), total


def window_low(w: np.ndarray, interp: float, window: float = 4.0) -> float:
    """The narrowest width the peak is searched at: the critical width (the widest of ``w`` below ``interp``), or
    ``interp / window`` if that is wider (a grid with no width near the threshold)."""
    below = w[w < interp] if np.isfinite(interp) else w[:0]
    return float(max(below.max(), interp / window)) if len(below) else interp / window


def find_peak(w: np.ndarray, test: np.ndarray, interp: float, window: float = 4.0,
              lo: float | None = None) -> tuple[int | None, float]:
    """Index of the highest strict local maximum of ``test`` with width in [``window_low``, interp * window],
    and its prominence; (None, nan) without one or when ``interp`` is NaN."""
    if not np.isfinite(interp):
        return None, np.nan
    peaks, _ = signal.find_peaks(test)
    lo = window_low(np.asarray(w, float), interp, window) if lo is None else lo
    peaks = [i for i in peaks if lo <= w[i] <= interp * window]
    if not peaks:
        return None, np.nan
    best = max(peaks, key=lambda i: test[i])
    return int(best), float(signal.peak_prominences(test, [best])[0][0])


def _curve_summary(c: pd.DataFrame, width: str, tol: float, window: float, widths=None) -> dict:
    c = c.sort_values(width)
    fits = c["train_mean"].to_numpy() <= tol
    interp = c[width].to_numpy(float)[fits.argmax()] if fits.any() else np.nan
    grid = c[width].to_numpy(float) if widths is None else np.asarray(sorted(widths), float)
    lo = window_low(grid, interp, window)  # on the grid's widths, those whose runs were left out included
    final = float(c["test_mean"].iloc[-1])
    c = c[c["n_seeds"] > 0]  # the test-error side reads the widths with a scored run only
    w, test = c[width].to_numpy(float), c["test_mean"].to_numpy(float)
    if not len(c):
        return {"interpolation_width": interp, "window_lo": lo, "window_hi": interp * window,
                "peak_width": np.nan, "peak_test_error": np.nan, "peak_height": np.nan, "peak_z": np.nan,
                "peak_stalled_seeds": 0, "peak_significant": False, "pooled_test_sd": np.nan,
                "min_test_error_before_peak": np.nan, "final_test_error": final,
                "best_width": np.nan, "best_test_error": np.nan}
    peak, height = find_peak(w, test, interp, window, lo)
    sd, dof = _pooled_sd(c)
    n = float(c["n_seeds"].min())
    z = height / (sd * np.sqrt(2.0 / n)) if peak is not None and dof > 0 and sd > 0 else np.nan
    best = int(np.argmin(test))
    stalled = c["n_stalled"].to_numpy() if "n_stalled" in c else np.zeros(len(c))
    stuck = int(stalled[peak]) if peak is not None else 0
    return {
        "interpolation_width": interp,
        "window_lo": lo, "window_hi": interp * window,
        "peak_width": w[peak] if peak is not None else np.nan,
        "peak_test_error": test[peak] if peak is not None else np.nan,
        "peak_height": height, "peak_z": z,
        "peak_stalled_seeds": stuck,
        "peak_significant": bool(np.isfinite(z) and z > stats.t.ppf(0.975, dof) and stuck == 0),
        "pooled_test_sd": sd,
        "min_test_error_before_peak": test[:peak].min() if peak is not None else np.nan,
        "final_test_error": final,
        "best_width": w[best], "best_test_error": test[best],
    }


def descent_summary(curves: pd.DataFrame, tol: float = 0.01, window: float = 4.0, widths=None) -> pd.DataFrame:
    """Per noise level: interpolation threshold, test-error peak near it, its height over the seed spread.

    Columns: the group keys, ``interpolation_width`` (NaN when no width interpolates), ``window_lo`` and
    ``window_hi`` (the widths searched), ``peak_width``, ``peak_test_error``, ``peak_height`` (prominence),
    ``peak_z`` (height / standard error of a difference of seed means), ``peak_significant``,
    ``peak_stalled_seeds`` (stalled seeds at the peak's width: such a peak is never significant),
    ``pooled_test_sd``, ``min_test_error_before_peak``, ``final_test_error`` (at the largest width),
    ``best_width`` and ``best_test_error``; peak columns are NaN without a peak (see the module docstring).
    ``widths``: the grid's widths where ``curves`` lack some (runs left out): the critical width is read on them."""
    if window < 1:
        raise ValueError(f"window={window}: the peak window is a factor around the threshold, >= 1 (default 4)")
    width, noise, by = curves.attrs["width"], curves.attrs["noise"], curves.attrs["by"]
    rows = []
    for key, c in curves.groupby([*by, noise], dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip([*by, noise], key, strict=True)), **_curve_summary(c, width, tol, window, widths)})
    return pd.DataFrame(rows)
