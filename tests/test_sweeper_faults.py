"""Fault injection for the vitsweep sweeper (`pytest -m faults`): dead workers, a dead main process, seeded grids
with several workers and resumes, failing and NaN trials, a silent worker on another host, bad storages.

Trials are the tiny task in tests/sweeper_app (sleeps, no torch), so the suite takes about a minute."""

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from hydra_plugins.vitsweep_sweeper import study as st
from tests.helpers import (
    APP,
    GRID,
    LIVENESS,
    ROOT,
    assert_each_point_once,
    counted,
    gone,
    load,
    run,
    sweep,
    wait_for,
)

pytestmark = pytest.mark.faults


def start(tmp_path, *overrides):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, str(APP), "-m", f"hydra.sweep.dir={tmp_path}", *overrides]
    return subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def running_worker_trial(tmp_path, main_pid):
    """A RUNNING trial whose worker (not the main process) is known, after its first evaluation."""
    for t in load(tmp_path).get_trials(states=(TrialState.RUNNING,)):
        owner = t.system_attrs.get(st.WORKER_ATTR, "")
        pid = int(owner.rpartition(":")[2] or 0)
        if pid and pid != main_pid and t.intermediate_values:
            return t, pid
    return None


def test_sigkill_of_one_worker_mid_trial_is_retried_and_the_study_completes(tmp_path):
    args = [*GRID, "sleep_s=0.4", "hydra.sweeper.n_workers=2", "hydra.sweeper.n_trials=6", *LIVENESS]
    proc = start(tmp_path, *args)
    victim, pid = wait_for(lambda: running_worker_trial(tmp_path, proc.pid), what="a running worker trial", proc=proc)
    os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]  # max_failure_rate=0: the interrupted trial is not a failure
    assert "lost worker" in out + err and "retried as trial" in out + err
    study = load(tmp_path)
    assert_each_point_once(study)
    dead = study.trials[victim.number]
    assert dead.state == TrialState.FAIL and "stopped answering" in dead.user_attrs["error"]
    (retry,) = [t for t in study.trials if t.user_attrs.get("retry_of") == victim.number]
    assert retry.state == TrialState.COMPLETE and retry.user_attrs["retries"] == 1
    assert retry.params == dead.params
    assert Path(retry.user_attrs["run_dir"]) == tmp_path / str(victim.number)  # the dead trial's run dir
    results = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    assert results["states"] == {"COMPLETE": 6}
    assert results["retried"] == [{"number": retry.number, "retry_of": victim.number,
                                   "error": dead.user_attrs["error"]}]


def test_sigkill_of_the_main_process_then_the_same_command_finishes_the_budget(tmp_path):
    args = [*GRID, "sleep_s=0.5", "hydra.sweeper.n_workers=2", "hydra.sweeper.n_trials=6", *LIVENESS]
    proc = start(tmp_path, *args)
    wait_for(lambda: len(load(tmp_path).get_trials(states=(TrialState.COMPLETE,))) >= 1, what="a finished trial",
             proc=proc)
    running = wait_for(lambda: running_worker_trial(tmp_path, proc.pid), what="a running worker trial", proc=proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    try:  # an orphan that hangs on its way out is ended 30 s (max(grace_s, 30)) after its SIGTERM
        wait_for(lambda: gone(running[1]), timeout=60, what="the orphaned workers to stop")
    except AssertionError as e:
        logs = {p.name: p.read_text(errors="replace")[-3000:] for p in sorted((tmp_path / "workers").glob("*.log"))}
        raise AssertionError(f"{e}\n{logs}") from None
    sweep(tmp_path, *args)  # the same command
    study = load(tmp_path)
    assert_each_point_once(study)
    interrupted = [t for t in study.trials if t.state == TrialState.FAIL]
    assert interrupted, "the orphaned workers stopped mid-trial: their trials are failed and retried"
    for t in interrupted:  # handed back by the orphan on its SIGTERM, or failed by the rerun as gone
        assert any(why in t.user_attrs["error"] for why in ("was stopped mid-trial", "stopped answering"))
        retry = last_retry(study, t)
        assert retry.state == TrialState.COMPLETE and retry.params == t.params, describe(study)
        assert retry.user_attrs["retries"] == 0, "a stop of the sweep was counted against max_retries"


def test_an_orphan_that_ignores_sigterm_is_ended_after_the_grace(tmp_path):
    """The parent watch sends SIGTERM when the parent is gone, and ends a child still alive `grace_s` later (a
    stop handler that hung, an exit waiting on a thread): no orphan outlives its grace."""
    child = (
        "import signal, sys, time\n"
        "from hydra_plugins.vitsweep_sweeper.parent_watch import watch_parent\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "watch_parent(int(sys.argv[1]), grace_s=1.0, poll_s=0.1)\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n")
    parent = (  # starts the child, waits until its watch runs, and exits: the child is an orphan
        "import os, subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, '-c', sys.argv[1], str(os.getpid())], text=True,\n"
        "                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)\n"
        "assert p.stdout.readline().strip() == 'ready'\n"
        "print(p.pid, flush=True)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", parent, child], env=env, capture_output=True, text=True, timeout=60)
    pid = int(out.stdout.strip())
    try:
        wait_for(lambda: gone(pid), timeout=20, what="the orphan that ignores SIGTERM to be ended")
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


def last_retry(study, t):
    """The end of `t`'s chain of retries. A retry can itself be interrupted (seen in CI: the first worker to see
    the main process gone handed its trial back, and the other one, not yet stopping, claimed that retry)."""
    while True:
        retries = [r for r in study.trials if r.user_attrs.get("retry_of") == t.number]
        assert len(retries) == 1, f"trial {t.number} has {len(retries)} retries\n{describe(study)}"
        (retry,) = retries
        if retry.state != TrialState.FAIL:
            return retry
        t = retry


def describe(study):
    """One line per trial, for assertion messages: number, state, params, retry_of, error."""
    return "\n".join(f"#{t.number} {t.state.name} {t.params} retry_of={t.user_attrs.get('retry_of')} "
                     f"error={t.user_attrs.get('error')}" for t in study.trials)


def test_seeded_grid_with_two_workers_runs_every_point_once(tmp_path):
    sweep(tmp_path, *GRID, "sleep_s=0.05", "hydra.sweeper.sampler.seed=7", "hydra.sweeper.n_workers=2",
          "hydra.sweeper.n_trials=6")
    assert_each_point_once(load(tmp_path))


def test_seeded_grid_resumed_with_a_larger_budget_runs_every_point_once(tmp_path):
    args = [*GRID, "hydra.sweeper.sampler.seed=7"]
    sweep(tmp_path, *args, "hydra.sweeper.n_trials=2")
    sweep(tmp_path, *args, "hydra.sweeper.n_trials=4", "hydra.sweeper.n_workers=2")
    proc = sweep(tmp_path, *args, "hydra.sweeper.n_trials=10", "hydra.sweeper.sampler.seed=8")
    assert "keeps the grid order of seed 7" in proc.stdout + proc.stderr
    assert_each_point_once(load(tmp_path))


def test_raising_and_nan_trials_are_listed_and_the_grid_finishes(tmp_path):
    sweep(tmp_path, "fail=choice(true,false)", "nan=choice(true,false)", "x=choice(0,1,2)",
          "hydra/sweeper/sampler=grid", "hydra.sweeper.n_trials=12", "hydra.sweeper.max_failure_rate=0.75")
    study = load(tmp_path)
    assert len(study.trials) == 12
    assert {t.state for t in study.trials if not t.params["fail"] and not t.params["nan"]} == {TrialState.COMPLETE}
    results = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    assert results["states"] == {"COMPLETE": 3, "FAIL": 9}
    errors = {(f["params"]["fail"], f["params"]["nan"]): f["error"] for f in results["failed"]}
    assert "RuntimeError: planted failure" in errors[(True, False)]
    assert "non-finite objective" in errors[(False, True)]


def test_failures_beyond_the_rate_stop_the_study_and_name_the_key(tmp_path):
    proc = sweep(tmp_path, "fail=choice(true,false)", "x=choice(0,1,2)", "hydra/sweeper/sampler=grid",
                 "hydra.sweeper.sampler.seed=0", "hydra.sweeper.max_failure_rate=0.1", check=False)
    assert proc.returncode != 0 and "hydra.sweeper.max_failure_rate=0.1" in proc.stderr


ONE_OF_THREE = ["x=choice(0,1,2)", "hydra/sweeper/sampler=grid", *LIVENESS]


def first_point_run(tmp_path):
    """The study after one of its three points ran, and a point it has not run."""
    sweep(tmp_path, *ONE_OF_THREE, "hydra.sweeper.n_trials=1")
    study = load(tmp_path)
    return study, next(p for p in ({"x": 0}, {"x": 1}, {"x": 2}) if p["x"] != study.trials[0].params["x"])


def claimed(study, point, owner=None, user_attrs=None):
    """A RUNNING trial of `point` as another process left it: owned by `owner`, or (None) claimed without one."""
    study.enqueue_trial(point, user_attrs=user_attrs)
    trial = study.ask()
    trial.suggest_categorical("x", [0, 1, 2])
    if owner is not None:
        for key, value in ((st.WORKER_ATTR, owner), (st.HEARTBEAT_ATTR, 1.0), (st.JOB_ATTR, trial.number)):
            study._storage.set_trial_system_attr(trial._trial_id, key, value)
    return trial


def test_a_silent_worker_on_another_host_is_failed_and_its_trial_retried(tmp_path):
    study, point = first_point_run(tmp_path)
    foreign = claimed(study, point, "gpu-node-7:4242")
    sweep(tmp_path, *ONE_OF_THREE, "hydra.sweeper.n_trials=3")
    study = load(tmp_path)
    dead = study.trials[foreign.number]
    assert dead.state == TrialState.FAIL
    assert dead.user_attrs["error"].startswith("worker gpu-node-7:4242 stopped answering")
    (retry,) = [t for t in study.trials if t.user_attrs.get("retry_of") == foreign.number]
    assert retry.state == TrialState.COMPLETE and retry.params == point
    assert sorted(t.params["x"] for t in study.get_trials(states=(TrialState.COMPLETE,))) == [0, 1, 2]


def test_a_worker_stopped_mid_trial_hands_its_trial_back_and_the_same_command_continues_it(tmp_path):
    """SIGTERM (e.g. SLURM preemption): the run stops after a checkpoint with SystemExit; the worker fails its trial
    and enqueues the retry at once, and the next command runs it under the same job number (run dir)."""
    proc = run([APP, "-m", f"hydra.sweep.dir={tmp_path}", "x=choice(0,1)", "hydra/sweeper/sampler=grid",
                "hydra.sweeper.n_trials=2"], cwd=tmp_path, check=False, env={"SWEEPER_APP_INTERRUPT": "1"})
    assert proc.returncode == 143
    study = load(tmp_path)
    first = study.trials[0]
    assert first.state == TrialState.FAIL
    assert first.user_attrs["error"].endswith("was stopped mid-trial (interrupted: SystemExit 143) and handed it back")
    assert "stopped answering" not in first.user_attrs["error"]  # it was told to stop; it did not go silent
    assert study.trials[1].state == TrialState.WAITING and study.trials[1].user_attrs["retry_of"] == 0
    sweep(tmp_path, "x=choice(0,1)", "hydra/sweeper/sampler=grid", "hydra.sweeper.n_trials=2")
    study = load(tmp_path)
    done = sorted(t.params["x"] for t in study.get_trials(states=(TrialState.COMPLETE,)))
    assert done == [0, 1] and len(counted(study)) == 2
    assert Path(study.trials[1].user_attrs["run_dir"]) == tmp_path / "0"


def test_an_unreachable_storage_fails_before_any_trial(tmp_path):
    url = "postgresql+psycopg://nobody@127.0.0.1:9/none"  # the discard port: nothing listens
    proc = sweep(tmp_path, "x=interval(0,1)", f"hydra.sweeper.storage='{url}'", check=False)
    assert proc.returncode != 0
    assert "hydra.sweeper.storage: cannot open 'postgresql+psycopg://nobody@127.0.0.1:9/none'" in proc.stderr
    assert not (tmp_path / "0").exists()


def test_a_missing_driver_names_the_extra_before_any_trial(tmp_path):
    shadow = tmp_path / "shadow" / "psycopg"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('psycopg is not installed here')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "shadow"), str(ROOT)])}
    from tests.helpers import run

    proc = run([APP, "-m", f"hydra.sweep.dir={tmp_path}", "x=interval(0,1)",
                "hydra.sweeper.storage='postgresql+psycopg://u:secret@db-host/vitsweep'"],
               cwd=tmp_path, check=False, env=env)
    assert proc.returncode != 0
    assert "needs the Python module 'psycopg'" in proc.stderr and "vitsweep[postgres]" in proc.stderr
    assert "secret" not in proc.stderr
    assert not (tmp_path / "0").exists()


def test_journal_storage_runs_two_workers(tmp_path):
    url = f"journal://{tmp_path}/study.log"
    sweep(tmp_path, *GRID, "sleep_s=0.05", "hydra.sweeper.n_workers=2", "hydra.sweeper.n_trials=6",
          f"hydra.sweeper.storage='{url}'")
    from hydra_plugins.vitsweep_sweeper.storage import open_storage

    assert_each_point_once(optuna.load_study(study_name="app", storage=open_storage(url)))


# one launcher batch of the whole grid (as the study files run it): two short trials, two long ones, which seed 3's
# grid order puts at jobs 0 and 3 (not consecutive)
BATCH = ["x=choice(0,1)", "epochs=choice(1,60)", "sleep_s=0.1", "hydra/sweeper/sampler=grid",
         "hydra.sweeper.sampler.seed=3", "hydra.sweeper.n_trials=4", "hydra.sweeper.n_jobs=4",
         "hydra/launcher=vectorized", "hydra.launcher.n_procs=4", *LIVENESS]


def told_while_batch_runs(tmp_path):
    """The finished and running trials once the short jobs of the batch are told and the long ones still run."""
    study = load(tmp_path)
    done = study.get_trials(states=(TrialState.COMPLETE,))
    running = study.get_trials(states=(TrialState.RUNNING,))
    return (done, running) if len(done) == 2 and len(running) == 2 else None


def descendants(pid: int) -> list[int]:
    """The live processes below ``pid`` (children, their children, ...), read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def kill_and_wait_for_orphans(proc: subprocess.Popen) -> None:
    """SIGKILL the sweep's main process (a session's end) and wait until the pool processes it orphaned have seen
    their parent gone and stopped (it took them about a second; the test slept 3 s here)."""
    orphans = descendants(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    try:
        wait_for(lambda: all(gone(p) for p in orphans), timeout=60, what="the orphaned pool processes to stop")
    finally:
        for p in orphans:
            if not gone(p):
                os.kill(p, signal.SIGKILL)


def test_a_batch_tells_each_trial_as_it_ends_and_a_sweep_killed_twice_resumes_in_one_batch(tmp_path):
    """Found in heads_depth: the storage learnt a batch's results only when the whole batch returned,
    so a killed sweep left its finished trials RUNNING; their retries ran one at a time; and a retry killed by a
    second session end used up max_retries and failed the point for good."""
    proc = start(tmp_path, *BATCH)
    done, running = wait_for(lambda: told_while_batch_runs(tmp_path), timeout=120,
                             what="the short trials told while the long ones run", proc=proc)
    assert {t.params["epochs"] for t in done} == {1} and {t.params["epochs"] for t in running} == {60}
    for _ in range(2):  # a session ends (everything killed), twice; the second time while the retries run
        kill_and_wait_for_orphans(proc)
        proc = start(tmp_path, *BATCH)
        owner = f"{socket.gethostname()}:{proc.pid}"
        wait_for(lambda owner=owner: len([t for t in load(tmp_path).get_trials(states=(TrialState.RUNNING,))
                              if t.system_attrs.get(st.WORKER_ATTR) == owner]) == 2, timeout=120,
                 what="the retries running in the new command", proc=proc)
    kill_and_wait_for_orphans(proc)
    out = sweep(tmp_path, *BATCH)  # the same command
    assert "Launching 2 jobs" in out.stdout + out.stderr, "the two retries (jobs 0 and 3) did not run as one batch"
    study = load(tmp_path)
    assert_each_point_once(study, n_points=4)
    assert sorted(t.number for t in done) == sorted(t.number for t in study.get_trials(states=(TrialState.COMPLETE,))
                                                    if t.params["epochs"] == 1), "a finished trial ran again"
    for t in study.get_trials(states=(TrialState.FAIL,)):
        assert t.user_attrs.get("interrupted"), t.user_attrs
        assert [r for r in study.trials if r.user_attrs.get("retry_of") == t.number], f"trial {t.number} not retried"


@pytest.mark.slow  # the suite's time: test_sweep_resume.py's SIGTERM tests check the hand-back by default
def test_sigterm_to_a_sweep_running_a_batch_hands_back_only_the_running_trials(tmp_path):
    proc = start(tmp_path, *BATCH)
    done, running = wait_for(lambda: told_while_batch_runs(tmp_path), timeout=120,
                             what="the short trials told while the long ones run", proc=proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    study = load(tmp_path)
    assert {t.number for t in study.get_trials(states=(TrialState.COMPLETE,))} == {t.number for t in done}
    for t in running:
        assert study.trials[t.number].state == TrialState.FAIL
        assert "interrupted: SystemExit 143" in study.trials[t.number].user_attrs["error"]
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert sorted(t.user_attrs["retry_of"] for t in waiting) == sorted(t.number for t in running)
    sweep(tmp_path, *BATCH)
    assert_each_point_once(load(tmp_path), n_points=4)


def test_a_trial_claimed_without_an_owner_is_retried_instead_of_waited_for(tmp_path):
    """A worker killed between Optuna's ask() and recording itself as the trial's owner left a RUNNING trial no
    reaper would fail: the next command waited for it forever."""
    study, point = first_point_run(tmp_path)
    orphan = claimed(study, point)  # RUNNING, with no vitsweep:worker
    run([APP, "-m", f"hydra.sweep.dir={tmp_path}", *ONE_OF_THREE, "hydra.sweeper.n_trials=3"], cwd=tmp_path,
        timeout=120)
    study = load(tmp_path)
    assert study.trials[orphan.number].state == TrialState.FAIL
    assert sorted(t.params["x"] for t in study.get_trials(states=(TrialState.COMPLETE,))) == [0, 1, 2]


def test_a_retry_left_running_on_another_host_is_retried_again_when_a_command_starts(tmp_path):
    """A session's end is not the trial's fault: a retry that an earlier command left RUNNING (here: on another
    host, so known dead only by its still heartbeat) runs again, though it used up max_retries=1."""
    study, point = first_point_run(tmp_path)
    first = claimed(study, point)  # the point's first run, whose worker died while a sweep went on: retried once
    first.set_user_attr("interrupted", True)
    study.tell(first, state=TrialState.FAIL)
    foreign = claimed(study, point, "gpu-node-7:4242", user_attrs={"retry_of": first.number, "retries": 1})
    sweep(tmp_path, *ONE_OF_THREE, "hydra.sweeper.n_trials=3")
    study = load(tmp_path)
    assert study.trials[foreign.number].state == TrialState.FAIL
    (retry,) = [t for t in study.trials if t.user_attrs.get("retry_of") == foreign.number]
    assert retry.state == TrialState.COMPLETE and retry.params == point and retry.user_attrs["retries"] == 1


def test_a_process_killed_between_failing_a_trial_and_enqueuing_its_retry_is_repaired(tmp_path, monkeypatch):
    """Failing a dead trial and enqueuing its retry are two storage writes. A process killed between them left a
    FAIL that no retry named: every later run of the command ended with "1 of 3 trials failed" and the point was
    never trained again. The next holder of the claim lock now enqueues the retry the dead process had decided."""
    from hydra_plugins.vitsweep_sweeper import _liveness

    study, point = first_point_run(tmp_path)
    foreign = claimed(study, point, "gpu-node-7:4242")
    storage = st.study_storage(study)

    def killed(*args, **kwargs):
        raise SystemExit(137)

    monkeypatch.setattr(storage, "create_new_trial", killed)
    with pytest.raises(SystemExit):
        _liveness.fail_and_retry(study, storage.get_trial(foreign._trial_id), "worker stopped", 0, counted=False)
    monkeypatch.undo()
    assert load(tmp_path).trials[foreign.number].state == TrialState.FAIL  # and no retry names it
    sweep(tmp_path, *ONE_OF_THREE, "hydra.sweeper.n_trials=3")
    study = load(tmp_path)
    (retry,) = [t for t in study.trials if t.user_attrs.get("retry_of") == foreign.number]
    assert retry.state == TrialState.COMPLETE and retry.params == point and retry.user_attrs["retries"] == 0
    assert sorted(t.params["x"] for t in study.get_trials(states=(TrialState.COMPLETE,))) == [0, 1, 2]


@pytest.mark.parametrize("where", ["_init_alembic", "_init_version_info_model"])
def test_two_workers_creating_one_new_storage_at_once_both_open_it(tmp_path, monkeypatch, where):
    """Optuna creates a new storage's tables and version rows unguarded, so of two sweeper workers starting on a
    new SQLite file at once one failed with "UNIQUE constraint failed: alembic_version.version_num" (seen in a CI
    run of the SIGKILL test above). Here the other worker wins the race once: opening must still succeed."""
    import sqlalchemy.exc
    from optuna.storages._rdb import storage as rdb

    from hydra_plugins.vitsweep_sweeper.storage import open_storage

    original = getattr(rdb._VersionManager, where)
    lost = []

    def racing(self):
        if not lost:
            lost.append(1)
            original(self)  # the other worker's insert commits first
            raise sqlalchemy.exc.IntegrityError("INSERT INTO alembic_version ...", {},
                                                Exception("UNIQUE constraint failed: alembic_version.version_num"))
        return original(self)

    monkeypatch.setattr(rdb._VersionManager, where, racing)
    storage = open_storage(f"sqlite:///{tmp_path / 'optuna.db'}")
    assert lost and optuna.create_study(storage=storage, study_name="s").study_name == "s"


def test_a_second_command_on_a_grid_the_first_claimed_whole_says_why_it_waits(tmp_path):
    """A second process on a study whose budget the first process claimed as one batch (hydra.sweeper.n_jobs = the
    grid: the double-descent sweep files do this) gets no trial. It waited in silence (found starting a second
    sweeper for the ViT double descent); it says so now, with the fix, and ends when the first has finished."""
    args = [*GRID, "sleep_s=0.6", "hydra.sweeper.n_trials=6", "hydra.sweeper.n_jobs=6", *LIVENESS]
    first = start(tmp_path, *args)
    wait_for(lambda: load(tmp_path).get_trials(states=(TrialState.RUNNING,)), what="the first batch", proc=first)
    second = sweep(tmp_path, *args)
    first.communicate(timeout=120)
    out = second.stdout + second.stderr
    assert "claimed by other workers" in out and "hydra.sweeper.n_jobs" in out, out[-2000:]
    assert_each_point_once(load(tmp_path))
