"""One row per run of the double_descent_vit sweep: stop reason, epochs, the three train errors (labels trained
on, clean labels, flipped images against their noisy labels), test error at each evaluation and at the end.

    python docs/studies/double_descent_vit/supplement.py /work/runs/double_descent_vit docs/studies/double_descent_vit
"""
import sys
from pathlib import Path

from analysis import load_history, load_runs, to_markdown

COLS = ["model.dim", "label_noise.p", "seed", "status", "stop_reason", "precision", "params", "epochs", "steps",
        "noisy_label_fraction", "train_loss", "train_error", "train_error_clean", "train_error_noisy_subset",
        "test_error", "best_test_error", "wall_s"]


def main() -> None:
    sweep, out = sys.argv[1], Path(sys.argv[2])
    runs = load_runs(sweep)
    runs = runs.sort_values(["label_noise.p", "model.dim"])[[c for c in COLS if c in runs.columns]]
    runs.to_csv(out / "runs.csv", index=False, float_format="%.4f")
    print(to_markdown(runs))
    hist = load_history(sweep)
    keep = [c for c in ["model.dim", "label_noise.p", "epoch", "lr", "train_error", "train_error_clean",
                        "train_error_noisy_subset", "test_error"] if c in hist.columns]
    hist = hist.sort_values(["label_noise.p", "model.dim", "epoch"])[keep]
    hist.to_csv(out / "history.csv", index=False, float_format="%.4f")
    print(to_markdown(hist))


if __name__ == "__main__":
    main()
