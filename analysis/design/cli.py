"""The command line: ``python -m analysis.design plan | test | compare``."""
from __future__ import annotations

import argparse
import json
import sys
import warnings

import numpy as np
import pandas as pd

from analysis.design.capped import with_capped
from analysis.design.compare import compare, compare_markdown
from analysis.design.grid import _declared_grids
from analysis.design.markdown import curves_markdown, machine_note, plan_markdown, precision_note, tests_markdown
from analysis.design.peaks import NO_GRID, peak_tests
from analysis.design.plan import choose_main, main_overrides, pilot_at_main_lr, plan, pooling_note
from analysis.design.power import spread
from analysis.design.sources import sources_markdown
from analysis.design.spikes import spike_note
from analysis.design.thresholds import CENTERS
from analysis.double_descent import width_column
from analysis.load import load_runs


def _fraction(text: str) -> float:
    """argparse type of ``--effect``: an error fraction, so 5 (percent) cannot make every design powerful."""
    try:
        v = float(text)
    except ValueError:
        v = np.nan
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give the published effect as a test-error fraction in (0, 1), "
                                         "e.g. 0.05 for 5 points")
    return v


def main(argv: list[str] | None = None) -> int:
    package_doc = sys.modules[__package__].__doc__  # analysis.design's: its first paragraph says what the tool does
    ap = argparse.ArgumentParser(prog="python -m analysis.design", description=package_doc.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_plan = sub.add_parser("plan", help="read a pilot: thresholds, collapses, the lr rule, spread, power")
    p_plan.add_argument("paths", nargs="+")
    p_plan.add_argument("--seeds", default="2,3,4,6,8", help="seed counts to give the smallest detectable peak for")
    p_plan.add_argument("--json", action="store_true", help="print the chosen lr and thresholds as JSON")
    p_plan.add_argument("--target", type=float, help="the published threshold: print the main run's overrides "
                        "(lr, n_train, grid, seeds) chosen by the declared rules (choose_main)")
    p_test = sub.add_parser("test", help="apply the declared peak test to a main run")
    p_test.add_argument("paths", nargs="+")
    p_test.add_argument("--pilot", nargs="+", required=True, help="the pilot's sweep dirs (its spread gives power)")
    p_test.add_argument("--capped-from", nargs="+", default=[], metavar="DIR",
                        help="a fixed-budget arm: take these sweeps' runs (the convergence arm) that ran to the same "
                             "epoch cap for the (width, seed) pairs the arm's own sweep did not train (with_capped)")
    p_test.add_argument("--curves", action="store_true",
                        help="also print each curve's finished runs per width (seeds, mean train and test error)")
    p_cmp = sub.add_parser("compare", help="two grids of one recipe (two devices): test error differences")
    p_cmp.add_argument("paths", nargs="+", help="the first grid's sweep dirs")
    p_cmp.add_argument("--against", nargs="+", required=True, help="the second grid's sweep dirs")
    p_cmp.add_argument("--out", help="also write the Markdown here")
    for p in (p_plan, p_test):
        p.add_argument("--center", choices=CENTERS, default="critical",
                       help="the width a peak is tested at (critical: the declared rule; threshold: sensitivity)")
        p.add_argument("--tol", type=float, default=0.01, help="train error counted as interpolating")
        p.add_argument("--effect", type=_fraction, default=0.05, help="the published peak, as a test-error contrast")
        p.add_argument("--out", help="also write the Markdown here")
    a = ap.parse_args(argv)
    if a.cmd == "plan":
        try:
            counts = [int(s) for s in a.seeds.split(",")]
        except ValueError:
            ap.error(f"--seeds={a.seeds!r}: give seed counts as integers separated by commas, e.g. 2,3,4,6,8")
        p = plan(a.paths, a.tol, counts, a.effect, a.center)
        if a.target is not None:
            if p["lr"] is None and len(p["lr_table"]):  # the pilot tried several lrs and the rule chose none: the
                # thresholds are every lr's, and overrides without an lr would train at the config's (review
                # 2026-11-29, analysis)
                print("the lr rule chose no lr (every lr the pilot tried collapsed or stalled at its threshold "
                      "widths): no main run follows from this pilot; pilot a lower lr or a stable recipe",
                      file=sys.stderr)
                return 1
            m = choose_main(p, a.target)
            if not m:
                print("no pilot size leaves two underfitting widths below its threshold", file=sys.stderr)
                return 1
            fresh = int(max(p["pilot_seeds"])) + 1 if p["pilot_seeds"] else 0  # the main run's seeds follow the pilot's
            print(" ".join(main_overrides(m, p["lr"], p["width"], fresh)))
            return 0
        if a.json:
            print(json.dumps({"lr": p["lr"], "thresholds": p["thresholds"].to_dict("records"),
                              "contrast_sd": p["spread"].contrast_sd, "grids": p["grids"]}, default=float))
            return 0
        text = plan_markdown(p)
    elif a.cmd == "compare":
        first = load_runs(a.paths, optuna_state=False)
        text = compare_markdown(compare(first, load_runs(a.against, optuna_state=False)), width_column(first))
    else:
        pilot = load_runs(a.pilot, optuna_state=False)
        main_runs = load_runs(a.paths, optuna_state=False)
        pilot = pilot_at_main_lr(pilot, main_runs, a.tol)
        sp = spread(pilot, tol=a.tol, rule=a.center)
        capped = load_runs(a.capped_from, optuna_state=False) if a.capped_from else None
        own = main_runs
        if capped is not None:
            main_runs = with_capped(main_runs, capped)
        grids = _declared_grids(main_runs)
        tests = peak_tests(main_runs, sp, a.effect, tol=a.tol, rule=a.center, grids=grids)
        text = tests_markdown(tests, sp, a.center)

        def reading(upto: list) -> list:  # the same test on the studies up to one (the interim readings)
            sel = own[pd.Series(list(zip(own["study_storage"], own["study_name"], strict=True)),
                                index=own.index).isin(upto)]
            sel.attrs = own.attrs
            runs = with_capped(sel, capped) if capped is not None else sel
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return peak_tests(runs, sp, a.effect, tol=a.tol, rule=a.center, grids=_declared_grids(runs))

        text += sources_markdown(main_runs, reading)
        text += pooling_note(pilot, main_runs, max([t.seeds for t in tests] or [0]), a.tol, a.center)
        text += spike_note(main_runs) + precision_note(main_runs) + machine_note(main_runs)
        if not grids:
            text += "\n" + NO_GRID[0].upper() + NO_GRID[1:] + ".\n"
        if a.curves:
            text += curves_markdown(main_runs)
    print(text)
    if a.out:
        from pathlib import Path
        Path(a.out).write_text(text)
    return 0
