"""Learning-curve power laws: error ~ prefactor * n^alpha (+ offset), fitted per group.

Point estimate: least squares in log-log on the geometric mean over seeds at each size (the mean of
log error), i.e. the pooled log-log fit of every run when each seed has a run at every size.

The 95% interval of ``alpha`` (:func:`seed_slope_interval`) is a t-interval on per-seed slopes: each
seed's runs, one per size, give their own log-log slope; with S such seeds the interval is
``alpha +- t(0.975, S - 1) * sd(slopes) / sqrt(S)``. It assumes only that the seeds are independent
repeats of the study: the log error of a run is the power law plus noise that may differ in size from
one n to another and may include a per-seed offset (a seed uniformly better: it cancels in the slope)
or a per-seed slope (then the interval covers the mean slope over seeds, the quantity of interest).
With normal log-noise the interval is exact; with 3 or 4 seeds it is wide (t = 4.30 or 3.18), which is
what 3 or 4 repeats can honestly say. Simulated studies with 3 or 4 seeds, 5-7 sizes and 3-10%
multiplicative noise cover a planted alpha in 94-96% of 1,000 studies each, with or without per-seed
offsets (tests/test_analysis_coverage.py). The percentile bootstrap of the seed means used before
covered 83-89% without offsets (its intervals about half as wide as these) and 97-100% with them.
Runs are paired into seeds by ``seed_col`` (or by their order within a size when it is None; a run with no seed
is refused, not dropped). When a seed lacks a run at some size, the point estimate is the slope within seeds
(least squares with an intercept per seed, which cancels a per-seed offset as the complete case does; the slope
of the size means would move with the missing seed's offset), and the interval takes its width from the seeds with
every size, with a warning, centred on that estimate: 95-96% coverage with per-seed offsets up to 0.2
in log (the slope of the means there covered 81%; tests/test_analysis_coverage.py). With fewer than 2 complete
seeds it is the t-interval over each seed's slope on its own sizes (the seeds with >= 3), centred on the estimate;
with fewer than 2 such seeds there is none (NaN). The scatter of the size means around the line (``n_points - 2``
degrees of freedom) sees neither seeds whose slopes differ nor noise correlated across n (a seed's subsets are
nested across n): with a per-seed slope sd of 0.03 its "95%" interval covered 65-71% (review 2026-12), so only a
single seed's fit uses it, and says so. ``ci_method`` names which one a row used.

The offset model ``a * n^alpha + c`` (4+ sizes) keeps a percentile bootstrap over seeds for its
intervals (``offset_*_lo/hi``): it is not coverage-tested and, like any percentile bootstrap of 3-4
seeds, is too narrow; read it as a sensitivity check, not a 95% interval.
"""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
from scipy import stats
from scipy.optimize import curve_fit

from analysis.load import _norm, completed_only, one_run_per_seed, recipe_columns, require_columns


def curve_points(df: pd.DataFrame, x: str, y: str, by: list[str], seed_col: str | None = "seed",
                 status: str | None = "completed") -> pd.DataFrame:
    """Per group and size: ``gmean`` (geometric mean of ``y`` over seeds, the point :func:`fit_learning_curve` fits)
    and ``log_std`` (std of ln ``y`` over seeds: the point's spread on a log axis is ``gmean * exp(+-log_std)``), both
    over the runs with ``y > 0`` like the fit; ``mean`` and ``std`` (arithmetic) and ``n_seeds``. Like the fit, only
    runs whose status is ``status`` count (None keeps all); runs repeating a seed are averaged first."""
    require_columns(df, x, y, *by)
    df = completed_only(df, "curve_points", status)
    cols = [*by, x]
    if seed_col is not None:
        df = one_run_per_seed(df, cols, [y], "curve_points", seed_col)
    df = df.dropna(subset=[y])
    logy = np.log(df[y].astype(float).where(df[y] > 0))
    g = df.assign(_logy=logy).groupby(cols, dropna=False)
    out = g[y].agg(mean="mean", std="std", n_seeds="count")
    out["gmean"] = np.exp(g["_logy"].mean())
    out["log_std"] = g["_logy"].std()
    return out.reset_index()


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


def _seed_matrix(g: pd.DataFrame, x: str, y: str, seed_col: str | None) -> pd.DataFrame:
    """log y as a (seed, size) table: runs paired by ``seed_col``, or by their order within a size."""
    seeds = g[seed_col] if seed_col is not None else g.groupby(x).cumcount()
    return pd.DataFrame({"seed": seeds.to_numpy(), x: g[x].to_numpy(), "logy": np.log(g[y].to_numpy(float))}
                        ).pivot_table(index="seed", columns=x, values="logy", aggfunc="mean").sort_index(axis=1)


def _require_seeds(g: pd.DataFrame, x: str, seed_col: str, label: str) -> None:
    """Refuse runs with no seed: the (seed, size) table would drop them without a word (a pivot drops a NaN index),
    and with them a seed's point at a size, or every point of the group (review 2026-12, F3)."""
    unseeded = g[g[seed_col].isna()]
    if unseeded.empty:
        return
    names = unseeded["run_dir"].astype(str) if "run_dir" in unseeded else pd.Series(unseeded.index.astype(str))
    shown = ", ".join(names.iloc[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    sizes = ", ".join(_value(v) for v in sorted(unseeded[x].unique()))
    raise ValueError(f"{label}: {len(unseeded)} runs have no {seed_col} ({shown}; at {x} = {sizes}); the fit pairs a "
                     f"seed's runs across sizes and cannot place them: set their {seed_col} (the seed they trained "
                     f"with), leave them out, or pass seed_col=None to pair runs by their order within each size")


def _require_one_recipe(g: pd.DataFrame, x: str, seed_col: str | None, keys: list[str], label: str) -> None:
    """Refuse a group whose runs at one size differ in a recipe key (:func:`analysis.load.recipe_columns`; ``x``, the
    seed and the grouping ``keys`` aside): seeds 0-1 at one learning rate and seeds 2-3 at another would read as one
    curve, and :func:`one_run_per_seed` compares recipes only among repeats of a (seed, size) cell (review 2026-12,
    F4). A key with one value per size is how the grid was set at that size, not refused: an alias of the size
    (``dataset.n_train`` beside the summary's ``n_train``, one size per value) passes unsaid, and one that changes
    between blocks of sizes (a step cap raised for the larger n, as ``analysis.report`` allows; or small and large
    sizes read from two sweeps) is named in a warning. Runs read by :func:`analysis.load.load_runs` name their config
    columns; a frame without them is not checked."""
    mixed, stepped = {}, {}
    for k in recipe_columns(g, (x, seed_col, *keys)):
        v = g[k].map(_norm)
        if v.nunique(dropna=False) <= 1:
            continue
        per_size = bool((v.groupby(g[x]).nunique(dropna=False) <= 1).all())
        if per_size and bool((g[x].groupby(v, dropna=False).nunique() <= 1).all()):
            continue
        name, where = (x, g[x]) if per_size or seed_col is None else ("seeds", g[seed_col])
        at = "; ".join(f"{_value(val)} at {name} {', '.join(_value(w) for w in sorted(where[v == val].unique()))}"
                       for val in sorted(v.unique(), key=str))
        (stepped if per_size else mixed)[k] = at
    if mixed:
        named = "; ".join(f"{k} ({at})" for k, at in mixed.items())
        raise ValueError(f"{label}: the runs differ in {named}: two recipes, which one alpha would pool into one "
                         f"curve; fit them apart (by={[*keys, *mixed]!r}) or read one study's folders")
    if stepped:
        named = "; ".join(f"{k} ({at})" for k, at in stepped.items())
        warnings.warn(f"{label}: {named} changes with {x}; fitted as one curve, each size at its own setting (a "
                      f"budget raised for the larger sizes?); if the sizes come from two recipes, fit them apart "
                      f"(by={[*keys, *stepped]!r})", stacklevel=4)


def _group_table(g: pd.DataFrame, x: str, y: str, seed_col: str | None, label: str,
                 keys: list[str] = ()) -> pd.DataFrame:
    """One group (of ``keys``)'s (seed, size) table of log y: runs with y <= 0 dropped with a warning, repeated seeds
    averaged; runs without a seed, and runs of two recipes, refused."""
    if seed_col is not None:
        _require_seeds(g, x, seed_col, label)
    _require_one_recipe(g, x, seed_col, list(keys), label)
    nonpos = g[g[y] <= 0]
    if len(nonpos):
        warnings.warn(f"{label}: dropped {len(nonpos)} runs with {y} <= 0 (log undefined)", stacklevel=3)
        g = g[g[y] > 0]
    if seed_col is not None:
        g = one_run_per_seed(g, [x], [y], label, seed_col)
    return _seed_matrix(g, x, y, seed_col)


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


def _group_fit(table: pd.DataFrame, n_boot: int, offset: bool, rng: np.random.Generator, label: str) -> dict:
    """The fits of one group from its (seed, size) table of log y."""
    sizes = table.columns.to_numpy(float)
    values = [np.exp(table[c].dropna().to_numpy()) for c in table.columns]  # y of each size's runs
    logx = np.log(sizes)
    logm = table.mean().to_numpy()  # log of the geometric mean over seeds
    slope, intercept = _loglog_lines(logx, logm)
    if table.isna().to_numpy().any():  # a seed lacks a size: the slope within seeds (the same slope when none does)
        within = _within_seed_slope(logx, table.to_numpy())
        if within is not None:
            slope, intercept = within, logm.mean() - within * logx.mean()
    resid = logm - (intercept + slope * logx)
    ss_tot = ((logm - logm.mean()) ** 2).sum()
    out = {
        "alpha": float(slope), "prefactor": float(np.exp(intercept)),
        "r2": float(1 - (resid**2).sum() / ss_tot) if ss_tot > 0 else np.nan,
        "n_points": len(sizes), "n_seeds": min(len(v) for v in values),
        "x_min": sizes.min(), "x_max": sizes.max(),
        **_alpha_interval(sizes, logm, float(slope), table, label),
    }
    boot = None
    if max(len(v) for v in values) >= 2 and n_boot > 0 and offset:
        # (n_boot, n_sizes): resample the seeds within each size, then average (offset model only)
        boot = np.stack([v[rng.integers(0, len(v), (n_boot, len(v)))].mean(1) for v in values], axis=1)
    if offset:
        means = np.array([v.mean() for v in values])
        out.update(_offset_fit(sizes, means, boot, (out["prefactor"], out["alpha"]), label))
    return out


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


def overfitting_regime(df: pd.DataFrame, x: str = "dataset.n_train", by: list[str] | str | None = None,
                       tol: float = 0.01, train: str = "train_error",
                       seed_col: str | None = "seed") -> tuple[pd.DataFrame, pd.DataFrame]:
    """The declared fit-range rule of a learning curve: the paper fits "in the overfitting regime" (004, 4.2), the
    regime where the model interpolates its training set (4.1). A size enters a group's fit only when every run of
    the group at that size completed with a train error at most ``tol`` and none is flagged stalled or collapsed (a
    run with no train error, or one that did not complete, cannot show that its seed interpolated: it fails the
    size; so does a seed of the group, one of those ``seed_col`` holds at any of its sizes, with no run at the size);
    the range is the sizes that pass, from the largest down to the first that fails (a fit over a gap would mix
    regimes).

    Reads train errors only, never the test error being fitted. Returns (the rows inside the range, one row per
    (group, size) with ``runs``, ``max_train_error``, ``flagged``, ``unfit`` (runs with no train error or not
    completed), ``missing_seeds`` and ``in_range``)."""
    by = [by] if isinstance(by, str) else list(by or [])
    require_columns(df, x, train, *by)
    flagged = pd.Series(False, index=df.index)
    for f in ("stalled", "collapsed"):
        if f in df.columns:
            flagged |= df[f].fillna(False).astype(bool)
    unfit = df[train].isna()
    if "status" in df.columns:
        unfit |= df["status"] != "completed"
    d = df.assign(_flag=flagged, _unfit=unfit)
    keys = [*by, x]
    table = (d.groupby(keys, dropna=False)
             .agg(runs=(train, "size"), max_train_error=(train, "max"), flagged=("_flag", "sum"),
                  unfit=("_unfit", "sum")).reset_index())
    table["missing_seeds"] = 0
    if seed_col and seed_col in df.columns:  # the group's seeds (at any size) minus those the size holds
        expected = d.groupby(by, dropna=False)[seed_col].transform("nunique") if by else d[seed_col].nunique()
        seeds = d.assign(_expected=expected).groupby(keys, dropna=False).agg(
            present=(seed_col, "nunique"), expected=("_expected", "max"))
        table["missing_seeds"] = (seeds["expected"] - seeds["present"]).to_numpy()
    table["passes"] = ((table["max_train_error"] <= tol) & (table["flagged"] == 0) & (table["unfit"] == 0)
                       & (table["missing_seeds"] == 0))
    table["in_range"] = False
    for _, g in table.groupby(by, dropna=False) if by else [((), table)]:
        for i in g.sort_values(x, ascending=False).index:
            if not table.at[i, "passes"]:
                break
            table.at[i, "in_range"] = True
    keep = d.merge(table.loc[table["in_range"], keys], on=keys, how="inner").drop(columns=["_flag", "_unfit"])
    keep.attrs.update(df.attrs)  # a merge drops them: the fit of these runs reads the config columns to check recipes
    return keep, table.drop(columns="passes")


def _value(v) -> str:
    """A size as a reader writes it: 800, not 800.0."""
    return f"{v:g}" if isinstance(v, int | float | np.number) else str(v)


def _measured(df: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """The runs with both ``x`` and ``y``; warns with the count of those without either, and for ``y`` the sizes they
    are at: a size where every run lacks ``y`` leaves the curve, which nothing else would show (review 2026-12, F2)."""
    sizeless = int(df[x].isna().sum())
    if sizeless:
        warnings.warn(f"{sizeless} completed runs have no {x} and are left out of the fit (a null config value, "
                      "such as `dataset.n_train: null` for the whole set? fit x='n_train', the images each run's "
                      "summary records)", stacklevel=3)
    df = df.dropna(subset=[x])
    unmeasured = df[y].isna()
    if unmeasured.any():
        lacking = df.loc[unmeasured, x].value_counts()
        runs = df[x].value_counts()
        at = ", ".join(f"{_value(n)} ({lacking[n]} of {runs[n]}{' runs' if i == 0 else ''})"
                       for i, n in enumerate(sorted(lacking.index)))
        gone = [_value(n) for n in sorted(lacking.index) if lacking[n] == runs[n]]
        lost = (f"; {x} = {', '.join(gone)} {'loses' if len(gone) == 1 else 'lose'} every run and "
                f"{'drops' if len(gone) == 1 else 'drop'} out of the fit") if gone else ""
        warnings.warn(f"{int(unmeasured.sum())} completed runs have no {y} and are left out of the fit, at {x}: "
                      f"{at}{lost} (a summary without the metric: a run written before it was recorded, or a "
                      f"crash after training? re-evaluate those runs, or fit a metric every run records)",
                      stacklevel=3)
    return df[~unmeasured]


def fit_learning_curve(df: pd.DataFrame, x: str = "dataset.n_train", y: str = "test_error",
                       by: list[str] | str | None = None, seed_col: str | None = "seed", n_boot: int = 1000,
                       offset: bool = False, status: str | None = "completed", seed: int = 0,
                       errors: str = "raise") -> pd.DataFrame:
    """Fit ``y = prefactor * x^alpha`` per group of ``by`` on the geometric means over seeds.

    Returns one row per group: the ``by`` columns, ``alpha``, ``alpha_lo``, ``alpha_hi`` (95%
    t-interval over per-seed slopes, see the module docstring), ``prefactor``, ``r2`` (log-log),
    ``n_points`` (distinct sizes), ``n_seeds`` (fewest seeds at any size), ``n_seeds_ci`` (the seeds with a run at
    every size, which the t-interval is over; else the seeds whose own slopes it is over; 0 for a single seed's
    residual interval or none), ``x_min``, ``x_max``, ``ci_method``; with ``offset=True`` also the fit of
    ``y = offset_prefactor * x^offset_alpha + offset`` (on the arithmetic means) and its percentile-bootstrap ranges
    over ``n_boot`` resamples
    (``offset_lo``, ``offset_hi``, ``offset_alpha_lo``, ``offset_alpha_hi``). Rows whose status is not
    ``status`` are excluded (pass None to keep all). A group with fewer than 3 sizes raises ValueError, or with
    ``errors="skip"`` is left out with a warning. Each run at a size counts as one seed; runs repeating a
    (size, ``seed_col``) pair are averaged first, and a run with no ``seed_col`` raises ValueError, as do runs of one
    group and size that differ in a recipe key (a config key other than ``x``, the seed, ``by`` and runtime keys:
    group by it); a key that changes only between sizes is named in a warning.
    """
    by = [by] if isinstance(by, str) else list(by or [])
    require_columns(df, x, y, *by, seed_col)
    df = completed_only(df, "fit_learning_curve", status)
    df = _measured(df, x, y)
    rng = np.random.default_rng(seed)
    rows = []
    groups = df.groupby(by, dropna=False) if by else [((), df)]
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        label = ", ".join(f"{k}={v}" for k, v in zip(by, key, strict=True)) or "all runs"
        table = _group_table(g, x, y, seed_col, label, by)
        if table.shape[1] < 3:
            msg = (f"{label}: a power-law fit needs >= 3 distinct values of {x}, "
                   f"got {table.shape[1]} ({table.columns.tolist()})")
            if errors == "skip":
                warnings.warn(msg + "; group skipped", stacklevel=2)
                continue
            raise ValueError(msg)
        fit = _group_fit(table, n_boot, offset, rng, label)
        rows.append({**dict(zip(by, key, strict=True)), **fit})
    order = ["alpha", "alpha_lo", "alpha_hi", "prefactor", "r2", "n_points", "n_seeds", "n_seeds_ci", "x_min", "x_max"]
    if not rows:
        raise ValueError(f"no group has >= 3 distinct values of {x}")
    out = pd.DataFrame(rows)
    out = out[[*by, *order, *[c for c in out.columns if c not in order and c not in by]]]
    out.attrs.update(x=x, y=y, by=by)
    return out


def slope_difference(df: pd.DataFrame, by: str, a: object, b: object, x: str = "dataset.n_train",
                     y: str = "test_error", seed_col: str = "seed", level: float = 0.95,
                     status: str | None = "completed", paired: bool = False) -> dict:
    """alpha(a) - alpha(b) for two groups of column ``by`` (e.g. two architectures), with a Welch t-interval, or
    with ``paired`` the t-interval of the per-seed differences.

    Each seed with a run at every size the two groups share gives one log-log slope per group (as in
    :func:`seed_slope_interval`); the difference of the two groups' mean slopes gets Welch's t-interval (unequal
    variances, the seeds of the two groups taken as independent). A seed is not independent across groups in this
    framework: it draws the same training subset at a size for every model (``src.data.stratified_subset``) and
    the test set is shared, so the slopes of one seed may correlate; ``paired=True`` uses the seeds both groups
    have and tests their slope differences (one-sample t). A negative difference whose interval excludes 0 says
    ``a``'s learning curve is steeper. Returns ``diff``, ``lo``, ``hi``, ``p`` (two-sided), the mean slopes
    ``alpha_a``, ``alpha_b``, the seeds used ``n_a``, ``n_b`` and ``sizes``."""
    require_columns(df, by, x, y, seed_col)
    df = _measured(completed_only(df, "slope_difference", status), x, y)
    tables = {}
    for name in (a, b):
        g = df[df[by] == name]
        if g.empty:
            raise ValueError(f"slope_difference: no completed run has {by} = {name!r}")
        tables[name] = _group_table(g, x, y, seed_col, f"{by}={name}", [by])
    sizes = sorted(set(tables[a].columns) & set(tables[b].columns))
    if len(sizes) < 3:
        raise ValueError(f"slope_difference: {by} = {a!r} and {b!r} share {len(sizes)} sizes of {x} ({sizes}); "
                         "a slope needs >= 3")
    complete = {name: table[sizes].dropna() for name, table in tables.items()}
    if paired:
        both = complete[a].index.intersection(complete[b].index)
        complete = {name: c.loc[both] for name, c in complete.items()}
    slopes = {}
    for name, c in complete.items():
        if len(c) < 2:
            raise ValueError(f"slope_difference: {by} = {name!r} has {len(c)} seeds with a run at every "
                             f"shared size {sizes}{' (seeds both groups have)' if paired else ''}; an interval "
                             "needs >= 2")
        slopes[name] = _loglog_lines(np.log(np.asarray(sizes, float)), c.to_numpy())[0]
    test = (stats.ttest_1samp(slopes[a] - slopes[b], 0.0) if paired
            else stats.ttest_ind(slopes[a], slopes[b], equal_var=False))
    ci = test.confidence_interval(level)
    return {"diff": float(slopes[a].mean() - slopes[b].mean()), "lo": float(ci.low), "hi": float(ci.high),
            "p": float(test.pvalue), "alpha_a": float(slopes[a].mean()), "alpha_b": float(slopes[b].mean()),
            "n_a": len(slopes[a]), "n_b": len(slopes[b]), "sizes": sizes}
