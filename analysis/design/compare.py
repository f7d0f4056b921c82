"""Two grids of one recipe trained apart (two devices) side by side: a device check, not a test."""
from __future__ import annotations

import pandas as pd

from analysis.design.grid import CURVE_KEYS, NOISE, SEED, _declared_grids, one_recipe, recipe_keys
from analysis.double_descent import width_column
from analysis.frames import _norm, completed_only
from analysis.tables import to_markdown


def compare(a: pd.DataFrame, b: pd.DataFrame, width: str | None = None) -> pd.DataFrame:
    """Two grids of one recipe trained apart (on two devices, say): per (curve, noise, width, seed) both finished,
    the test error of ``b`` minus ``a``'s (``diff``). A device check, not a test: it says how far one grid's runs
    stand from the other's, beside the seed spread. Each grid must pass what the declared test asks of one
    (``one_recipe``: one recipe on one device, each point once); across the two, raises where a recipe key takes
    other values in one grid than in the other, or is set in one only (``dataset.root`` and ``trainer.device``
    aside: a dataset's place and the device asked for; that the two places hold the same data is not checked)."""
    width = width or width_column(a)
    for df in (a, b):
        one_recipe(df, width, _declared_grids(df))
    a, b = completed_only(a, "compare (first)"), completed_only(b, "compare (second)")
    keys = [k for k in (*CURVE_KEYS, NOISE) if k in a and k in b]
    free = {width, SEED, *keys, "dataset.root", "trainer.device"}

    def values(df: pd.DataFrame, k: str) -> list[str]:
        return sorted({str(_norm(v)) for v in df[k]}) if k in df else ["(not set)"]
    recipe = dict.fromkeys([*recipe_keys(a, free), *recipe_keys(b, free)])
    differ = {k: (values(a, k), values(b, k)) for k in recipe}
    differ = {k: v for k, v in differ.items() if v[0] != v[1]}
    if differ:
        raise ValueError("compare: the two grids differ in their recipe: "
                         + "; ".join(f"{k} = {x} against {y}" for k, (x, y) in differ.items()))
    ids = [*keys, width, SEED]

    def points(df: pd.DataFrame) -> pd.DataFrame:  # the ids in one spelling in both (8, 8.0 and "8" alike)
        return df[[*ids, "test_error", "train_error"]].assign(**{k: df[k].map(_norm) for k in ids})
    pairs = points(a).merge(points(b), on=ids, suffixes=("_a", "_b"))
    if pairs.empty:
        raise ValueError(f"compare: no point ({', '.join(ids)}) finished in both grids")
    return pairs.assign(diff=pairs["test_error_b"] - pairs["test_error_a"])


def compare_markdown(pairs: pd.DataFrame, width: str) -> str:
    """The shared points' count, mean and sd of the difference, overall and per curve and width."""
    keys = [c for c in pairs.columns if c not in (width, SEED) and not c.endswith(("_a", "_b")) and c != "diff"
            and pairs[c].nunique() > 1]  # the keys that tell the curves apart
    per = (pairs.groupby([*keys, width])["diff"].agg(n="count", mean="mean", sd="std", max_abs=lambda d: d.abs().max())
           .reset_index())
    d = pairs["diff"]
    return ("## Two grids of one recipe: test error of the second minus the first, per shared (curve, width, seed)\n\n"
            f"{len(d)} points both finished: mean {d.mean():+.4f}, sd {d.std():.4f} a run, largest |difference| "
            f"{d.abs().max():.4f}. A device check, not a test.\n\n" + to_markdown(per) + "\n")
