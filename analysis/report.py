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
# how long and how a run was trained, not what was studied: learning-curve runs of different sizes
# often get different step caps, and splitting the fit by them would be wrong (--by overrides)
IGNORED_RUN_SETTINGS = {f"trainer.{k}" for k in (
    "max_epochs", "max_steps", "max_wall_s", "converge_epochs", "converge_tol",
    "eval_every", "train_eval_size", "num_threads", "compile", "channels_last")}
MAX_GROUPS = 12  # curves per figure (more are illegible)
MAX_ROWS = 60  # rows per Markdown table (the CSV has them all): every group of a study grid


def varied_keys(df: pd.DataFrame) -> list[str]:
    """Config columns taking more than one value across runs, minus seeds, bookkeeping and stop rules
    (``IGNORED_RUN_SETTINGS``); of keys that map one-to-one onto each other (model._target_ and model.name, or
    model.mlp_dim set to 2 x model.dim by a preset) only the first is kept. A numeric key whose value differs in
    every run is always kept: in a continuous search every sampled float is unique per trial, so lr and weight
    decay map one-to-one without being aliases."""
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
    for k in keys:
        if not any(alias(k, j) for j in kept):
            kept.append(k)
    return kept


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
        table = pd.DataFrame({"trial": t["trial_number"].astype("Int64"),
                              "status": [st if st == "completed" or not isinstance(why, str) else f"{st} ({why})"
                                         for st, why in zip(t["status"], reason, strict=True)]})
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
    x = "n_train" if "n_train" in runs and runs["n_train"].notna().all() else "dataset.n_train"
    by = [k for k in varied if k != "dataset.n_train"]
    rep.add("## Learning curves", "", "`test_error ≈ prefactor · n^alpha`, least squares in log-log on the "
            f"geometric mean over seeds (n = `{x}`, images trained on); alpha_lo/alpha_hi: 95% t-interval over "
            "the per-seed slopes (`ci_method` names the fallback used with fewer than 2 complete seeds). "
            "The offset model `a · n^alpha + c` is fitted when there are >= 4 sizes; its `_lo`/`_hi` columns are "
            "a percentile bootstrap over seeds, too narrow with 3-4 seeds: a sensitivity check only.", "")
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
    rep.table(fits, "learning_curve_fits")
    rep.figure(figures.plot_learning_curves(runs, fits, rep.out / "figures" / "learning_curves.png"),
               "learning curves")


def _double_descent(rep: Report, runs: pd.DataFrame, varied: list[str], width: str, tol: float) -> None:
    noise = "label_noise.p"
    by = [k for k in varied if k not in (width, noise)]
    curves = descent_curves(runs, width=width, noise=noise, by=by)
    summary = descent_summary(curves, tol=tol)
    rep.add("## Double descent", "", f"Train and test error against `{width}` per `{noise}`. Interpolation "
            f"threshold: smallest width with mean train error <= {tol} (against the labels trained on). Peak: "
            "highest local maximum of the mean test error within a factor 4 of the threshold (`window_lo`.."
            "`window_hi`); `peak_height` is its prominence and `peak_z` that height over the standard error of a "
            "difference of seed means (test-error spread pooled over widths); `peak_significant` when it "
            "exceeds the 5% t point. The train panel adds the error on clean labels (dashed) and on the "
            "flipped images (dotted) when the runs recorded them.", "")
    rep.table(summary, "double_descent_summary")
    rep.table(curves, "double_descent_curves")
    rep.figure(figures.plot_double_descent(curves, summary, rep.out / "figures" / "double_descent.png"),
               "double descent")


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
    varied = list(by) if by else varied_keys(runs)
    out.mkdir(parents=True, exist_ok=True)
    rep = Report(out)
    status = runs["status"].value_counts().to_dict()
    rep.add("# Sweep report", "", f"Sweep folders: {', '.join(f'`{p}`' for p in paths)}", "",
            f"Runs: {len(runs)} ({', '.join(f'{n} {s}' for s, n in status.items())}); seeds: "
            f"{runs['seed'].nunique() if 'seed' in runs else 1}. Varied keys: "
            f"{', '.join(f'`{k}`' for k in varied) or 'none (repeats of one config)'}. "
            "Fits and tables use completed runs only.", "")
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
    bad = runs[runs["status"].isin(["failed", "unknown"])]
    if len(bad):
        cols = [c for c in ("run_dir", "stop_reason", "error") if c in bad]
        rep.add("## Failed runs", "", to_markdown(bad[cols].fillna("")), "")
    rep.write()
    return rep.files


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+", help="sweep output folders (searched recursively for run dirs)")
    ap.add_argument("--out", default=None, help="output folder (default: FIRST_PATH/report)")
    ap.add_argument("--n-boot", type=int, default=1000, help="bootstrap samples for the offset model's ranges")
    ap.add_argument("--tol", type=float, default=0.01, help="train error below which a width interpolates")
    ap.add_argument("--by", nargs="+", default=None, metavar="KEY",
                    help="config keys that define the compared settings (default: every key that varied, "
                         "minus seeds, bookkeeping and stop rules such as trainer.max_steps)")
    args = ap.parse_args(argv)
    try:
        files = make_report(args.paths, args.out or Path(args.paths[0]) / "report", args.n_boot, args.tol, args.by)
    except (FileNotFoundError, NotADirectoryError, ValueError) as e:
        raise SystemExit(f"analysis.report: {e}") from None
    print(f"wrote {files[0]} and {len(files) - 1} tables/figures")


if __name__ == "__main__":
    main()
