"""Review 2026-11-29 of the sweeper and launcher plugins: results recorded against the wrong parameters."""

import pytest
from optuna.trial import TrialState

from tests.helpers import load, sweep


@pytest.mark.parametrize("order", [["y=choice(0,3)", "kind=choice(a,b)"], ["kind=choice(a,b)", "y=choice(0,3)"]])
def test_a_preset_that_sets_a_sampled_key_is_refused_before_any_trial(tmp_path, order):
    """Review 2026-11-29: a preset choice that set a key the study also samples (preset a sets y, and y is swept)
    trained whichever override came last in the job's command line, by the order of hydra.sweeper.params: with y
    listed before kind, every kind=a run trained y = 2 while Optuna recorded y = 0 or 3, so best_params and any
    grouping by the trial's params named a y that was never trained. Refused before any trial, naming both keys."""
    proc = sweep(tmp_path, *order, "x=choice(0)", "hydra/sweeper/sampler=grid", "hydra/sweeper=app_presets",
                 check=False)
    assert proc.returncode != 0, proc.stderr[-2000:]
    assert "hydra.sweeper.presets.kind.a sets y, which hydra.sweeper.params samples" in proc.stderr, proc.stderr[-2000:]
    assert not [p for p in tmp_path.iterdir() if p.name.isdigit()]  # no trial ran


def test_a_fixed_preset_that_sets_a_sampled_key_is_refused_before_any_trial(tmp_path):
    """As above for a preset key fixed on the command line (+kind=a): its overrides come after the sampled ones, so
    every run trained preset a's y = 2 while Optuna recorded the sampled y."""
    proc = sweep(tmp_path, "kind=choice(a,b)", "+kind=a", "y=choice(0,3)", "x=choice(0)",
                 "hydra/sweeper/sampler=grid", "hydra/sweeper=app_presets", check=False)
    assert proc.returncode != 0, proc.stderr[-2000:]
    assert "hydra.sweeper.presets.kind.a sets y, which hydra.sweeper.params samples" in proc.stderr, proc.stderr[-2000:]


def test_a_preset_that_sets_only_unsampled_keys_still_runs(tmp_path):
    sweep(tmp_path, "kind=choice(a,b)", "x=choice(0,1)", "hydra/sweeper/sampler=grid", "hydra/sweeper=app_presets")
    done = load(tmp_path).get_trials(states=(TrialState.COMPLETE,))
    # a: y = 2, b: y = 1; the value is x^2 + y^2
    assert sorted((t.params["kind"], t.params["x"], t.value) for t in done) == [
        ("a", 0, 4.0), ("a", 1, 5.0), ("b", 0, 1.0), ("b", 1, 2.0)]
