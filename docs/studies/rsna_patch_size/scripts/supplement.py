"""The binary-task scores the study file asks for, which `python -m analysis.report` does not tabulate.

    python docs/studies/rsna_patch_size/scripts/supplement.py RUNS_DIR docs/studies/rsna_patch_size/analysis

Writes synthetic_runs.csv and synthetic_runs.md (one row per run dir: the sweep objective val_auc, and
test accuracy, ROC AUC, probabilistic F1, sensitivity and specificity at 0.5, wall time, throughput).
"""
import sys
from pathlib import Path

from analysis.load import load_runs

COLUMNS = ["model.patch", "trial_number", "status", "epochs", "steps", "n_train", "val_auc", "test_acc", "test_auc",
           "test_pf1", "test_sensitivity", "test_specificity", "test_balanced_acc", "wall_s", "train_images_per_s",
           "precision", "skipped", "rows_in_csv", "patients_train", "patients_val", "patients_test"]


def cell(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def markdown(table) -> str:
    """A pipe table (pandas' to_markdown needs tabulate, which the project does not install)."""
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sweep, out = Path(sys.argv[1]), Path(sys.argv[2] if len(sys.argv) > 2 else ".")
    runs = load_runs(sweep).sort_values("model.patch", ascending=False)[COLUMNS]
    runs.to_csv(out / "synthetic_runs.csv", index=False)
    (out / "synthetic_runs.md").write_text(markdown(runs))
    print(markdown(runs), end="")
