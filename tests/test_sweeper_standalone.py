"""The vitsweep sweeper in an app that is not vitsweep's: nothing under hydra_plugins imports the trainer (`src`) or
the analysis, and tests/sweeper_app, run in processes where importing either fails
(SWEEPER_APP_STANDALONE), still prunes, resumes a grid and a TPE study, and refuses a changed recipe."""

import ast
from pathlib import Path

from optuna.trial import TrialState

from tests.helpers import APP, ROOT, load, run

PLUGINS = ROOT / "hydra_plugins"  # the sweeper and the vectorized launcher


def standalone(tmp_path, *overrides, check=True):
    return run([APP, "-m", f"hydra.sweep.dir={tmp_path}", *overrides], cwd=tmp_path, check=check,
               env={"SWEEPER_APP_STANDALONE": "1"})


def test_no_module_of_the_plugins_imports_the_trainer_or_the_analysis():
    """Lazy imports inside functions included: a plugin must not behave differently because one fails. What the
    plugins need of the app it declares (protocol.declare_app)."""
    found = []
    for path in sorted(PLUGINS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            found += [f"{path.relative_to(PLUGINS)}:{node.lineno} {n}" for n in names
                      if n.split(".")[0] in ("src", "analysis")]
    assert found == []


def test_the_app_cannot_import_src_when_standalone(tmp_path):
    """The guard the tests below rely on: with the variable set, importing src fails in the app's process."""
    proc = run(["-c", f"import sys; sys.path.insert(0, {str(APP.parent)!r}); import app; import src"],
               cwd=tmp_path, check=False, env={"SWEEPER_APP_STANDALONE": "1"})
    assert proc.returncode != 0 and "import of src halted" in proc.stderr, proc.stderr[-2000:]


def test_a_grid_study_prunes_and_resumes_without_the_trainer(tmp_path):
    grid = ["x=choice(0,1)", "bad=choice(true,false)", "y=choice(0,1)", "epochs=4", "hydra/sweeper/sampler=grid",
            "hydra.sweeper.sampler.seed=0", "hydra/sweeper/pruner=median", "hydra.sweeper.pruner.n_startup_trials=2"]
    standalone(tmp_path, *grid, "hydra.sweeper.n_trials=5")
    proc = standalone(tmp_path, *grid, "hydra.sweeper.n_trials=8")  # the same study, finished
    study = load(tmp_path)
    assert study.direction.name == "MINIMIZE"  # no app declared a direction: hydra-optuna-sweeper's default
    assert len(study.trials) == 8 and len({tuple(sorted(t.params.items())) for t in study.trials}) == 8
    pruned = study.get_trials(states=(TrialState.PRUNED,))
    assert pruned and all(t.params["bad"] for t in pruned), [(t.params, t.state) for t in study.trials]
    assert "Done:" in proc.stdout + proc.stderr


def test_a_tpe_study_resumes_and_refuses_a_changed_recipe_without_the_trainer(tmp_path):
    standalone(tmp_path, "x=interval(0,1)", "epochs=2", "hydra.sweeper.n_trials=2")
    proc = standalone(tmp_path, "x=interval(0,1)", "epochs=3", "hydra.sweeper.n_trials=4", check=False)
    assert proc.returncode != 0
    assert "epochs: 2 -> 3" in proc.stderr and "hydra.sweeper.study_name" in proc.stderr, proc.stderr[-2000:]
    standalone(tmp_path, "x=interval(0,1)", "epochs=2", "hydra.sweeper.n_trials=4")
    study = load(tmp_path)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 4
    assert all(Path(t.user_attrs["run_dir"]).is_dir() for t in study.trials)
