"""One report per sweep: detect what varied, write report.md with the matching tables, fits, figures.

    python -m analysis.report SWEEP_DIR [SWEEP_DIR ...] --out DIR

Writes DIR/report.md, DIR/tables/*.csv (+ .md) and DIR/figures/*.png.
"""
from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import pandas as pd

from analysis import figures
from analysis.double_descent import WIDTH_KEYS, descent_curves, descent_summary
from analysis.fits import fit_learning_curve
from analysis.load import load_history, load_runs
from analysis.tables import format_table, format_value, summary_table, to_markdown, write_table

# config keys that never count as "what the sweep varied"
IGNORED_PREFIXES = ("hydra.", "trial.study_name", "trial.number", "trial.storage")  # old runs' trial identity
IGNORED_LEAVES = {"seed", "root", "download", "dir", "path", "storage", "output_dir", "num_workers", "device",
                  "progress", "log_every", "checkpoint", "eval_batch_size"}
# how fast a run went, not what it computed: never a compared setting
IGNORED_RUN_SETTINGS = {f"trainer.{k}" for k in ("num_threads", "compile", "channels_last")}
# when a run stops: a compared setting like any other (1 and 6 epochs are two results, not two seeds), unless it
# takes one value per value of other varied keys (max_steps scaled with n_train): then it is named, not an axis
STOP_RULE_KEYS = {f"trainer.{k}" for k in (
    "max_epochs", "max_steps", "max_wall_s", "converge_epochs", "converge_tol", "stalled_margin", "eval_every",
    "train_eval_size")}
MAX_GROUPS = 12  # curves per figure (more are illegible)
MAX_ROWS = 60  # rows per Markdown table (the CSV has them all): every group of a study grid


def _determined_by(df: pd.DataFrame, key: str, by: list[str]) -> bool:
    """True when ``key`` takes one value within every group of ``by``: grouping by ``by`` never mixes its values."""
    if not by:
        return df[key].astype(str).nunique() <= 1
    return df.astype({c: str for c in [key, *by]}).groupby(by)[key].nunique().max() <= 1


def key_roles(df: pd.DataFrame) -> tuple[list[str], dict[str, list[str]]]:
    """The compared keys (see :func:`varied_keys`) and the stop-rule keys that vary only with them: each such key
    maps to the varied keys it takes one value per value of (``{'trainer.max_steps': ['dataset.n_train']}``)."""
    cols = df.attrs.get("config_columns") or [c for c in df.columns if "." in c or c == "seed"]
    keys = [c for c in cols if c in df.columns and not c.startswith(IGNORED_PREFIXES)
            and c not in IGNORED_RUN_SETTINGS and c.rsplit(".", 1)[-1] not in IGNORED_LEAVES
            and df[c].astype(str).nunique() > 1]
    numeric = pd.api.types.is_numeric_dtype

    def alias(k: str, j: str) -> bool:  # two keys naming the same choice (model._target_ / model.name, mlp_dim / dim)
        a, b = df[k].astype(str), df[j].astype(str)
        if (numeric(df[k]) or numeric(df[j])) and a.nunique() == len(df):
            return False  # a float sampled anew for every run: a parameter of its own
        return a.groupby(b).nunique().max() == 1 and b.groupby(a).nunique().max() == 1

    kept: list[str] = []
    for k in [k for k in keys if k not in STOP_RULE_KEYS]:
        if not any(alias(k, j) for j in kept):
            kept.append(k)
    dependents: dict[str, list[str]] = {}
    for k in [k for k in keys if k in STOP_RULE_KEYS]:
        # a float sampled anew for every run "determines" everything: it never makes a stop rule a dependent
        axes = [j for j in kept if not (pd.api.types.is_float_dtype(df[j]) and df[j].nunique() == len(df))]
        single = [j for j in axes if _determined_by(df, k, [j])]
        if single:
            dependents[k] = single[:1]
        elif axes and _determined_by(df, k, axes):
            dependents[k] = axes
        else:
            kept.append(k)
    return kept, dependents


def varied_keys(df: pd.DataFrame) -> list[str]:
    """Config columns taking more than one value across runs, minus seeds, bookkeeping and execution settings
    (``IGNORED_RUN_SETTINGS``). Runs that differ in a kept key are never averaged as seeds.

    Of keys that map one-to-one onto each other (model._target_ and model.name, or model.mlp_dim set to 2 x model.dim
    by a preset) only the first is kept. A numeric key whose value differs in every run is always kept: in a
    continuous search every sampled float is unique per trial, so lr and weight decay map one-to-one without being
    aliases. A stop-rule key (``STOP_RULE_KEYS``: max_epochs, max_steps, ...) is kept like any other, except when it
    takes one value per value of the other kept keys (max_steps scaled with n_train): it then splits no group and
    :func:`key_roles` names it as a dependent instead."""
    return key_roles(df)[0]


class Report:
    def __init__(self, out: Path):
        self.out, self.lines, self.files = out, [], []

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def figure(self, path: Path, caption: str) -> None:
        self.files.append(path)
        self.add(f"![{caption}]({path.relative_to(self.out).as_posix()})", "")

    def table(self, numbers: pd.DataFrame, name: str, formatted: pd.DataFrame | None = None) -> None:
        csv, md = write_table(numbers, self.out / "tables" / name, formatted)
        self.files += [csv, md]
        shown = numbers if formatted is None else formatted
        note = f"\n(first {MAX_ROWS} of {len(shown)} rows; all in the CSV)\n" if len(shown) > MAX_ROWS else ""
        self.add(to_markdown(shown.head(MAX_ROWS)) + note, f"Data: [{csv.name}](tables/{csv.name})", "")

    def write(self) -> Path:
        path = self.out / "report.md"
        path.write_text("\n".join(self.lines) + "\n")
        self.files.insert(0, path)
        return path


def _results(rep: Report, runs: pd.DataFrame, varied: list[str]) -> None:
    table = summary_table(runs, varied)
    rep.add(f"## Results per {', '.join(varied) or 'sweep'}", "",
            "Mean ± std over seeds of completed runs; wall time (m:s) is training plus evaluation and checkpoints.", "")
    rep.table(table, "results", format_table(table))
    shown = table.head(MAX_GROUPS * 2)
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
        name, direction = _first(t, "objective_name", "objective"), _first(t, "objective_direction", "minimize")
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
    rep.add("## Training curves", "", "Accuracy and loss per epoch, mean over seeds (solid: test, dashed: train)"
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
            "The offset model `a · n^alpha + c` is fitted when there are >= 4 sizes; its `_lo`/`_hi` columns are "
            "a percentile bootstrap over seeds, too narrow with 3-4 seeds: a sensitivity check only; "
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
    curves = descent_curves(runs, width=width, noise=noise, by=by)
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
            "convergence rule, counts the seeds that reached the epoch cap first (not converged). The train panel "
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


def _grouping_notes(runs: pd.DataFrame, varied: list[str], dependents: dict[str, list[str]],
                    by: list[str] | None) -> list[str]:
    """Lines naming the stop rules that vary only with a compared key, and (with ``--by``) every varied key that the
    chosen groups average over."""
    lines = [f"- `{k}` varies with {', '.join(f'`{j}`' for j in on)} (one value per value of "
             f"{'it' if len(on) == 1 else 'them'}): not a separate axis." for k, on in dependents.items()
             if not by or set(on) <= set(varied)]
    if by:
        mixed = [k for k in [*key_roles(runs)[0], *dependents]
                 if k not in varied and not _determined_by(runs, k, varied)]
        lines += [f"- note: the rows average runs that differ in `{k}` (not in --by)." for k in mixed]
    return [*lines, ""] if lines else []


def _run_names(run_dirs: pd.Series, paths: list[str]) -> list[str]:
    """Each run dir relative to the sweep folder holding it (the folder's own name when it is one)."""
    roots = [Path(p).resolve() for p in paths]
    names = []
    for d in map(Path, run_dirs):
        root = next((r for r in roots if d == r or r in d.parents), None)
        names.append(d.relative_to(root).as_posix() if root is not None and d != root else d.name)
    return names


EXECUTION = ("precision", "device")  # what each run's summary.json records of how it trained; no config column says


def _counts(values: pd.Series) -> str:
    """``"fp32 2, bf16 1"``: each value with its count, the commonest first (ties by name)."""
    counts = values.value_counts()
    order = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{v} {n}" for v, n in order)


def _execution(rep: Report, runs: pd.DataFrame, varied: list[str]) -> None:
    """The precision and device the completed runs trained at, from their summaries: `trainer.precision=auto` times
    fp32 and bf16 for each model on the machine, so two compared settings can train at two precisions while both
    configs say `auto`, and a grid resumed elsewhere can mix devices. One line when every run shares them; otherwise
    a count per compared setting, and a warning when the settings differ in them (a difference between settings may
    then be precision's or the device's as well)."""
    done = runs[runs["status"] == "completed"]
    cols = [c for c in EXECUTION if c in done and done[c].notna().any() and c not in varied]  # --by precision: a key
    if done.empty or not cols:
        return
    shown = done.assign(**{c: done[c].fillna("unknown").astype(str) for c in cols})
    if "device" in cols:
        shown["device"] = shown["device"].str.split(":").str[0]  # cuda:0 and cuda:1 are one kind of device
    if all(shown[c].nunique() == 1 for c in cols):
        where = " on ".join(shown[c].iloc[0] for c in cols)
        rep.add(f"- Every completed run trained at {where} (the {' and '.join(cols)} its summary.json records).", "")
        return
    groups = shown.groupby(varied, dropna=False, sort=True) if varied else shown.assign(_all="all").groupby("_all")
    table = groups[cols].agg(_counts).reset_index()

    def confounded(c: str) -> bool:  # the settings differ in it, and not because it is one of them (a pinned value)
        if f"trainer.{c}" in varied:
            return bool((groups[c].nunique() > 1).any())
        return groups[c].apply(lambda v: tuple(sorted(v.value_counts(normalize=True).round(6).items()))).nunique() > 1

    differ = bool(varied) and any(confounded(c) for c in cols)
    rep.add("## Precision and device", "",
            "The completed runs trained at more than one " + " or ".join(cols) + " (from their summary.json; "
            "`trainer.precision=auto` chooses per model and machine, so configs that all say `auto` can differ)"
            + (". **Warning: the compared settings differ in the precision or device they trained at**, so a "
               "difference between them may be precision's or the device's as well as the settings'; pin "
               "`trainer.precision` (and `trainer.device`) to compare them." if differ else "."), "")
    rep.table(table, "execution")


def _flag_notes(runs: pd.DataFrame, paths: list[str]) -> list[str]:
    """Lines counting stalled runs and naming the runs that stopped moving while their lr had annealed."""
    lines = []
    stalled = runs["stalled"].fillna(False).astype(bool) if "stalled" in runs else pd.Series(False, runs.index)
    if stalled.any():
        collapsed = int(runs["collapsed"].fillna(False).astype(bool).sum()) if "collapsed" in runs else 0
        lines.append(f"- {int(stalled.sum())} stalled runs (train error at or near chance at the end"
                     + (f"; {collapsed} of them collapsed there from a far lower one they had reached" if collapsed
                        else "") + "): results, kept in every table and curve and counted in their `stalled` column.")
    low = runs["low_lr_stop"].fillna(False).astype(bool) if "low_lr_stop" in runs else pd.Series(False, runs.index)
    if low.any():
        n = int(low.sum())
        named = ", ".join(f"`{d}`" for d in runs.loc[low, "run_dir"])
        its = "their" if n > 1 else "its"
        lines.append(f"- {n} run{'s' if n > 1 else ''} stopped (converged or stalled) with {its} lr below "
                     f"10% of {its} base (the trainer's `low_lr_stop`): the train error may have "
                     f"stopped moving because the lr had annealed, not because the model had fitted ({named}). "
                     "Counted in the tables' `low-lr stops` column.")
    return [*lines, ""] if lines else []


def _failed(rep: Report, runs: pd.DataFrame, varied: list[str], paths: list[str]) -> None:
    """Failed runs (diverged to NaN, crashed, unreadable), counted per configuration and stop reason."""
    bad = runs[runs["status"].isin(["failed", "unknown"])]
    if bad.empty:
        return
    bad = bad.assign(stop_reason=bad["stop_reason"].fillna("-") if "stop_reason" in bad else "-",
                     _name=_run_names(bad["run_dir"], paths),
                     _error=bad["error"].fillna("").astype(str).str.slice(0, 120) if "error" in bad else "")
    seeds = bad["seed"] if "seed" in bad else pd.Series(None, bad.index)
    rows = []
    for key, g in bad.assign(_seed=seeds).groupby([*varied, "stop_reason"], dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip([*varied, "stop_reason"], key, strict=True)), "runs": len(g),
                     "seeds": ", ".join(str(v) for v in sorted(g["_seed"].dropna().unique())),
                     "run dirs": ", ".join(g["_name"]), "error": g["_error"].iloc[0]})
    rep.add("## Failed runs", "", f"{len(bad)} run{'s' if len(bad) > 1 else ''} failed (a loss that diverged to NaN, "
            "a crash, an unreadable summary); they are in no table or curve above. Per configuration:", "")
    rep.table(pd.DataFrame(rows), "failed_runs")


def make_report(paths: list[str | Path], out: str | Path, n_boot: int = 1000, tol: float = 0.01,
                by: list[str] | None = None) -> list[Path]:
    """Write the report for the runs under ``paths`` into ``out``; return every file written.

    ``by``: the config keys that define the compared settings, instead of :func:`varied_keys`."""
    paths = [str(p) for p in paths]
    out = Path(out)
    runs = load_runs(paths)
    if by:
        unknown = [k for k in by if k not in runs.columns]
        if unknown:
            keys = sorted(c for c in runs.columns if "." in c and not c.startswith(IGNORED_PREFIXES))
            raise ValueError(f"--by {' '.join(unknown)}: no such config key in these runs; choose from {keys}")
    auto, dependents = key_roles(runs)
    varied = list(by) if by else auto
    out.mkdir(parents=True, exist_ok=True)
    rep = Report(out)
    status = runs["status"].value_counts().to_dict()
    rep.add("# Sweep report", "", f"Sweep folders: {', '.join(f'`{p}`' for p in paths)}", "",
            f"Runs: {len(runs)} ({', '.join(f'{n} {s}' for s, n in status.items())}); seeds: "
            f"{runs['seed'].nunique() if 'seed' in runs else 1}. Varied keys: "
            f"{', '.join(f'`{k}`' for k in varied) or 'none (repeats of one config)'}. "
            "Fits and tables use completed runs; stalled runs are results and are in them, counted per row.", "")
    rep.add(*_grouping_notes(runs, varied, dependents, by), *_flag_notes(runs, paths))
    _execution(rep, runs, varied)
    if (runs["status"] == "completed").sum() == 0:
        rep.add("No completed runs yet: nothing to tabulate.", "")
    else:
        _results(rep, runs, varied)
        if "trial_number" in runs and "objective" in runs and runs["trial_number"].notna().any():
            _trials(rep, runs[runs["trial_number"].notna()], varied)
        _history(rep, paths, varied)
        if "dataset.n_train" in varied or ("n_train" in runs and runs["n_train"].nunique() > 1):
            _learning_curves(rep, runs, varied, n_boot)
        width = next((k for k in WIDTH_KEYS if k in varied), None)
        if width and "label_noise.p" in runs:
            _double_descent(rep, runs, varied, width, tol)
    _failed(rep, runs, varied, paths)
    rep.write()
    return rep.files


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+", help="sweep output folders (searched recursively for run dirs)")
    ap.add_argument("--out", default=None, help="output folder (default: FIRST_PATH/report)")
    ap.add_argument("--n-boot", type=int, default=1000, help="bootstrap samples for the offset model's ranges")
    ap.add_argument("--tol", type=float, default=0.01, help="train error below which a width interpolates")
    ap.add_argument("--by", nargs="+", default=None, metavar="KEY",
                    help="config keys that define the compared settings (default: every key that varied, stop rules "
                         "included, minus seeds, bookkeeping and a stop rule that takes one value per value of "
                         "another varied key); the report names any varied key the chosen rows average over")
    args = ap.parse_args(argv)
    try:
        files = make_report(args.paths, args.out or Path(args.paths[0]) / "report", args.n_boot, args.tol, args.by)
    except (FileNotFoundError, NotADirectoryError, ValueError) as e:
        raise SystemExit(f"analysis.report: {e}") from None
    print(f"wrote {files[0]} and {len(files) - 1} tables/figures")


if __name__ == "__main__":
    main()
