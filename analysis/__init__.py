"""Sweep analysis: run directories and Optuna storages into pandas, fits, tables, figures.

Reads files only (the run-directory contract); never imports the trainer.
"""
from analysis.double_descent import descent_curves, descent_summary
from analysis.fits import curve_points, fit_learning_curve, slope_difference
from analysis.frames import MissingColumnError, require_columns
from analysis.load import load_history, load_runs, load_study
from analysis.run_dir import find_run_dirs
from analysis.tables import format_table, summary_table, to_markdown, write_table

__all__ = [
    "MissingColumnError", "curve_points", "descent_curves", "descent_summary", "find_run_dirs",
    "fit_learning_curve", "format_table", "load_history", "load_runs", "load_study", "require_columns",
    "slope_difference", "summary_table", "to_markdown", "write_table",
]
