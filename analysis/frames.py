"""What the analyses ask of a runs frame: named columns, completed runs, one run per seed, its recipe keys."""
from __future__ import annotations

import difflib
import warnings
from collections.abc import Iterable

import pandas as pd

from src import run_contract as contract  # the run directory's runtime keys, shared with the trainer


class MissingColumnError(KeyError):
    """A requested column is not in the frame; the message lists the close names."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


def require_columns(df: pd.DataFrame, *columns: str | None) -> None:
    """Raise MissingColumnError naming each missing column and the closest existing ones."""
    existing = [str(c) for c in df.columns]
    for col in columns:
        if col is None or col in df.columns:
            continue
        close = difflib.get_close_matches(col, existing, n=5, cutoff=0.5)
        hint = f"; close names: {', '.join(close)}" if close else ""
        raise MissingColumnError(f"column '{col}' not found{hint} ({len(existing)} columns in all)")


def completed_only(df: pd.DataFrame, who: str, status: str | None = "completed") -> pd.DataFrame:
    """Keep rows whose status equals ``status`` (None keeps all); print how many were excluded."""
    if status is None or "status" not in df.columns:
        return df
    keep = df["status"] == status
    if (~keep).any():
        counts = df.loc[~keep, "status"].fillna("unknown").value_counts().to_dict()
        detail = ", ".join(f"{n} {s}" for s, n in counts.items())
        print(f"{who}: excluded {int((~keep).sum())} runs with status != {status} ({detail})")
    return df[keep]


def one_run_per_seed(df: pd.DataFrame, keys: list[str], metrics: list[str], who: str,
                     seed_col: str = "seed") -> pd.DataFrame:
    """``df`` with runs that repeat a (``keys``, seed) averaged into one row, so a repeat (the same grid read from
    two folders, a rerun beside the first run) never counts as an extra seed; warns when it averages.

    Runs that differ in a recipe key (a config key not in ``keys``, runtime keys aside: another dropout, weight
    decay or stop limit; not the data file's path, one of ``NOT_RECIPE``) are not repeats of one seed but two
    settings: raises, naming the key, since averaged they would read as one seed of a smaller spread
    (``analysis.design.spread``'s power with it)."""
    if seed_col not in df.columns or df[seed_col].isna().all():
        return df
    cols = [*keys, seed_col]
    dup = df.duplicated(cols, keep=False) & df[seed_col].notna()  # runs without a seed are never repeats
    if not dup.any():
        return df
    differ = _recipe_differences(df[dup], cols)
    if differ:
        named = named_values(differ)
        raise ValueError(f"{who}: runs of one ({', '.join(cols)}) differ in {named}: two recipes, not one seed run "
                         f"twice; keep them apart (by={[*differ]!r}, or a groupby on them) or read one study's folders")
    warnings.warn(f"{who}: {int(dup.sum())} runs repeat a seed of the same setting ({', '.join(cols)}); each "
                  "seed's runs are averaged and counted once", stacklevel=3)
    merged = df[dup].groupby(cols, dropna=False, sort=False, as_index=False)[metrics].mean()
    return pd.concat([df.loc[~dup, [*cols, *metrics]], merged], ignore_index=True)


# where the run read its data and which device trained it are not the recipe: the same grid read from a committed
# copy and a live one differs in dataset.root (as design.compare exempts them)
NOT_RECIPE = (*contract.STUDY_RUNTIME_KEYS, "hydra", "logger", "trial", "dataset.root", "trainer.device",
              "trainer.compile")


def recipe_columns(df: pd.DataFrame, exclude: Iterable[str] = ()) -> list[str]:
    """The config columns of ``df`` (``df.attrs['config_columns']``, as :func:`load_runs` sets them; none for a frame
    without) that define what a run computed: not a key of ``NOT_RECIPE`` (or under one), not in ``exclude``."""
    exclude = set(exclude)
    return [k for k in df.attrs.get("config_columns", []) if k in df and k not in exclude
            and not any(k == r or k.startswith(r + ".") for r in NOT_RECIPE)]


def require_one_recipe(df: pd.DataFrame, keys: list[str], who: str, by: list[str] | None = None,
                       seed_col: str = "seed") -> None:
    """Refuse runs of one group of ``keys`` (one point of a curve, one row of a table) that differ in a recipe key
    (:func:`recipe_columns`; the seed aside): weight decay 0 on seeds 0-2 and 0.01 on seeds 3-5 would read as one
    setting of six seeds. :func:`one_run_per_seed` finds two recipes only among repeats of one seed, so seeds that do
    not overlap passed it (review 2026-11-29 session 53, figures review); ``analysis.fit_inputs`` refuses them in a
    learning-curve fit likewise. ``by``: the caller's grouping argument, which the message extends (default ``keys``).
    A frame without ``config_columns`` is not checked."""
    differ = _recipe_differences(df, keys, exclude=(seed_col,))
    if differ:
        named = named_values(differ)
        raise ValueError(f"{who}: runs of one ({', '.join(keys)}) differ in {named}: two recipes, which one point "
                         f"would average as one setting's seeds; keep them apart (add {', '.join(differ)} to the "
                         f"groupby: by={[*(keys if by is None else by), *differ]!r}) or read one study's folders")


def warn_mixed_recipes(df: pd.DataFrame, keys: list[str], who: str, seed_col: str = "seed") -> None:
    """Warn where runs of one group of ``keys`` differ in a recipe key (:func:`require_one_recipe`'s check): for a
    table that pools them as asked, and says so, where a curve or a fit refuses."""
    differ = _recipe_differences(df, keys, exclude=(seed_col,))
    if differ:
        named = named_values(differ)
        warnings.warn(f"{who}: rows of ({', '.join(keys)}) average runs that differ in {named}: their mean and std are "
                      f"over two recipes, not one setting's seeds; add {', '.join(differ)} to by to keep them apart",
                      stacklevel=3)


def named_values(differ: dict[str, list[str]]) -> str:
    """``key (value, value); key (...)``: the recipe keys found to differ, for a message."""
    return "; ".join(f"{k} ({', '.join(v)})" for k, v in differ.items())


def _recipe_differences(df: pd.DataFrame, cols: list[str], exclude: Iterable[str] = ()) -> dict[str, list[str]]:
    """Config keys (runtime keys and ``exclude`` aside) whose value differs within a group of ``cols`` -> the values
    seen."""
    keys = recipe_columns(df, [*cols, *exclude])
    out = {}
    for k in keys:
        v = df[k].map(_norm)
        groups = v.groupby([df[c] for c in cols], dropna=False) if cols else v.groupby(lambda _: 0)  # no key: one group
        if (groups.nunique(dropna=False) > 1).any():
            out[k] = sorted({str(x) for x in v})
    return out


def _norm(v):
    """One spelling of a config value: 8, 8.0 and "8" alike; NaN and None alike."""
    if v is None or (isinstance(v, float) and v != v):
        return "nan"
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)
