"""Test error against width at fixed epochs of a double-descent sweep (the runs still training at that epoch).

    python -m analysis.by_epoch /work/studies/double_descent_cnn \
        --out docs/studies/double_descent_cnn/test_error_by_epoch

The study's figures score each run where its train error stopped moving; this table shows the same runs at fixed
training budgets instead (the test split is scored every `trainer.test_every` epochs). Stalled runs are left out.
Writes <out>.csv (every cell with its seed count) and <out>.md.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from analysis.double_descent import width_column
from analysis.load import load_history, load_runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep_dir")
    ap.add_argument("--out", required=True, help="path without suffix")
    ap.add_argument("--width", default=None, help="the width key (default: the one the sweep varied)")
    ap.add_argument("--epochs", default="20,40,60,100,200")
    args = ap.parse_args()
    runs = load_runs(args.sweep_dir)
    runs = runs[~runs["stalled"].astype(bool)]
    args.width = args.width or width_column(runs)
    hist = load_history(args.sweep_dir)
    hist = hist[hist["run_dir"].isin(runs["run_dir"]) & hist["test_error"].notna()]
    epochs = [int(e) for e in args.epochs.split(",")]
    at = hist[hist["epoch"].isin(epochs)]
    table = (at.groupby(["epoch", "label_noise.p", args.width])["test_error"]
             .agg(mean="mean", sd="std", seeds="count").reset_index())
    table.to_csv(f"{args.out}.csv", index=False)
    lines = []
    for epoch, part in table.groupby("epoch"):
        cell = part.assign(v=[f"{100 * m:.1f} ({n})" for m, n in zip(part["mean"], part["seeds"], strict=True)])
        wide = cell.pivot(index="label_noise.p", columns=args.width, values="v").fillna("-")
        lines.append(f"**epoch {epoch}**: test error % (runs still training)\n\n| p | "
                     + " | ".join(f"{args.width} {w}" for w in wide.columns) + " |\n|---|"
                     + "---|" * len(wide.columns) + "\n"
                     + "\n".join(f"| {p} | " + " | ".join(wide.loc[p]) + " |" for p in wide.index) + "\n")
    Path(f"{args.out}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
