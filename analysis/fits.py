"""Learning-curve power laws: error ~ prefactor * n^alpha (+ offset), fitted per group.

Point estimate: least squares in log-log on the geometric mean over seeds at each size (the mean of
log error), i.e. the pooled log-log fit of every run when each seed has a run at every size.

The 95% interval of ``alpha`` (:func:`analysis.fit_slopes.seed_slope_interval`) is a t-interval on per-seed slopes: each
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

The offset model ``a * n^alpha + c`` (4+ sizes) is fitted to the arithmetic means over seeds at each size; its ranges
(``offset_*_lo/hi``) are the 2.5 and 97.5 percentiles of the same fit over ``n_boot`` resamples of whole seeds: each
draws S rows of the (seed, size) table with replacement and averages them at every size (a seed lacking a size leaves
that size's mean to the drawn seeds that have it; a resample where no drawn seed has some size is skipped), since a
seed's subsets are nested across sizes and its errors move together. Resampling each size's runs on their own (before
review 2026-11-29) mixed seed 1 at one size with seed 3 at the next and drew a narrower range: on heads_depth's h1_d1
curve, a floor of 0.010-0.070, clearly above zero, that whole seeds put at 0-0.085. With 4 seeds this range is
no 95% interval: in 200 simulated studies of 4 seeds at 6 sizes (5% noise per run, with or without a per-seed
factor of log-sd 0.08 shared by a seed's sizes; 200 resamples each) it covered the planted exponent in 78% and the
floor in 76-77% (tests/test_analysis_coverage.py, marked slow: ``pytest -m slow -k offset_models_bootstrap``). Read
it as a sensitivity check.
"""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
from scipy import stats

from analysis.fit_inputs import _group_table, _measured
from analysis.fit_offset import _offset_fit
from analysis.fit_shape import curvature_check
from analysis.fit_slopes import _alpha_interval, _loglog_lines, _within_seed_slope
from analysis.frames import completed_only, one_run_per_seed, require_columns


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


def _seed_resamples(y: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(n_boot, n_sizes) bootstrap means of a (seed, size) table ``y``: each resample draws S whole seeds (rows) with
    replacement and averages them at every size, so a seed's runs stay together across the sizes (its subsets are
    nested, its errors correlated). A seed lacking a size leaves that size's mean to the drawn seeds that have it;
    a size none of the drawn seeds has is NaN (the offset fit skips that resample)."""
    drawn = y[rng.integers(0, y.shape[0], (n_boot, y.shape[0]))]  # (n_boot, S, n_sizes)
    present = np.isfinite(drawn)
    count = present.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, np.where(present, drawn, 0.0).sum(axis=1) / count, np.nan)


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
        **curvature_check(logx, table, resid),
    }
    boot = None
    if table.shape[0] >= 2 and n_boot > 0 and offset:
        boot = _seed_resamples(np.exp(table.to_numpy()), n_boot, rng)
    if offset:
        means = np.array([v.mean() for v in values])
        out.update(_offset_fit(sizes, means, boot, label))
    return out


def overfitting_regime(df: pd.DataFrame, x: str = "dataset.n_train", by: list[str] | str | None = None,
                       tol: float = 0.01, train: str = "train_error",
                       seed_col: str | None = "seed") -> tuple[pd.DataFrame, pd.DataFrame]:
    """The declared fit-range rule of a learning curve: the paper fits "in the overfitting regime" (004, 4.2), the
    regime where the model interpolates its training set (4.1). A size enters a group's fit only when every run of
    the group at that size completed with a train error at most ``tol`` and none is flagged stalled or collapsed (a
    run with no train error, or one that did not complete, cannot show that its seed interpolated: it fails the
    size; so does a seed of the group, one of those ``seed_col`` holds at any of its sizes, with no run at the size,
    and a size another group has, inside this group's smallest to largest size, where this group has no run at all);
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
    if by:  # a size another group has, inside this group's own span, where the group has no run: every seed missing
        sizes = np.sort(table[x].unique())
        absent = []
        for key, g in d.groupby(by, dropna=False):
            key = key if isinstance(key, tuple) else (key,)
            lo, hi, have = g[x].min(), g[x].max(), set(g[x])
            seeds = g[seed_col].nunique() if seed_col and seed_col in df.columns else 0
            absent += [{**dict(zip(by, key, strict=True)), x: n, "runs": 0, "max_train_error": np.nan, "flagged": 0,
                        "unfit": 0, "missing_seeds": seeds} for n in sizes if lo < n < hi and n not in have]
        if absent:
            table = pd.concat([table, pd.DataFrame(absent)], ignore_index=True).sort_values(keys, ignore_index=True)
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
    over ``n_boot`` resamples of whole seeds (``offset_lo``, ``offset_hi``, ``offset_alpha_lo``, ``offset_alpha_hi``;
    no 95% interval with 3-4 seeds, see the module docstring). Rows whose status is not
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
