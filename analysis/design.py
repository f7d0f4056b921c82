"""Study design: can a double-descent grid see the peak it tests? Pilot first, declare the test, report the power.

``python -m analysis.design plan PILOT_DIR...`` reads a pilot sweep (a few widths, two or three training-set sizes,
an lr ladder, two seeds) and prints, per training-set size and lr:

- the **interpolation threshold**: the smallest width whose mean final train error (on the labels trained on) is
  at most ``tol``, over the runs that did not collapse, and how many grid widths below it underfit;
- the **collapse table**: runs per (lr, width) and how many ended flagged ``stalled``/``collapsed``
  (``analysis.load.result_flags``);
- the **lr rule**, stated before it is applied and never looking at test error: the largest lr of the ladder under
  which no pilot run at the threshold widths (the grid widths within a factor 2 of that lr's threshold) collapsed or
  stalled;
- the **seed spread** at the chosen lr: the standard deviation over seeds of each width's test error, and of the
  declared statistic below, pooled over the pilot's curves;
- the **smallest detectable peak** for k seeds (``mde``), and a suggested main grid around the threshold.

The declared statistic of a peak (``peak_contrast``): per seed, the test error at the tested width W minus the
test error at its left neighbour (the nearest grid width at most W/2) and minus that at its right neighbour (the
nearest at least 2W); seeds share their data subset and noisy labels across widths, so both contrasts are paired.
A peak stands above both: the test is the intersection-union test of two one-sided paired t-tests over seeds
("W above left" and "W above right", each at level ``alpha`` = 0.05; its p is the larger p), and the peak's
``height`` is the smaller mean contrast. A curve that only bends (falls slower at W) is not a peak.

W is the **critical width** (``center='critical'``): the widest grid width below the threshold, the model that
just fails to fit its labels, where Nakkiran et al.'s peak sits (their critical regime: the model can barely fit
the training set); ``center='threshold'`` tests at T itself and is reported as a sensitivity check. W comes from the
main run's train errors only, so the widths tested are fixed without looking at any test error. The power figure
uses the seed sds of the two contrasts, measured the same way on the pilot (``Spread.mde``, ``mde_sides``: a peak
needs both tests, each with the power of its own sd, jointly 0.8; where no pilot contrast had a neighbour on each
side, sqrt(2) x one width's seed sd, ``Spread.power_sd``, and the output says which).

``python -m analysis.design test MAIN_DIR... --pilot PILOT_DIR... --effect 0.05`` applies exactly that test to
the main run, and turns it into a verdict that states its power (``verdict``): *reproduced* where the contrast is
significant; *not reproduced* only where it is not and the smallest effect detectable with the main run's seeds,
from the pilot's spread, is below the published effect; otherwise *inconclusive*, with what would settle it.
A flagged (collapsed or stalled) run at one of the three widths makes the verdict inconclusive: a failed
training is not a test-error value. A run that ended inside a loss spike (``ended_in_spike``: a learned model read
at a transient) is read as declared, at its final errors, but the verdict says "fragile" where such runs decide it:
where reading each run's train error as its recent median moves the tested width (``spike_centre``), or where
leaving out their seeds turns a peak into none or no peak into one. An **unfinished grid** makes the verdict
inconclusive too (``unfinished``): the critical width comes from every declared seed's train errors and the power
from the declared seeds, so while any run of a curve's grid (the
widths x seeds its sweep declared, read from the study's storage, else those its runs hold) has not finished, the
verdict is "inconclusive (grid unfinished: 46 of 48 runs finished, 2 stopped)"; the contrast on the seeds that
happened to finish first is printed but is not the declared test. Records that are not one grid are refused
before any test (``one_recipe``): a curve whose runs trained on two devices, or at one width under two recipes (a
config key other than the curve keys, width, seed and runtime keys), or whose widths differ in such a key (a model
key that takes a different value at each width, a ViT's MLP size, aside), a (curve, width, seed) with two finished runs,
finished runs outside the grid their study declared. A finished run with no test or train error is named and makes
the verdict inconclusive (``unscored``): it is not a seed to drop. Mixes the test does not refuse are named after
its table: precisions (``precision_note``) and machines (``machine_note``: CPU or GPU models of one device type,
from the summaries' ``machines``). The power figure's pilot sd is printed with its 95% interval,
and each curve's own contrast sd beside it (an observation: the power was declared from the pilot's).

A fixed-budget arm whose sweep trained only the runs the convergence rule ended early names the convergence arm's
sweeps with ``--capped-from``: their runs that reached the same cap stand for the rest of its grid (``with_capped``).

``python -m analysis.design compare A_DIR... --against B_DIR...`` sets two grids of one recipe trained apart (a CPU
and a GPU grid of one sweep, which the test never mixes) side by side: per (curve, width, seed) both finished, B's
test error minus A's, overall and per width (``compare``). A device check beside the seed spread, not a test.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import warnings
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy import optimize, stats

from analysis.double_descent import descent_curves, width_column
from analysis.load import _norm, completed_only, load_runs, one_run_per_seed, require_columns, studies_of
from analysis.tables import to_markdown
from src.run_contract import SPIKE_RISE, SPIKE_WINDOW, STUDY_RUNTIME_KEYS

NOISE = "label_noise.p"
LR = "optimizer.lr"
SEED = "seed"
# keys that split a pilot or main run into separate curves when they take several values
CURVE_KEYS = ("dataset.n_train", "optimizer.lr", "optimizer.weight_decay", "trainer.converge_epochs",
              "trainer.max_epochs")
ALPHA, POWER = 0.05, 0.8


def curve_keys(df: pd.DataFrame) -> list[str]:
    """The keys of ``CURVE_KEYS`` that vary in ``df`` (one curve per combination, and per noise level)."""
    return [k for k in CURVE_KEYS if k in df.columns and df[k].nunique(dropna=False) > 1]


STOP_RULE_KEYS = ("trainer.converge_epochs", "trainer.converge_tol")  # what the two arms may differ in


def recipe_keys(df: pd.DataFrame, free: tuple | set = ()) -> list[str]:
    """The config keys of ``df`` that define its recipe: not runtime keys (``STUDY_RUNTIME_KEYS``, ``hydra.*``,
    ``logger.*``, ``trial.*``) and not in ``free`` (what a grid varies). The stop limits (``max_epochs``,
    ``max_steps``, ``max_wall_s``) are the recipe's: a run stopped by one still ends ``completed``."""
    skip = (*STUDY_RUNTIME_KEYS, "hydra", "logger", "trial")
    return [k for k in df.attrs.get("config_columns", []) if k in df and k not in free
            and not any(k == r or k.startswith(r + ".") for r in skip)]


def curve_name(keys: list[str], key) -> str:
    """``k=v, ...`` for one curve of a ``groupby(keys)``."""
    return ", ".join(f"{k}={v}" for k, v in zip(keys, np.atleast_1d(key), strict=True))


def with_capped(main: pd.DataFrame, capped: pd.DataFrame, width: str | None = None) -> pd.DataFrame:
    """A fixed-budget arm's runs (``main``) with the runs of another arm (``capped``: the convergence arm) that ran
    to the same epoch cap, for each (curve, width, seed) ``main`` holds no run of.

    A stop rule that never fired did not change the training (bitwise: ``tests/test_stop_rules.py``), so a run that
    reached the cap under the convergence rule is the fixed-budget run of that cap, and the fixed arm's own sweep
    need train only what the rule ended early. Taken: completed runs stopped by ``max_epochs`` at the same
    ``trainer.max_epochs`` as ``main``'s, in one of ``main``'s curves (the curve keys but the stop rule's); they
    join ``main``'s curve (``trainer.converge_epochs`` set to its value). A pair ``main`` holds keeps ``main``'s run,
    and a pair its study declared and has not trained yet stays missing (its sweep will train it).
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
    """Runs that completed the whole epoch budget: stopped by ``max_epochs`` at ``budget`` epochs (not by a
    convergence rule, ``max_steps`` or ``max_wall_s``)."""
    ok = ((df["status"] == "completed") & (df.get("stop_reason") == "max_epochs")
          & (pd.to_numeric(df.get("trainer.max_epochs"), errors="coerce") == budget))
    if "epochs" in df:
        ok &= pd.to_numeric(df["epochs"], errors="coerce") == budget
    return ok

def _recipe_differences(main: pd.DataFrame, same: pd.DataFrame, taken: pd.DataFrame, width: str, curves: list[str]
                        ) -> dict[str, tuple[list[str], object]]:
    """Recipe keys where the other arm's runs differ from the fixed arm's (``main``): key -> (their values, ours).

    A key ``main`` holds at one value must have it in every run ``taken``, unless the other arm's runs of the same
    curves (``same``) tie it to the width (one value per width, several in all: a width's preset, as the ViT's
    mlp_dim = 2 x dim); such a key, and any ``main`` holds at one value per width, must agree at each width both arms
    hold. The ``curves`` keys (weight decay, noise: one curve per value) are not compared."""
    def norm(s: pd.Series) -> pd.Series:
        return s.map(_norm)

    w_main, w_same = norm(main[width]), norm(same[width])

    def per_width(df: pd.DataFrame, w: pd.Series, k: str) -> bool:
        return bool((norm(df[k]).groupby(w).nunique(dropna=False) <= 1).all())

    out = {}
    for k in recipe_keys(main, {*STOP_RULE_KEYS, width, SEED, *curves}):
        if k not in same:
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


def _flagged(df: pd.DataFrame) -> pd.Series:
    out = pd.Series(False, index=df.index)
    for f in ("stalled", "collapsed"):
        if f in df.columns:
            out |= df[f].fillna(False).astype(bool)
    return out


def _declared_grids(df: pd.DataFrame) -> dict[tuple[str, str], dict]:
    """(study_storage, study_name) -> the grid that study declared (the sweeper's record), for every study the runs
    name whose storage opens and holds one; a study that cannot be read warns and is left out."""
    from hydra_plugins.vitsweep_sweeper.protocol import declared_grid

    out = {}
    for storage, name, _, found in studies_of(df):
        try:
            grid = declared_grid(found, name)
        except Exception as e:  # moved storage, another machine's server: the runs' own grid is used instead
            warnings.warn(f"cannot read the grid study '{name}' declared at {storage} ({e}); counting the widths and "
                          "seeds its runs hold", stacklevel=3)
            continue
        if grid:
            out[(storage, name)] = grid
    return out


def grid_values(grid: dict, key: str, runs: pd.DataFrame) -> set:
    """The values (``_norm``-spelled) a study's declared ``grid`` gives ``key``: its own entry; for ``label_noise.p``
    the ``p`` of each ``label_noise`` group it chose (conf/label_noise/<name>.yaml); where it declares neither, the
    values its ``runs`` hold (a null one too: ``dataset.n_train: null`` is the whole training set)."""
    if grid.get(key):
        return {_norm(v) for v in grid[key]}
    if key == NOISE and grid.get("label_noise"):
        return {_norm(_noise_p(g)) for g in grid["label_noise"]}
    return {_norm(v) for v in runs[key]} if key in runs else set()


def _noise_p(group: str) -> float:
    """``p`` of the label_noise config group ``group`` (conf/label_noise/<group>.yaml)."""
    from pathlib import Path

    import yaml

    path = Path(__file__).resolve().parents[1] / "conf" / "label_noise" / f"{group}.yaml"
    try:
        return float(yaml.safe_load(path.read_text())["p"])
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"the grid declares label_noise={group}, whose p cannot be read from {path} ({e}): "
                         "run the analysis from the checkout the study ran from") from e


def declared_pairs(grid: dict, runs: pd.DataFrame, width: str) -> set[tuple[float, float]]:
    """(width, seed) pairs of a study's declared ``grid``; where it declares none, those ``runs`` hold."""
    widths = [float(w) for w in grid.get(width, runs[width].dropna().unique())]
    seeds = [float(s) for s in grid.get(SEED, runs[SEED].dropna().unique())]
    return {(w, s) for w in widths for s in seeds}


def expected_pairs(c: pd.DataFrame, width: str, grids: dict[tuple[str, str], dict] | None = None,
                   seeds: set[float] | None = None) -> set[tuple[float, float]]:
    """The (width, seed) pairs a curve's runs should hold: each study's declared widths x seeds (``grids``, from
    ``_declared_grids``), or, for runs of a study that declares none (or naming no study), those they hold;
    ``seeds``: the seeds every width should hold instead (a fixed arm's declared seeds, at the widths it borrows)."""
    grids = grids or {}
    study = ["study_storage", "study_name"]
    sources = c.groupby(study, dropna=False) if set(study) <= set(c.columns) else [(None, c)]
    expected: set[tuple[float, float]] = set()
    for src, runs in sources:  # runs naming no study form one source, whose grid is what they hold
        pairs = declared_pairs(grids.get(src, {}), runs, width)
        expected |= {(w, s) for w in {w for w, _ in pairs} for s in seeds} if seeds else pairs
    return expected


def unfinished(c: pd.DataFrame, width: str, grids: dict[tuple[str, str], dict] | None = None,
               declared: set[tuple[float, float]] = frozenset(), seeds: set[float] | None = None) -> str | None:
    """What of a curve's grid has no finished (``completed``) run, as ``"34 of 36 runs finished, 1 stopped, 1 not
    started"``; None when every run is finished. The grid is each study's declared widths x seeds (``grids``, from
    ``_declared_grids``), or where a study declares none (or the runs name no study), the widths x seeds its runs
    hold, so a seed that reached some widths and not others counts as missing at the others. ``declared``: pairs
    a study declared for this curve, whether or not any of its runs is in ``c`` (``_declared_curves``); ``seeds``:
    see :func:`expected_pairs`."""
    expected = expected_pairs(c, width, grids, seeds) | set(declared)
    pairs = list(zip(c[width].astype(float), c[SEED].astype(float), strict=True))
    done = {p for p, st in zip(pairs, c["status"], strict=True) if st == "completed"}
    missing = expected - done
    if not missing:
        return None
    status = {}
    for p, st in zip(pairs, c["status"].fillna("running"), strict=True):
        if p in missing:
            status.setdefault(p, st)
    counts = pd.Series([status.get(p, "not started") for p in sorted(missing)]).value_counts()
    order = sorted(counts.index, key=lambda k: (k == "not started", -counts[k], k))
    detail = ", ".join(f"{counts[k]} {k}" for k in order)
    return f"{len(expected & done)} of {len(expected)} runs finished, {detail}"


def one_recipe(df: pd.DataFrame, width: str, grids: dict[tuple[str, str], dict]) -> None:
    """Refuse what would make the declared test read something other than one study's grid: a curve whose finished
    runs trained on more than one device, or at one width under more than one value of a config key (another
    data file, model or optimizer setting: another recipe; runtime keys aside), or whose widths differ in a key
    other than a model key that takes a different value at each width (``follows``: a ViT's MLP size); a (curve,
    width, seed) with two finished runs (they would be averaged into one seed's value); finished runs outside the
    grid their study declared (extra seeds would join the test and its power unnoticed)."""
    done = df[df["status"] == "completed"]
    keys = [*curve_keys(df), NOISE]
    fixed = recipe_keys(done, {*keys, width, SEED})
    problems = []
    for key, c in done.groupby(keys, dropna=False, sort=True):
        where = curve_name(keys, key)
        if "device" in c and c["device"].nunique() > 1:
            problems.append(f"{where}: runs on device " + " and ".join(repr(v) for v in sorted(c["device"].unique()))
                            + " (the declared test reads one device's grid: pass one device's sweep dirs)")
        mixed = [k for k in fixed if (c.groupby(width)[k].agg(lambda v: v.map(_norm).nunique()) > 1).any()]
        if mixed:
            problems.append(f"{where}: runs of one width differ in " + "; ".join(
                f"{k} ({', '.join(sorted({str(v) for v in c[k].map(_norm)}))})" for k in mixed)
                + " (another recipe: pass one study's sweep dirs)")
        along = [k for k in fixed if k not in mixed and c[k].map(_norm).nunique() > 1
                 and not (k.startswith("model.") and follows(c, k, width))]
        if along:  # a model key may follow the width one-to-one (a ViT's MLP size); any other is the recipe's
            problems.append(f"{where}: its widths differ in " + "; ".join(
                f"{k} ({', '.join(sorted({str(v) for v in c[k].map(_norm)}))})" for k in along)
                + " (a curve stitched from two recipes: pass one study's sweep dirs)")
    ids = [*keys, width, SEED]
    twice = done[done.duplicated(ids, keep=False)]
    if len(twice):
        problems.append(f"{int(done.duplicated(ids).sum())} finished runs repeat a (curve, width, seed) another "
                        f"run holds ({', '.join(str(d) for d in twice.get('run_dir', twice.index)[:4])}, ...): "
                        "pass each sweep dir once, and a rerun's records instead of the first's, not beside them")
    outside = []
    study = ["study_storage", "study_name"]
    if grids and set(study) <= set(done.columns):
        for src, runs in done.groupby(study, dropna=False):
            if src in grids:
                pairs = declared_pairs(grids[src], runs, width)
                held = zip(runs[width].astype(float), runs[SEED].astype(float), strict=True)
                outside += [f"{width} {w:g} seed {x:g}" for w, x in held if (w, x) not in pairs]
    if outside:
        problems.append(f"{len(outside)} finished runs lie outside the grid their study declared ("
                        + ", ".join(outside[:4]) + (", ..." if len(outside) > 4 else "")
                        + "): a study's grid is declared before it runs; put extra seeds in a study of their own")
    if problems:
        raise ValueError("the declared test reads one recipe's grid on one device, each run once: "
                         + "; ".join(problems))


def follows(c: pd.DataFrame, key: str, width: str) -> bool:
    """Whether ``key`` takes a different value at each width of the curve (a size that follows the width, as a ViT's
    MLP size does), not two recipes' values split between its widths."""
    per_width = c.groupby(width)[key].agg(lambda v: v.map(_norm).iloc[0])
    return per_width.nunique() == len(per_width)


def threshold(c: pd.DataFrame, width: str, tol: float, flagged: bool = False) -> float:
    """Smallest width whose mean final train error over its unflagged runs (``flagged``: over all its runs) is at
    most ``tol`` (NaN if none)."""
    ok = c if flagged else c[~_flagged(c)]
    means = ok.groupby(width)["train_error"].mean().sort_index()
    fits = means[means <= tol]
    return float(fits.index[0]) if len(fits) else np.nan


def thresholds(df: pd.DataFrame, width: str | None = None, tol: float = 0.01) -> pd.DataFrame:
    """Per curve (varying keys and noise): the threshold, the grid, and how many grid widths below it underfit."""
    width = width or width_column(df)
    require_columns(df, width, NOISE, "train_error")
    df = completed_only(df, "thresholds")
    keys = [*curve_keys(df), NOISE]
    rows = []
    for key, c in df.groupby(keys, dropna=False, sort=True):
        t = threshold(c, width, tol)
        grid = sorted(c[width].unique())
        means = c[~_flagged(c)].groupby(width)["train_error"].mean()
        below = [w for w in grid if np.isfinite(t) and w < t and means.get(w, 0.0) > tol]
        rows.append({**dict(zip(keys, np.atleast_1d(key), strict=True)), "threshold": t,
                     "underfit_below": len(below), "grid": ",".join(f"{w:g}" for w in grid),
                     "runs": len(c), "flagged": int(_flagged(c).sum())})
    return pd.DataFrame(rows)


def critical(c: pd.DataFrame, width: str, tol: float, flagged: bool = False) -> float:
    """The widest grid width below the threshold whose mean train error (unflagged runs) is above ``tol``: the
    width that just fails to fit its labels (NaN without a threshold or with nothing below it)."""
    t = threshold(c, width, tol, flagged)
    below = [w for w in sorted(c[width].unique()) if np.isfinite(t) and w < t]
    return float(below[-1]) if below else np.nan


def center(c: pd.DataFrame, width: str, tol: float, rule: str, flagged: bool = False) -> float:
    """The width a peak is tested at: ``critical`` (the declared rule) or ``threshold`` (a sensitivity check);
    ``flagged``: with the collapsed and stalled runs' train errors counted (see ``deciding_flags``)."""
    if rule not in CENTERS:
        raise ValueError(f"center={rule!r}: choose one of {CENTERS}")
    return critical(c, width, tol, flagged) if rule == "critical" else threshold(c, width, tol, flagged)


def deciding_flags(c: pd.DataFrame, width: str, tol: float, rule: str) -> int:
    """Flagged (collapsed or stalled) runs that decide where the test is centred: the centre is read without them,
    so where counting their train errors would move it, they are counted (at the widths up to the threshold read
    without them); else 0. Three of four seeds collapsed at the threshold width left the fourth to place it."""
    t = center(c, width, tol, rule)
    if _same(t, center(c, width, tol, rule, flagged=True)):
        return 0
    upto = threshold(c, width, tol)
    return int(_flagged(c[c[width] <= upto] if np.isfinite(upto) else c).sum())


def _recent(c: pd.DataFrame) -> pd.DataFrame:
    """``c`` with each run's train error read as its recent one (``recent_train_error``: the median of its last
    readings), the final one where a run has none."""
    if "recent_train_error" not in c:
        return c
    return c.assign(train_error=pd.to_numeric(c["recent_train_error"], errors="coerce").fillna(c["train_error"]))


def spike_centre(c: pd.DataFrame, width: str, tol: float, rule: str) -> tuple[int, str]:
    """Whether end-of-run loss spikes decide where the test is centred: (the runs whose final and recent train
    errors fall on either side of ``tol``, at the widths up to the larger of the two readings' thresholds; the
    centre read from the recent train errors, with what the same contrast reads there, post hoc) where that centre
    differs from the declared reading's (the final train errors), else (0, ""). The declared reading stays; the
    verdict says it is fragile."""
    t, r = center(c, width, tol, rule), center(_recent(c), width, tol, rule)
    if _same(t, r):
        return 0, ""
    upto = np.nanmax([threshold(c, width, tol), threshold(_recent(c), width, tol), -np.inf])
    sel = c[c[width] <= upto] if np.isfinite(upto) else c
    n = int(((sel["train_error"] > tol) != (_recent(sel)["train_error"] > tol)).sum())
    if not np.isfinite(r):
        return n, "none (no width below a threshold in the grid)"
    d, (lo, _, hi) = peak_contrast(c, width, r)
    if lo is None or hi is None:
        return n, f"{r:g}, with no grid width {'at most half' if lo is None else 'at least twice'} it to test against"
    k, p, _, height, _, _ = _contrast_test(d, lo, hi, False, tol, np.nan, ALPHA)
    if not np.isfinite(p):
        return n, f"{r:g} ({k} seeds hold it and both neighbours: no paired test)"
    return n, f"{r:g}, where the same contrast (post hoc) stands {height:.3f} above {lo:g} and {hi:g}, p {p:.2g}"


def spike_note(df: pd.DataFrame) -> str:
    """The finished runs that ended inside a loss spike (``ended_in_spike``), per curve with their final and recent
    train errors, else "": the test reads their final errors, as declared, and the reader should know."""
    if "ended_in_spike" not in df or not df["ended_in_spike"].any():
        return ""
    width = width_column(df)
    keys = [*curve_keys(df), NOISE]
    spiked = df[df["ended_in_spike"] & (df["status"] == "completed")].sort_values([width, SEED])
    parts = [f"{curve_name(keys, key)}: " + ", ".join(
        f"{width} {w:g} seed {x:g} ({f:.3f}, recent {r:.3f})"
        for w, x, f, r in zip(c[width], c[SEED], c["train_error"], c["recent_train_error"], strict=True))
        for key, c in spiked.groupby(keys, dropna=False, sort=True)]
    return (f"\nRuns that ended inside a loss spike (final train error {SPIKE_RISE:g} or more above its recent one, "
            f"the median of its last {SPIKE_WINDOW} readings; the test reads their final errors, as declared, so "
            "their test errors are read inside the spike; `spiked_runs` counts those at the tested widths): "
            + "; ".join(parts) + ".\n")


def _same(a: float, b: float) -> bool:
    return (np.isnan(a) and np.isnan(b)) or a == b


CENTERS = ("critical", "threshold")


def collapse_table(df: pd.DataFrame, width: str | None = None) -> pd.DataFrame:
    """Runs and flagged (collapsed or stalled) runs per (curve keys, noise, width)."""
    width = width or width_column(df)
    df = completed_only(df, "collapse_table").assign(flagged=lambda d: _flagged(d))
    keys = [*curve_keys(df), NOISE, width]
    g = df.groupby(keys, dropna=False, sort=True)
    return g.agg(runs=("flagged", "size"), flagged=("flagged", "sum")).reset_index()


def near(grid: list[float], t: float, factor: float = 2.0) -> list[float]:
    """The grid widths within ``factor`` of ``t`` (every width when ``t`` is NaN: no threshold, all are suspect)."""
    return [w for w in grid if not np.isfinite(t) or t / factor <= w <= t * factor]


def choose_lr(df: pd.DataFrame, width: str | None = None, tol: float = 0.01) -> tuple[float | None, pd.DataFrame]:
    """The lr rule: the largest lr under which no run at its threshold widths collapsed or stalled.

    Thresholds are taken per (other curve keys, noise) at each lr; an lr whose curves have no interpolating width
    counts every width as a threshold width. Returns (lr or None, one row per lr with its flagged runs there)."""
    width = width or width_column(df)
    require_columns(df, LR)
    df = completed_only(df, "choose_lr")
    others = [k for k in curve_keys(df) if k != LR]
    rows = []
    for lr, at in df.groupby(LR, sort=True):
        bad = total = 0
        for _, c in at.groupby([*others, NOISE], dropna=False):
            t = threshold(c, width, tol)
            sel = c[c[width].isin(near(sorted(c[width].unique()), t))]
            bad += int(_flagged(sel).sum())
            total += len(sel)
        rows.append({LR: float(lr), "runs_at_threshold_widths": total, "flagged": bad, "stable": bad == 0})
    table = pd.DataFrame(rows)
    stable = table[table["stable"]]
    return (float(stable[LR].max()) if len(stable) else None), table


def neighbours(grid: list[float], t: float, factor: float = 2.0) -> tuple[float | None, float | None]:
    """The nearest grid widths at most ``t / factor`` and at least ``t * factor``."""
    lo = [w for w in grid if w <= t / factor]
    hi = [w for w in grid if w >= t * factor]
    return (max(lo) if lo else None), (min(hi) if hi else None)


def peak_contrast(c: pd.DataFrame, width: str, t: float) -> tuple[pd.DataFrame, tuple]:
    """Per seed (rows): test error at width ``t`` minus that at its left and at its right neighbour (columns
    ``left``, ``right``); seeds missing a width are dropped."""
    lo, hi = neighbours(sorted(c[width].unique()), t)
    if lo is None or hi is None:
        return pd.DataFrame(columns=["left", "right"], dtype=float), (lo, t, hi)
    m = c.pivot_table(index=SEED, columns=width, values="test_error", aggfunc="mean", dropna=False)
    m = m.reindex(columns=sorted({*m.columns, lo, t, hi}))  # a width with no test error at all: NaN, not KeyError
    d = pd.DataFrame({"left": m[t] - m[lo], "right": m[t] - m[hi]})
    return d.dropna(), (lo, t, hi)


def mde(sd: float, k: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest peak height (both contrasts at least this) the declared test detects over ``k`` seeds with joint
    ``power``: a peak needs both one-sided paired t-tests, so each is given power ``sqrt(power)``, as if the two
    contrasts were independent (they share the centre width's value and are positively correlated, so the joint
    power is at least ``power``).

    The figure is the larger of the central-t sum ``(t(1 - alpha) + t(sqrt(power))) sd / sqrt(k)``, with which the
    designs were declared, and the exact height at which each test has power ``sqrt(power)`` by the noncentral t:
    the sum is the larger from 4 seeds on (conservative), the exact height at 2 and 3 (the sum gave each test power
    0.851 at 2 seeds, a joint power near 0.72; 0.893 at 3)."""
    if k < 2 or not np.isfinite(sd) or sd <= 0:  # no spread measured: no power figure (not "detects everything")
        return np.nan
    crit = stats.t.ppf(1 - alpha, k - 1)
    approx = (crit + stats.t.ppf(np.sqrt(power), k - 1)) / np.sqrt(k)

    def short(d: float) -> float:  # each test's power at height d (in units of sd) minus sqrt(power)
        return float(stats.nct.sf(crit, k - 1, d * np.sqrt(k))) - np.sqrt(power)

    exact = approx if short(approx) >= 0 else optimize.brentq(short, approx, 2 * approx, xtol=1e-10)
    return float(max(approx, exact) * sd)


def mde_sides(sd_left: float, sd_right: float, k: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest peak height (both contrasts at least this) the declared test detects over ``k`` seeds with joint
    ``power``, each one-sided paired t-test's power from its own contrast's sd (noncentral t), the joint power their
    product (the two share the centre width, correlate positively, so it is at least that). With one side quiet the
    other carries the power alone: about ``power`` on it, not ``sqrt(power)`` (taking the larger sd for both, as on
    2026-11-29 first, gave a joint power near 0.9 and asked 8 seeds where 6 have 0.8)."""
    sds = np.array([sd_left, sd_right], float)
    if k < 2 or not np.isfinite(sds).all() or (sds <= 0).any():
        return np.nan
    crit = stats.t.ppf(1 - alpha, k - 1)

    def short(d: float) -> float:  # joint power at height d minus the target
        return float(np.prod(stats.nct.sf(crit, k - 1, d * np.sqrt(k) / sds))) - power

    hi = mde(float(sds.max()), k, alpha, power)  # each side at sqrt(power) with the larger sd: joint >= power
    return float(optimize.brentq(short, 1e-12 * hi, hi, xtol=1e-12)) if short(hi) > 0 else hi


@dataclass
class Spread:
    contrast_sd: float  # pooled sd over seeds of the two peak contrasts
    dof: int  # of contrast_sd: both sides' (each side has half)
    width_sd: float  # pooled sd over seeds of one width's test error
    curves: int
    left_sd: float = np.nan  # pooled sd over seeds of the left contrast alone (dof / 2)
    right_sd: float = np.nan  # and of the right

    @property
    def side(self) -> str | None:
        """The noisier contrast, ``left`` or ``right`` (None without both sides' sds)."""
        if not (np.isfinite(self.left_sd) and np.isfinite(self.right_sd)):
            return None
        return "left" if self.left_sd >= self.right_sd else "right"

    def mde(self, k: int, alpha: float = ALPHA, power: float = POWER) -> float:
        """The smallest detectable peak over ``k`` seeds from this pilot: from both contrasts' own sds
        (``mde_sides``) where the pilot measured them, else from ``power_sd``."""
        if self.dof and self.side is not None:
            return mde_sides(self.left_sd, self.right_sd, k, alpha, power)
        return mde(self.power_sd, k, alpha, power)

    @property
    def power_sd(self) -> float:
        """The sd the power figure uses: the pilot's larger one-side contrast sd, since a peak needs both one-sided
        tests to reject and the noisier side sets the joint power (the two sides' pooled sd overstated it: joint power
        0.68-0.70 at the printed mde with sides of sd 0.039 and 0.007; found 2026-11-29); with no sides' sds, the
        pooled one; where no pilot curve had a contrast with both neighbours (0 dof), sqrt(2) x one width's sd, the
        contrast's sd if the two widths' errors were independent (seeds share data and labels across widths, so the
        paired contrast's true sd is at most this when the errors correlate positively)."""
        if not self.dof:
            return float(np.sqrt(2) * self.width_sd)
        return self.contrast_sd if self.side is None else max(self.left_sd, self.right_sd)

    def sd_interval(self, level: float = 0.95) -> tuple[float, float]:
        """The ``level`` chi-square interval of ``power_sd`` (NaNs without a contrast): the power figure takes the
        sd as known, so the smallest detectable peak is uncertain in the same proportion. One side's sd has
        ``dof / 2`` independent degrees of freedom (each seed of each curve once).

        For the pooled sd of both sides: a seed's left and right contrasts share the centre width's error
        (correlation 0.5 when the widths' errors are independent), so their ``dof`` squared deviations carry
        ``dof / (1 + 0.5^2)`` degrees of freedom (the effective dof of two such sample variances pooled); counted as
        ``dof`` the interval covered 92-93%, with this 95-96% (tests/test_design.py)."""
        if not self.dof:
            return np.nan, np.nan
        a = (1 - level) / 2
        sd, dof = (self.contrast_sd, self.dof / 1.25) if self.side is None else (self.power_sd, self.dof / 2)
        return (float(sd * np.sqrt(dof / stats.chi2.ppf(1 - a, dof))),
                float(sd * np.sqrt(dof / stats.chi2.ppf(a, dof))))

    @property
    def power_source(self) -> str:
        if self.dof and self.side:
            other = "right" if self.side == "left" else "left"
            return (f"the pilot's two contrast sds, {self.side} {self.power_sd:.4f} and {other} "
                    f"{min(self.left_sd, self.right_sd):.4f} ({self.dof // 2} dof each over {self.curves} curves): a "
                    "peak needs both one-sided tests, each with the power of its own sd, jointly the stated power "
                    "(`mde_sides`)")
        if self.dof:
            return f"the pilot's contrast sd {self.contrast_sd:.4f} ({self.dof} dof over {self.curves} curves)"
        return (f"sqrt(2) x the pilot's one-width sd {self.width_sd:.4f} = {self.power_sd:.4f} (no pilot contrast "
                "had a neighbour on each side)")


def spread(df: pd.DataFrame, width: str | None = None, tol: float = 0.01, rule: str = "critical") -> Spread:
    """Seed spread of the pilot's curves (unflagged runs; runs repeating a (curve, width, seed) averaged into one, with
    a warning): of the contrast at each curve's threshold, and of a single width's test error, both pooled (sum of
    squares over degrees of freedom)."""
    width = width or width_column(df)
    df = completed_only(df, "spread")
    df = df[~_flagged(df)]
    # a run repeating a (curve, width, seed) (the pilot read from two folders, or a width rerun in a second pilot
    # sweep) is not another seed: counted as one it shrank the sd with inflated dof, and the smallest detectable
    # peak with it; averaged into one value per seed, as every table and fit does
    df = one_run_per_seed(df, [*curve_keys(df), NOISE, width], ["test_error", "train_error"], "spread")
    ss_c = dof_c = ss_w = dof_w = curves = 0
    ss_side = {"left": 0.0, "right": 0.0}
    for _, c in df.groupby([*curve_keys(df), NOISE], dropna=False):
        for _, g in c.groupby(width):
            if g["test_error"].count() > 1:
                ss_w += g["test_error"].var() * (g["test_error"].count() - 1)
                dof_w += g["test_error"].count() - 1
        t = center(c, width, tol, rule)
        if not np.isfinite(t):
            continue
        d, _ = peak_contrast(c, width, t)
        if len(d) > 1:
            for side in ("left", "right"):
                ss_side[side] += d[side].var() * (len(d) - 1)
                ss_c += d[side].var() * (len(d) - 1)
                dof_c += len(d) - 1
            curves += 1
    sides = {s: float(np.sqrt(2 * v / dof_c)) if dof_c else np.nan for s, v in ss_side.items()}
    return Spread(float(np.sqrt(ss_c / dof_c)) if dof_c else np.nan, int(dof_c),
                  float(np.sqrt(ss_w / dof_w)) if dof_w else np.nan, curves, sides["left"], sides["right"])


LADDER = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128)


def suggest_grid(t: float, ladder: tuple = LADDER, below: int = 2) -> list[float]:
    """Widths of ``ladder`` from ``below`` steps under a factor 2 below ``t`` up to 8 t: the threshold in the
    middle of a log axis, dense around it, with room for the second descent."""
    if not np.isfinite(t):
        return []
    lo = [w for w in ladder if w <= t / 2]
    start = lo[-below] if len(lo) >= below else ladder[0]
    return [w for w in ladder if start <= w <= 8 * t]


@dataclass
class PeakTest:
    curve: str
    center: float  # the width tested (the critical width, or the threshold)
    left: float | None
    right: float | None
    seeds: int
    vs_left: float  # mean over seeds of test(T) - test(left)
    vs_right: float  # mean over seeds of test(T) - test(right)
    height: float  # the smaller of the two: how far the threshold's test error stands above both neighbours
    p_value: float  # the larger of the two one-sided paired t-tests' p (intersection-union test of a peak)
    flagged_runs: int
    contrast_sd: float  # this run's own pooled sd of the two contrasts over its seeds (an observation beside the
    # pilot's, which the power figure uses)
    mde: float
    effect: float
    spiked_runs: int  # runs at the three tested widths that ended inside a loss spike (``ended_in_spike``)
    verdict: str


def verdict(p: float, mean: float, detectable: float, effect: float, flagged: int, alpha: float = ALPHA,
            missing: str | None = None, unread: str | None = None, no_p: str | None = None,
            deciding: int = 0, spikes: tuple[int, str] = (0, ""), without: str = "") -> str:
    """reproduced / not reproduced / inconclusive (with what would settle it), per the module docstring.
    ``unread``: finished runs with no test or train error; ``no_p``: why there is no p value; ``deciding``: flagged
    runs that decide where the test is centred (``deciding_flags``); ``spikes``: runs whose end-of-run spikes decide
    it and the centre read without them (``spike_centre``), and ``without``: what the test reads without the seeds
    whose runs at the tested widths ended inside a spike, where that is another verdict: either makes the verdict
    "fragile", said in it."""
    says = _verdict(p, mean, detectable, effect, flagged, alpha, missing, unread, no_p, deciding)
    fragile = []
    if spikes[0]:
        fragile.append(f"{spikes[0]} run{'s' if spikes[0] > 1 else ''}' final train errors, read inside end-of-run "
                       f"loss spikes or dips, decide the tested width: read by each run's median over its last "
                       f"{SPIKE_WINDOW} readings it is {spikes[1]}")
    if without:
        fragile.append(without)
    return f"{says} (fragile: {'; '.join(fragile)})" if fragile else says


def _verdict(p: float, mean: float, detectable: float, effect: float, flagged: int, alpha: float,
             missing: str | None, unread: str | None, no_p: str | None, deciding: int) -> str:
    if missing:
        return f"inconclusive (grid unfinished: {missing})"
    if unread:
        return f"inconclusive ({unread}: score it again or rerun it)"
    if deciding:
        return (f"inconclusive ({deciding} collapsed or stalled runs decide the threshold: counted, they move the "
                "tested width; rerun them under a stable recipe)")
    if flagged:
        return f"inconclusive ({flagged} collapsed or stalled runs at the tested widths)"
    if not np.isfinite(p):
        return f"inconclusive ({no_p or 'no threshold with a neighbour on each side in the grid'})"
    if p < alpha and mean > 0:
        return "reproduced"
    if np.isfinite(detectable) and detectable <= effect:
        return "not reproduced"
    if not np.isfinite(detectable):
        return ("inconclusive (no power figure: the pilot measured no seed spread, or too few seeds finished; a "
                "pilot with two or more seeds that differ would settle what the design can detect)")
    return (f"inconclusive (the design detects {detectable:.3f} and up, the published effect is taken as "
            f"{effect:.3f}: more seeds would settle it)")


def unscored(c: pd.DataFrame, width: str) -> str | None:
    """Finished runs with no test error or no train error (the threshold reads train errors at every width, the
    contrast test errors), named; None if every finished run has both. Such a run is not a missing seed to drop."""
    bad = c[c["test_error"].isna() | c["train_error"].isna()].sort_values([width, SEED])
    if not len(bad):
        return None
    named = ", ".join(f"{width} {w:g} seed {x:g}" for w, x in zip(bad[width], bad[SEED], strict=True))
    return f"{len(bad)} finished run{'s have' if len(bad) > 1 else ' has'} no test or train error ({named})"


NO_GRID = ("no declared grid: the runs name no study whose storage records one (a plain Hydra multirun, or records "
           "without their optuna.db), so the grid is taken as the widths x seeds the runs hold, and a width or seed "
           "that never started is invisible: a missing width moves a neighbour of the tested one. Run the study "
           "through the vitsweep sweeper, which records its grid, or check the grid by hand")


def peak_tests(df: pd.DataFrame, pilot_sd: float | Spread, effect: float, width: str | None = None,
               tol: float = 0.01, alpha: float = ALPHA, rule: str = "critical",
               grids: dict[tuple[str, str], dict] | None = None) -> list[PeakTest]:
    """The declared test on every curve of a main run: threshold from train errors, paired contrast, verdict.
    ``pilot_sd``: the pilot's ``Spread`` (its ``mde``), or one sd; ``grids``: ``_declared_grids(df)``, read here
    when not given."""
    width = width or width_column(df)
    require_columns(df, width, NOISE, SEED, "train_error", "test_error")
    grids = _declared_grids(df) if grids is None else grids
    if not grids:
        warnings.warn(NO_GRID, stacklevel=2)
    one_recipe(df, width, grids)
    borrowed = {tuple(b) for b in df.attrs.get("borrowed_studies", ())}  # with_capped's other arm
    own = {k: g for k, g in grids.items() if k not in borrowed}
    # a fixed arm (with_capped's output): every width of either arm, at the seeds this arm declared, the widths it
    # borrows included (a declared seed the other arm never ran is missing there, not left out of the pairing)
    seeds = {float(v) for g in own.values() for v in g.get(SEED, [])} if "borrowed_studies" in df.attrs else set()
    varied = {k for g in own.values() for k, v in g.items() if k in CURVE_KEYS and k in df and len(v) > 1}
    keys = [*[k for k in CURVE_KEYS if k in curve_keys(df) or k in varied], NOISE]
    done = completed_only(df, "peak_tests").index
    declared = _declared_curves(df, keys, width, own)  # a study's curve may hold none of its runs yet
    out = []
    for key, whole in df.groupby(keys, dropna=False, sort=True):  # every curve, finished runs or not
        missing = unfinished(whole, width, grids, declared.pop(tuple(_norm(v) for v in np.atleast_1d(key)), set()),
                             seeds=seeds or None)
        c = whole[whole.index.isin(done)]
        name = curve_name(keys, key)
        t = center(c, width, tol, rule) if len(c) else np.nan
        never = len(c) and not np.isfinite(threshold(c, width, tol))
        d, (lo, _, hi) = (peak_contrast(c, width, t) if np.isfinite(t)
                          else (pd.DataFrame(columns=["left", "right"], dtype=float), (None, t, None)))
        tested = c[c[width].isin([w for w in (lo, t, hi) if w is not None])]
        flagged = int(_flagged(tested).sum())
        spiked = int(tested["ended_in_spike"].sum()) if "ended_in_spike" in tested else 0
        deciding = deciding_flags(c, width, tol, rule) if len(c) else 0
        spikes = spike_centre(c, width, tol, rule) if len(c) else (0, "")
        k, p, means, height, detectable, no_p = _contrast_test(d, lo, hi, never, tol, pilot_sd, alpha)
        unread = unscored(c, width)
        # runs at the tested widths that ended inside a spike: their test errors read it. Fragile where they decide
        # the verdict: a peak that is not significant without their seeds, or no peak where the seeds left show one
        # (significant, or as high as the effect); fewer seeds alone (power) make nothing fragile
        spiked_seeds = set(tested.loc[tested["ended_in_spike"], SEED]) if spiked else set()
        without = ""
        if spiked_seeds and not missing:
            _, kp, _, kept_height, kd, kno = _contrast_test(d[~d.index.isin(spiked_seeds)], lo, hi, never, tol,
                                                            pilot_sd, alpha)
            kept = verdict(kp, kept_height, kd, effect, flagged, alpha, missing, unread, kno, deciding)
            ours = _verdict(p, height, detectable, effect, flagged, alpha, missing, unread, no_p, deciding)
            ours, kept_says = ours.split(" (")[0], kept.split(" (")[0]
            if ((ours == "reproduced" and kept_says != "reproduced")
                    or (ours != "reproduced" and (kept_says == "reproduced" or kept_height >= effect))):
                n = len(spiked_seeds)
                without = (f"{spiked} run{'s' if spiked > 1 else ''} at the tested widths ended inside a loss spike; "
                           f"without {'its seed' if n == 1 else f'their {n} seeds'} the test reads {kept}")
        says = verdict(p, height, detectable, effect, flagged, alpha, missing, unread, no_p, deciding, spikes, without)
        own = float(np.sqrt((d["left"].var() + d["right"].var()) / 2)) if k >= 2 else np.nan
        out.append(PeakTest(name, t, lo, hi, k, float(means["left"]), float(means["right"]), height, p, flagged,
                            own, detectable, effect, spiked, says))
    out += [PeakTest(curve_name(keys, key), np.nan, None, None, 0, np.nan, np.nan, np.nan, np.nan, 0, np.nan, np.nan,
                     effect, 0, verdict(np.nan, np.nan, np.nan, effect, 0, alpha,
                                     f"0 of {len(pairs)} runs finished, {len(pairs)} not started"))
            for key, pairs in declared.items()]  # declared curves with no run at all
    return out


def _contrast_test(d: pd.DataFrame, lo, hi, never: bool, tol: float, pilot_sd: float | Spread, alpha: float
                   ) -> tuple[int, float, pd.Series, float, float, str | None]:
    """The paired one-sided tests on per-seed contrasts ``d`` (``peak_contrast``): (seeds, the intersection-union p,
    the contrasts' means, the height (the smaller mean), the smallest detectable peak with these seeds, why there is
    no p where there is none)."""
    k = len(d)
    p = np.nan
    no_p = (f"no width interpolates (mean train error <= {tol} at none): the threshold lies past the grid's "
            "widest model" if never else None)
    if k >= 2 and (d.std() > 0).all():
        p = max(float(stats.ttest_1samp(d[s].to_numpy(), 0.0, alternative="greater").pvalue) for s in ("left", "right"))
    elif lo is not None and hi is not None:
        no_p = (f"{k} seed{'s have' if k != 1 else ' has'} the three tested widths: the paired t-test needs 2 or "
                "more" if k < 2 else "a contrast is the same in every seed: the paired t-test needs a spread; "
                "check that the seeds differ")
    means = d.mean() if k else pd.Series({"left": np.nan, "right": np.nan})
    height = float(min(means["left"], means["right"]))
    detectable = pilot_sd.mde(k, alpha) if isinstance(pilot_sd, Spread) else mde(pilot_sd, k, alpha)
    return k, p, means, height, detectable, no_p


def _declared_curves(df: pd.DataFrame, keys: list[str], width: str, grids: dict[tuple[str, str], dict]
                     ) -> dict[tuple, set[tuple[float, float]]]:
    """Each curve the studies of ``df``'s runs declared (the grid's values of ``keys``; a key the grid does not vary,
    at the values that study's runs hold) -> the (width, seed) pairs declared for it."""
    if not grids or not {"study_storage", "study_name"} <= set(df.columns):
        return {}
    out: dict[tuple, set[tuple[float, float]]] = {}
    for (storage, name), grid in grids.items():
        runs = df[(df["study_storage"] == storage) & (df["study_name"] == name)]
        values = [sorted(grid_values(grid, k, runs), key=str) for k in keys]
        for combo in itertools.product(*values):
            out.setdefault(combo, set()).update(declared_pairs(grid, runs, width))
    return out


def choose_main(p: dict, target: float, noise: float | None = None, min_seeds: int = 3, max_seeds: int = 8) -> dict:
    """The main run's n_train, grid and seeds from a pilot, by rules that read train errors and the seed spread only.

    n_train: among the pilot sizes whose threshold (at the chosen lr and the largest noise level, or ``noise``)
    leaves at least two underfitting pilot widths below it, the one whose threshold is closest to ``target`` (the
    published threshold) on a log scale. Grid: ``suggest_grid`` around that threshold, on the ladder's multiples of a
    ViT pilot's head count. Seeds: the fewest in ``min_seeds..max_seeds`` whose smallest detectable contrast is at
    most the published effect (else ``max_seeds``).
    """
    th = p["thresholds"]
    noise = th[NOISE].max() if noise is None else noise
    ok = th[(th[NOISE] == noise) & (th["underfit_below"] >= 2) & th["threshold"].notna()]
    if ok.empty:
        return {}
    ok = ok.assign(dist=np.abs(np.log(ok["threshold"] / target)))
    row = ok.sort_values(["dist", "threshold"]).iloc[0]
    sp = p["spread"]
    seeds = next((k for k in range(min_seeds, max_seeds + 1) if sp.mde(k) <= p["effect"]), max_seeds)
    ladder = tuple(w for w in LADDER if w % p["heads"] == 0) if p.get("heads") else LADDER  # dims a ViT can take
    out = {"threshold": float(row["threshold"]), "grid": suggest_grid(row["threshold"], ladder), "seeds": seeds,
           "mde": sp.mde(seeds)}
    if "dataset.n_train" in th:
        out["n_train"] = int(row["dataset.n_train"])
    return out


def main_overrides(m: dict, lr: float | None, width: str = "model.width", first_seed: int = 0) -> list[str]:
    """Hydra overrides for the main run chosen by ``choose_main`` (and the lr rule), on the pilot's width key, with
    ``m["seeds"]`` seeds from ``first_seed``."""
    out = [] if lr is None else [f"optimizer.lr={lr:g}"]
    if "n_train" in m:
        out.append(f"dataset.n_train={m['n_train']}")
    out.append(f"{width}=choice(" + ",".join(f"{w:g}" for w in m["grid"]) + ")")
    out.append("seed=choice(" + ",".join(str(s) for s in range(first_seed, first_seed + m["seeds"])) + ")")
    return out


def plan(paths: list[str], tol: float, seeds: list[int], effect: float, rule: str = "critical") -> dict:
    df = load_runs(paths, optuna_state=False)  # the design reads the runs' own records only
    width = width_column(df)
    lr, lr_table = choose_lr(df, width, tol) if LR in curve_keys(df) else (None, pd.DataFrame())
    at = df if lr is None else df[np.isclose(df[LR].astype(float), lr)]
    sp = spread(at, width, tol, rule)
    th = thresholds(at, width, tol)
    keys = [*curve_keys(df), NOISE, width]
    done = completed_only(df, "plan")
    curves = (done.groupby(keys, dropna=False).agg(runs=("train_error", "size"), train_mean=("train_error", "mean"),
                                                    test_mean=("test_error", "mean"), test_sd=("test_error", "std"))
              .reset_index())
    heads = df["model.heads"].dropna().unique() if width == "model.dim" and "model.heads" in df else []
    return {"width": width, "lr": lr, "lr_table": lr_table, "curves": curves, "thresholds": th,
            "pilot_seeds": tuple(sorted(df[SEED].dropna().unique())) if SEED in df else (),
            "heads": int(heads[0]) if len(heads) == 1 else None,
            "collapses": collapse_table(df, width), "spread": sp,
            "mde": {k: sp.mde(k) for k in seeds}, "effect": effect,
            "grids": {str(r.get("dataset.n_train", "")) + f" p={r[NOISE]}": suggest_grid(r["threshold"])
                      for r in th.to_dict("records")}}


def plan_markdown(p: dict) -> str:
    sp = p["spread"]
    lines = ["## Pilot", "", "### Collapses (runs flagged collapsed or stalled)", "",
             to_markdown(p["collapses"]), ""]
    if len(p["lr_table"]):
        chosen = "none: every lr collapsed at its threshold widths" if p["lr"] is None else f"{p['lr']:g}"
        lines += ["### lr rule: the largest lr with no flagged run at its threshold widths (within 2x)", "",
                  to_markdown(p["lr_table"]), "", f"Chosen lr: **{chosen}**", ""]
    lines += ["### Interpolation thresholds (mean train error <= tol, unflagged runs)", "",
              to_markdown(p["thresholds"]), "",
              "### Seed spread and the smallest detectable peak", "",
              f"Contrast sd {sp.contrast_sd:.4f} ({sp.dof} dof over {sp.curves} curves); one width's test-error sd "
              f"{sp.width_sd:.4f}. Power from {sp.power_source}. Two one-sided paired t-tests (alpha {ALPHA} "
              f"each), joint power {POWER}:", "",
              "| seeds | smallest detectable contrast |", "|---|---|"]
    lines += [f"| {k} | {v:.4f} |" for k, v in p["mde"].items()]
    lines += ["", f"Published effect taken as {p['effect']:.3f}.", "", "### Suggested main grids", ""]
    lines += [f"- {k}: {', '.join(f'{w:g}' for w in g) or 'no threshold in the pilot grid'}"
              for k, g in p["grids"].items()]
    lines += ["", "### Pilot curves (observations, finished runs: the declared test runs on the main run's seeds)", "",
              to_markdown(p["curves"])]
    return "\n".join(lines) + "\n"


def tests_markdown(tests: list[PeakTest], pilot: Spread, rule: str = "critical") -> str:
    rows = pd.DataFrame([asdict(t) for t in tests])
    lo, hi = pilot.sd_interval()
    interval = (f" (95% interval {lo:.4f}-{hi:.4f}: the smallest detectable peak `mde` is uncertain in the same "
                "proportion)" if pilot.dof else "")
    return (f"## Declared test: the {rule} width's test error above both neighbours (paired one-sided t, "
            "intersection-union)\n\n"
            f"Pilot contrast sd {pilot.contrast_sd:.4f}, both sides pooled ({pilot.dof} dof); power from "
            f"{pilot.power_source}{interval}. "
            "`contrast_sd`: this run's own pooled sd of the two contrasts over its seeds, beside the pilot's "
            "(an observation; `mde` uses the pilot's, declared before the run).\n\n"
            + to_markdown(rows) + "\n")


def mixed_note(df: pd.DataFrame, column: str, label, title: str) -> str:
    """A line naming each curve whose finished runs hold more than one ``label`` of ``column``, with the counts and
    the widths of all but the commonest, after ``title``; "" where every curve has one."""
    if column not in df.columns or "status" not in df.columns:
        return ""
    done = df[df["status"] == "completed"]
    done = done.assign(_label=done[column].map(label))
    keys = [*curve_keys(df), NOISE]
    mixed = []
    for key, c in done.groupby(keys, dropna=False, sort=True):
        counts = c["_label"].value_counts()
        if len(counts) > 1:
            where = curve_name(keys, key)
            by_width = c[c["_label"] != counts.index[0]].groupby(width_column(df))["_label"].size()
            mixed.append(f"{where}: " + ", ".join(f"{n} {p}" for p, n in counts.items())
                         + " (the fewer at " + ", ".join(f"{w:g}" for w in by_width.index) + ")")
    return f"\n{title}: " + "; ".join(mixed) + ".\n" if mixed else ""


def precision_note(df: pd.DataFrame) -> str:
    """Each curve whose finished runs trained at more than one precision (``precision=auto`` times its candidates
    on the machine at each start, so one grid can mix them; a pinned precision cannot), else ""."""
    return mixed_note(df, "precision", lambda v: "unknown" if pd.isna(v) else v,
                      "Mixed precisions among the finished runs (the test treats them alike)")


def machine_note(df: pd.DataFrame) -> str:
    """Each curve whose finished runs trained on more than one machine (the summary's ``machines``: every machine
    a run trained on, in order), else "". Not refused as two devices are: a run on another CPU model is still a
    run of the recipe, but not a bitwise copy, and where the machines split by width their effect is confounded
    with the width's."""
    def label(v) -> str:
        return " then ".join(v) if isinstance(v, (list, tuple)) and len(v) else "not recorded"
    return mixed_note(df, "machines", label,
                      "Finished runs of one curve on more than one machine (noted, not refused: each is a run of the "
                      "recipe, but a machine effect would be confounded with the widths named; \"not recorded\": "
                      "the run, or its part before a resume, trained before summaries named their machine)")


def curves_markdown(df: pd.DataFrame) -> str:
    """The curves the test read: per curve and width, the finished runs' seed count and mean train and test error
    (observations beside the test, not part of it)."""
    width = width_column(df)
    keys = [*curve_keys(df), NOISE]
    c = descent_curves(df, width, by=[k for k in keys if k != NOISE])
    cols = [*keys, width, "n_seeds", "train_mean", "train_std", "test_mean", "test_std"]
    return ("\n## The curves it read (finished runs; observations, not the test)\n\n"
            + to_markdown(c[[k for k in cols if k in c]]) + "\n")


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


def pilot_at_main_lr(pilot: pd.DataFrame, main_runs: pd.DataFrame, tol: float = 0.01) -> pd.DataFrame:
    """The pilot's runs at the lr the main run trained at, where the pilot tried several (its spread at another lr
    is another recipe's): the main run's one lr, else the lr rule's choice. Refused (SystemExit) when the main run's
    lr is not among the pilot's, or when the main run holds none and the rule chose none (every rung collapsed)."""
    if LR not in curve_keys(pilot):
        return pilot
    tried = sorted(pilot[LR].dropna().astype(float).unique())
    main_lrs = sorted(main_runs[LR].dropna().astype(float).unique()) if LR in main_runs else []
    if len(main_lrs) == 1:
        if not np.isclose(tried, main_lrs[0]).any():
            raise SystemExit(f"the main run trained at {LR} {main_lrs[0]:g}, which the pilot never tried (it tried "
                             f"{', '.join(f'{v:g}' for v in tried)}): its spread is another recipe's; pass the pilot "
                             "of the main run's lr")
        return pilot[np.isclose(pilot[LR].astype(float), main_lrs[0])]
    lr, _ = choose_lr(pilot, tol=tol)
    if lr is None:
        raise SystemExit(f"the pilot tried {LR} {', '.join(f'{v:g}' for v in tried)} and the lr rule chose none (each "
                         "collapsed or stalled at its threshold widths), and the main runs name no single lr: no "
                         "pilot spread belongs to them")
    return pilot[np.isclose(pilot[LR].astype(float), lr)]


def _fraction(text: str) -> float:
    """argparse type of ``--effect``: an error fraction, so 5 (percent) cannot make every design powerful."""
    try:
        v = float(text)
    except ValueError:
        v = np.nan
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give the published effect as a test-error fraction in (0, 1), "
                                         "e.g. 0.05 for 5 points")
    return v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.design", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_plan = sub.add_parser("plan", help="read a pilot: thresholds, collapses, the lr rule, spread, power")
    p_plan.add_argument("paths", nargs="+")
    p_plan.add_argument("--seeds", default="2,3,4,6,8", help="seed counts to give the smallest detectable peak for")
    p_plan.add_argument("--json", action="store_true", help="print the chosen lr and thresholds as JSON")
    p_plan.add_argument("--target", type=float, help="the published threshold: print the main run's overrides "
                        "(lr, n_train, grid, seeds) chosen by the declared rules (choose_main)")
    p_test = sub.add_parser("test", help="apply the declared peak test to a main run")
    p_test.add_argument("paths", nargs="+")
    p_test.add_argument("--pilot", nargs="+", required=True, help="the pilot's sweep dirs (its spread gives power)")
    p_test.add_argument("--capped-from", nargs="+", default=[], metavar="DIR",
                        help="a fixed-budget arm: take these sweeps' runs (the convergence arm) that ran to the same "
                             "epoch cap for the (width, seed) pairs the arm's own sweep did not train (with_capped)")
    p_test.add_argument("--curves", action="store_true",
                        help="also print each curve's finished runs per width (seeds, mean train and test error)")
    p_cmp = sub.add_parser("compare", help="two grids of one recipe (two devices): test error differences")
    p_cmp.add_argument("paths", nargs="+", help="the first grid's sweep dirs")
    p_cmp.add_argument("--against", nargs="+", required=True, help="the second grid's sweep dirs")
    p_cmp.add_argument("--out", help="also write the Markdown here")
    for p in (p_plan, p_test):
        p.add_argument("--center", choices=CENTERS, default="critical",
                       help="the width a peak is tested at (critical: the declared rule; threshold: sensitivity)")
        p.add_argument("--tol", type=float, default=0.01, help="train error counted as interpolating")
        p.add_argument("--effect", type=_fraction, default=0.05, help="the published peak, as a test-error contrast")
        p.add_argument("--out", help="also write the Markdown here")
    a = ap.parse_args(argv)
    if a.cmd == "plan":
        try:
            counts = [int(s) for s in a.seeds.split(",")]
        except ValueError:
            ap.error(f"--seeds={a.seeds!r}: give seed counts as integers separated by commas, e.g. 2,3,4,6,8")
        p = plan(a.paths, a.tol, counts, a.effect, a.center)
        if a.target is not None:
            m = choose_main(p, a.target)
            if not m:
                print("no pilot size leaves two underfitting widths below its threshold", file=sys.stderr)
                return 1
            fresh = int(max(p["pilot_seeds"])) + 1 if p["pilot_seeds"] else 0  # the main run's seeds follow the pilot's
            print(" ".join(main_overrides(m, p["lr"], p["width"], fresh)))
            return 0
        if a.json:
            print(json.dumps({"lr": p["lr"], "thresholds": p["thresholds"].to_dict("records"),
                              "contrast_sd": p["spread"].contrast_sd, "grids": p["grids"]}, default=float))
            return 0
        text = plan_markdown(p)
    elif a.cmd == "compare":
        first = load_runs(a.paths, optuna_state=False)
        text = compare_markdown(compare(first, load_runs(a.against, optuna_state=False)), width_column(first))
    else:
        pilot = load_runs(a.pilot, optuna_state=False)
        main_runs = load_runs(a.paths, optuna_state=False)
        pilot = pilot_at_main_lr(pilot, main_runs, a.tol)
        sp = spread(pilot, tol=a.tol, rule=a.center)
        if a.capped_from:
            main_runs = with_capped(main_runs, load_runs(a.capped_from, optuna_state=False))
        grids = _declared_grids(main_runs)
        text = tests_markdown(peak_tests(main_runs, sp, a.effect, tol=a.tol, rule=a.center, grids=grids), sp,
                              a.center)
        text += spike_note(main_runs) + precision_note(main_runs) + machine_note(main_runs)
        if not grids:
            text += "\n" + NO_GRID[0].upper() + NO_GRID[1:] + ".\n"
        if a.curves:
            text += curves_markdown(main_runs)
    print(text)
    if a.out:
        from pathlib import Path
        Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
