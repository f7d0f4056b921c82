"""Migrating from hydra-optuna-sweeper (HOS), end to end: lightning-hydra-template's `mnist_optuna.yaml` shape
(tests/sweeper_app/conf/hparams_search/mnist_optuna.yaml: HOS's `_target_` line deleted, `study_name: null`, a
fixed storage, a user's own `trial` key), run twice with the same command, as docs/hos_migration.md says."""

import json
from pathlib import Path

import optuna
import pytest

from tests.helpers import APP, run


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """The same command run twice; the tests only read what it left (shared, so the two sweeps run once)."""
    tmp_path = tmp_path_factory.mktemp("hos")
    for name in ("first", "second"):
        run([APP, "+hparams_search=mnist_optuna", f"hydra.sweep.dir={tmp_path / name}",
             "hydra.sweep.subdir='${hydra.job.override_dirname}'"], cwd=tmp_path)
    return tmp_path


def test_each_run_makes_its_own_study_with_the_full_trial_count(two_runs):
    summaries = optuna.get_all_study_summaries(f"sqlite:///{two_runs / 'hos_studies.db'}")
    assert len(summaries) == 2 and len({s.study_name for s in summaries}) == 2
    assert [s.n_trials for s in summaries] == [4, 4]
    assert all(s.direction == optuna.study.StudyDirection.MAXIMIZE for s in summaries)
    for s in summaries:
        study = optuna.load_study(study_name=s.study_name, storage=f"sqlite:///{two_runs / 'hos_studies.db'}")
        assert all(t.state.name == "COMPLETE" for t in study.trials)


def test_the_users_trial_key_reaches_every_job_unchanged(two_runs):
    run_dirs = sorted(p.parent for p in two_runs.glob("*/*/summary.json"))
    assert len(run_dirs) == 8
    names = set()
    for run_dir in run_dirs:
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["user_trial"] == {"alpha": 0.5, "tag": "mine"}
        names.add(summary["study_name"])
        keys = [kv.split("=", 1)[0] for kv in Path(run_dir).name.split(",")]  # override_dirname
        assert keys == ["+hparams_search", "x", "y"]  # the command line's and the sampled parameters, nothing else
    assert len(names) == 2
