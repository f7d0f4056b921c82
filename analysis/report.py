"""One report per sweep: detect what varied, write report.md with the matching tables, fits, figures.

    python -m analysis.report SWEEP_DIR [SWEEP_DIR ...] --out DIR

Writes DIR/report.md, DIR/tables/*.csv (+ .md) and DIR/figures/*.png.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from analysis.double_descent import WIDTH_KEYS
from analysis.load import load_runs
from analysis.report_notes import _execution, _failed, _flag_notes, _grouping_notes
from analysis.report_page import Report
from analysis.report_results import _double_descent, _history, _learning_curves, _results, _trials
from analysis.varied import IGNORED_PREFIXES, key_roles


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
            "Fits and tables use completed runs; stalled runs and runs that ended inside a loss spike are results "
            "and are in them, counted per row.", "")
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
