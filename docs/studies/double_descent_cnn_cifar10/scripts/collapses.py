"""The collapsed runs of a double-descent sweep, from their records: where each got to before it collapsed.

    python docs/studies/double_descent_cnn_cifar10/scripts/collapses.py \
        docs/studies/double_descent_cnn_cifar10/records/earlier_cpu \
        docs/studies/double_descent_cnn_cifar10/records/earlier_cpu_threshold

For every run `analysis.load` flags ``collapsed`` (train error ended 0.5 or more above the lowest it reached): the
lowest train error and its epoch, the test error scored nearest before that (the test split is scored every
`trainer.test_every` epochs), the first later epoch with the train error above 85% (collapsed), and how it ended.
"""

import sys

from analysis.load import load_history, load_runs

COLLAPSED_ABOVE = 0.85  # train error: above this a 10-class model answers (nearly) every image alike

if __name__ == "__main__":
    runs = load_runs(sys.argv[1:])
    hist = load_history(sys.argv[1:])
    print("| C1 | noise | seed | lowest train error (epoch) | test error then (epoch) | above 85% from epoch "
          "| final train / test error | stop |")
    print("|---|---|---|---|---|---|---|---|")
    for _, run in runs[runs["collapsed"]].sort_values(["model.width", "label_noise.p", "seed"]).iterrows():
        h = hist[hist["run_dir"] == run["run_dir"]].sort_values("epoch")
        low = h.loc[h["train_error"].idxmin()]
        later = h[(h["epoch"] > low["epoch"]) & (h["train_error"] > COLLAPSED_ABOVE)]
        scored = h[h["test_error"].notna() & (h["epoch"] <= low["epoch"])]
        test = scored.iloc[-1] if len(scored) else None
        print(f"| {run['model.width']} | {run['label_noise.p']:g} | {run['seed']} | "
              f"{100 * low['train_error']:.1f}% ({low['epoch']}) | "
              + (f"{100 * test['test_error']:.1f}% ({test['epoch']})" if test is not None else "-")
              + f" | {later['epoch'].iloc[0] if len(later) else '-'} | "
              f"{100 * run['train_error']:.1f}% / {100 * run['test_error']:.1f}% | {run['stop_reason']} |")
