"""Test error against width at fixed epochs of a double-descent sweep (the runs still training at that epoch).

    python -m analysis.by_epoch outputs/sweeps/double_descent_cnn \
        --out docs/studies/double_descent_cnn/test_error_by_epoch

The study's figures score each run where its train error stopped moving; this table shows the same runs at fixed
training budgets instead (the test split is scored every `trainer.test_every` epochs). Stalled runs are left out.
Writes <out>.csv (every cell with its seed and run counts) and <out>.md.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from analysis.double_descent import width_column
from analysis.load import load_history, load_runs
from analysis.tables import to_markdown
from analysis.varied import varied_keys


def by_epoch(sweep_dir: str | Path, epochs: list[int], width: str | None = None) -> tuple[pd.DataFrame, str]:
    """Mean test error (with its seed count) per epoch, label noise and width, over the runs not stalled that were
    scored at that epoch; returns the long table and its Markdown (one width-by-noise table per epoch). A seed run
    more than once is one seed at the mean of its runs (``runs`` counts the runs, and the cell says so)."""
    runs = load_runs(sweep_dir)
    runs = runs[~runs["stalled"].astype(bool)]
    width = width or width_column(runs)
    hist = load_history(sweep_dir)
    hist = hist[hist["run_dir"].isin(runs["run_dir"]) & hist["test_error"].notna()]
    # every other setting the sweep varied (weight decay, n_train, lr ...) is its own row, never averaged as seeds
    other = [k for k in varied_keys(runs) if k not in ("label_noise.p", width) and k in hist.columns]
    keys = ["epoch", *other, "label_noise.p", width]
    # a seed run twice (a rerun in another run dir) is one seed: its runs are averaged first, then the seeds
    per_seed = (hist[hist["epoch"].isin(epochs)].groupby([*keys, "seed"], dropna=False)["test_error"]
                .agg(test_error="mean", runs="count").reset_index())
    table = (per_seed.groupby(keys, dropna=False)
             .agg(mean=("test_error", "mean"), sd=("test_error", "std"), seeds=("test_error", "count"),
                  runs=("runs", "sum")).reset_index())
    parts = []
    for epoch, part in table.groupby("epoch"):
        cell = part.assign(v=[f"{100 * m:.1f} ({n})" if n == r else f"{100 * m:.1f} ({n} seeds, {r} runs)"
                              for m, n, r in zip(part["mean"], part["seeds"], part["runs"], strict=True)])
        wide = cell.pivot_table(index=[*other, "label_noise.p"], columns=width, values="v", aggfunc="first",
                                dropna=False).fillna("-")
        wide.columns = [f"{width} {w}" for w in wide.columns]
        parts.append(f"**epoch {epoch}**: test error % (seeds), runs still training\n\n"
                     + to_markdown(wide.rename_axis(index={"label_noise.p": "p"}).reset_index()))
    return table, "\n".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep_dir")
    ap.add_argument("--out", required=True, help="path without suffix")
    ap.add_argument("--width", default=None, help="the width key (default: the one the sweep varied)")
    ap.add_argument("--epochs", default="20,40,60,100,200")
    args = ap.parse_args()
    table, md = by_epoch(args.sweep_dir, [int(e) for e in args.epochs.split(",")], args.width)
    table.to_csv(f"{args.out}.csv", index=False)
    Path(f"{args.out}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
