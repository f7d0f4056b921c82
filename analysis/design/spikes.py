"""Runs whose final train error is not their fit: those that ended inside a loss spike, and those that ended above
their best (lost their fit); whether they decide the tested width, and the note naming the spiked ones."""
from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.design.grid import NOISE, SEED, curve_keys, curve_name
from analysis.design.power import ALPHA, _contrast_test
from analysis.design.thresholds import _same, center, peak_contrast, threshold
from analysis.double_descent import width_column
from src.run_contract import SPIKE_RISE, SPIKE_WINDOW


def _recent(c: pd.DataFrame) -> pd.DataFrame:
    """``c`` with each run's train error read as its recent one (``recent_train_error``: the median of its last
    readings), the final one where a run has none."""
    if "recent_train_error" not in c:
        return c
    return c.assign(train_error=pd.to_numeric(c["recent_train_error"], errors="coerce").fillna(c["train_error"]))


LOST_FIT_RISE = SPIKE_RISE  # a run lost its fit where its recent train error lies this far above its best (5 points:
# the CIFAR-10 caveat's; smaller rises at the threshold widths are the noise around the fit tolerance, where a
# run's lowest reading is biased low, not lost fit)


def _best(c: pd.DataFrame) -> pd.DataFrame:
    """``c`` with the train error of each run that lost its fit (its recent train error, else its final one,
    ``LOST_FIT_RISE`` or more above its best, ``min_train_error``) read as its best; the others' as they are."""
    if "min_train_error" not in c:
        return c
    best = pd.to_numeric(c["min_train_error"], errors="coerce")
    now = pd.to_numeric(c.get("recent_train_error", c["train_error"]), errors="coerce").fillna(c["train_error"])
    return c.assign(train_error=c["train_error"].where(~(now - best >= LOST_FIT_RISE), best))


def spike_centre(c: pd.DataFrame, width: str, tol: float, rule: str) -> tuple[int, str]:
    """Whether end-of-run loss spikes decide where the test is centred: (the runs whose final and recent train
    errors fall on either side of ``tol``, at the widths up to the larger of the two readings' thresholds; the
    centre read from the recent train errors, with what the same contrast reads there, post hoc) where that centre
    differs from the declared reading's (the final train errors), else (0, ""). The declared reading stays; the
    verdict says it is fragile."""
    return _reread_centre(c, _recent, width, tol, rule)


def lost_fit_centre(c: pd.DataFrame, width: str, tol: float, rule: str) -> tuple[int, str]:
    """As ``spike_centre``, reading the best train error (``min_train_error``) of each run that lost its fit (``_best``:
    its recent train error ``LOST_FIT_RISE`` or more above it, a drift that outlasts a spike, under a constant lr and
    below the 0.5 rise that flags a collapse): such runs decide the tested width where the centre read so differs.
    Review 2026-11-29 (r_design_9): in the CIFAR-10 study this moved the critical width 6 -> 4 at 0% noise, and the
    verdict said nothing."""
    return _reread_centre(c, _best, width, tol, rule)


def _reread_centre(c: pd.DataFrame, reread, width: str, tol: float, rule: str) -> tuple[int, str]:
    alt = reread(c)
    t, r = center(c, width, tol, rule), center(alt, width, tol, rule)
    if _same(t, r):
        return 0, ""
    upto = np.nanmax([threshold(c, width, tol), threshold(alt, width, tol), -np.inf])
    sel = c[width] <= upto if np.isfinite(upto) else pd.Series(True, c.index)
    n = int(((c.loc[sel, "train_error"] > tol) != (alt.loc[sel, "train_error"] > tol)).sum())
    if not np.isfinite(r):
        return n, "none (no width below a threshold in the grid)"
    d, (lo, _, hi) = peak_contrast(c, width, r)
    if lo is None or hi is None:
        return n, f"{r:g}, with no grid width {'at most half' if lo is None else 'at least twice'} it to test against"
    k, p, _, height, _, _ = _contrast_test(d, lo, hi, False, tol, np.nan, ALPHA)
    if not np.isfinite(p):
        return n, f"{r:g} ({k} {'seed holds' if k == 1 else 'seeds hold'} it and both neighbours: no paired test)"
    return n, f"{r:g}, where the same contrast (post hoc) stands {height:.3f} above {lo:g} and {hi:g}, p {p:.2g}"


def spike_note(df: pd.DataFrame) -> str:
    """The finished runs that ended inside a loss spike (``ended_in_spike``), per curve with their final and recent
    train errors, else "": the test reads their final errors, as declared, and the reader should know."""
    if "ended_in_spike" not in df or not df["ended_in_spike"].any():
        return ""
    width = width_column(df)
    keys = [*curve_keys(df), NOISE]
    spiked = df[df["ended_in_spike"] & (df["status"] == "completed")].sort_values([width, SEED])
    parts = [f"{curve_name(keys, key)}: " + ", ".join(
        f"{width} {w:g} seed {x:g} ({f:.3f}, recent {r:.3f})"
        for w, x, f, r in zip(c[width], c[SEED], c["train_error"], c["recent_train_error"], strict=True))
        for key, c in spiked.groupby(keys, dropna=False, sort=True)]
    return (f"\nRuns that ended inside a loss spike (final train error {SPIKE_RISE:g} or more above its recent one, "
            f"the median of its last {SPIKE_WINDOW} readings; the test reads their final errors, as declared, so "
            "their test errors are read inside the spike; `spiked_runs` counts those at the tested widths): "
            + "; ".join(parts) + ".\n")
