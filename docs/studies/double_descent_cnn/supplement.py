"""Supplement to the double_descent_cnn report: runs.csv and the descent curves without the runs stuck at chance.

Usage: python docs/studies/double_descent_cnn/supplement.py SWEEP_DIR OUT_DIR (OUT_DIR/figures must exist)."""
import sys

from analysis import load_runs
from analysis.double_descent import descent_curves, descent_summary
from analysis.figures import plot_double_descent

out = sys.argv[2]
runs = load_runs(sys.argv[1])
cols = ["trial_number", "model.width", "label_noise.p", "seed", "status", "stop_reason", "epochs", "precision",
        "params", "train_error", "train_error_clean", "train_error_noisy_subset", "test_error", "best_test_error",
        "wall_s"]
per = runs[cols].sort_values(["label_noise.p", "model.width", "seed"])
per.to_csv(f"{out}/runs.csv", index=False)
print(per.to_string(index=False))
dead = runs.train_error >= 0.85  # never left chance (10 classes: 0.9)
dead_cols = ["trial_number", "model.width", "label_noise.p", "seed", "epochs", "stop_reason"]
print("dead runs:", runs.loc[dead, dead_cols].to_dict("records"))
curves = descent_curves(runs[~dead])
summ = descent_summary(curves)
summ.to_csv(f"{out}/double_descent_summary_without_chance_runs.csv", index=False)
curves.to_csv(f"{out}/double_descent_curves_without_chance_runs.csv", index=False)
print(summ.to_string())
print(curves[["label_noise.p", "model.width", "train_mean", "test_mean", "test_std", "n_seeds"]].to_string())
plot_double_descent(curves, summ, f"{out}/figures/double_descent_without_chance_runs.png")
