"""The vitsweep sweeper on the real hydra-submitit-launcher (`hydra/launcher=submitit_local`): a grid runs each point
once, a TPE study reaches its budget with two workers, the pruner stops trials, a job killed mid-trial is retried
in its run dir from its checkpoint, SIGTERM to the sweep cancels its job and the same command resumes it, and a
launcher setting that would run a trial twice is refused (docs/slurm.md).

Each job is a fresh Python process started by submitit, so a job costs a few seconds; the trials are the tiny task
in tests/sweeper_app."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from optuna.trial import TrialState

from hydra_plugins.vitsweep_sweeper import study as st
from tests.helpers import APP, GRID, LIVENESS, ROOT, assert_each_point_once, counted, gone, load, run, sweep, wait_for

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the [submitit] extra")
LOCAL = ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10"]


@pytest.mark.slow  # the suite's time: the TPE and pruning tests below run batches through submitit; a grid's claim is
# the sweeper's own, checked in test_sweeper_faults.py (two workers, a resumed larger budget)
def test_a_grid_in_batches_runs_each_point_once(tmp_path):
    sweep(tmp_path, *LOCAL, *GRID, "hydra.sweeper.n_jobs=4", "hydra.sweeper.n_trials=6")
    assert_each_point_once(load(tmp_path))
    assert (tmp_path / ".submitit").is_dir()  # the jobs went through submitit
    assert yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())["states"] == {"COMPLETE": 6}


@pytest.mark.slow  # the suite's time (CI 893 s of 900): two workers sharing one study's budget is the sweeper's own
# claim, tested with two workers in test_sweeper_faults.py and test_postgres.py; submitit's batches stay tested by
# the pruning and dead-job tests below
def test_a_tpe_study_with_two_workers_reaches_its_budget(tmp_path):
    proc = sweep(tmp_path, *LOCAL, "x=interval(-2,2)", "y=interval(-2,2)", "hydra.sweeper.n_workers=2",
                 "hydra.sweeper.n_jobs=2", "hydra.sweeper.n_trials=5")
    study = load(tmp_path)
    assert len(counted(study)) == 5 and all(t.state == TrialState.COMPLETE for t in study.trials)
    assert "TPESampler" in proc.stdout + proc.stderr
    owners = {t.system_attrs[st.WORKER_ATTR].rpartition(":")[2] for t in study.trials}
    assert len(owners) == 2, "both workers launched batches"
    for t in study.trials:  # each trial ran in its own job, under its job number, and reported every epoch
        assert Path(t.user_attrs["run_dir"]) == tmp_path / str(t.number)
        assert len(t.intermediate_values) == 3


def test_pruning_stops_bad_trials_in_submitit_jobs(tmp_path):
    sweep(tmp_path, *LOCAL, "x=choice(0,1)", "bad=choice(true,false)", "y=choice(0,1)", "epochs=4",
          "hydra/sweeper/sampler=grid", "hydra.sweeper.sampler.seed=0", "hydra.sweeper.n_jobs=4",
          "hydra/sweeper/pruner=median", "hydra.sweeper.pruner.n_startup_trials=2", "hydra.sweeper.n_trials=8")
    study = load(tmp_path)
    pruned = study.get_trials(states=(TrialState.PRUNED,))
    assert len(study.trials) == 8 and pruned, [(t.params, t.state) for t in study.trials]
    for t in pruned:
        assert t.params["bad"]
        summary = json.loads((Path(t.user_attrs["run_dir"]) / "summary.json").read_text())
        assert summary["stop_reason"] == "pruned" and summary["trial_number"] == t.number


def _job_task(tmp_path):
    """The pid of the task process of a live submitit_local job of the sweep in tmp_path (the job id is the pid
    of submitit's controller, whose child runs the task)."""
    jobs = {int(d.name) for d in (tmp_path / ".submitit").glob("[0-9]*")}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[1])
            if ppid in jobs and b"submitit" in Path(f"/proc/{entry}/cmdline").read_bytes() and not gone(int(entry)):
                return int(entry)
        except (OSError, ValueError, IndexError):
            pass
    return None


def _start_resumable_sweep(tmp_path, epochs: int) -> subprocess.Popen:
    """A 2-trial submitit_local study of the app, whose jobs resume from their metrics file (its checkpoint)."""
    if not os.path.isdir("/proc/self"):
        pytest.skip("finds the job's process through /proc (Linux)")
    args = [APP, "-m", f"hydra.sweep.dir={tmp_path}", *LOCAL, "x=interval(-2,2)", f"epochs={epochs}", "sleep_s=1",
            "hydra.sweeper.n_trials=2", *LIVENESS]
    return subprocess.Popen([sys.executable, *map(str, args)], cwd=tmp_path, env=_resume_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _resume_env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "SWEEPER_APP_RESUME": "1"}


@pytest.mark.faults
@pytest.mark.slow  # the suite's time: the vectorized launcher's twin is in the default suite (test_sweep_resume.py)
def test_a_job_killed_mid_trial_is_retried_in_its_run_dir_from_its_checkpoint(tmp_path):
    proc = _start_resumable_sweep(tmp_path, epochs=4)
    try:
        victim = wait_for(lambda: next((t for t in load(tmp_path).get_trials(states=(TrialState.RUNNING,))
                                        if len(t.intermediate_values) >= 2), None), what="a trial two epochs in",
                          proc=proc)
        os.kill(wait_for(lambda: _job_task(tmp_path), what="its submitit task"), signal.SIGKILL)
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert "ended without a result" in out and "retried as trial" in out, out[-3000:]
    study = load(tmp_path)
    assert len(counted(study)) == 2, "the budget counts the retry, not the killed trial"
    dead = study.trials[victim.number]
    assert dead.state == TrialState.FAIL and "ended without a result" in dead.user_attrs["error"]
    (retry,) = [t for t in study.trials if t.user_attrs.get("retry_of") == victim.number]
    assert retry.state == TrialState.COMPLETE and retry.params == dead.params and retry.user_attrs["retries"] == 1
    run_dir = tmp_path / str(victim.number)
    assert Path(retry.user_attrs["run_dir"]) == run_dir  # the killed job's run dir
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trial_number"] == retry.number and summary["resumed_from_epoch"] >= 2  # from its checkpoint
    epochs = [json.loads(line)["epoch"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [0, 1, 2, 3], "one curve, no epoch run twice"
    assert sorted(retry.intermediate_values) == [0, 1, 2, 3]
    results = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    assert results["states"] == {"COMPLETE": 2}  # an interrupted trial is listed as retried, not as a state
    assert [r["retry_of"] for r in results["retried"]] == [victim.number]


def test_several_tasks_per_trial_are_refused_before_any_trial(tmp_path):
    proc = sweep(tmp_path, *LOCAL, "x=choice(0,1)", "hydra.launcher.tasks_per_node=2", check=False)
    assert proc.returncode != 0
    err = proc.stdout + proc.stderr
    assert "hydra.launcher.tasks_per_node=2" in err and "would run each trial's job 2 times" in err, err[-2000:]
    assert not (tmp_path / ".submitit").exists()


def test_a_launcher_key_submitit_does_not_take_is_refused_before_any_trial(tmp_path):
    """A key added to hydra.launcher (`+hydra.launcher.cpus_per_gpu=1` under submitit_local, which has no such
    setting) was refused by submitit only when the first batch was submitted: the sweep had claimed a trial by then
    and died with it RUNNING in the study. It is refused now with the launcher's other checks, before any trial."""
    proc = sweep(tmp_path, *LOCAL, "x=choice(0,1)", "+hydra.launcher.cpus_per_gpu=1", check=False)
    assert proc.returncode != 0
    err = proc.stdout + proc.stderr
    assert "hydra.launcher.cpus_per_gpu" in err and "submitit_local" in err, err[-2000:]
    assert not (tmp_path / "optuna.db").exists() or not load(tmp_path).trials


@pytest.mark.parametrize("extra", [{"ntasks_per_node": 2}, {"additional_parameters": {"ntasks-per-node": 2}},
                                   {"additional_parameters": {"nodes": 2}}])
def test_several_tasks_per_trial_in_slurm_s_own_words_are_refused(tmp_path, extra):
    """`+hydra.launcher.ntasks_per_node=2` (SLURM's name, which submitit lets win over tasks_per_node) or sbatch's
    own options in additional_parameters ran each trial's job twice in one run dir, past the check that refuses
    tasks_per_node=2 (docs/slurm.md: "must stay 1: refused otherwise")."""
    from hydra_plugins.vitsweep_sweeper._submitit import check

    with pytest.raises(ValueError, match="would run each trial's job 2 times"):
        check(_Launcher("slurm", tmp_path / "%j", **extra))


def test_only_slurm_jobs_keep_this_machines_cores_and_gpus_unshared():
    """Under submitit_slurm the sweeper's workers set no OMP_NUM_THREADS, CUDA_VISIBLE_DEVICES or pinning: sbatch
    would export them into the jobs, which get their own resources from SLURM."""
    from omegaconf import OmegaConf

    from hydra_plugins.vitsweep_sweeper import _submitit

    def cfg(target):
        return OmegaConf.create({"hydra": {"launcher": {"_target_": target}}})
    prefix = "hydra_plugins.hydra_submitit_launcher.submitit_launcher."
    assert _submitit.is_remote(cfg(prefix + "SlurmLauncher"))
    assert not _submitit.is_remote(cfg(prefix + "LocalLauncher"))
    assert not _submitit.is_remote(cfg("hydra._internal.core_plugins.basic_launcher.BasicLauncher"))


@pytest.mark.faults
def test_sigterm_to_the_sweep_cancels_its_jobs_and_the_same_command_resumes_them(tmp_path):
    proc = _start_resumable_sweep(tmp_path, epochs=5)
    try:
        victim = wait_for(lambda: next((t for t in load(tmp_path).get_trials(states=(TrialState.RUNNING,))
                                        if t.intermediate_values), None), what="a trial one epoch in",
                          proc=proc)
        task = wait_for(lambda: _job_task(tmp_path), what="its submitit task")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, out[-3000:]
    wait_for(lambda: gone(task), timeout=30, what="the cancelled job to end")
    stopped = load(tmp_path).trials[victim.number]
    assert stopped.state == TrialState.FAIL and "interrupted" in stopped.user_attrs["error"]
    proc = subprocess.run(proc.args, cwd=tmp_path, env=_resume_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    study = load(tmp_path)
    (retry,) = [t for t in study.trials if t.user_attrs.get("retry_of") == victim.number]
    assert retry.state == TrialState.COMPLETE and retry.params == stopped.params and retry.user_attrs["retries"] == 0
    run_dir = tmp_path / str(victim.number)
    assert Path(retry.user_attrs["run_dir"]) == run_dir
    epochs = [json.loads(line)["epoch"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [0, 1, 2, 3, 4] and json.loads((run_dir / "summary.json").read_text())["resumed_from_epoch"] >= 1
    assert len(counted(study)) == 2


class _Done:
    """A finished submitit job whose task returned ``ret`` (the fields `_result` reads)."""

    def __init__(self, ret):
        self.ret, self.job_id, self.state = ret, "123", "COMPLETED"
        self.paths = type("Paths", (), {"stdout": "123_0_log.out"})()

    def results(self):
        return [self.ret]


def test_a_time_out_that_submitit_did_not_requeue_is_a_job_that_died_and_is_retried():
    """Past max_num_timeout submitit's time-out handler raises UncompletedJobError inside the task, and Hydra's
    run_job returns it as a failed JobReturn, which submitit pickles as the job's result: the sweeper failed the trial
    for good, where docs/slurm.md promises a retry from its checkpoint (reproduced with submitit_local,
    timeout_min=1, max_num_timeout=0: `Done: {'FAIL': 1}; 0 retried`). It is a JobDied now; other failures stay."""
    from hydra.core.utils import JobReturn, JobStatus
    from submitit.core.utils import UncompletedJobError

    from hydra_plugins.vitsweep_sweeper._submitit import JobDied, SubmititBatches

    def failed(exc):
        ret = JobReturn()
        ret.status, ret.return_value = JobStatus.FAILED, exc
        ret.hydra_cfg, ret.working_dir = {"hydra": {"runtime": {"output_dir": "/sweep/7"}}}, "/sweep/7"
        return ret

    timed_out = SubmititBatches._result(None, _Done(failed(UncompletedJobError("timed-out too many times"))), 7)
    assert isinstance(timed_out._return_value, JobDied) and "not requeued" in str(timed_out._return_value)
    assert timed_out.working_dir == "/sweep/7" and timed_out.hydra_cfg is not None  # the trial keeps its run dir
    error = SubmititBatches._result(None, _Done(failed(ValueError("a bug in the task"))), 7)
    assert isinstance(error._return_value, ValueError)  # the task's own error fails its trial, as before


class _Launcher:
    """The fields of a hydra-submitit-launcher launcher that `SubmititBatches._executor` reads."""

    def __init__(self, kind, folder, **params):
        self._EXECUTOR = kind
        self.params = {"submitit_folder": str(folder), "timeout_min": 5, "tasks_per_node": 1, "nodes": 1, **params}


def test_submitit_local_jobs_train_on_the_gpus_this_process_was_given(tmp_path, monkeypatch):
    """submitit's LocalExecutor sets each job's CUDA_VISIBLE_DEVICES to 0..gpus_per_node-1 whatever this process's
    own: a sweeper worker given GPU 1 (docs/slurm.md: under submitit_local "each worker's jobs inherit its share")
    had its jobs train on GPU 0, beside the other worker's. The jobs now take their GPUs from this process's."""
    from hydra_plugins.vitsweep_sweeper._submitit import SubmititBatches

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    executor = SubmititBatches(_Launcher("local", tmp_path / "%j", gpus_per_node=1))._executor()
    assert executor.submit(os.getenv, "CUDA_VISIBLE_DEVICES").result() == "1"  # os.getenv: pickled by name
    with pytest.raises(ValueError, match="gpus_per_node=3, but this process has 2 GPU"):  # before any trial
        SubmititBatches(_Launcher("local", tmp_path / "%j", gpus_per_node=3))


REUSED_PID = '''
import os, runpy, sys, time
import cloudpickle
import submitit.local.local as local
from hydra.core.utils import JobReturn, JobStatus
from submitit.core.utils import JobPaths

start = local.start_controller


def reused_pid(folder, *args, **kwargs):
    """A controller whose pid an earlier submitit_local job had: that job's result is in the pid's folder."""
    process = start(folder, *args, **kwargs)
    stale = JobReturn()
    stale.status, stale.return_value = JobStatus.COMPLETED, -123.0
    path = JobPaths(folder, job_id=str(process.pid), task_id=0).result_pickle
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        cloudpickle.dump(("success", stale), fh)
    os.utime(path, (time.time() - 86400,) * 2)  # written a day ago
    return process


local.start_controller = reused_pid
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def test_a_local_job_that_died_is_not_told_the_result_an_earlier_job_with_its_pid_left(tmp_path):
    """A submitit_local job's id is its controller's pid, and its files go to `.submitit/<pid>/`; submitit neither
    clears that folder nor tells a dead job from one that left a result there. A job that died without a result (here
    a run stopped by SIGTERM) in a folder where an earlier job of the sweep dir with the same pid (pids wrap at
    pid_max, and restart at each boot, while a sweep dir is resumed for days) left its result was told that old
    result: the trial was COMPLETE with another trial's value and no retry. Stale results are moved aside at
    submission (kept, not deleted)."""
    driver = tmp_path / "reused_pid.py"
    driver.write_text(REUSED_PID)
    args = [driver, APP, "-m", f"hydra.sweep.dir={tmp_path}", *LOCAL, "x=choice(1)", "hydra.sweeper.n_trials=1",
            "hydra.sweeper.max_retries=0", "hydra.sweeper.max_failure_rate=1.0"]
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=tmp_path, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "SWEEPER_APP_INTERRUPT": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (trial,) = load(tmp_path).trials
    assert trial.state == TrialState.FAIL and trial.values is None, (trial.state, trial.values)
    assert "ended without a result" in trial.user_attrs["error"]
    assert len(list((tmp_path / ".submitit").glob("*/*_result.pkl.stale-*"))) == 1  # the old result, moved aside


def test_a_job_whose_result_cannot_be_loaded_fails_its_trial_and_is_not_retried(tmp_path):
    """A task whose exception does not unpickle leaves a result the sweeper cannot load: it was read as a job that died
    and the same failing job ran again (`retried as trial 1`, `1 retried, 1 failed`, the error not in the trial's
    record). Its trial fails with the error, as a task's own exception does, and is not retried."""
    proc = run([APP, "-m", f"hydra.sweep.dir={tmp_path}", *LOCAL, "x=choice(1)", "fail=true",
                "hydra.sweeper.n_trials=1", "hydra.sweeper.max_failure_rate=1.0"], cwd=tmp_path,
               env={"SWEEPER_APP_UNPICKLABLE": "1"})
    out = proc.stdout + proc.stderr
    (trial,) = load(tmp_path).trials
    assert trial.state == TrialState.FAIL and "retried as trial" not in out, out[-3000:]
    assert "TwoArgumentError" in trial.user_attrs["error"] and not trial.user_attrs.get("interrupted")
    assert (tmp_path / "0" / "attempts").read_text() == "1", "the job ran once"


def test_a_task_that_calls_sys_exit_fails_its_trial_with_its_exit_code_and_is_not_retried(tmp_path):
    """A task's own sys.exit(n) (n not 128 + a signal's number, a stop's code) left no result, as a killed job does:
    its trial was failed as interrupted and the same job ran again (submitit's state, FINISHED, is a stopped run's
    too). Found by exiting a task with code 3. The job now returns its exit as the task's error: its trial fails
    naming the code, and is not retried."""
    proc = run([APP, "-m", f"hydra.sweep.dir={tmp_path}", *LOCAL, "x=choice(1)", "hydra.sweeper.n_trials=1",
                "hydra.sweeper.max_failure_rate=1.0"], cwd=tmp_path, env={"SWEEPER_APP_EXIT": "3"})
    out = proc.stdout + proc.stderr
    (trial,) = load(tmp_path).trials
    assert trial.state == TrialState.FAIL and "retried as trial" not in out, out[-3000:]
    assert "sys.exit(3)" in trial.user_attrs["error"] and not trial.user_attrs.get("interrupted")
    assert (tmp_path / "0" / "attempts").read_text() == "1", "the job ran once"


def test_a_stop_s_exit_and_submitit_s_own_exit_still_leave_the_job_without_a_result():
    """Only a task's own exit is returned: a stopped run's SystemExit(128 + signal) and the exit of submitit's requeue
    (raised by its signal handler inside the task's frames: -1 on SLURM) still end the job without a result."""
    import types

    from hydra_plugins.vitsweep_sweeper._submitit import ExitAsResult, JobError

    def exits(code):
        def task(*args):
            raise SystemExit(code)
        return task

    submitit_code = types.ModuleType("submitit.core.job_environment")  # where submitit's requeue exits
    exec("def _exit(*args):\n    raise SystemExit(-1)", submitit_code.__dict__)
    for launcher in (exits(143), exits(130), submitit_code._exit):
        with pytest.raises(SystemExit):
            ExitAsResult(launcher)()
    ret = ExitAsResult(exits(1))()
    assert isinstance(ret._return_value, JobError) and "sys.exit(1)" in str(ret._return_value)
    assert ExitAsResult(exits(1)).checkpoint("a").function.launcher is not None  # a requeue resubmits the wrapper


class _Raised(_Done):
    """A finished submitit job whose `results()` raises ``exc`` (what submitit raises for its outcome)."""

    def __init__(self, exc):
        super().__init__(None)
        self.exc = exc
        self.paths.stderr = "123_0_log.err"

    def results(self):
        raise self.exc


def _trace(last: str) -> str:
    """submitit's FailedJobError message around a traceback whose exception lines are ``last``."""
    return ("Job (task=0) failed during processing with trace:\n----------------------\nTraceback (most recent call "
            f"last):\n  File \"x.py\", line 1, in f\n    g()\n{last}\n\n----------------------\nYou can check full "
            "logs with 'job.stderr(0)' and 'job.stdout(0)'or at paths:\n  - 123_0_log.err\n  - 123_0_log.out")


def test_only_a_job_that_left_no_result_or_was_stopped_by_submitit_is_retried():
    """A job with no result (killed, preempted, out of memory) or stopped by submitit's time-out handler is a
    JobDied (retried); one that raised, or whose result this process cannot read (an exception of the task that does
    not unpickle), is a failed return naming the error, which fails its trial for good, as under the basic launcher."""
    from submitit.core.utils import FailedJobError, UncompletedJobError

    from hydra_plugins.vitsweep_sweeper._submitit import JobDied, SubmititBatches

    def value(exc):
        return SubmititBatches._result(None, _Raised(exc), 7)._return_value

    assert isinstance(value(UncompletedJobError("Job 123 has not produced any output (state: FINISHED)")), JobDied)
    timed_out = "submitit.core.utils.UncompletedJobError: Job not requeued because: timed-out too many times."
    assert isinstance(value(FailedJobError(_trace(timed_out))), JobDied)
    raised = value(FailedJobError(_trace("hydra.errors.ConfigCompositionException: Could not override 'zz'.\n"
                                         "To append to your config use +zz=1")))
    assert not isinstance(raised, JobDied)
    assert str(raised).startswith("hydra.errors.ConfigCompositionException: Could not override 'zz'.\nTo append")
    assert "submitit job 123 (Hydra job #7)" in str(raised) and "123_0_log.err" in str(raised)
    unreadable = value(TypeError("KeyError2.__init__() missing 1 required positional argument: 'why'"))
    assert not isinstance(unreadable, JobDied) and "missing 1 required positional argument" in str(unreadable)


try:  # a site's own launchers, as a cluster's users write them: submitit's, with their defaults, under their module
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher, SlurmLauncher

    class SiteSlurmLauncher(SlurmLauncher):
        pass

    class SiteLocalLauncher(LocalLauncher):
        pass
except ImportError:  # the [submitit] extra is missing: the module is skipped above
    pass


def test_a_subclass_of_submitit_s_slurm_launcher_is_remote_wherever_it_lives():
    """Whether the jobs run on other machines was read from the spelling of hydra.launcher._target_ (submitit's
    module, a name not ending in .LocalLauncher): a site's subclass of SlurmLauncher under its own module was taken
    for a local launcher, so the workers set OMP_NUM_THREADS and MKL_NUM_THREADS to their share of this machine's
    cores (and CUDA_VISIBLE_DEVICES to one of its GPUs), which sbatch exports into every SLURM job. It is read from
    the launcher's class now."""
    from omegaconf import OmegaConf

    from hydra_plugins.vitsweep_sweeper import _submitit

    def cfg(target):
        return OmegaConf.create({"hydra": {"launcher": {"_target_": target}}})
    assert _submitit.is_remote(cfg(f"{__name__}.SiteSlurmLauncher"))
    assert not _submitit.is_remote(cfg(f"{__name__}.SiteLocalLauncher"))
    assert not _submitit.is_remote(cfg("hydra_plugins.vitsweep_launcher.launcher.VectorizedLauncher"))


def test_a_task_s_own_failed_submitit_job_fails_its_trial_and_is_not_retried():
    """Only submitit's time-out handler's UncompletedJobError, raised inside the task, is a job that died; a
    FailedJobError (its subclass) that the task raised itself (a job it submitted failed) is the task's own error."""
    from hydra.core.utils import JobReturn, JobStatus
    from submitit.core.utils import FailedJobError

    from hydra_plugins.vitsweep_sweeper._submitit import JobDied, SubmititBatches

    ret = JobReturn()
    ret.status, ret.return_value = JobStatus.FAILED, FailedJobError("Job (task=0) failed during processing")
    assert isinstance(SubmititBatches._result(None, _Done(ret), 7)._return_value, FailedJobError)
    assert not isinstance(SubmititBatches._result(None, _Done(ret), 7)._return_value, JobDied)


def test_a_trial_whose_overrides_do_not_compose_fails_before_its_job_is_submitted(tmp_path):
    """Hydra's sweepers compose each job of a batch before the launch (`validate_batch_is_legal`): "this repeats work
    the launcher will do, but as the launcher may be performing this in a different process/machine it's important to
    do it here as well to detect failures early". The sweeper did not, so on SLURM a trial whose overrides Hydra
    cannot compose waited in the queue for a job that failed at its start. It fails now without a job."""
    sweep(tmp_path, *LOCAL, "x=choice(1)", "zz=choice(1)", "hydra.sweeper.n_trials=1",
          "hydra.sweeper.max_failure_rate=1.0")
    (trial,) = load(tmp_path).trials
    assert trial.state == TrialState.FAIL and "Could not override 'zz'" in trial.user_attrs["error"]
    assert not list((tmp_path / ".submitit").glob("*/*.pkl")), "no job was submitted"


def test_a_batch_with_one_job_that_does_not_compose_submits_and_reports_the_others_under_their_numbers():
    """The job that does not compose fails alone, first; the others are submitted and told under their own job
    numbers (a retry's number need not follow its batch's first)."""
    from hydra.core.utils import JobReturn, JobStatus
    from omegaconf import OmegaConf

    from hydra_plugins.vitsweep_sweeper._submitit import JobError, SubmititBatches

    good = JobReturn()
    good.status, good.return_value = JobStatus.COMPLETED, 1.5

    class Job(_Done):
        def done(self):
            return True

    class Executor:
        def map_array(self, fn, overrides, *rest):
            assert list(overrides) == [["x=2"]], "only the job that composes is submitted"
            return [Job(good)]

    class Loader:
        def load_sweep_config(self, config, overrides):
            if overrides == ["zz=1"]:
                raise ValueError("Could not override 'zz'")

    batches = SubmititBatches.__new__(SubmititBatches)
    batches.launcher = type("L", (), {"config": OmegaConf.create({"hydra": {"sweep": {"dir": "/sweep"}}}),
                                      "_EXECUTOR": "slurm",
                                      "hydra_context": type("C", (), {"config_loader": Loader()})()})()
    batches.poll_s, batches.job_numbers, told = 0.0, [9, 4], []
    batches.on_job_done = lambda n, ret: told.append((n, ret))
    batches._executor = Executor
    bad, ok = batches.launch([["zz=1"], ["x=2"]], initial_job_idx=9)
    assert isinstance(bad._return_value, JobError) and "Could not override 'zz'" in str(bad._return_value)
    assert ok is good and [(n, r.status) for n, r in told] == [(9, JobStatus.FAILED), (4, JobStatus.COMPLETED)]
