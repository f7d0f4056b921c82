"""The report's result sections: results per setting, the Optuna trials, training curves, learning curves
and double descent."""
from __future__ import annotations

import warnings

import pandas as pd

from analysis import figures
from analysis.double_descent import descent_curves, descent_summary
from analysis.fits import fit_learning_curve
from analysis.load import load_history
from analysis.report_page import Report
from analysis.tables import format_table, format_value, summary_table
from src.run_contract import objective_direction

MAX_GROUPS = 12  # curves per figure (more are illegible)


def _results(rep: Report, runs: pd.DataFrame, varied: list[str]) -> None:
    table = summary_table(runs, varied)
    rep.add(f"## Results per {', '.join(varied) or 'sweep'}", "",
            "Mean ± std over seeds of completed runs; wall time (m:s) is training plus evaluation and checkpoints.", "")
    rep.table(table, "results", format_table(table))
    shown = table.head(MAX_GROUPS * 2)  # bars past this are illegible; the page says the figure stops there
    if len(shown) < len(table):
        rep.add(f"The figure below shows the first {len(shown)} of {len(table)} groups (the table's order); "
                "all are in the table.", "")
    rep.figure(figures.plot_bars(shown, varied, rep.out / "figures" / "results_bars.png"), "test accuracy and time")


def _first(t: pd.DataFrame, col: str, default: str) -> str:
    return t[col].dropna().iloc[0] if col in t and t[col].notna().any() else default


def _trial_status(status: str, reason: object, stalled: bool) -> str:
    """A trial's status as the trials table shows it: a stopped run with its reason, a completed one that ended at
    chance (``analysis.load.result_flags``) as stalled, with the stop rule that ended it when that was another."""
    if status == "completed" and stalled:
        why = "" if not isinstance(reason, str) or reason == "stalled" else f": at chance at {reason}"
        return f"completed (stalled{why})"
    return f"{status} ({reason})" if status != "completed" and isinstance(reason, str) else status


def _trials(rep: Report, runs: pd.DataFrame, varied: list[str]) -> None:
    """Every trial of the Optuna studies in these folders, pruned and stopped ones included, with its
    objective; the best completed trial of each study named."""
    keys = [c for c in ("study_name", "study_storage") if c in runs]
    studies = runs[keys].astype("string").fillna("").agg(" in ".join, axis=1) if keys else ""
    rep.add("## Trials", "", "Every trial, in order, with the objective it reported last (a pruned trial's value "
            "is from the evaluation it was pruned at); the tables above use completed trials only.", "")
    groups = runs.assign(_study=studies).groupby("_study", sort=True)
    for i, (study, t) in enumerate(groups):
        t = t.sort_values("trial_number")
        name = _first(t, "objective_name", "objective")  # runs from before the direction was recorded: the trainer's
        direction = _first(t, "objective_direction", objective_direction(name))  # rule for the name (acc: maximize)
        reason = t["stop_reason"] if "stop_reason" in t else pd.Series(None, index=t.index)
        stuck = t["stalled"].fillna(False).astype(bool) if "stalled" in t else pd.Series(False, index=t.index)
        table = pd.DataFrame({"trial": t["trial_number"].astype("Int64"),
                              "status": [_trial_status(st, why, s)
                                         for st, why, s in zip(t["status"], reason, stuck, strict=True)]})
        if "optuna_state" in t and t["optuna_state"].notna().any():
            table["Optuna state"] = t["optuna_state"].fillna("-")
        cols = [*varied, "objective", *(c for c in ("epochs", "wall_s") if c in t)]
        table[cols] = t[cols]
        shown = table.copy()
        for c in cols:
            shown[c] = [format_value(v, "time" if c == "wall_s" else "num") if isinstance(v, float) else str(v)
                        for v in t[c]]
        if groups.ngroups > 1:
            rep.add(f"Study `{study}`:", "")
        rep.table(table, f"trials_{i}" if i else "trials",
                  shown.rename(columns={"objective": name, "wall_s": "wall (m:s)"}))
        done = t[(t["status"] == "completed") & t["objective"].notna()]
        if len(done):
            best = done.loc[done["objective"].idxmin() if direction == "minimize" else done["objective"].idxmax()]
            params = "".join(f", `{k}` = {shown.loc[best.name, k]}" for k in varied)
            rep.add(f"Best trial: {int(best['trial_number'])} ({direction}), {name} = "
                    f"{shown.loc[best.name, 'objective']}{params and ';' + params[1:]}.", "")


def _history(rep: Report, paths: list[str], varied: list[str]) -> None:
    try:
        hist = load_history(paths)
    except FileNotFoundError as e:
        rep.add("## Training curves", "", f"No curves: {e}", "")
        return
    hist = hist[hist["status"] == "completed"] if "status" in hist else hist
    groups = hist.groupby(varied, dropna=False).ngroups if varied else 1
    if groups > MAX_GROUPS:
        first = hist.groupby(varied, dropna=False).ngroup() < MAX_GROUPS
        hist = hist[first]
    rep.add("## Training curves", "", "Accuracy and loss per epoch, mean over seeds (solid: test, dashed: train; "
            "faded past the epoch where a group's first run stopped, where the mean is over the runs still training)"
            + (f"; first {MAX_GROUPS} of {groups} groups." if groups > MAX_GROUPS else "."), "")
    rep.figure(figures.plot_history(hist, varied, rep.out / "figures" / "history.png"), "accuracy and loss per epoch")


def _learning_curves(rep: Report, runs: pd.DataFrame, varied: list[str], n_boot: int) -> None:
    # the images trained on, as each finished run's summary records them (a running job has no summary yet, and
    # `dataset.n_train` is null for "the whole training set": choosing x from every run would drop that size)
    done = runs[runs["status"] == "completed"] if "status" in runs else runs
    x = "n_train" if "n_train" in done and len(done) and done["n_train"].notna().all() else "dataset.n_train"
    by = [k for k in varied if k != "dataset.n_train"]
    rep.add("## Learning curves", "", "`test_error ≈ prefactor · n^alpha`, least squares in log-log on the "
            f"geometric mean over seeds (n = `{x}`, images trained on); alpha_lo/alpha_hi: 95% t-interval over "
            "the per-seed slopes (`ci_method` names the fallback used with fewer than 2 complete seeds). "
            "`curved`: the power law misses its points, its alpha depending on the sizes fitted (the 95% t-interval "
            "over seeds of each seed's log-log curvature, `curvature_lo`..`curvature_hi`, excludes 0; the figure "
            "dashes the line); `max_miss`: the farthest geometric mean from the line, as a fraction. "
            "The offset model `a · n^alpha + c` is fitted when there are >= 4 sizes; its `_lo`/`_hi` columns are "
            "a percentile bootstrap resampling whole seeds, no 95% interval with 3-4 seeds (about 78% coverage in "
            "simulated 4-seed studies): a sensitivity check only; "
            "`offset_ok` is false (and the figure greys the curve out) when its floor misses its own points "
            "(`offset_note`: above a measured mean, or at zero).", "")
    stalled = runs["stalled"].fillna(False).astype(bool) if "stalled" in runs else pd.Series(False, runs.index)
    _fit_and_draw(rep, runs, x, by, n_boot, "")
    if stalled.any():  # stalled runs are results, in the curve above; this shows what leaving them out would change
        rep.add(f"### Without the {int(stalled.sum())} stalled runs", "",
                "The same fits with the runs whose train error stayed at chance left out (for comparison only: "
                "leaving them out biases the small-n end downwards).", "")
        _fit_and_draw(rep, runs[~stalled], x, by, n_boot, "_without_stalled")


def _fit_and_draw(rep: Report, runs: pd.DataFrame, x: str, by: list[str], n_boot: int, suffix: str) -> None:
    sizes = runs[x].nunique()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fits = fit_learning_curve(runs, x=x, y="test_error", by=by, n_boot=n_boot, offset=sizes >= 4,
                                      errors="skip")
    except ValueError as e:
        rep.add(f"No fit: {e}", "")
        return
    for w in caught:
        rep.add(f"- note: {w.message}")
    rep.add("")
    rep.table(fits, f"learning_curve_fits{suffix}")
    rep.figure(figures.plot_learning_curves(runs, fits, rep.out / "figures" / f"learning_curves{suffix}.png"),
               "learning curves" + (" without stalled runs" if suffix else ""))


def _double_descent(rep: Report, runs: pd.DataFrame, varied: list[str], width: str, tol: float) -> None:
    noise = "label_noise.p"
    by = [k for k in varied if k not in (width, noise)]
    try:
        curves = descent_curves(runs, width=width, noise=noise, by=by)
    except ValueError as e:  # e.g. a --by that pools two recipes into one point
        rep.add("## Double descent", "", f"No curves: {e}", "")
        return
    summary = descent_summary(curves, tol=tol)
    rep.add("## Double descent", "", f"Train and test error against `{width}` per `{noise}`. Interpolation "
            f"threshold: smallest width with mean train error <= {tol} (against the labels trained on). Peak: "
            "highest local maximum of the mean test error from the critical width (the widest below the threshold) "
            "to 4 x the threshold (`window_lo`..`window_hi`); `peak_height` is its prominence and `peak_z` that "
            "height over the standard error of a difference of seed means (test-error spread pooled over widths); "
            "`peak_significant` when it exceeds the 5% t point and no seed at the peak's width stalled "
            "(`peak_stalled_seeds`: a run stuck at chance is a failed training, not a model that barely "
            "interpolates). **Post hoc, a description, not a test**: the peak and its base are chosen after "
            "looking (on flat curves the flag fires about 23% of the time); the declared test of a peak, with its "
            "power, is `python -m analysis.design test`; `n_capped`, where the runs stop by a "
            "convergence rule, counts the seeds that reached the epoch cap first (not converged); `n_ended_in_spike` "
            "counts the seeds read inside an end-of-run loss spike (hollow diamonds; kept, at their final errors). "
            "The train panel "
            "adds the error "
            "on clean labels (dashed) and on the flipped images (dotted) when the runs recorded them.", "")
    rep.table(summary, "double_descent_summary")
    rep.table(curves, "double_descent_curves")
    rep.figure(figures.plot_double_descent(curves, summary, rep.out / "figures" / "double_descent.png", runs=runs),
               "double descent")
    if "n_stalled" in curves and curves["n_stalled"].sum() > 0:  # they are in the curves above, flagged
        kept = runs[~runs["stalled"].fillna(False).astype(bool)]
        rep.add(f"### Without the {int(curves['n_stalled'].sum())} stalled runs", "",
                "`n_stalled` above counts the seeds per point whose train error ended at chance (or collapsed "
                "towards it); they are results "
                "and stay in the curves. For comparison only, the same curves with them left out (leaving them out "
                "biases the under-parametrised end downwards):", "")
        if kept.empty:
            rep.add("Every run stalled: no curve without them.", "")
            return
        curves2 = descent_curves(kept, width=width, noise=noise, by=by)
        summary2 = descent_summary(curves2, tol=tol, widths=curves[width].unique())  # the critical width: full grid's
        rep.table(summary2, "double_descent_summary_without_stalled")
        rep.figure(figures.plot_double_descent(curves2, summary2,
                                               rep.out / "figures" / "double_descent_without_stalled.png", runs=kept),
                   "double descent without stalled runs")
