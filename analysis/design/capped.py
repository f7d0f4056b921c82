"""A fixed-budget arm completed by the convergence arm's runs that reached the same cap (``--capped-from``)."""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from analysis.design.grid import (
    CURVE_KEYS,
    NOISE,
    SEED,
    STOP_RULE_KEYS,
    _declared_curves,
    _declared_grids,
    grid_values,
    recipe_keys,
)
from analysis.double_descent import width_column
from analysis.frames import _norm


def with_capped(main: pd.DataFrame, capped: pd.DataFrame, width: str | None = None) -> pd.DataFrame:
    """A fixed-budget arm's runs (``main``) with the runs of another arm (``capped``: the convergence arm) that ran
    to the same epoch cap, for each (curve, width, seed) ``main`` holds no run of.

    A stop rule that never fired did not change the training (bitwise: ``tests/test_stop_rules.py``), so a run that
    reached the cap under the convergence rule is the fixed-budget run of that cap, and the fixed arm's own sweep
    need train only what the rule ended early. Taken: completed runs that trained the whole ``trainer.max_epochs`` of
    ``main``'s (stopped by it, or by the rule at the cap's own evaluation: ``_ran_to``), in one of ``main``'s curves
    (the curve keys but the stop rule's); they join ``main``'s curve (``trainer.converge_epochs`` set to its value).
    A pair ``main`` holds keeps ``main``'s run, and a pair its study declared and has not trained yet stays missing
    (its sweep will train it).
    The other runs of ``capped`` at pairs ``main`` lacks join too, as not finished (a run the rule ended early gets
    status ``ended early``), so ``unfinished`` counts them until the fixed arm's sweep trains them. Every config key
    that ``main`` holds at one value must have that value in ``capped`` (runtime and stop-rule keys aside): another
    dataset, model or optimizer setting (or a configured precision or device) is another recipe, and raises; the
    realised device and precision of ``auto`` are the test's to check (:func:`one_recipe` refuses a curve whose
    finished runs trained on two devices; its output names a precision mix). The width column is read from both
    arms: the fixed arm alone may hold one width (its first runs; a rule that ended only one width early). Where the
    fixed arm's study declares its seeds, only runs of those seeds are taken, and the test expects every width at
    them (:func:`peak_tests`): a declared seed the convergence arm never ran is missing at the widths borrowed."""
    width = width or width_column(pd.concat([main, capped], ignore_index=True))
    budget = main["trainer.max_epochs"].dropna().unique() if "trainer.max_epochs" in main else []
    if len(budget) != 1:
        raise ValueError("a fixed-budget arm has one trainer.max_epochs; these runs have "
                         f"{sorted(budget) or 'none'}: pass one arm's sweep dirs")
    rule = [v for v in (main["trainer.converge_epochs"].dropna().unique() if "trainer.converge_epochs" in main else [])
            if v]  # 0 and null both leave the rule off (src/stop_rules.py)
    if len(rule):
        raise ValueError("the fixed-budget arm's runs stop by convergence (trainer.converge_epochs = "
                         f"{', '.join(f'{float(v):g}' for v in sorted(rule))}): a fixed budget is the run with "
                         "the rule off; run its sweep with trainer.converge_epochs=null")
    main = main.copy()
    if "trainer.converge_epochs" in main:  # 0 and null alike: one value, so they never split a curve
        main["trainer.converge_epochs"] = np.nan
    own_ok = _ran_to(main, budget[0])
    main.loc[~own_ok & (main["status"] == "completed"), "status"] = "ended early"  # max_steps, max_wall_s
    main.loc[~own_ok, ["train_error", "test_error"]] = np.nan
    keys = [k for k in (*CURVE_KEYS, NOISE) if k not in STOP_RULE_KEYS and k in main and k in capped]
    ids = [*keys, width, SEED]

    def tuples(df: pd.DataFrame, cols: list[str]) -> list[tuple]:
        return [tuple(_norm(v) for v in row) for row in df[cols].itertuples(index=False, name=None)]

    # the arm's curves: each key at the values its runs hold or its study declared (a weight decay not begun yet)
    allowed = {k: set(main[k].map(_norm)) for k in keys}
    grids = _declared_grids(main)  # read once: the storage is opened per study
    for grid in grids.values():
        for k in keys:
            allowed[k] |= grid_values(grid, k, main.iloc[:0])
    same = capped.loc[np.array([all(v in allowed[k] for k, v in zip(keys, t, strict=True))
                                for t in tuples(capped, keys)], dtype=bool)]
    if not len(same):
        raise ValueError("--capped-from holds no run of the fixed-budget arm's curves ("
                         + "; ".join(f"{k} = {sorted(map(str, allowed[k]))} here, "
                                     f"{sorted({str(_norm(v)) for v in capped[k]})} there" for k in keys)
                         + "): pass the convergence arm of the same study, budget and training-set size")
    seeds = {_norm(v) for grid in grids.values() for v in grid.get(SEED, [])}
    if seeds:  # the seeds the fixed arm declared: another seed of the convergence arm joins no pairing here
        same = same[same[SEED].map(_norm).isin(seeds)]
    declared = _declared_curves(main, keys, width, grids)  # a pair the arm's sweep declared is its own
    held = set(tuples(main, ids)) | {(*curve, w, s) for curve, pairs in declared.items() for w, s in pairs}
    c = same.loc[np.array([i not in held for i in tuples(same, ids)], dtype=bool)]
    differ = _recipe_differences(main, same, c, width, keys)
    if differ:
        raise ValueError("--capped-from runs of another recipe than the fixed-budget arm's: "
                         + "; ".join(f"{k} = {v} there, {here!r} here" for k, (v, here) in differ.items())
                         + ". Pass the convergence arm of the same study, device and precision")
    if c.duplicated(ids).any():  # a failed attempt beside its completed rerun: the completed run is the pair's
        warnings.warn(f"--capped-from: {int(c.duplicated(ids).sum())} runs repeat a (curve, width, seed); a "
                      "completed one of each is taken", stacklevel=2)
        c = c.assign(_done=c["status"] == "completed").sort_values("_done", ascending=False, kind="stable")
        c = c[~c.duplicated(ids)].drop(columns="_done").sort_index()
    c = c.copy()
    capped_ok = _ran_to(c, budget[0])
    c.loc[~capped_ok & (c["status"] == "completed"), "status"] = "ended early"
    for col in ("train_error", "test_error"):
        c.loc[~capped_ok, col] = np.nan
    if "trainer.converge_epochs" in main:
        c["trainer.converge_epochs"] = main["trainer.converge_epochs"].iloc[0]
    out = pd.concat([main, c], ignore_index=True)
    own = set(zip(main.get("study_storage", []), main.get("study_name", []), strict=True))
    borrowed = set(zip(c.get("study_storage", []), c.get("study_name", []), strict=True)) - own
    out.attrs = {**main.attrs, "borrowed_studies": sorted(borrowed, key=str)}  # their grids declare no curve here
    return out


def _ran_to(df: pd.DataFrame, budget) -> pd.Series:
    """Runs that completed the whole epoch budget: stopped at ``budget`` epochs by ``max_epochs``, or by a convergence
    rule that fired at that cap's evaluation (the run records ``converged`` or ``stalled`` there, having trained every
    epoch of the budget); not by a convergence rule before the cap, ``max_steps`` or ``max_wall_s``."""
    reason = df["stop_reason"] if "stop_reason" in df else pd.Series(None, index=df.index, dtype=object)
    ok = (df["status"] == "completed") & (pd.to_numeric(df.get("trainer.max_epochs"), errors="coerce") == budget)
    if "epochs" not in df:  # no epoch count: only the cap's own reason says the run trained the whole budget
        return ok & (reason == "max_epochs")
    return ok & reason.isin(["max_epochs", "converged", "stalled"]) & (pd.to_numeric(df["epochs"], errors="coerce")
                                                                       == budget)


NOT_SET = "(not set)"  # a config key a run's config does not hold


def _recipe_differences(main: pd.DataFrame, same: pd.DataFrame, taken: pd.DataFrame, width: str, curves: list[str]
                        ) -> dict[str, tuple[list[str], object]]:
    """Recipe keys where the other arm's runs differ from the fixed arm's (``main``): key -> (their values, ours).

    A key ``main`` holds at one value must have it in every run ``taken``, unless the other arm's runs of the same
    curves (``same``) tie it to the width (one value per width, several in all: a width's preset, as the ViT's
    mlp_dim = 2 x dim); such a key, and any ``main`` holds at one value per width, must agree at each width both arms
    hold. The ``curves`` keys (weight decay, noise: one curve per value) are not compared. A key one arm's configs
    lack altogether differs where the other sets it (not null) in the runs taken (``NOT_SET`` on the side without).
    """
    def norm(s: pd.Series) -> pd.Series:
        return s.map(_norm)

    w_main, w_same = norm(main[width]), norm(same[width])

    def per_width(df: pd.DataFrame, w: pd.Series, k: str) -> bool:
        return bool((norm(df[k]).groupby(w).nunique(dropna=False) <= 1).all())

    out = {}
    free = {*STOP_RULE_KEYS, width, SEED, *curves}
    for k in recipe_keys(same, free):  # a key the other arm sets and the fixed arm's configs lack altogether (review
        # 2026-11-29, analysis: it was never compared, here nor in the test, whose config columns are main's)
        if k not in main:
            theirs = sorted({str(v) for v in norm(taken[k])} - {"nan"})
            if theirs:
                out[k] = (theirs, NOT_SET)
    for k in recipe_keys(main, free):
        if k not in same:  # and one the fixed arm sets that the other arm's configs lack
            if len(taken) and main[k].notna().any():
                here = main[k].dropna().iloc[0]
                out[k] = ([NOT_SET], here.item() if isinstance(here, np.generic) else here)
            continue
        ours = norm(main[k])
        tied = same[k].notna().any() and norm(same[k]).nunique() > 1 and per_width(same, w_same, k)
        if ours.nunique(dropna=False) == 1 and not tied:
            theirs = {str(v) for v in norm(taken[k])} - {str(ours.iloc[0])}
            if theirs:
                out[k] = (sorted(theirs), main[k].iloc[0])
        elif per_width(main, w_main, k):
            at = dict(zip(w_main, ours, strict=True))
            for wv, v in zip(w_same, norm(same[k]), strict=True):
                if wv in at and str(v) != str(at[wv]):
                    out.setdefault(k, ([], at[wv]))[0].append(str(v))
    return {k: (sorted(set(v)), here) for k, (v, here) in out.items()}
