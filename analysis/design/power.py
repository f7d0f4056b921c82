"""The paired contrast test and its power: the smallest detectable peak and the pilot's seed spread."""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import optimize, stats

from analysis.design.grid import NOISE, SEED, along_widths, curve_keys, curve_name
from analysis.design.thresholds import _flagged, center, peak_contrast
from analysis.double_descent import width_column
from analysis.frames import _norm, _recipe_differences, completed_only, named_values, recipe_columns, require_one_recipe

ALPHA, POWER = 0.05, 0.8


def mde(sd: float, k: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest peak height (both contrasts at least this) the declared test detects over ``k`` seeds with joint
    ``power``: a peak needs both one-sided paired t-tests, so each is given power ``sqrt(power)``, as if the two
    contrasts were independent. They share the centre width's value, which correlates them positively when the
    widths' errors are independent, but the committed curves measure -0.31 to positive; simulated at the stated
    height with equal sds the joint power is 0.793 at correlation -0.5, 0.801 at 0, 0.820 at +0.5 (8 seeds; review
    2026-11-29), so ``power`` holds to within a point either way.

    The figure is the larger of the central-t sum ``(t(1 - alpha) + t(sqrt(power))) sd / sqrt(k)``, with which the
    designs were declared, and the exact height at which each test has power ``sqrt(power)`` by the noncentral t:
    the sum is the larger from 4 seeds on (conservative), the exact height at 2 and 3 (the sum gave each test power
    0.851 at 2 seeds, a joint power near 0.72; 0.893 at 3)."""
    if k < 2 or not np.isfinite(sd) or sd <= 0:  # no spread measured: no power figure (not "detects everything")
        return np.nan
    crit = stats.t.ppf(1 - alpha, k - 1)
    approx = (crit + stats.t.ppf(np.sqrt(power), k - 1)) / np.sqrt(k)

    def short(d: float) -> float:  # each test's power at height d (in units of sd) minus sqrt(power)
        return float(stats.nct.sf(crit, k - 1, d * np.sqrt(k))) - np.sqrt(power)

    exact = approx if short(approx) >= 0 else optimize.brentq(short, approx, 2 * approx, xtol=1e-10)
    return float(max(approx, exact) * sd)


def mde_sides(sd_left: float, sd_right: float, k: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest peak height (both contrasts at least this) the declared test detects over ``k`` seeds with joint
    ``power``, each one-sided paired t-test's power from its own contrast's sd (noncentral t), the joint power their
    product (exact for independent contrasts; at correlation -0.5 to +0.5 simulated 0.798-0.808 with the ViT pilot's
    sds, see :func:`mde`). With one side quiet the
    other carries the power alone: about ``power`` on it, not ``sqrt(power)`` (taking the larger sd for both, as on
    2026-11-29 first, gave a joint power near 0.9 and asked 8 seeds where 6 have 0.8)."""
    sds = np.array([sd_left, sd_right], float)
    if k < 2 or not np.isfinite(sds).all() or (sds <= 0).any():
        return np.nan
    crit = stats.t.ppf(1 - alpha, k - 1)

    def short(d: float) -> float:  # joint power at height d minus the target
        return float(np.prod(stats.nct.sf(crit, k - 1, d * np.sqrt(k) / sds))) - power

    hi = mde(float(sds.max()), k, alpha, power)  # each side at sqrt(power) with the larger sd: joint >= power
    return float(optimize.brentq(short, 1e-12 * hi, hi, xtol=1e-12)) if short(hi) > 0 else hi


@dataclass
class Spread:
    contrast_sd: float  # pooled sd over seeds of the two peak contrasts
    dof: int  # of contrast_sd: both sides' (each side has half)
    width_sd: float  # pooled sd over seeds of one width's test error
    curves: int
    left_sd: float = np.nan  # pooled sd over seeds of the left contrast alone (dof / 2)
    right_sd: float = np.nan  # and of the right
    reruns: int = 0  # pilot runs beyond the first of a (curve, width, seed) whose results differ (genuine reruns)
    rerun_cells: int = 0  # (curve, width, seed) cells with such reruns
    rerun_sd: float = np.nan  # pooled sd of test error within a cell's reruns (``reruns`` dof)
    duplicates: int = 0  # runs identical to another of their cell (one run read twice): counted once
    width_dof: int = 0  # of width_sd: seeds - 1 summed over the (curve, width) groups
    contrast_seeds: int = 0  # distinct seeds among the contrasts (curves that share seeds count them once)
    width_seeds: int = 0  # distinct seeds among the width groups

    @property
    def rerun_note(self) -> str:
        """How the pilot's repeated (curve, width, seed) cells were counted, for the printed output."""
        n = self.duplicates
        dup = (f"; {n} run{'s' if n != 1 else ''} identical to another of {'their' if n != 1 else 'its'} (curve, "
               "width, seed) (the same run read twice) counted once" if n else "")
        if not self.reruns:
            return f"Reruns: none (each (curve, width, seed) of the pilot ran once{dup})."
        return (f"Reruns: the pilot reran {self.rerun_cells} (curve, width, seed) cell"
                f"{'s' if self.rerun_cells != 1 else ''} with different results ({self.reruns} extra "
                f"run{'s' if self.reruns != 1 else ''}; rerun sd {self.rerun_sd:.4f}, pooled over the cells, "
                f"{self.reruns} dof){dup}. A seed's reruns are averaged into one value, and each variance above is "
                "that of the per-seed values plus the pooled rerun variance x mean(1 - 1/r) over the seeds (r: a "
                "seed's runs at a width, each width of a contrast counted), so it estimates one run's variance, "
                "which the main test's single run per seed faces.")

    @property
    def side(self) -> str | None:
        """The noisier contrast, ``left`` or ``right`` (None without both sides' sds)."""
        if not (np.isfinite(self.left_sd) and np.isfinite(self.right_sd)):
            return None
        return "left" if self.left_sd >= self.right_sd else "right"

    def mde(self, k: int, alpha: float = ALPHA, power: float = POWER) -> float:
        """The smallest detectable peak over ``k`` seeds from this pilot: from both contrasts' own sds
        (``mde_sides``) where the pilot measured them, else from ``power_sd``."""
        if self.dof and self.side is not None:
            return mde_sides(self.left_sd, self.right_sd, k, alpha, power)
        return mde(self.power_sd, k, alpha, power)

    @property
    def power_sd(self) -> float:
        """The sd the power figure uses: the pilot's larger one-side contrast sd, since a peak needs both one-sided
        tests to reject and the noisier side sets the joint power (the two sides' pooled sd overstated it: joint power
        0.68-0.70 at the printed mde with sides of sd 0.039 and 0.007; found 2026-11-29); with no sides' sds, the
        pooled one; where no pilot curve had a contrast with both neighbours (0 dof), sqrt(2) x one width's sd, the
        contrast's sd if the two widths' errors were independent (seeds share data and labels across widths, so the
        paired contrast's true sd is at most this when the errors correlate positively)."""
        if not self.dof:
            return float(np.sqrt(2) * self.width_sd)
        return self.contrast_sd if self.side is None else max(self.left_sd, self.right_sd)

    def sd_interval(self, level: float = 0.95, seeds_once: bool = False) -> tuple[float, float]:
        """The ``level`` chi-square interval of ``power_sd``: the power figure takes the sd as known, so the smallest
        detectable peak is uncertain in the same proportion. One side's sd has ``dof / 2`` independent degrees of
        freedom (each seed of each curve once). Without a contrast (the fallback, sqrt(2) x one width's sd), the
        interval of that sd on its own ``width_dof`` (NaNs where it has none).

        ``seeds_once``: with the dof capped at what each distinct seed counted once gives (``once_dof``). Curves (and
        widths) that share a seed share its data subset, label noise and init, so their deviations need not be
        independent: the ViT pilot's two weight-decay curves on seeds 0-1 moved the same way (review 2026-11-29).
        The truth lies between the two intervals; both are printed.

        For the pooled sd of both sides: a seed's left and right contrasts share the centre width's error
        (correlation 0.5 when the widths' errors are independent), so their ``dof`` squared deviations carry
        ``dof / (1 + 0.5^2)`` degrees of freedom (the effective dof of two such sample variances pooled); counted as
        ``dof`` the interval covered 92-93%, with this 95-96% (tests/test_design.py)."""
        a = (1 - level) / 2
        dof = min(self.interval_dof, self.once_dof) if seeds_once else self.interval_dof
        if not dof:
            return np.nan, np.nan
        sd = self.contrast_sd if self.dof and self.side is None else self.power_sd
        return (float(sd * np.sqrt(dof / stats.chi2.ppf(1 - a, dof))),
                float(sd * np.sqrt(dof / stats.chi2.ppf(a, dof))))

    @property
    def interval_dof(self) -> float:
        """The dof ``sd_interval`` gives ``power_sd``: one side's ``dof / 2``; both sides pooled ``dof / 1.25``; the
        fallback's ``width_dof`` (the fallback, sqrt(2) x one width's sd: that sd's own dof, review 2026-11-29, D3)."""
        if not self.dof:
            return self.width_dof
        return self.dof / 1.25 if self.side is None else self.dof / 2

    @property
    def once_dof(self) -> float:
        """The dof of ``power_sd`` with each distinct seed counted once: seeds - 1 for one side's sd (or one width's,
        in the fallback), 2 (seeds - 1) / 1.25 for both sides pooled (see ``sd_interval``); inf where unknown."""
        if not self.dof:
            return self.width_seeds - 1 if self.width_seeds else np.inf
        if not self.contrast_seeds:
            return np.inf
        return 2 * (self.contrast_seeds - 1) / 1.25 if self.side is None else self.contrast_seeds - 1

    @property
    def power_source(self) -> str:
        if self.dof and self.side:
            other = "right" if self.side == "left" else "left"
            return (f"the pilot's two contrast sds, {self.side} {self.power_sd:.4f} and {other} "
                    f"{min(self.left_sd, self.right_sd):.4f} ({self.dof // 2} dof each over {self.curves} curves): a "
                    "peak needs both one-sided tests, each with the power of its own sd, jointly the stated power "
                    "(`mde_sides`)")
        if self.dof:
            return f"the pilot's contrast sd {self.contrast_sd:.4f} ({self.dof} dof over {self.curves} curves)"
        return (f"sqrt(2) x the pilot's one-width sd {self.width_sd:.4f} = {self.power_sd:.4f} (no pilot contrast "
                "had a neighbour on each side)")


def one_run_variance(var_of_means: float, lost, rerun_var: float) -> float:
    """One run's variance from the variance over seeds of per-seed values, each a mean of a seed's reruns whose own
    variance is ``rerun_var``: ``var_of_means + rerun_var x mean(lost)``, where ``lost`` is, per seed, the share of
    the rerun variance the averaging took away: ``1 - 1/r`` for one width run r times, the sum over a contrast's two
    widths. A seed's mean of r reruns has variance ``seed_var + rerun_var / r``, and the sample variance of values
    of unequal variances has for expectation their mean, so this is unbiased for ``seed_var + rerun_var``, one
    run's (with an unbiased ``rerun_var``). No reruns (``rerun_var`` 0 or every ``lost`` 0) leave it as is."""
    return float(var_of_means + rerun_var * np.mean(np.asarray(lost, float))) if rerun_var else float(var_of_means)


def _one_run_per_cell(df: pd.DataFrame, keys: list[str], who: str) -> tuple[pd.DataFrame, dict]:
    """``df`` with one row per (``keys``, seed): its runs' mean test and train error and ``runs`` (r), and what
    the repeats were. A run identical to another of its cell (test and train error: one run read twice) is dropped
    first, with a warning; runs of one cell that differ in a recipe key are refused (two recipes, not one seed run
    twice, ``analysis.frames.one_run_per_seed``'s rule); the rest are genuine reruns, whose pooled within-cell
    variance of test error is returned (``ss``, ``dof``) with their count."""
    if SEED not in df.columns or df[SEED].isna().all():
        return df.assign(runs=1), {"ss": 0.0, "dof": 0, "cells": 0, "duplicates": 0}
    cols = [*keys, SEED]
    dup = df.duplicated(cols, keep=False) & df[SEED].notna()
    if dup.any():
        differ = _recipe_differences(df[dup], cols)
        if differ:
            named = named_values(differ)
            raise ValueError(f"{who}: runs of one ({', '.join(cols)}) differ in {named}: two recipes, not one seed "
                             f"run twice; keep them apart (by={[*differ]!r}, or a groupby on them) or read one "
                             "study's folders")
    same = df.duplicated([*cols, "test_error", "train_error"]) & df[SEED].notna()
    if same.any():
        warnings.warn(f"{who}: {int(same.sum())} runs repeat a seed of the same setting ({', '.join(cols)}) with "
                      "identical results (one run read twice): counted once", stacklevel=3)
    df = df[~same]
    g = df.groupby(cols, dropna=False, sort=False)
    out = g[["test_error", "train_error"]].mean().assign(runs=g.size()).reset_index()
    r = out["runs"]
    v = g["test_error"].var().reset_index(drop=True)  # NaN for a single run
    ss = float((v[r > 1] * (r[r > 1] - 1)).sum())
    dof = int((r - 1).sum())
    if dof:
        warnings.warn(f"{who}: {int((r > 1).sum())} (curve, width, seed) cells were rerun with different results "
                      f"({dof} extra runs): each seed's runs are averaged, and the pooled rerun variance x mean(1 - "
                      "1/r) is added back so the spread is one run's", stacklevel=3)
    return out, {"ss": ss, "dof": dof, "cells": int((r > 1).sum()), "duplicates": int(same.sum())}


def _one_recipe_per_curve(df: pd.DataFrame, width: str) -> None:
    """Refuse a pilot curve that pools two recipes where no (width, seed) holds both (``_one_run_per_cell`` finds
    them only there): at one width on other seeds (``require_one_recipe``), or at other widths (two pilot sweeps
    stitched; a model key that takes a different value at each width, a ViT's MLP size, aside, as ``one_recipe``
    has it for the main run): their seed spread and contrasts would span the two recipes."""
    keys = [*curve_keys(df), NOISE]
    require_one_recipe(df, [*keys, width], "spread")
    free = recipe_columns(df, [*keys, width, SEED])
    for key, c in df.groupby(keys, dropna=False, sort=True):
        along = {k: sorted({str(v) for v in c[k].map(_norm)}) for k in along_widths(c, free, width)}
        if along:
            raise ValueError(f"spread: the pilot's curve {curve_name(keys, key)}: its widths differ in "
                             f"{named_values(along)}: a curve stitched from two recipes, whose contrasts would span "
                             "them; pass one recipe's pilot sweeps")


def spread(df: pd.DataFrame, width: str | None = None, tol: float = 0.01, rule: str = "critical") -> Spread:
    """Seed spread of the pilot's curves (unflagged runs): of the contrast at each curve's threshold, and of a single
    width's test error, both pooled (sum of squares over degrees of freedom), as the variance of a single run per
    seed, which is what the main test reads.

    Repeats of a (curve, width, seed): a run identical to another (the pilot read from two folders) is counted once;
    genuine reruns that differ (a width rerun in a second pilot sweep, nondeterministic on a GPU) are averaged into
    one value per seed, whose variance over seeds understates one run's (the sd of a mean of reruns: the CIFAR-10
    pilot reran C1 = 8 at seeds 0 and 1, review 2026-11-29, D2). The rule: each group's variance over seeds is the
    variance of the per-seed means plus ``s_e^2 x mean(1 - 1/r)`` over its seeds, where ``s_e^2`` is the rerun
    variance of test error pooled over every rerun cell (assumed the same at every width) and ``r`` a seed's runs
    at that width; for a contrast the term is ``s_e^2 x mean((1 - 1/r_W) + (1 - 1/r_side))``. Unbiased for one
    run's variance (tests/test_design.py); ``dof`` stays the seeds' (the rerun term is not counted)."""
    width = width or width_column(df)
    df = completed_only(df, "spread")
    df = df[~_flagged(df)]
    _one_recipe_per_curve(df, width)
    df, rr = _one_run_per_cell(df, [*curve_keys(df), NOISE, width], "spread")
    e2 = rr["ss"] / rr["dof"] if rr["dof"] else 0.0
    ss_c = dof_c = ss_w = dof_w = curves = 0
    ss_side = {"left": 0.0, "right": 0.0}
    seeds_c, seeds_w = set(), set()
    for _, c in df.groupby([*curve_keys(df), NOISE], dropna=False):
        for _, g in c.groupby(width):
            n = g["test_error"].count()
            if n > 1:
                seeds_w |= set(g.loc[g["test_error"].notna(), SEED])
                lost = 1 - 1 / g.loc[g["test_error"].notna(), "runs"]
                ss_w += one_run_variance(g["test_error"].var(), lost, e2) * (n - 1)
                dof_w += n - 1
        t = center(c, width, tol, rule)
        if not np.isfinite(t):
            continue
        d, (lo, _, hi) = peak_contrast(c, width, t)
        if len(d) > 1:
            seeds_c |= set(d.index)
            r = c.set_index([width, SEED])["runs"]
            for side, w in (("left", lo), ("right", hi)):
                lost = sum(1 - 1 / r.loc[x].reindex(d.index).to_numpy() for x in (t, w))  # both widths' share
                v = one_run_variance(d[side].var(), lost, e2) * (len(d) - 1)
                ss_side[side] += v
                ss_c += v
                dof_c += len(d) - 1
            curves += 1
    sides = {s: float(np.sqrt(2 * v / dof_c)) if dof_c else np.nan for s, v in ss_side.items()}
    return Spread(float(np.sqrt(ss_c / dof_c)) if dof_c else np.nan, int(dof_c),
                  float(np.sqrt(ss_w / dof_w)) if dof_w else np.nan, curves, sides["left"], sides["right"],
                  reruns=rr["dof"], rerun_cells=rr["cells"], width_dof=int(dof_w),
                  rerun_sd=float(np.sqrt(e2)) if rr["dof"] else np.nan, duplicates=rr["duplicates"],
                  contrast_seeds=len(seeds_c), width_seeds=len(seeds_w))


def _contrast_test(d: pd.DataFrame, lo, hi, never: bool, tol: float, pilot_sd: float | Spread, alpha: float
                   ) -> tuple[int, float, pd.Series, float, float, str | None]:
    """The paired one-sided tests on per-seed contrasts ``d`` (``peak_contrast``): (seeds, the intersection-union p,
    the contrasts' means, the height (the smaller mean), the smallest detectable peak with these seeds, why there is
    no p where there is none)."""
    k = len(d)
    p = np.nan
    no_p = (f"no width interpolates (mean train error <= {tol} at none): the threshold lies past the grid's "
            "widest model" if never else None)
    if k >= 2 and (d.std() > 0).all():
        p = max(float(stats.ttest_1samp(d[s].to_numpy(), 0.0, alternative="greater").pvalue) for s in ("left", "right"))
    elif lo is not None and hi is not None:
        no_p = (f"{k} seed{'s have' if k != 1 else ' has'} the three tested widths: the paired t-test needs 2 or "
                "more" if k < 2 else "a contrast is the same in every seed: the paired t-test needs a spread; "
                "check that the seeds differ")
    means = d.mean() if k else pd.Series({"left": np.nan, "right": np.nan})
    height = float(min(means["left"], means["right"]))
    detectable = pilot_sd.mde(k, alpha) if isinstance(pilot_sd, Spread) else mde(pilot_sd, k, alpha)
    return k, p, means, height, detectable, no_p
