"""Which runs make one declared grid: curve keys, one recipe, the grid a study declared, what of it finished."""
from __future__ import annotations

import itertools
import warnings

import numpy as np
import pandas as pd

from analysis.frames import _norm
from analysis.studies import studies_of
from src.run_contract import STUDY_RUNTIME_KEYS

NOISE = "label_noise.p"
LR = "optimizer.lr"
SEED = "seed"
# keys that split a pilot or main run into separate curves when they take several values
CURVE_KEYS = ("dataset.n_train", "optimizer.lr", "optimizer.weight_decay", "trainer.converge_epochs",
              "trainer.max_epochs")


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

    path = Path(__file__).resolve().parents[2] / "conf" / "label_noise" / f"{group}.yaml"
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
        along = [k for k in along_widths(c, fixed, width) if k not in mixed]
        if along:
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


def along_widths(c: pd.DataFrame, keys: list[str], width: str) -> list[str]:
    """The ``keys`` whose value differs between the widths of the curve ``c``: a curve stitched from two recipes. A
    model key may follow the width one-to-one (``follows``: a ViT's MLP size); any other is the recipe's."""
    return [k for k in keys if c[k].map(_norm).nunique() > 1 and not (k.startswith("model.") and follows(c, k, width))]


def follows(c: pd.DataFrame, key: str, width: str) -> bool:
    """Whether ``key`` takes a different value at each width of the curve (a size that follows the width, as a ViT's
    MLP size does), not two recipes' values split between its widths."""
    per_width = c.groupby(width)[key].agg(lambda v: v.map(_norm).iloc[0])
    return per_width.nunique() == len(per_width)


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
