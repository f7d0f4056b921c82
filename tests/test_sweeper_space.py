"""Hydra sweep grammar -> Optuna distributions (the parts a sweep file relies on)."""

import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from hydra_plugins.vitsweep_sweeper.search_space import SearchSpaceError, from_legacy, grid, parse
from hydra_plugins.vitsweep_sweeper.study import worker_seed


def test_grammar_maps_to_the_values_hydra_would_sweep():
    space, fixed = parse(
        {"a": "choice(2, 4, 8)", "b": "range(2, 8)", "c": "tag(log, interval(1e-4, 3e-3))",
         "d": "interval(0.0, 0.3)", "e": "range(-5.5, 5.5, 0.5)", "f": "1,2"},
        ["g=3", "a=4"],  # the command line fixes `a`
    )
    assert fixed == {"g": "3", "a": "4"}
    assert space["b"] == IntDistribution(2, 8)  # range's stop is included, as in hydra-optuna-sweeper
    assert space["c"] == FloatDistribution(1e-4, 3e-3, log=True)
    assert space["d"] == FloatDistribution(0.0, 0.3)
    assert space["e"] == FloatDistribution(-5.5, 5.5, step=0.5)
    assert space["f"] == CategoricalDistribution([1, 2])


@pytest.mark.parametrize("expr", ["choice(1,", "range(3, 1)", "glob(*)"])
def test_malformed_expressions_name_the_key(expr):
    with pytest.raises(SearchSpaceError, match="hydra.sweeper.params.x"):
        parse({"x": expr}, [])


def test_grid_rejects_continuous_intervals():
    space, _ = parse({"x": "interval(0, 1.5)"}, [])
    with pytest.raises(SearchSpaceError, match="hydra.sweeper.params.x"):
        grid(space)


def test_legacy_search_space_node_converts():
    params = from_legacy({
        "lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
        "bs": {"type": "categorical", "choices": [32, 64]},
        "n": {"type": "int", "low": 1, "high": 9, "step": 2},
    })
    space, _ = parse(params, [])
    assert space == {"lr": FloatDistribution(1e-4, 1e-1, log=True), "bs": CategoricalDistribution([32, 64]),
                     "n": IntDistribution(1, 9, step=2)}


def test_seed_is_kept_for_a_fresh_run_and_moved_for_resumes_and_workers():
    assert worker_seed(123, 0, 0) == 123
    seeds = {worker_seed(123, 0, 1), worker_seed(123, 5, 0), worker_seed(123, 5, 1)}
    assert len(seeds) == 3 and 123 not in seeds
    assert worker_seed(None, 5, 1) is None


def test_range_includes_its_stop_as_in_hydra_optuna_sweeper():
    space, _ = parse({"a": "range(2, 8)", "b": "range(-5.5, 5.5, step=0.5)", "c": "range(0, 10, 4)"}, [])
    assert space["a"] == IntDistribution(2, 8)  # HOS: IntDistribution(start, stop), both ends sampled
    assert space["b"] == FloatDistribution(-5.5, 5.5, step=0.5)
    assert space["c"] == IntDistribution(0, 8, step=4)  # the last value the step reaches


def test_a_grid_range_excludes_its_stop_as_in_hydra_optuna_sweeper():
    """HOS lists `(high - low) // step` values for the grid sampler: Hydra's own range, stop excluded."""
    space, _ = parse({"a": "range(2, 8)", "b": "range(-5.5, 5.5, step=0.5)", "c": "range(0, 10, 4)",
                      "d": "range(-1.0, 1.0, step=1)"}, [], grid=True)
    values = grid(space)
    assert values["a"] == [2, 3, 4, 5, 6, 7]
    assert values["b"] == [-5.5 + 0.5 * i for i in range(22)]
    assert values["c"] == [0, 4, 8]
    assert values["d"] == [-1.0, 0.0]  # HOS's test_grid.yaml


def test_shuffle_is_accepted_where_hydra_optuna_sweeper_accepts_it():
    """`shuffle(range(...))` and `shuffle(choice(...))` are categoricals over Hydra's values, in one order that
    every worker and resume shares (a shuffled order would make each process's distribution another one)."""
    space, _ = parse({"a": "shuffle(range(-5, 5))", "b": "shuffle(choice(3, 1, 2))"}, [])
    assert space["a"] == CategoricalDistribution(list(range(-5, 5)))
    assert space["b"] == CategoricalDistribution([1, 2, 3])
    assert parse({"a": "shuffle(range(-5, 5))"}, [])[0] == parse({"a": "shuffle(range(-5, 5))"}, [])[0]


def _pruned_at(n_warmup_steps, first_step):
    """The steps at which a trial reporting a much worse curve than a finished one gets pruned."""
    import optuna

    from hydra_plugins.vitsweep_sweeper.study import PRUNER_ATTR, pruner_from_study

    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage)
    storage.set_study_system_attr(study._study_id, PRUNER_ATTR, {
        "_target_": "optuna.pruners.MedianPruner", "n_startup_trials": 1, "n_warmup_steps": n_warmup_steps})
    good = study.ask()
    for step in range(first_step, first_step + 4):
        good.report(0.0, step)
    study.tell(good, 0.0)
    bad = optuna.Trial(optuna.load_study(study_name=study.study_name, storage=storage,
                                         pruner=pruner_from_study(storage, study._study_id)), study.ask()._trial_id)
    pruned = []
    for step in range(first_step, first_step + 4):
        bad.report(1.0, step)
        if bad.should_prune():
            pruned.append(step)
    return pruned


@pytest.mark.parametrize("first_step", [0, 1])  # the test app counts evaluations from 0, the trainer from 1
def test_n_warmup_steps_protects_that_many_evaluations(first_step):
    assert _pruned_at(1, first_step)[0] == first_step + 1
    assert _pruned_at(2, first_step)[0] == first_step + 2
    assert _pruned_at(0, first_step)[0] == first_step


def test_a_bare_deletion_is_passed_on_as_written():
    """`~key` (HOS keeps it as a fixed override): not `~key=null`, which Hydra reads as "delete if null"."""
    from hydra_plugins.vitsweep_sweeper.search_space import override_line

    _, fixed = parse({}, ["~z", "~q=3", "x=1"])
    assert [override_line(k, v) for k, v in fixed.items()] == ["~z", "~q=3", "x=1"]


def test_hydras_plugin_scan_does_not_load_optuna():
    """Every Hydra process scans the plugins (a single run, a multirun's launching process before it starts its
    workers, each launcher worker): the scan must not load Optuna (0.15-0.2 s), only a sweep that uses it."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = ("import sys; from hydra.core.plugins import Plugins; Plugins.instance(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'optuna'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout[-2000:], out.stderr[-2000:])


def test_hydras_plugin_scan_leaves_the_public_modules_objects_alone():
    """Hydra's plugin scan re-executes every hydra_plugins module whose name has no leading underscore, in place
    (hydra/core/plugins.py). The public modules must survive that: a class bound before a rescan (an exception a
    caller catches, the trial identity) is the one the code raises and builds afterwards."""
    from hydra.core.plugins import Plugins

    import hydra_plugins
    from hydra_plugins.vitsweep_sweeper import protocol, storage, study

    before = (SearchSpaceError, protocol.TrialIdentity, study.WarmupPruner, storage.open_storage)
    Plugins._scan_all_plugins(modules=[hydra_plugins])
    with pytest.raises(before[0]):
        parse({"x": "choice(1,"}, [])
    after = (SearchSpaceError, protocol.TrialIdentity, study.WarmupPruner, storage.open_storage)
    import hydra_plugins.vitsweep_sweeper.search_space as ss

    assert ss.SearchSpaceError is before[0] and after[1:] == before[1:]


def test_a_glob_sweep_is_refused_with_what_to_use_instead():
    """Review 2026-11-29 (user path, 5): `model.patch=glob(*)` failed with "ConfigLoader is not set"."""
    with pytest.raises(SearchSpaceError, match=r"command line: .*glob is not supported: use choice, range or interval"):
        parse({}, ["model.patch=glob(*)"])
