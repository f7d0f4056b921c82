"""The declared peak test on each curve of a main run, and the verdict that states its power."""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from analysis.design.grid import (
    CURVE_KEYS,
    NOISE,
    SEED,
    _declared_curves,
    _declared_grids,
    curve_keys,
    curve_name,
    one_recipe,
    unfinished,
)
from analysis.design.power import ALPHA, Spread, _contrast_test
from analysis.design.spikes import LOST_FIT_RISE, lost_fit_centre, spike_centre
from analysis.design.thresholds import _flagged, center, deciding_flags, peak_contrast, threshold
from analysis.double_descent import width_column
from analysis.frames import _norm, completed_only, require_columns
from src.run_contract import SPIKE_WINDOW


@dataclass
class PeakTest:
    curve: str
    center: float  # the width tested (the critical width, or the threshold)
    left: float | None
    right: float | None
    seeds: int
    vs_left: float  # mean over seeds of test(T) - test(left)
    vs_right: float  # mean over seeds of test(T) - test(right)
    height: float  # the smaller of the two: how far the threshold's test error stands above both neighbours
    height_upper: float  # one-sided (1 - alpha) upper bound of the height: min over sides of mean + t(1-a/2, k-1) se
    p_value: float  # the larger of the two one-sided paired t-tests' p (intersection-union test of a peak)
    flagged_runs: int
    contrast_sd: float  # this run's own pooled sd of the two contrasts over its seeds (an observation beside the
    # pilot's, which the power figure uses)
    mde: float
    effect: float
    spiked_runs: int  # runs at the three tested widths that ended inside a loss spike (``ended_in_spike``)
    verdict: str


def verdict(p: float, mean: float, detectable: float, effect: float, flagged: int, alpha: float = ALPHA,
            missing: str | None = None, unread: str | None = None, no_p: str | None = None,
            deciding: int = 0, spikes: tuple[int, str] = (0, ""), without: str = "", upper: float = np.nan,
            lost: tuple[int, str] = (0, "")) -> str:
    """reproduced / not reproduced / inconclusive (with what would settle it), per the module docstring.
    "Not reproduced" needs the smallest detectable peak ``detectable`` below ``effect`` and ``upper``, the one-sided
    upper confidence bound of the observed height ``mean`` (``height_upper``), below it too: a peak observed as high
    as the effect, or one the run's own spread cannot bound below it, is not evidence of absence (review
    2026-11-29, D1: a run with a peak 0.062 above both neighbours at p 0.057 read "not reproduced"). Without
    ``upper`` (NaN) the verdict is never "not reproduced".
    ``unread``: finished runs with no test or train error; ``no_p``: why there is no p value; ``deciding``: flagged
    runs that decide where the test is centred (``deciding_flags``); ``spikes``: runs whose end-of-run spikes decide
    it and the centre read without them (``spike_centre``), and ``without``: what the test reads without the seeds
    whose runs at the tested widths ended inside a spike, where that is another verdict; ``lost``: runs that ended
    above their best train error and decide the tested width, and the centre read from each run's best
    (``lost_fit_centre``): any of them makes the verdict "fragile", said in it."""
    says = _verdict(p, mean, detectable, effect, flagged, alpha, missing, unread, no_p, deciding, upper)
    fragile = []
    if spikes[0]:
        whose = "runs'" if spikes[0] > 1 else "run's"
        fragile.append(f"{spikes[0]} {whose} final train errors, read inside end-of-run "
                       f"loss spikes or dips, decide the tested width: read by each run's median over its last "
                       f"{SPIKE_WINDOW} readings it is {spikes[1]}")
    if lost[0]:
        runs, their, decide = ("runs", "their", "decide") if lost[0] > 1 else ("run", "its", "decides")
        fragile.append(f"{lost[0]} {runs} lost {their} fit ({LOST_FIT_RISE:g} or more above {their} "
                       f"best train error) and {decide} the tested width: read at {their} best it is {lost[1]}")
    if without:
        fragile.append(without)
    return f"{says} (fragile: {'; '.join(fragile)})" if fragile else says


def _verdict(p: float, mean: float, detectable: float, effect: float, flagged: int, alpha: float,
             missing: str | None, unread: str | None, no_p: str | None, deciding: int, upper: float = np.nan) -> str:
    if missing:
        return f"inconclusive (grid unfinished: {missing})"
    if unread:
        return f"inconclusive ({unread}: score it again or rerun it)"
    if deciding:
        return (f"inconclusive ({deciding} collapsed or stalled runs decide the threshold: counted, they move the "
                "tested width; rerun them under a stable recipe)")
    if flagged:
        return f"inconclusive ({flagged} collapsed or stalled runs at the tested widths)"
    if not np.isfinite(p):
        return f"inconclusive ({no_p or 'no threshold with a neighbour on each side in the grid'})"
    if p < alpha and mean > 0:
        return "reproduced"
    if np.isfinite(detectable) and detectable < effect:  # issue 26: "below" the published effect
        if np.isfinite(upper) and upper < effect:
            return "not reproduced"
        bound = f"upper bound {upper:.3f}" if np.isfinite(upper) else "no upper bound given"
        return (f"inconclusive (observed height {mean:.3f}, {bound} above the published effect {effect:.3f}: "
                "the run's own spread does not bound the peak below it; more seeds would settle it)")
    if not np.isfinite(detectable):
        return ("inconclusive (no power figure: the pilot measured no seed spread, or too few seeds finished; a "
                "pilot with two or more seeds that differ would settle what the design can detect)")
    return (f"inconclusive (the design detects {detectable:.3f} and up, the published effect is taken as "
            f"{effect:.3f}: more seeds would settle it)")


def height_upper(d: pd.DataFrame, alpha: float = ALPHA) -> float:
    """The one-sided ``1 - alpha`` upper confidence bound of the peak's height, min(mu_left, mu_right), from the
    per-seed contrasts ``d`` (``peak_contrast``): the smaller of the two sides' one-sided ``1 - alpha/2`` bounds,
    mean + t(1 - alpha/2, k - 1) sd / sqrt(k) each (Bonferroni). Where both sides' bounds cover their own means
    (at least 1 - alpha of the time, whatever the sides' correlation) the smaller bound covers the smaller mean.
    The bound of the side whose observed mean is smaller, at ``1 - alpha``, picks its side by the data and covered
    about 0.90 where the two true contrasts tie (the test that shows it). NaN with fewer than 2 seeds."""
    k = len(d)
    if k < 2:
        return np.nan
    sides = d[["left", "right"]]
    return float((sides.mean() + stats.t.ppf(1 - alpha / 2, k - 1) * sides.std() / np.sqrt(k)).min())


def unscored(c: pd.DataFrame, width: str) -> str | None:
    """Finished runs with no test error or no train error (the threshold reads train errors at every width, the
    contrast test errors), named; None if every finished run has both. Such a run is not a missing seed to drop."""
    bad = c[c["test_error"].isna() | c["train_error"].isna()].sort_values([width, SEED])
    if not len(bad):
        return None
    named = ", ".join(f"{width} {w:g} seed {x:g}" for w, x in zip(bad[width], bad[SEED], strict=True))
    return f"{len(bad)} finished run{'s have' if len(bad) > 1 else ' has'} no test or train error ({named})"


NO_GRID = ("no declared grid: the runs name no study whose storage records one (a plain Hydra multirun, or records "
           "without their optuna.db), so the grid is taken as the widths x seeds the runs hold, and a width or seed "
           "that never started is invisible: a missing width moves a neighbour of the tested one. Run the study "
           "through the vitsweep sweeper, which records its grid, or check the grid by hand")


def peak_tests(df: pd.DataFrame, pilot_sd: float | Spread, effect: float, width: str | None = None,
               tol: float = 0.01, alpha: float = ALPHA, rule: str = "critical",
               grids: dict[tuple[str, str], dict] | None = None) -> list[PeakTest]:
    """The declared test on every curve of a main run: threshold from train errors, paired contrast, verdict.
    ``pilot_sd``: the pilot's ``Spread`` (its ``mde``), or one sd; ``grids``: ``_declared_grids(df)``, read here
    when not given."""
    width = width or width_column(df)
    require_columns(df, width, NOISE, SEED, "train_error", "test_error")
    grids = _declared_grids(df) if grids is None else grids
    if not grids:
        warnings.warn(NO_GRID, stacklevel=2)
    one_recipe(df, width, grids)
    borrowed = {tuple(b) for b in df.attrs.get("borrowed_studies", ())}  # with_capped's other arm
    own = {k: g for k, g in grids.items() if k not in borrowed}
    # a fixed arm (with_capped's output): every width of either arm, at the seeds this arm declared, the widths it
    # borrows included (a declared seed the other arm never ran is missing there, not left out of the pairing)
    seeds = {float(v) for g in own.values() for v in g.get(SEED, [])} if "borrowed_studies" in df.attrs else set()
    varied = {k for g in own.values() for k, v in g.items() if k in CURVE_KEYS and k in df and len(v) > 1}
    keys = [*[k for k in CURVE_KEYS if k in curve_keys(df) or k in varied], NOISE]
    done = completed_only(df, "peak_tests").index
    declared = _declared_curves(df, keys, width, own)  # a study's curve may hold none of its runs yet
    out = []
    for key, whole in df.groupby(keys, dropna=False, sort=True):  # every curve, finished runs or not
        missing = unfinished(whole, width, grids, declared.pop(tuple(_norm(v) for v in np.atleast_1d(key)), set()),
                             seeds=seeds or None)
        c = whole[whole.index.isin(done)]
        name = curve_name(keys, key)
        t = center(c, width, tol, rule) if len(c) else np.nan
        never = len(c) and not np.isfinite(threshold(c, width, tol))
        d, (lo, _, hi) = (peak_contrast(c, width, t) if np.isfinite(t)
                          else (pd.DataFrame(columns=["left", "right"], dtype=float), (None, t, None)))
        tested = c[c[width].isin([w for w in (lo, t, hi) if w is not None])]
        flagged = int(_flagged(tested).sum())
        spiked = int(tested["ended_in_spike"].sum()) if "ended_in_spike" in tested else 0
        deciding = deciding_flags(c, width, tol, rule) if len(c) else 0
        spikes = spike_centre(c, width, tol, rule) if len(c) else (0, "")
        lost = lost_fit_centre(c, width, tol, rule) if len(c) else (0, "")
        k, p, means, height, detectable, no_p = _contrast_test(d, lo, hi, never, tol, pilot_sd, alpha)
        upper = height_upper(d, alpha)
        unread = unscored(c, width)
        # runs at the tested widths that ended inside a spike: their test errors read it. Fragile where they decide
        # the verdict: a peak that is not significant without their seeds, or no peak where the seeds left show one
        # (significant, or as high as the effect); fewer seeds alone (power) make nothing fragile
        spiked_seeds = set(tested.loc[tested["ended_in_spike"], SEED]) if spiked else set()
        without = ""
        if spiked_seeds and not missing:
            kept_d = d[~d.index.isin(spiked_seeds)]
            _, kp, _, kept_height, kd, kno = _contrast_test(kept_d, lo, hi, never, tol, pilot_sd, alpha)
            kept = verdict(kp, kept_height, kd, effect, flagged, alpha, missing, unread, kno, deciding,
                           upper=height_upper(kept_d, alpha))
            ours = _verdict(p, height, detectable, effect, flagged, alpha, missing, unread, no_p, deciding, upper)
            ours, kept_says = ours.split(" (")[0], kept.split(" (")[0]
            if ((ours == "reproduced" and kept_says != "reproduced")
                    or (ours != "reproduced" and (kept_says == "reproduced" or kept_height >= effect))):
                n = len(spiked_seeds)
                without = (f"{spiked} run{'s' if spiked > 1 else ''} at the tested widths ended inside a loss spike; "
                           f"without {'its seed' if n == 1 else f'their {n} seeds'} the test reads {kept}")
        says = verdict(p, height, detectable, effect, flagged, alpha, missing, unread, no_p, deciding, spikes, without,
                       upper, lost)
        own = float(np.sqrt((d["left"].var() + d["right"].var()) / 2)) if k >= 2 else np.nan
        out.append(PeakTest(name, t, lo, hi, k, float(means["left"]), float(means["right"]), height, upper, p, flagged,
                            own, detectable, effect, spiked, says))
    out += [PeakTest(curve_name(keys, key), np.nan, None, None, 0, np.nan, np.nan, np.nan, np.nan, np.nan, 0, np.nan,
                     np.nan,
                     effect, 0, verdict(np.nan, np.nan, np.nan, effect, 0, alpha,
                                     f"0 of {len(pairs)} runs finished, {len(pairs)} not started"))
            for key, pairs in declared.items()]  # declared curves with no run at all
    return out
