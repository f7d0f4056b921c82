"""One row per run of the heads_depth sweep (final train and test error, epochs, wall time) and the mean train
error per (architecture, n_train): shows whether a run fitted its training set within the step budget.

    python docs/studies/heads_depth/supplement.py /work/runs/heads_depth docs/studies/heads_depth
"""
import sys
from pathlib import Path

from analysis import load_runs, to_markdown

COLS = ["arch", "dataset.n_train", "seed", "status", "stop_reason", "precision", "params", "epochs", "steps",
        "train_loss", "train_error", "test_error", "wall_s"]


def main() -> None:
    sweep, out = sys.argv[1], Path(sys.argv[2])
    runs = load_runs(sweep)
    runs["arch"] = runs["model._target_"].map({"src.models.vit.ViT": "h1_d1 (ViT)",
                                               "src.models.cnn.WidthCNN": "cnn_w10 (CNN)"})
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
