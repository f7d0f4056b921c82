"""One row per run of the heads_depth sweep (final train and test error, epochs, wall time) and the mean train
error per (architecture, n_train): shows whether a run fitted its training set within the step budget.

    python docs/studies/heads_depth/scripts/supplement.py RUNS_DIR OUT_DIR
"""
import sys
from pathlib import Path

from analysis import load_runs, to_markdown

COLS = ["arch", "dataset.n_train", "seed", "status", "stop_reason", "precision", "params", "epochs", "steps",
        "train_loss", "train_error", "test_error", "wall_s"]


def arch_of(row) -> str:
    """The sweep's arch preset name, from the run's config, with its family: "h4_d3 (ViT)", "cnn_w10 (CNN)"."""
    if str(row["model._target_"]).endswith("ViT"):
        return f"h{int(row['model.heads'])}_d{int(row['model.depth'])} (ViT)"
    return f"cnn_w{int(row['model.width'])} (CNN)"


def main() -> None:
    sweep, out = sys.argv[1], Path(sys.argv[2])
    runs = load_runs(sweep)
    runs["arch"] = runs.apply(arch_of, axis=1)
    runs = runs.sort_values(["arch", "dataset.n_train", "seed"])[COLS]
    runs.to_csv(out / "runs.csv", index=False, float_format="%.4f")
    done = runs[runs.status == "completed"]
    g = done.groupby(["arch", "dataset.n_train"])
    table = g[["epochs", "train_error", "test_error", "wall_s"]].agg(["mean", "std"]).round(4)
    table.columns = [f"{a}_{b}" for a, b in table.columns]
    table["n_seeds"] = g["seed"].count()
    table = table.reset_index()
    table.to_csv(out / "train_vs_test_error.csv", index=False)
    print(to_markdown(table))


if __name__ == "__main__":
    main()
