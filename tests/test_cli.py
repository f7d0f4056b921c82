"""The command line a researcher types: `python -m src.train [-m] overrides`."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

from src.malloc import TUNABLES, lean_malloc_env
from tests.conftest import ROOT, TINY
from tests.helpers import SUMMARY_KEYS


def run_cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "src.train", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow  # the suite's time (2026-11-30: 944 s of a 900 s budget): README's multirun block, which the
# default suite runs (test_readme.py), trains the same model.patch=2,4,8 multirun and reports on its three run dirs
def test_patch_size_multirun_writes_three_complete_run_dirs(tmp_path):
    done = run_cli("-m", "model.patch=2,4,8", *TINY, f"hydra.sweep.dir={tmp_path}")
    assert done.returncode == 0, done.stderr[-2000:]
    runs = sorted(p for p in tmp_path.iterdir() if p.is_dir())
    assert [p.name for p in runs] == ["0", "1", "2"]
    patches = []
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        assert SUMMARY_KEYS <= summary.keys() and summary["status"] == "completed"
        assert (run / "metrics.jsonl").read_text().strip() and (run / ".hydra" / "config.yaml").is_file()
        patches.append(int((run / ".hydra" / "overrides.yaml").read_text().split("model.patch=")[1].split()[0]))
    assert patches == [2, 4, 8]


def test_bad_input_exits_nonzero_with_the_key_and_no_summary(tmp_path):
    done = run_cli("model.patch=3", *TINY, f"hydra.run.dir={tmp_path}")
    assert done.returncode != 0
    assert "model.patch=3 does not divide the image size 16" in done.stderr
    assert not (tmp_path / "summary.json").exists()


def test_unknown_group_option_lists_choices(tmp_path):
    done = run_cli("dataset=imagenet", f"hydra.run.dir={tmp_path}")
    assert done.returncode != 0 and "Available options" in done.stderr and "cifar10" in done.stderr


def _without_malloc_settings() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "VITSWEEP_MALLOC")}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings are Linux-only")
def test_training_processes_restart_once_with_lean_malloc_settings():
    code = ("import os, src.malloc as m; print('start', flush=True); m.restart_with_lean_malloc(); "
            "print(os.environ.get('GLIBC_TUNABLES'))")
    env = _without_malloc_settings()
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env)
    assert done.stdout.split() == ["start", "start", TUNABLES], done.stderr
    opted_out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                               env={**env, "VITSWEEP_MALLOC": "default"})
    assert opted_out.stdout.split() == ["start", "None"], opted_out.stderr


def test_a_misspelt_malloc_choice_stops_with_the_fix():
    with pytest.raises(SystemExit, match="VITSWEEP_MALLOC='defualt' is unknown: set it to 'lean'"):
        lean_malloc_env({"VITSWEEP_MALLOC": "defualt"})


def test_lean_malloc_keeps_the_users_own_tunables():
    assert lean_malloc_env({"GLIBC_TUNABLES": "glibc.malloc.tcache_count=7"}) is None
    env = lean_malloc_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    if env is not None:  # None on non-glibc systems
        assert env["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{TUNABLES}"


def test_the_entry_point_restarts_before_torch_loads():
    """glibc reads its malloc settings at start-up: the restart must come before any heavy import."""
    tree = ast.parse((ROOT / "src" / "train.py").read_text())
    body = [n for n in tree.body
            if not (isinstance(n, ast.Expr) or isinstance(n, ast.ImportFrom) and n.module == "__future__")]
    first = body[0]
    assert isinstance(first, ast.If) and "restart_with_lean_malloc" in ast.unparse(first)


def test_pruning_is_decided_from_the_returned_summary():
    import optuna

    from src.train import objective_of

    pruned = {"stop_reason": "pruned", "epochs": 2, "objective_name": "val_acc", "objective": 0.5}
    with pytest.raises(optuna.TrialPruned, match="pruned at epoch 2 with val_acc 0.5"):
        objective_of(pruned, in_trial=True)
    assert objective_of(pruned, in_trial=False) == 0.5
    assert objective_of({**pruned, "stop_reason": "converged"}, in_trial=True) == 0.5


@pytest.mark.slow  # the suite's time: test_resume.py checks the same in process (test_a_crashed_run_resumes_exactly_
# and_a_finished_one_is_not_retrained, test_a_changed_config_refuses_to_resume_and_names_the_keys)
def test_a_finished_run_is_not_retrained_from_the_command_line(tmp_path):
    args = (*TINY, "trainer.checkpoint=true", f"hydra.run.dir={tmp_path}")
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr[-2000:]
    rows = (tmp_path / "metrics.jsonl").read_text()
    again = run_cli(*args, "trainer.progress=true")  # a runtime key may differ
    assert again.returncode == 0 and "holds a finished run (max_epochs): not retraining" in again.stdout
    assert (tmp_path / "metrics.jsonl").read_text() == rows
    changed = run_cli(*args, "optimizer.lr=0.5")
    assert changed.returncode != 0 and "optimizer.lr: 0.0003 -> 0.5" in changed.stderr
    assert "trainer.resume=never" in changed.stderr
