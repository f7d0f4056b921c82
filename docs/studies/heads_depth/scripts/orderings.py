"""The published orderings of the learning-curve study (EPFL study 4.2), tested on heads_depth's runs.

    python docs/studies/heads_depth/scripts/orderings.py docs/studies/heads_depth/records/main \
        docs/studies/heads_depth/analysis/orderings
    python docs/studies/heads_depth/scripts/orderings.py docs/studies/heads_depth/records/main \
        docs/studies/heads_depth/analysis --declared

The second form applies the declared fit-range rule (issue 26; ``analysis.fits.overfitting_regime``: a size enters
an architecture's fit only when every seed there interpolated its training set, train error <= 1%, none stalled)
and writes ``declared.md``: the range per architecture, alpha per architecture, and the slope orderings (Welch, as
declared, and paired by seed beside it: a seed draws the same training subset for every architecture) and the error
orderings on it.

Writes ``tables/alpha_by_arch.csv`` (alpha per architecture, 95% t-interval over per-seed slopes),
``tables/error_by_arch.csv`` (test error per architecture and size over seeds) and ``tables/orderings.csv`` (each
ordering: a slope difference with its Welch 95% interval and the seeds paired, or an error comparison per size, on
the runs that did not stall at chance), and prints them as Markdown. alpha is given with and without the stalled runs.
Architectures are named as the sweep's ``arch`` presets, from the run configs (``h<heads>_d<depth>`` for the
ViT, ``cnn_w<width>`` for the CNN). Unfinished runs are left out; an ordering that lacks the seeds it
needs says so instead of a number.
"""
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import fit_learning_curve, load_runs, slope_difference, to_markdown
from analysis.design.grid import _declared_grids, expected_pairs, unfinished
from analysis.fits import overfitting_regime

RECORDS_DIR = Path(__file__).resolve().parents[1] / "records"
PUBLISHED_ALPHA = -0.53  # both basic blocks on MNIST (4.2.1, fig. 12a)
# (name, a, b, what the paper says): slope orderings test alpha(a) - alpha(b) < 0 (a steeper)
SLOPES = [
    ("depth steepens the slope (fig. 14a)", "h1_d3", "h1_d1"),
    ("the (4, 3) ViT has a better slope than the CNN (fig. 15a)", "h4_d3", "cnn_w10"),
    ("more heads: slope (fig. 13a)", "h4_d1", "h1_d1"),
]
# error orderings: a below b at every size
ERRORS = [
    ("the CNN is below the 1x1 ViT in error (fig. 12a)", "cnn_w10", "h1_d1"),
    ("4 heads are below 1 head in error (fig. 13a)", "h4_d1", "h1_d1"),
]


def arch_of(row: pd.Series) -> str:
    if str(row["model._target_"]).endswith("ViT"):
        return f"h{int(row['model.heads'])}_d{int(row['model.depth'])}"
    return f"cnn_w{int(row['model.width'])}"


def error_comparison(runs: pd.DataFrame, a: str, b: str) -> tuple[str, str]:
    """Per shared size: mean test error of a and b (%), and whether every seed of a is below every seed of b."""
    cells, separated = [], []
    sizes = set(runs.loc[runs.arch == a, "dataset.n_train"]) & set(runs.loc[runs.arch == b, "dataset.n_train"])
    for n in sorted(sizes):
        ea = runs.loc[(runs.arch == a) & (runs["dataset.n_train"] == n), "test_error"] * 100
        eb = runs.loc[(runs.arch == b) & (runs["dataset.n_train"] == n), "test_error"] * 100
        cells.append(f"n {n}: {ea.mean():.1f} vs {eb.mean():.1f} ({len(ea)}, {len(eb)} seeds)")
        separated.append(ea.max() < eb.min())
    if not cells:
        return "no shared size", ""
    held = sum(separated)
    return "; ".join(cells), f"every seed of {a} below every seed of {b} at {held} of {len(separated)} sizes"


def main(sweep_dir: str, out_dir: str) -> None:
    runs = load_runs(sweep_dir)
    runs = runs[runs["status"] == "completed"].copy()
    runs["arch"] = runs.apply(arch_of, axis=1)
    tables = Path(out_dir) / "tables"
    tables.mkdir(parents=True, exist_ok=True)

    err = runs.groupby(["arch", "dataset.n_train"])["test_error"].agg(["mean", "std", "count"]).reset_index()
    err[["mean", "std"]] *= 100
    err.to_csv(tables / "error_by_arch.csv", index=False)
    wide = err.assign(cell=[f"{m:.1f} ± {s:.1f} ({c})" if c > 1 else f"{m:.1f} (1)"
                            for m, s, c in zip(err["mean"], err["std"].fillna(0), err["count"], strict=True)])
    print("Test error (%), mean ± std over seeds (number of seeds):\n")
    wide = wide.pivot(index="arch", columns="dataset.n_train", values="cell").fillna("-").reset_index()
    print(to_markdown(wide), "\n")

    stalled = runs["stalled"].astype(bool)
    n_runs = len(runs)
    if stalled.any():
        print("Stalled runs (train error at chance when the stop rule fired; results, shown both ways below):\n")
        print(to_markdown(runs.loc[stalled, ["arch", "dataset.n_train", "seed", "epochs", "train_error",
                                             "test_error", "best_test_error"]]), "\n")
    cols = ["arch", "alpha", "alpha_lo", "alpha_hi", "n_points", "n_seeds", "ci_method", "contains_published"]
    frames = []
    for runs_used, which in ((runs, "all completed runs"), (runs[~stalled], "without stalled runs")):
        fits = fit_learning_curve(runs_used, by="arch", n_boot=0, errors="skip")
        fits["contains_published"] = (fits["alpha_lo"] <= PUBLISHED_ALPHA) & (PUBLISHED_ALPHA <= fits["alpha_hi"])
        frames.append(fits[cols].assign(runs=which))
    fits = pd.concat(frames, ignore_index=True)
    fits.to_csv(tables / "alpha_by_arch.csv", index=False)
    print("alpha per architecture (test error ~ n^alpha; 95% t-interval over per-seed slopes):\n")
    print(to_markdown(fits.round(3)), "\n")
    runs = runs[~stalled]  # the orderings below: without stalled runs (a run that never left chance is no point
    # on a learning curve; the table above shows what they change)

    rows = slope_rows(runs).to_dict("records")
    for what, a, b in ERRORS:
        cells, verdict = error_comparison(runs, a, b)
        rows.append({"ordering": what, "test": f"test error of {a} vs {b} (%)", "result": cells, "holds": verdict})
    table = pd.DataFrame(rows)
    table.to_csv(tables / "orderings.csv", index=False)
    print("Orderings:\n")
    print(to_markdown(table))
    print(f"\n{n_runs} completed runs ({int(stalled.sum())} stalled); architectures {sorted(runs.arch.unique())}; "
          f"precision {runs['precision'].value_counts().to_dict()}; "
          f"run wall time of the runs that left chance {np.sum(runs['wall_s']) / 60:.1f} min")


def slope_rows(runs: pd.DataFrame, slopes: list = SLOPES) -> pd.DataFrame:
    rows = []
    for what, a, b in slopes:
        try:
            d = slope_difference(runs, "arch", a, b)
        except ValueError as e:
            rows.append({"ordering": what, "test": f"alpha({a}) - alpha({b})", "result": f"n/a: {e}", "holds": "",
                         "paired by seed (sensitivity)": ""})
            continue
        try:
            p = slope_difference(runs, "arch", a, b, paired=True)
            paired = f"{p['diff']:+.3f} [{p['lo']:+.3f}, {p['hi']:+.3f}], {p['n_a']} seeds: {holds(p)}"
        except ValueError as e:  # the two groups' complete seeds may differ
            paired = f"n/a: {e}"
        rows.append({"ordering": what, "test": f"alpha({a}) - alpha({b})",
                     "result": f"{d['diff']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}] ({d['alpha_a']:.3f} vs "
                               f"{d['alpha_b']:.3f}; {d['n_a']} and {d['n_b']} seeds, "
                               f"n {d['sizes'][0]}..{d['sizes'][-1]})",
                     "holds": holds(d),
                     "paired by seed (sensitivity)": paired})
    return pd.DataFrame(rows)


def holds(d: dict) -> str:
    return "yes" if d["hi"] < 0 else ("no (reversed)" if d["lo"] > 0 else "not resolved (interval spans 0)")


RULE = ("the paper fits \"in the overfitting regime\" (4.2), the regime where the model interpolates its training set "
        "(4.1). A size enters an architecture's fit only when every seed there ended with train error <= 1% and none "
        "stalled or collapsed; the range runs from the largest size down to the first that fails "
        "(`analysis.fits.overfitting_regime`).")
# the committed records the declared analysis is written for: title, what was declared when, where its output goes,
# and the confirmatory test (a, b) if the records were run to test one ordering
RECORDS = {
    "main": {"title": "the declared fit range (issue 26)", "out": "docs/studies/heads_depth/analysis",
             "when": "Rule, written on 2026-11-26 after these runs had finished and their every-size fit had been seen "
                     "(issue 26 asked for a range rule to be declared and applied to these records; it reads train "
                     "errors only, and what it leaves out is listed below): "},
    "confirm": {"title": "the confirmatory run's declared test (issue 26)", "out":
                "docs/studies/heads_depth/analysis/confirm", "test": ("h4_d3", "cnn_w10"),
                "when": "Declared on 2026-11-28 before any of these runs "
                        "(`sweeps/scales/heads_depth/cpu_confirm.yaml`, fresh seeds 4-7): the statistic is "
                        "alpha(h4_d3) - alpha(cnn_w10) with the seeds paired, on "
                        "the sizes both architectures' ranges hold, a 95% t-interval; the ordering is confirmed if "
                        "the interval lies below 0, refuted if above 0, else not resolved. The range rule, written "
                        "2026-11-26: "},
}


def declared(sweep_dir: str, out_dir: str | None = None) -> str:
    """The declared analysis as Markdown (see the module docstring). Records named in ``RECORDS`` get their own
    provenance and, for a confirmatory run, the declared test's verdict; any other sweep dir gets the rule alone."""
    name = Path(sweep_dir).name
    committed = name in RECORDS and Path(sweep_dir).resolve() == RECORDS_DIR / name  # not any folder so named
    spec = RECORDS[name] if committed else {"title": f"the declared fit range on {name}", "out": out_dir or
                                            "<out dir>", "when": "The range rule, written 2026-11-26: "}
    records = f"docs/studies/heads_depth/records/{name}" if committed else sweep_dir
    runs = load_runs(sweep_dir, optuna_state=False).copy()
    runs["arch"] = runs.apply(arch_of, axis=1)
    present = set(runs["arch"])
    kept, table = overfitting_regime(runs, by="arch")  # every run: one that did not complete fails its size
    ranges = (table.groupby("arch").apply(lambda g: ", ".join(str(n) for n in g.loc[g.in_range, "dataset.n_train"]),
                                          include_groups=False).rename("sizes fitted").reset_index())
    out = table[~table["in_range"]][["arch", "dataset.n_train", "runs", "max_train_error", "flagged", "unfit",
                                      "missing_seeds"]]
    fits = fit_learning_curve(kept, by="arch", n_boot=0, errors="skip")
    fits["contains_published"] = (fits["alpha_lo"] <= PUBLISHED_ALPHA) & (PUBLISHED_ALPHA <= fits["alpha_hi"])
    cols = ["arch", "alpha", "alpha_lo", "alpha_hi", "n_points", "n_seeds", "x_min", "x_max", "contains_published"]
    slopes = [s for s in SLOPES if {s[1], s[2]} <= present]  # orderings of architectures these records hold
    errors = [e for e in ERRORS if {e[1], e[2]} <= present]
    slope_table = slope_rows(kept, slopes)
    if "test" in spec:  # the confirmatory run declared the paired interval; Welch is the sensitivity there
        slope_heading = ("## Slope orderings on the declared range (the declared test is the paired column; Welch's "
                         "interval after it, as a sensitivity)")
        slope_table = slope_table.rename(columns={"result": "Welch 95% interval (sensitivity)", "holds":
                                                  "holds (Welch)", "paired by seed (sensitivity)":
                                                  "paired by seed (declared)"})
        slope_table = slope_table[["ordering", "test", "paired by seed (declared)",
                                   "Welch 95% interval (sensitivity)", "holds (Welch)"]]
    else:
        slope_heading = ("## Slope orderings on the declared range (Welch 95% interval of the difference, as the "
                         "header declares; beside it, the seeds paired: a seed draws the same training subset for "
                         "every architecture)")
    text = [
        f"# heads_depth: {spec['title']}", "",
        *textwrap.wrap(spec["when"] + RULE + " Regenerate:", 116),
        f"`python docs/studies/heads_depth/scripts/orderings.py {records} {spec['out']} --declared`.", ""]
    if "test" in spec:
        text += ["## The declared test", "", confirm_test(runs, kept, *spec["test"], _declared_grids(runs)), ""]
    return "\n".join(text + [
        "## Range per architecture", "", to_markdown(ranges), "",
        "Sizes left out:", "", to_markdown(out) if len(out) else "none", "",
        "## alpha per architecture on the declared range (95% t-interval over per-seed slopes)", "",
        to_markdown(fits[cols].round(3)), "",
        "## Does a power law fit its points? (post hoc (sensitivity): a check added 2026-11-29, after these fits "
        "were seen)", "",
        *textwrap.wrap("Each seed's log-log curvature on the declared range, its 95% t-interval over seeds, and the "
                       "farthest geometric mean from the fitted line (`analysis.fit_shape`). Where `curved`, the "
                       "curve bends the same way in every seed: its alpha is the mean slope over x_min..x_max, not "
                       "one exponent, and a slope ordering with it depends on the sizes fitted (negative curvature: "
                       "the slope steepens with n). It changes no declared result.", 116), "",
        to_markdown(fits[["arch", "curvature", "curvature_lo", "curvature_hi", "curved", "max_miss"]].round(3)), "",
        slope_heading, "", to_markdown(slope_table), "",
        "## Error orderings on the declared range (the sizes both architectures' ranges hold)", "",
        to_markdown(pd.DataFrame([{"ordering": what, "result": cells, "holds": verdict} for what, a, b in errors
                                  for cells, verdict in [error_comparison(kept, a, b)]])) if errors else "none", ""])


def confirm_test(runs: pd.DataFrame, kept: pd.DataFrame, a: str, b: str, grids: dict) -> str:
    """The confirmatory test's line: alpha(a) - alpha(b), seeds paired, on the shared in-range sizes (``kept``), and
    its verdict (confirmed below 0, refuted above 0, else not resolved). The grid is the one the sweep declared
    (``grids``, from ``analysis.design.grid._declared_grids``: sizes x seeds per architecture). The line is drawn only
    when every run of that grid completed and every declared seed is in the paired fit, which sees that grid
    alone; otherwise it says why it is not drawn."""
    expected = {}
    for arch in (a, b):
        c = runs[runs["arch"] == arch]
        if gap := unfinished(c, "dataset.n_train", grids):
            return f"not drawn: {arch}'s declared grid is unfinished ({gap})"
        expected[arch] = expected_pairs(c, "dataset.n_train", grids)
    cell = list(zip(kept["dataset.n_train"].astype(float), kept["seed"].astype(float), strict=True))
    in_grid = [p in expected.get(arch, ()) for arch, p in zip(kept["arch"], cell, strict=True)]
    try:  # runs at other sizes or seeds in the records do not enter the fit
        d = slope_difference(kept[in_grid], "arch", a, b, paired=True)
    except ValueError as e:
        return f"not drawn: {e}"
    seeds = {s for _, s in expected[a] & expected[b]}
    if d["n_a"] != len(seeds):
        return f"not drawn: {d['n_a']} of the {len(seeds)} declared seeds have a run at every fitted size"
    verdict = {"yes": "confirmed", "no (reversed)": "refuted"}.get(holds(d), "not resolved")
    return (f"alpha({a}) - alpha({b}), seeds paired: **{d['diff']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]** "
            f"(p {d['p']:.2g}, two-sided; alpha {d['alpha_a']:.3f} vs {d['alpha_b']:.3f}; {d['n_a']} seeds; "
            f"n {', '.join(str(n) for n in d['sizes'])}): **{verdict}**")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[3] == "--declared":
        text = declared(sys.argv[1], sys.argv[2])
        Path(sys.argv[2]).mkdir(parents=True, exist_ok=True)
        (Path(sys.argv[2]) / "declared.md").write_text(text)
        print(text)
    elif len(sys.argv) == 3:
        main(sys.argv[1], sys.argv[2])
    else:
        sys.exit(__doc__)
