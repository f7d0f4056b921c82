"""The runs a learning-curve fit reads: measured, seeded, one recipe per group, as a (seed, size) table of log y."""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from analysis.frames import _norm, one_run_per_seed, recipe_columns


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
    """Refuse a group whose runs at one size differ in a recipe key (:func:`analysis.frames.recipe_columns`; ``x``, the
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
