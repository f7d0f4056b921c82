"""Reading a pilot: collapses, the lr rule, thresholds and spread, and the main run they choose."""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from analysis.design.grid import LR, NOISE, SEED, curve_keys, follows
from analysis.design.power import spread
from analysis.design.thresholds import _flagged, threshold, thresholds
from analysis.double_descent import width_column
from analysis.frames import _norm, completed_only, recipe_columns, require_columns
from analysis.load import load_runs


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
    counts every width as a threshold width. A run whose loss went non-finite there (status failed,
    ``nonfinite_loss``: diverged) counts as flagged too: it is the lr's instability, not a run that did not finish.
    Returns (lr or None, one row per lr with its flagged runs there)."""
    width = width or width_column(df)
    require_columns(df, LR)
    diverged = (df[(df["status"] == "failed") & (df["stop_reason"] == "nonfinite_loss")]
                if {"status", "stop_reason"} <= set(df.columns) else df.iloc[:0])
    df = completed_only(df, "choose_lr")
    others = [k for k in curve_keys(df) if k != LR]
    blown = {tuple(_norm(v) for v in k): g for k, g in diverged.groupby([LR, *others, NOISE], dropna=False)}
    rows = []
    for lr, at in df.groupby(LR, sort=True):
        bad = total = 0
        for key, c in at.groupby([*others, NOISE], dropna=False):
            t = threshold(c, width, tol)
            lost = blown.get(tuple(_norm(v) for v in (lr, *key)), diverged.iloc[:0])  # a list groupby: key is a tuple
            widths = near(sorted({*c[width].unique(), *lost[width].unique()}), t)
            sel = c[c[width].isin(widths)]
            gone = int(lost[width].isin(widths).sum())
            bad += int(_flagged(sel).sum()) + gone
            total += len(sel) + gone
        rows.append({LR: float(lr), "runs_at_threshold_widths": total, "flagged": bad, "stable": bad == 0})
    table = pd.DataFrame(rows)
    stable = table[table["stable"]]
    return (float(stable[LR].max()) if len(stable) else None), table


LADDER = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128)


def suggest_grid(t: float, ladder: tuple = LADDER, below: int = 2) -> list[float]:
    """Widths of ``ladder`` from ``below`` steps under a factor 2 below ``t`` up to 8 t: the threshold in the
    middle of a log axis, dense around it, with room for the second descent."""
    if not np.isfinite(t):
        return []
    lo = [w for w in ladder if w <= t / 2]
    start = lo[-below] if len(lo) >= below else ladder[0]
    return [w for w in ladder if start <= w <= 8 * t]


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
    # a seed run twice (a rerun) is one seed at the mean of its runs, as in ``spread``: means and sd over seeds
    per_seed = (done.groupby([*keys, SEED], dropna=False)
                .agg(runs=("train_error", "size"), train_error=("train_error", "mean"),
                     test_error=("test_error", "mean")).reset_index())
    curves = (per_seed.groupby(keys, dropna=False)
              .agg(seeds=(SEED, "size"), runs=("runs", "sum"), train_mean=("train_error", "mean"),
                   test_mean=("test_error", "mean"), test_sd=("test_error", "std")).reset_index())
    heads = df["model.heads"].dropna().unique() if width == "model.dim" and "model.heads" in df else []
    return {"width": width, "lr": lr, "lr_table": lr_table, "curves": curves, "thresholds": th,
            "pilot_seeds": tuple(sorted(df[SEED].dropna().unique())) if SEED in df else (),
            "heads": int(heads[0]) if len(heads) == 1 else None,
            "collapses": collapse_table(df, width), "spread": sp,
            "mde": {k: sp.mde(k) for k in seeds}, "effect": effect,
            "grids": {str(r.get("dataset.n_train", "")) + f" p={r[NOISE]}": suggest_grid(r["threshold"])
                      for r in th.to_dict("records")}}


def pilot_at_main_lr(pilot: pd.DataFrame, main_runs: pd.DataFrame, tol: float = 0.01) -> pd.DataFrame:
    """The pilot's runs at the lr the main run trained at, where the pilot tried several (its spread at another lr
    is another recipe's): the main run's one lr, else the lr rule's choice. Refused (SystemExit) when the main run's
    lr is not among the pilot's (a pilot of one lr too), or when the main run holds none and the rule chose none
    (every rung collapsed)."""
    tried = sorted(pilot[LR].dropna().astype(float).unique()) if LR in pilot else []
    main_lrs = sorted(main_runs[LR].dropna().astype(float).unique()) if LR in main_runs else []
    if LR not in curve_keys(pilot) and not (len(main_lrs) == 1 and len(tried)):
        return pilot
    if len(main_lrs) == 1:
        if not np.isclose(tried, main_lrs[0]).any():
            raise SystemExit(f"the main run trained at {LR} {main_lrs[0]:g}, which the pilot never tried (it tried "
                             f"{', '.join(f'{v:g}' for v in tried)}): its spread is another recipe's; pass the pilot "
                             "of the main run's lr")
        return pilot[np.isclose(pilot[LR].astype(float), main_lrs[0])] if LR in curve_keys(pilot) else pilot
    lr, _ = choose_lr(pilot, tol=tol)
    if lr is None:
        raise SystemExit(f"the pilot tried {LR} {', '.join(f'{v:g}' for v in tried)} and the lr rule chose none (each "
                         "collapsed or stalled at its threshold widths), and the main runs name no single lr: no "
                         "pilot spread belongs to them")
    return pilot[np.isclose(pilot[LR].astype(float), lr)]


def recipe_departures(pilot: pd.DataFrame, main_runs: pd.DataFrame) -> str:
    """``key (pilot's values -> main run's)`` for each recipe key whose values differ between the two (review
    2026-11-30: the ViT's pilot trained 300 epochs under precision auto, the main run 500 under bf16), or "" when none
    does. The seed, the lr (``pilot_at_main_lr``), the training-set sizes and noise levels (the pooling note's own
    lines), the width, and a size that follows the width in both (a ViT's MLP size) aside."""
    width = width_column(main_runs)
    skip = (SEED, LR, "dataset.n_train", NOISE, width)
    ours, theirs = recipe_columns(pilot, skip), recipe_columns(main_runs, skip)

    def spelled(df: pd.DataFrame, key: str) -> str:
        if key not in df:
            return "not recorded"
        vals = sorted({_norm(v) for v in df[key]}, key=str)
        return ", ".join("null" if v == "nan" else f"{v:g}" if isinstance(v, float) else str(v) for v in vals)

    parts = []
    for key in [*ours, *(k for k in theirs if k not in ours)]:
        a, b = spelled(pilot, key), spelled(main_runs, key)
        if a != b and not (key in pilot and key in main_runs and width in pilot
                           and follows(pilot, key, width) and follows(main_runs, key, width)):
            parts.append(f"{key} ({a} -> {b})")
    return "; ".join(parts)


def pooling_note(pilot: pd.DataFrame, main_runs: pd.DataFrame, seeds: int, tol: float = 0.01,
                 rule: str = "critical") -> str:
    """What the power figure's pilot spread pools (``pilot``: the pilot at the main run's lr, as
    ``pilot_at_main_lr`` gives it): the rule, which was in force before the main runs and stays (changing it after
    them would be post hoc), the training-set sizes and noise levels it pools against the main run's, and, where it
    pools several sizes, each size's smallest detectable peak at ``seeds`` seeds alone, labelled post hoc
    (sensitivity) (review 2026-11-29, design D5)."""
    from analysis.design.power import spread

    done = completed_only(pilot, "pooling_note")
    done = done[~_flagged(done)]

    def values(df: pd.DataFrame, key: str) -> list:
        return sorted(df[key].dropna().unique()) if key in df else []

    parts = []
    for key in ("dataset.n_train", NOISE):
        ours, theirs = values(done, key), values(main_runs, key)
        if ours:
            parts.append(f"{key} {', '.join(f'{v:g}' for v in ours)} {'pooled' if len(ours) > 1 else 'only'}; "
                         "the main run trains at "
                         + (", ".join(f"{v:g}" for v in theirs) or "none recorded"))
    text = ("\nPilot pooling (the rule in force before the main runs, `pilot_at_main_lr`: the pilot's finished, "
            "unflagged runs at the main run's lr, every training-set size and noise level pooled; kept as "
            "declared): " + "; ".join(parts) + ".")
    if len(done) < len(pilot):  # which runs a stop catches (the slow ones) need not be random: say how many
        left = pilot.loc[~pilot.index.isin(done.index)]
        why = left["status"].where(left["status"] != "completed", "flagged (collapsed or stalled)").fillna("unknown")
        counts = sorted(why.value_counts().items(), key=lambda kv: (-kv[1], kv[0]))
        text += (f" The spread reads {len(done)} of the pilot's {len(pilot)} runs at that lr ({len(left)} left out: "
                 + ", ".join(f"{n} {s}" for s, n in counts) + ").")
    otherwise = recipe_departures(done, main_runs)
    if otherwise:
        text += (f" The pilot trained otherwise than the main run in {otherwise}: the power figure takes the spread of "
                 "the pilot's recipe as the main run's.")
    sizes = values(done, "dataset.n_train")
    if len(sizes) > 1:
        alone = []
        for n in sizes:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sp = spread(pilot[pilot["dataset.n_train"] == n], tol=tol, rule=rule)
            if seeds >= 2:
                alone.append(f"dataset.n_train {n:g} alone: mde at {seeds} seeds {sp.mde(seeds):.4f} (power sd "
                             f"{sp.power_sd:.4f})")
            else:  # an unfinished grid whose tests hold one seed (or none): mde(1) is undefined, not a figure
                alone.append(f"dataset.n_train {n:g} alone: power sd {sp.power_sd:.4f} (no mde: the tests hold "
                             f"{seeds} seed{'' if seeds == 1 else 's'}, and a seed spread needs 2)")
        text += (" Post hoc (sensitivity), not the declared figure: the spread of each size alone: "
                 + "; ".join(alone) + ".")
    return text + "\n"
