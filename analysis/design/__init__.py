"""Study design: can a double-descent grid see the peak it tests? Pilot first, declare the test, report the power.

``python -m analysis.design plan PILOT_DIR...`` reads a pilot sweep (a few widths, two or three training-set sizes,
an lr ladder, two seeds) and prints, per training-set size and lr:

- the **interpolation threshold**: the smallest width whose mean final train error (on the labels trained on) is
  at most ``tol``, over the runs that did not collapse, and how many grid widths below it underfit;
- the **collapse table**: runs per (lr, width) and how many ended flagged ``stalled``/``collapsed``
  (``analysis.load.result_flags``);
- the **lr rule**, stated before it is applied and never looking at test error: the largest lr of the ladder under
  which no pilot run at the threshold widths (the grid widths within a factor 2 of that lr's threshold) collapsed,
  stalled or diverged (a non-finite loss);
- the **seed spread** at the chosen lr: the standard deviation over seeds of each width's test error, and of the
  declared statistic below, pooled over the pilot's curves;
- the **smallest detectable peak** for k seeds (``mde``), and a suggested main grid around the threshold.

The declared statistic of a peak (``peak_contrast``): per seed, the test error at the tested width W minus the
test error at its left neighbour (the nearest grid width at most W/2) and minus that at its right neighbour (the
nearest at least 2W); seeds share their data subset and noisy labels across widths, so both contrasts are paired.
A peak stands above both: the test is the intersection-union test of two one-sided paired t-tests over seeds
("W above left" and "W above right", each at level ``alpha`` = 0.05; its p is the larger p), and the peak's
``height`` is the smaller mean contrast. A curve that only bends (falls slower at W) is not a peak.

W is the **critical width** (``center='critical'``): the widest grid width below the threshold, the model that
just fails to fit its labels, where Nakkiran et al.'s peak sits (their critical regime: the model can barely fit
the training set); ``center='threshold'`` tests at T itself and is reported as a sensitivity check. W comes from the
main run's train errors only, so the widths tested are fixed without looking at any test error. The power figure
uses the seed sds of the two contrasts, measured the same way on the pilot (``Spread.mde``, ``mde_sides``: a peak
needs both tests, each with the power of its own sd, jointly 0.8; where no pilot contrast had a neighbour on each
side, sqrt(2) x one width's seed sd, ``Spread.power_sd``, and the output says which).

``python -m analysis.design test MAIN_DIR... --pilot PILOT_DIR... --effect 0.05`` applies exactly that test to
the main run, and turns it into a verdict that states its power (``verdict``): *reproduced* where the contrast is
significant; *not reproduced* only where it is not and the smallest effect detectable with the main run's seeds,
from the pilot's spread, is below the published effect and the one-sided 95% upper bound of the observed height
(``height_upper``: the smaller of the two sides' mean + t(0.975) sd / sqrt(k) over the run's seeds, Bonferroni)
lies below it too; otherwise *inconclusive*, with what would settle it.
A flagged (collapsed or stalled) run at one of the three widths makes the verdict inconclusive: a failed
training is not a test-error value. A run that ended inside a loss spike (``ended_in_spike``: a learned model read
at a transient) is read as declared, at its final errors, but the verdict says "fragile" where such runs decide it:
where reading each run's train error as its recent median moves the tested width (``spike_centre``), or where
leaving out their seeds turns a peak into none or no peak into one; so is it where reading the runs that lost their
fit (recent train error 0.05 or more above their best) at their best moves the tested width (``lost_fit_centre``).
An **unfinished grid** makes the verdict
inconclusive too (``unfinished``): the critical width comes from every declared seed's train errors and the power
from the declared seeds, so while any run of a curve's grid (the
widths x seeds its sweep declared, read from the study's storage, else those its runs hold) has not finished, the
verdict is "inconclusive (grid unfinished: 46 of 48 runs finished, 2 stopped)"; the contrast on the seeds that
happened to finish first is printed but is not the declared test. Records that are not one grid are refused
before any test (``one_recipe``): a curve whose runs trained on two devices, or at one width under two recipes (a
config key other than the curve keys, width, seed and runtime keys), or whose widths differ in such a key (a model
key that takes a different value at each width, a ViT's MLP size, aside), a (curve, width, seed) with two finished runs,
finished runs outside the grid their study declared. A finished run with no test or train error is named and makes
the verdict inconclusive (``unscored``): it is not a seed to drop. Mixes the test does not refuse are named after
its table: precisions (``precision_note``) and machines (``machine_note``: CPU or GPU models of one device type,
from the summaries' ``machines``). The power figure's pilot sd is printed with its 95% interval,
and each curve's own contrast sd beside it (an observation: the power was declared from the pilot's). The pilot
pooling note (``pooling_note``) says what that sd pools: the training-set sizes and noise levels, how many of the
pilot's runs at the main run's lr it reads (a stop catches the slow runs, not a random draw), and each recipe key the
pilot trained otherwise than the main run (``recipe_departures``: its epochs, precision, stop rule).

A fixed-budget arm whose sweep trained only the runs the convergence rule ended early names the convergence arm's
sweeps with ``--capped-from``: their runs that reached the same cap stand for the rest of its grid (``with_capped``).

``python -m analysis.design compare A_DIR... --against B_DIR...`` sets two grids of one recipe trained apart (a CPU
and a GPU grid of one sweep, which the test never mixes) side by side: per (curve, width, seed) both finished, B's
test error minus A's, overall and per width (``compare``). A device check beside the seed spread, not a test.
"""
from analysis.design.capped import with_capped
from analysis.design.cli import main
from analysis.design.compare import compare, compare_markdown
from analysis.design.grid import one_recipe, unfinished
from analysis.design.markdown import curves_markdown, machine_note, plan_markdown, precision_note, tests_markdown
from analysis.design.peaks import PeakTest, height_upper, peak_tests, verdict
from analysis.design.plan import choose_lr, choose_main, main_overrides, pilot_at_main_lr, plan, suggest_grid
from analysis.design.power import ALPHA, POWER, Spread, mde, mde_sides, spread
from analysis.design.spikes import spike_note
from analysis.design.thresholds import CENTERS, thresholds

__all__ = [
    "ALPHA", "CENTERS", "POWER", "PeakTest", "Spread", "choose_lr", "choose_main", "compare", "compare_markdown",
    "curves_markdown", "height_upper", "machine_note", "main", "main_overrides", "mde", "mde_sides", "one_recipe",
    "peak_tests", "pilot_at_main_lr", "plan", "plan_markdown", "precision_note", "spike_note", "spread", "suggest_grid",
    "tests_markdown", "thresholds", "unfinished", "verdict", "with_capped",
]
