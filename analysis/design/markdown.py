"""The Markdown the command prints: the pilot's plan, the test's table, and the notes after it."""
from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pandas as pd

from analysis.design.grid import NOISE, curve_keys, curve_name
from analysis.design.peaks import PeakTest
from analysis.design.power import ALPHA, POWER, Spread
from analysis.double_descent import descent_curves, width_column
from analysis.tables import to_markdown


def plan_markdown(p: dict) -> str:
    sp = p["spread"]
    lines = ["## Pilot", "", "### Collapses (runs flagged collapsed or stalled)", "",
             to_markdown(p["collapses"]), ""]
    if len(p["lr_table"]):
        chosen = "none: every lr collapsed at its threshold widths" if p["lr"] is None else f"{p['lr']:g}"
        lines += ["### lr rule: the largest lr with no flagged run at its threshold widths (within 2x)", "",
                  to_markdown(p["lr_table"]), "", f"Chosen lr: **{chosen}**", ""]
    lines += ["### Interpolation thresholds (mean train error <= tol, unflagged runs)", "",
              to_markdown(p["thresholds"]), "",
              "### Seed spread and the smallest detectable peak", "",
              f"Contrast sd {sp.contrast_sd:.4f} ({sp.dof} dof over {sp.curves} curves); one width's test-error sd "
              f"{sp.width_sd:.4f}. Power from {sp.power_source}. Two one-sided paired t-tests (alpha {ALPHA} "
              f"each), joint power {POWER}:", "",
              "| seeds | smallest detectable contrast |", "|---|---|"]
    lines += [f"| {k} | {v:.4f} |" for k, v in p["mde"].items()]
    lines += ["", sp.rerun_note]
    lines += ["", f"Published effect taken as {p['effect']:.3f}.", "", "### Suggested main grids", ""]
    lines += [f"- {k}: {', '.join(f'{w:g}' for w in g) or 'no threshold in the pilot grid'}"
              for k, g in p["grids"].items()]
    lines += ["", "### Pilot curves (observations, finished runs, a rerun seed counted once at its runs' mean: the "
              "declared test runs on the main run's seeds)", "",
              to_markdown(p["curves"])]
    return "\n".join(lines) + "\n"


def tests_markdown(tests: list[PeakTest], pilot: Spread, rule: str = "critical") -> str:
    rows = pd.DataFrame([asdict(t) for t in tests])
    lo, hi = pilot.sd_interval()
    source = "" if pilot.dof else f", from the one-width sd's {pilot.width_dof} dof"
    once = ""
    if np.isfinite(lo) and pilot.once_dof < pilot.interval_dof:
        o_lo, o_hi = pilot.sd_interval(seeds_once=True)
        once = (f"; counting each seed once ({pilot.once_dof:g} dof): {o_lo:.4f}-{o_hi:.4f}, since the pilot's "
                f"{'curves' if pilot.dof else 'curves and widths'} share seeds, whose data subset, labels and init "
                "they share")
    interval = (f" (95% interval {lo:.4f}-{hi:.4f}{source}{once}: the smallest detectable peak `mde` is uncertain "
                "in the same proportion)" if np.isfinite(lo) else "")
    return (f"## Declared test: the {rule} width's test error above both neighbours (paired one-sided t, "
            "intersection-union)\n\n"
            f"Pilot contrast sd {pilot.contrast_sd:.4f}, both sides pooled ({pilot.dof} dof); power from "
            f"{pilot.power_source}{interval}. "
            "`contrast_sd`: this run's own pooled sd of the two contrasts over its seeds, beside the pilot's "
            "(an observation; `mde` uses the pilot's, declared before the run). "
            f"{pilot.rerun_note}\n\n"
            + to_markdown(rows) + "\n")


def mixed_note(df: pd.DataFrame, column: str, label, title: str) -> str:
    """A line naming each curve whose finished runs hold more than one ``label`` of ``column``, with the counts and
    the widths of all but the commonest, after ``title``; "" where every curve has one."""
    if column not in df.columns or "status" not in df.columns:
        return ""
    done = df[df["status"] == "completed"]
    done = done.assign(_label=done[column].map(label))
    keys = [*curve_keys(df), NOISE]
    mixed = []
    for key, c in done.groupby(keys, dropna=False, sort=True):
        counts = c["_label"].value_counts()
        if len(counts) > 1:
            where = curve_name(keys, key)
            by_width = c[c["_label"] != counts.index[0]].groupby(width_column(df))["_label"].size()
            mixed.append(f"{where}: " + ", ".join(f"{n} {p}" for p, n in counts.items())
                         + " (the fewer at " + ", ".join(f"{w:g}" for w in by_width.index) + ")")
    return f"\n{title}: " + "; ".join(mixed) + ".\n" if mixed else ""


def precision_note(df: pd.DataFrame) -> str:
    """Each curve whose finished runs trained at more than one precision (``precision=auto`` times its candidates
    on the machine at each start, so one grid can mix them; a pinned precision cannot), else ""."""
    return mixed_note(df, "precision", lambda v: "unknown" if pd.isna(v) else v,
                      "Mixed precisions among the finished runs (the test treats them alike)")


def machine_note(df: pd.DataFrame) -> str:
    """Each curve whose finished runs trained on more than one machine (the summary's ``machines``: every machine
    a run trained on, in order), else "". Not refused as two devices are: a run on another CPU model is still a
    run of the recipe, but not a bitwise copy, and where the machines split by width their effect is confounded
    with the width's."""
    def label(v) -> str:
        return " then ".join(v) if isinstance(v, (list, tuple)) and len(v) else "not recorded"
    return mixed_note(df, "machines", label,
                      "Finished runs of one curve on more than one machine (noted, not refused: each is a run of the "
                      "recipe, but a machine effect would be confounded with the widths named; \"not recorded\": "
                      "the run, or its part before a resume, trained before summaries named their machine)")


def curves_markdown(df: pd.DataFrame) -> str:
    """The curves the test read: per curve and width, the finished runs' seed count and mean train and test error
    (observations beside the test, not part of it)."""
    width = width_column(df)
    keys = [*curve_keys(df), NOISE]
    c = descent_curves(df, width, by=[k for k in keys if k != NOISE])
    cols = [*keys, width, "n_seeds", "train_mean", "train_std", "test_mean", "test_std"]
    return ("\n## The curves it read (finished runs; observations, not the test)\n\n"
            + to_markdown(c[[k for k in cols if k in c]]) + "\n")
