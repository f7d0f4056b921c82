"""Tables in the papers' form: one row per value of the varied keys, mean +- std over seeds."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.frames import completed_only, one_run_per_seed, require_columns, warn_mixed_recipes

# metric column -> (header, kind); kind picks the formatting
METRICS = {
    "wall_s": ("wall time (m:s)", "time"),  # training plus evaluation and checkpoints, across resumes
    "train_acc": ("train acc (%)", "pct"),
    "val_acc": ("val acc (%)", "pct"),
    "test_acc": ("test acc (%)", "pct"),
    "train_loss": ("train loss", "num"),
    "test_loss": ("test loss", "num"),
    "val_auc": ("val AUC", "num"),  # the binary scores, where the runs recorded them (two-class data)
    "test_auc": ("test AUC", "num"),
    "test_pf1": ("test pF1", "num"),
}


# run flags counted per row of a table: column -> header. ``ended_in_spike`` (``analysis.load.result_flags``): a
# run whose final train error lies well above its recent ones, read inside a loss spike; a result at its final
# errors, in the means like the stalled runs, and counted as they are
FLAGS = {"stalled": "stalled", "low_lr_stop": "low-lr stops", "capped": "at the cap",
         "ended_in_spike": "ended in a spike"}


def with_accuracies(df: pd.DataFrame) -> pd.DataFrame:
    """Add ``*_acc = 1 - *_error`` where an error column exists and the accuracy does not."""
    df = df.copy()
    for split in ("train", "val", "test"):
        if f"{split}_error" in df.columns and f"{split}_acc" not in df.columns:
            df[f"{split}_acc"] = 1.0 - df[f"{split}_error"]
    return df


def summary_table(df: pd.DataFrame, by: list[str] | str, metrics: list[str] | None = None,
                  status: str | None = "completed") -> pd.DataFrame:
    """Numeric table: the ``by`` columns, ``<metric>_mean`` and ``<metric>_std`` per metric, ``n_seeds``
    (runs repeating a seed of one setting are averaged first and count once), ``<metric>_count`` for a metric that
    some seeds lack (its mean and std are over that many), and per flag in ``FLAGS`` that the
    runs carry, ``n_<flag>``: how many of those seeds' runs have it (stalled runs, and runs that ended inside a loss
    spike, are results and are in the means). Rows that average runs differing in a recipe key not in ``by`` (weight
    decay 0 on seeds 0-2, 0.01 on seeds 3-5) are kept, with a warning naming the key (review 2026-11-29)."""
    by = [by] if isinstance(by, str) else list(by)
    df = with_accuracies(df)
    metrics = metrics or [m for m in METRICS if m in df.columns]
    require_columns(df, *by, *metrics)
    df = completed_only(df, "summary_table", status)
    flags = [f for f in FLAGS if f in df.columns]
    df = df.assign(**{f: df[f].astype(float) for f in flags})  # a repeated seed's flags average like its metrics
    warn_mixed_recipes(df, by, "summary_table")
    df = one_run_per_seed(df, by, [*metrics, *flags], "summary_table")
    g = df.groupby(by, dropna=False, sort=True) if by else df.assign(_all="all runs").groupby("_all")
    out = g[metrics].agg(["mean", "std"])
    out.columns = [f"{m}_{stat}" for m, stat in out.columns]
    out["n_seeds"] = g.size()
    for m in metrics:  # a metric some seeds lack: its mean and std are over fewer seeds, and the table says so
        held = g[m].count()
        if (held < out["n_seeds"]).any():
            out[f"{m}_count"] = held
    for f in flags:
        out[f"n_{f}"] = g[f].agg(lambda v: int((v > 0).sum()))
    return out.reset_index()


def format_value(x: float, kind: str = "num") -> str:
    """One number for a table: ``time`` as m:s, ``pct`` as percent, ``num`` to 4 significant digits (tiny values,
    such as learning rates, in e-notation)."""
    if not np.isfinite(x):
        return "-"
    if kind == "time":
        s = int(round(x))
        return f"{s // 60}:{s % 60:02d}"
    if kind == "pct":
        return f"{100 * x:.2f}"
    return f"{x:.2e}" if x != 0 and abs(x) < 1e-3 else f"{x:.4g}"


def format_table(table: pd.DataFrame) -> pd.DataFrame:
    """Strings "mean ± std" with the papers' units (m:s, percent); std left off with one seed; the seed and flag
    counts as they are."""
    metrics = [c[: -len("_mean")] for c in table.columns if c.endswith("_mean")]
    counts = ["n_seeds", *(f"n_{f}" for f in FLAGS)]
    keys = [c for c in table.columns if not c.endswith(("_mean", "_std", "_count")) and c not in counts]
    out = table[keys].copy()
    for m in metrics:
        header, kind = METRICS.get(m, (m, "num"))
        mean, std = table[f"{m}_mean"], table[f"{m}_std"]
        held = table[f"{m}_count"] if f"{m}_count" in table else table["n_seeds"]
        out[header] = [format_value(a, kind) + (f" ± {format_value(b, kind)}" if np.isfinite(b) else "")
                       + (f" ({k} of {n} seeds)" if k < n else "")
                       for a, b, k, n in zip(mean, std, held, table["n_seeds"], strict=True)]
    out["seeds"] = table["n_seeds"]
    for f, header in FLAGS.items():
        if f"n_{f}" in table:
            out[header] = table[f"n_{f}"]
    return out


def to_markdown(table: pd.DataFrame, floatfmt: str = ".4g") -> str:
    """A GitHub-flavoured Markdown table (no tabulate dependency)."""
    def cell(v):
        if isinstance(v, float | np.floating):
            return "-" if not np.isfinite(v) else format(v, floatfmt)
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(map(str, table.columns)) + " |", "|" + " --- |" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def write_table(table: pd.DataFrame, stem: str | Path, formatted: pd.DataFrame | None = None) -> tuple[Path, Path]:
    """Write ``stem``.csv (numbers) and ``stem``.md (``formatted``, or the numbers); return both paths."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    csv, md = stem.with_suffix(".csv"), stem.with_suffix(".md")
    table.to_csv(csv, index=False)
    md.write_text(to_markdown(table if formatted is None else formatted))
    return csv, md
