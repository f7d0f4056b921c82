"""`hydra/launcher=vectorized`: worker processes behind Hydra's basic sweeper and the vitsweep sweeper."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from optuna.trial import TrialState

from hydra_plugins.vitsweep_launcher.launcher import VectorizedLauncher
from tests.conftest import ROOT, TINY
from tests.helpers import (
    APP,
    load,
    run,
    run_cli,
)

LAUNCH = ["hydra/launcher=vectorized", "hydra.launcher.n_procs=2"]


def app(tmp_path, *overrides, check=True):
    return run([APP, "-m", f"hydra.sweep.dir={tmp_path}", *LAUNCH, *overrides], cwd=tmp_path, check=check)


@pytest.mark.parametrize("kwargs, key", [({"n_procs": 0}, "hydra.launcher.n_procs=0"),
                                         ({"max_members": 0}, "hydra.launcher.max_members=0"),
                                         ({"stack": "sometimes"}, "hydra.launcher.stack='sometimes'"),
                                         ({"start_method": "fork"}, "hydra.launcher.start_method='fork'")])
def test_bad_keys_fail_naming_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key.replace("[", r"\[")):
        VectorizedLauncher(**kwargs)


def test_bad_key_stops_the_multirun_before_any_job(tmp_path):
    done = app(tmp_path, "hydra/sweeper=basic", "x=1,2", "hydra.launcher.stack=sometimes", check=False)
    assert done.returncode != 0 and "hydra.launcher.stack='sometimes' must be one of auto, always, never" \
        in done.stderr
    assert not (tmp_path / "0").exists()


def test_basic_sweeper_gets_returns_in_job_order_and_a_failed_job_raises(tmp_path):
    """A failing job fails the multirun like the basic launcher does; the other jobs still ran, each
    in its own run dir, and every finished run got one line."""
    done = app(tmp_path, "hydra/sweeper=basic", "x=1,2,3", "fail=false,true", "hydra.launcher.n_procs=8",
               check=False)
    assert done.returncode != 0 and "planted failure" in done.stderr
    assert "Launching 6 jobs on 6 worker process(es)" in done.stdout  # n_procs=8, cut to the jobs
    lines = [line for line in done.stdout.splitlines() if "] #" in line and "(worker " in line]
    assert len(lines) == 6, done.stdout[-3000:]
    assert sum("FAILED RuntimeError: planted failure" in line for line in lines) == 3
    for k in range(6):
        overrides = (tmp_path / str(k) / ".hydra" / "overrides.yaml").read_text()
        assert f"x={k // 2 + 1}" in overrides and f"fail={'True' if k % 2 else 'False'}" in overrides
        assert (tmp_path / str(k) / "summary.json").is_file() == (k % 2 == 0)
    # the pool starts a worker for each job it cannot hand to an idle one: a job this short may end before the
    # last submit, and its worker takes the next (CI, loaded: 5 workers for 6 jobs). Each line names a worker
    # that has its own log, and no more than 6 started
    logs = {p.name for p in (tmp_path / ".launcher").glob("worker-*.log")}
    named = {"worker-" + line.split("(worker ")[1].split(")")[0] + ".log" for line in lines}
    assert named <= logs and logs <= {f"worker-{k}.log" for k in range(6)}, (named, logs)


def test_more_processes_than_jobs_uses_fewer(tmp_path):
    done = app(tmp_path, "hydra/sweeper=basic", "x=1,2", "hydra.launcher.n_procs=8")
    assert "Launching 2 jobs on 2 worker process(es)" in done.stdout
    assert [json.loads((tmp_path / k / "summary.json").read_text())["objective"] for k in "01"] == [1.0, 4.0]


def test_vitsweep_sweeper_trials_prune_and_fail_through_the_pool(tmp_path):
    """n_jobs trials at a time; a TrialPruned raised in a worker reaches Optuna as PRUNED and a planted
    failure as FAIL, as with the basic launcher."""
    app(tmp_path, "x=choice(0,1)", "bad=choice(true,false)", "y=choice(0,1)", "epochs=4",
        "hydra/sweeper/sampler=grid", "hydra.sweeper.sampler.seed=0", "hydra.sweeper.n_jobs=4",
        "hydra/sweeper/pruner=median", "hydra.sweeper.pruner.n_startup_trials=2", "hydra.sweeper.n_trials=8")
    study = load(tmp_path)
    states = [t.state for t in study.trials]
    assert len(states) == 8 and TrialState.PRUNED in states, states
    for t in study.trials:
        if t.state == TrialState.COMPLETE:
            assert t.value == t.params["x"] ** 2 + t.params["y"] ** 2 + (100.0 if t.params["bad"] else 0.0)
    failed = tmp_path / "failed"
    failed.mkdir()
    app(failed, "x=choice(0,1)", "fail=true", "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=2",
        "hydra.sweeper.max_failure_rate=1.0")
    assert [t.state for t in load(failed).trials] == [TrialState.FAIL] * 2
    assert "planted failure" in load(failed).trials[0].user_attrs["error"]


def test_training_grid_matches_the_basic_launcher(tmp_path):
    """The same 4-run grid through both launchers: identical results, run by run."""
    grid = ["model=cnn", "model.width=1,2", "seed=0,1", *[o for o in TINY if not o.startswith("model.")]]
    results = {}
    for name, launcher in (("basic", []), ("vectorized", LAUNCH)):
        out = tmp_path / name
        done = run_cli("-m", *grid, *launcher, f"hydra.sweep.dir={out}")
        assert done.returncode == 0, done.stderr[-3000:]
        results[name] = [json.loads((out / str(k) / "summary.json").read_text()) for k in range(4)]
    for a, b in zip(results["basic"], results["vectorized"], strict=True):
        assert (a["test_error"], a["train_loss"], a["params"]) == (b["test_error"], b["train_loss"], b["params"])


def test_stacked_trials_each_know_their_own_trial(tmp_path):
    """Two trials trained as one stacked model in one process: each member's summary names its own trial (from its
    Hydra config, not the process environment) and each trial gets its own pruning reports."""
    grid = ["model=cnn", "model.width=2", *[o for o in TINY if not o.startswith("model.")], "trainer.max_epochs=2"]
    done = run_cli("-m", *grid, "seed=choice(0,1)", "hydra/sweeper=vitsweep", "hydra/sweeper/sampler=grid",
                   "hydra.sweeper.n_jobs=2", "hydra.sweeper.study_name=s", "hydra/launcher=vectorized",
                   "hydra.launcher.stack=always", f"hydra.sweep.dir={tmp_path}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "stacked in 1 group(s)" in done.stdout + done.stderr
    import optuna

    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/optuna.db")
    assert len(study.trials) == 2
    for t in study.trials:
        summary = json.loads((tmp_path / str(t.number) / "summary.json").read_text())
        assert (summary["study_name"], summary["trial_number"], summary["seed"]) == ("s", t.number, t.params["seed"])
        epochs = [json.loads(line)["epoch"] for line in (tmp_path / str(t.number) / "metrics.jsonl").open()]
        assert t.intermediate_values and set(t.intermediate_values) <= set(epochs)  # this member's own reports


def test_stack_auto_groups_members_on_cuda_only():
    """`auto` stacks where it pays (CUDA), not on CPU, where it measured no faster than processes."""
    from hydra_plugins.vitsweep_launcher.units import plan_units
    from tests.conftest import compose_cfg

    cfgs = [compose_cfg(["model=cnn", f"seed={s}"]) for s in (0, 1, 2)]
    s = "src.stacked"  # vitsweep's stacker, as src/train.py declares it
    assert plan_units(cfgs, "auto", 16, "cpu", s) == [[0], [1], [2]]
    assert plan_units(cfgs, "auto", 16, "cuda", s) == [[0, 1, 2]] == plan_units(cfgs, "always", 16, "cpu", s)
    assert plan_units(cfgs, "never", 16, "cuda", s) == [[0], [1], [2]] == plan_units(cfgs, "always", 1, "cuda", s)
    assert plan_units(cfgs, "auto", 16, "cuda", None) == [[0], [1], [2]]  # an app with no stacked training
    with pytest.raises(ValueError, match="declares no stacked training"):
        plan_units(cfgs, "always", 16, "cuda", None)


@pytest.mark.parametrize("n_procs", [pytest.param(1, marks=pytest.mark.slow), 2])  # the suite's time: the
# default suite keeps the case where a surviving worker must go on
def test_a_worker_that_dies_fails_its_jobs_with_a_clear_error(tmp_path, n_procs):
    """A job that kills its worker process (as the kernel's OOM killer would) fails, naming the cause; the
    jobs the dead worker took with it run again, so only the killer fails."""
    (tmp_path / "app.py").write_text(
        "import os\nimport hydra\n\n\n@hydra.main(version_base='1.3', config_path=None)\n"
        "def main(cfg):\n    if cfg.x == 2:\n        os._exit(3)\n    return cfg.x\n\n\n"
        "if __name__ == '__main__':\n    main()\n")
    done = run([tmp_path / "app.py", "-m", "+x=2,1,3", *LAUNCH, f"hydra.launcher.n_procs={n_procs}",
                f"hydra.sweep.dir={tmp_path / 'out'}"], cwd=tmp_path, check=False)
    assert done.returncode != 0 and "worker process died" in done.stderr
    lines = sorted(line.split("] ", 2)[2] for line in done.stdout.splitlines() if "(worker " in line)
    assert len(lines) == 3 and lines[0].startswith("#0 FAILED RuntimeError: worker process died"), lines
    assert lines[1].startswith("#1 returned 1 ") and lines[2].startswith("#2 returned 3 "), lines


def test_sweeper_workers_split_the_cores_between_their_pools(tmp_path):
    """n_workers sweeper processes each get their share of the cores (CPU affinity), and the launcher in
    each sizes its pool and threads by that share: the machine is not oversubscribed n_workers times."""
    import os

    share = max(1, len(os.sched_getaffinity(0)) // 2)
    app(tmp_path, "hydra.launcher.n_procs=null", "x=choice(0,1,2,3)", "hydra/sweeper/sampler=grid",
        "hydra.sweeper.n_workers=2", "hydra.sweeper.n_jobs=2", "hydra.sweeper.n_trials=4")
    for log in sorted((tmp_path / "workers").glob("worker-*.log")):
        text = log.read_text()
        assert f"on {share} worker process(es) (1 torch thread(s) each)" in text, text[-2000:]


@pytest.mark.faults
@pytest.mark.parametrize("stack", ["never", "always"])
def test_killing_the_launching_process_stops_its_workers_after_they_save(tmp_path, stack):
    """SIGKILL of the multirun's main process (no chance to clean up): its workers notice within seconds,
    every running run (alone or stacked) writes its checkpoint and an `interrupted` summary and the
    workers exit, instead of training on as orphans that a rerun would race for the same run dirs."""
    import os
    import signal
    import time

    from tests.helpers import gone, wait_for

    cnn = ["model=cnn", "model.width=2", *[o for o in TINY if not o.startswith(("model.", "trainer.checkpoint"))]]
    proc = subprocess.Popen([sys.executable, "-m", "src.train", "-m", *cnn, "seed=0,1", "trainer.max_epochs=100000",
                             "hydra/launcher=vectorized", "hydra.launcher.n_procs=1", f"hydra.launcher.stack={stack}",
                             f"hydra.sweep.dir={tmp_path}"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    log = tmp_path / ".launcher" / "worker-0.log"
    wait_for(lambda: (tmp_path / "0" / "checkpoint.pt").is_file(), timeout=120, what="a first checkpoint")
    pid = int(log.read_text().split("(pid ", 1)[1].split(")", 1)[0])
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    start = time.monotonic()
    try:
        wait_for(lambda: gone(pid), timeout=60, what="the orphaned worker to stop")
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)
    print(f"stack={stack}: worker gone {time.monotonic() - start:.1f} s after its parent was killed")
    running = [0] if stack == "never" else [0, 1]  # one process: alone, only job 0 had started
    for k in running:
        summary = json.loads((tmp_path / str(k) / "summary.json").read_text())
        assert summary["stop_reason"] == "interrupted" and summary["epochs"] < 100000, summary
    assert "is gone: stopping this worker" in log.read_text()


@pytest.mark.faults
@pytest.mark.parametrize("gpus, mark", [([], b"forkserver"), (["0"], b"spawn_main")], ids=["cpu-forkserver", "spawn"])
def test_a_worker_whose_launching_process_died_while_it_started_stops(tmp_path, gpus, mark):
    """Found by CI: a pool worker still starting (spawn: importing) when its launching process was
    killed took the process it was re-parented to for its parent, so it never saw its parent gone and lived on
    as an orphan (holding the sweep's output pipe: the killed sweep's caller waited for ever). A CPU pool's
    workers fork from a fork server: it, and they, must end too."""
    import multiprocessing as mp

    from tests.helpers import run_marked, wait_until_gone

    if mark == b"forkserver" and "forkserver" not in mp.get_all_start_methods():
        pytest.skip("no forkserver start method on this platform")
    marked = run_marked("import os, types\n"
                        "from hydra_plugins.vitsweep_launcher import pool\n"
                        "launcher = types.SimpleNamespace(hydra_context=None, task_function=print, pool=None)\n"
                        f"ex = pool._pool(launcher, 1, 1, {gpus!r}, {str(tmp_path)!r})\n"
                        "ex.submit(os.getpid)\n"  # starts the worker; the launching process dies before it is up
                        "assert ex._processes, 'no worker started'\n"
                        "os._exit(9)\n")
    # a spawned worker is still importing here; a forked one may already have seen its launching process gone and
    # ended (with the fork server), so only its start is checked (above)
    assert mark == b"forkserver" or marked(mark), "the launching process died before it started a worker"
    wait_until_gone(marked, "the orphaned worker (and the resource tracker) to stop")


def test_several_workers_on_one_gpu_without_mps_get_a_warning(tmp_path, monkeypatch):
    """Measured on a lent H200: 16 processes sharing the GPU without NVIDIA MPS time-sliced it (47 ms a stacked CNN
    step); under the MPS daemon 4 processes ran the same stacks 4x faster. The launcher says so, with the fix."""
    from hydra_plugins.vitsweep_launcher.devices import gpu_sharing_note

    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "mps"))
    assert gpu_sharing_note(1, ["0"]) is None and gpu_sharing_note(4, []) is None  # one per GPU, or the CPU
    note = gpu_sharing_note(8, ["0"])
    assert "8 worker processes share 1 GPU" in note and "nvidia-cuda-mps-control -d" in note
    (tmp_path / "mps").mkdir()
    (tmp_path / "mps" / "control").touch()  # the daemon's control pipe: MPS is running
    assert gpu_sharing_note(8, ["0"]) is None


def test_more_torch_threads_than_cores_get_one_warning_before_any_job(tmp_path):
    """trainer.num_threads replaces the cores // workers threads each worker takes: set for a single run and kept in
    a sweep, n_procs workers of it ran n_procs x trainer.num_threads threads on the cores, with no word (small models
    train much slower oversubscribed). Found by reading the launcher. It now warns once, before the first job,
    naming both settings and the cores this process may use; null is the worker's own share."""
    import os

    cores = len(os.sched_getaffinity(0))
    done = app(tmp_path, "hydra/sweeper=basic", "x=1,2", f"+trainer.num_threads={cores}")  # 2 workers (LAUNCH)
    out = done.stdout + done.stderr
    assert out.count(f"trainer.num_threads={cores} x 2 worker processes") == 1, out[-3000:]
    assert out.index("trainer.num_threads=") < out.index("] #"), out[-3000:]  # before the first job's line
    from hydra_plugins.vitsweep_launcher.devices import thread_oversubscription_note

    assert thread_oversubscription_note(2, None, 2) is None and thread_oversubscription_note(2, 1, 2) is None
    note = thread_oversubscription_note(4, 3, 8)
    assert "trainer.num_threads=3" in note and "hydra.launcher.n_procs" in note and "8 cores" in note


def test_stacked_members_return_what_a_single_run_returns(monkeypatch):
    """A pruned member inside an Optuna trial becomes optuna.TrialPruned (``src.train.objective_of``, as a single
    run), a finished one its objective, a failed one its exception."""
    import optuna
    from hydra.core.utils import JobReturn, JobStatus
    from omegaconf import OmegaConf

    import hydra_plugins.vitsweep_sweeper.protocol as protocol
    import src.stacked
    from hydra_plugins.vitsweep_launcher import members

    summaries = [{"stop_reason": "pruned", "epochs": 3, "objective_name": "val_error", "objective": 0.5},
                 {"stop_reason": "max_epochs", "epochs": 5, "objective_name": "val_error", "objective": 0.2},
                 RuntimeError("planted")]
    monkeypatch.setattr(members, "run_job", lambda **kw: JobReturn())
    monkeypatch.setattr(protocol, "trial_of_hydra", lambda hydra_cfg: None)
    monkeypatch.setattr(protocol, "make_reporter", lambda trial: object())  # every member is in a trial
    monkeypatch.setattr(src.stacked, "train_members", lambda *args, **kwargs: summaries)
    rets = members.run_member_jobs([OmegaConf.create({"hydra": {}}) for _ in summaries], hydra_context=None,
                                   stacker="src.stacked")
    assert [r.status for r in rets] == [JobStatus.FAILED, JobStatus.COMPLETED, JobStatus.FAILED]
    with pytest.raises(optuna.TrialPruned, match="pruned at epoch 3 with val_error 0.5"):
        rets[0].return_value  # noqa: B018 - a failed JobReturn raises its exception when read
    assert rets[1].return_value == 0.2
    with pytest.raises(RuntimeError, match="planted"):
        rets[2].return_value  # noqa: B018


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_worker_skips_the_interpreters_teardown_but_runs_every_exit_handler(tmp_path, method):
    """Workers end with os._exit after the other exit handlers (the launching process waits for them at the end
    of every grid, and a torch process's teardown takes about 0.85 s): what a job's exit handlers write, its
    logging and its unflushed output must still reach disk. Found switching CPU pools to a fork server: a forked
    worker ended with os._exit straight after its last task, and ran no exit handler at all. Found again through a
    real multirun: each worker's Hydra plugin scan re-ran the fork server's module, which registered its
    os._exit again, ahead of the worker's flush of the standard streams (an earlier test, which built the pool by
    hand, had no scan)."""
    import multiprocessing as mp

    if method not in mp.get_all_start_methods():
        pytest.skip(f"no {method} start method on this platform")
    run([APP, "-m", f"hydra.sweep.dir={tmp_path}", "hydra/sweeper=basic", "hydra/launcher=vectorized",
         "hydra.launcher.n_procs=1", f"hydra.launcher.start_method={method}", "x=1,2"], cwd=tmp_path,
        env={"SWEEPER_APP_EXIT_PROBE": "1"})
    log = (tmp_path / ".launcher" / "worker-0.log").read_text()
    for k in range(2):  # one worker: both jobs' handlers run at its exit
        assert (tmp_path / str(k) / "exit_handler").read_text() == "ran"
        assert f"printed at exit by {k}" in log, log[-2000:]
    # the last job's log handler is still open (Hydra's logging set-up for job 1 closed job 0's, as in any launcher)
    assert "logged at exit by 1" in (tmp_path / "1" / "probe.log").read_text()


def _collector_state():
    import gc

    return gc.isenabled(), gc.get_freeze_count()


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_workers_collect_garbage_and_keep_their_loaded_modules_out_of_its_way(tmp_path, method):
    """The fork server imports torch with the garbage collector off (the launch's critical path) and freezes what
    it loaded; a worker, forked or spawned, runs its jobs with the collector on, torch's objects frozen."""
    import multiprocessing as mp
    import types

    from hydra_plugins.vitsweep_launcher import pool

    if method not in mp.get_all_start_methods():
        pytest.skip(f"no {method} start method on this platform")
    launcher = types.SimpleNamespace(hydra_context=None, task_function=print, pool=None, start_method=method)
    ex = pool._pool(launcher, 1, 1, [], str(tmp_path))
    try:
        enabled, frozen = ex.submit(_collector_state).result(timeout=120)
    finally:
        ex.shutdown()
    assert enabled and frozen > 100_000, (enabled, frozen)


def test_the_configs_the_sweepers_check_composed_are_the_launchers_once_each():
    """Hydra's sweepers compose every job to check a batch (``validate_batch_is_legal``), then the launcher composed
    each again: the checked configs are handed over instead, once each; what other callers compose is never kept."""
    import types

    from hydra.plugins.sweeper import Sweeper

    from hydra_plugins.vitsweep_launcher import _validated

    calls = []
    loader = types.SimpleNamespace(load_sweep_config=lambda master, overrides: calls.append(overrides) or
                                   {"job": list(overrides)})
    wrapper = _validated.install(loader)
    assert _validated.install(loader) is wrapper  # once per loader
    master, other_master = object(), object()
    sweeper = types.SimpleNamespace(hydra_context=types.SimpleNamespace(config_loader=loader), config=master)
    Sweeper.validate_batch_is_legal(sweeper, [["x=1"], ["x=2"]])
    kept = wrapper.take(master, ["x=1"])
    assert kept == {"job": ["x=1"]} and wrapper.take(master, ["x=1"]) is None  # handed over once
    assert wrapper.take(other_master, ["x=2"]) is None  # another master config composes afresh
    loader.load_sweep_config(master, ["x=3"])  # a caller other than the check may change what it gets: not kept
    assert wrapper.take(master, ["x=3"]) is None and len(calls) == 3


def test_the_configs_the_vitsweep_sweeper_composed_to_check_its_jobs_are_the_launchers_once_each():
    """The vitsweep sweeper composes each job of a batch before its launch, to fail alone a trial whose config does
    not compose (``_claim_loop.job_compose_error``): the launcher runs each job with that config, not a second one."""
    import types

    from hydra_plugins.vitsweep_launcher import _validated
    from hydra_plugins.vitsweep_sweeper._claim_loop import job_compose_error

    calls = []
    loader = types.SimpleNamespace(load_sweep_config=lambda master, overrides: calls.append(overrides) or
                                   {"job": list(overrides)})
    wrapper = _validated.install(loader)
    master = object()
    assert job_compose_error(loader, master, ["x=1"]) is None
    assert wrapper.take(master, ["x=1"]) == {"job": ["x=1"]} and calls == [["x=1"]]


def _kill_own_worker() -> None:
    import os

    os._exit(9)


def test_a_pool_whose_worker_a_job_killed_is_not_reused(tmp_path):
    """Found in review: the launcher runs a unit that killed its worker twice alone on a fresh 1-worker pool and kept
    that pool; the next batch of 1 job took it, broken, and every submit failed with BrokenProcessPool (not a stop,
    so its trials were not handed back). A broken pool is replaced."""
    import types
    from concurrent.futures.process import BrokenProcessPool

    from hydra_plugins.vitsweep_launcher import pool

    launcher = types.SimpleNamespace(hydra_context=None, task_function=print, pool=None)
    first = pool._pool(launcher, 1, 1, [], str(tmp_path))
    with pytest.raises(BrokenProcessPool):
        first.submit(_kill_own_worker).result(timeout=60)
    second = pool._pool(launcher, 1, 1, [], str(tmp_path))
    try:
        assert second is not first
        assert second.submit(sum, [1, 2]).result(timeout=60) == 3
    finally:
        second.shutdown()


STACK_APP = '''import logging
import os

import hydra

from hydra_plugins.vitsweep_sweeper import protocol

protocol.declare_app(stacker="fakestack")


@hydra.main(version_base="1.3", config_path=None)
def main(cfg):
    logging.getLogger("app").info("single job x=%s", cfg.x)
    return os.environ.get("MY_FLAG", "unset")


if __name__ == "__main__":
    main()
'''

FAKE_STACKER = '''import logging
import os

log = logging.getLogger("fakestack")


def plan_groups(cfgs, max_members, strict):
    return [list(range(len(cfgs)))]


def train_stacked(cfgs, run_dirs, reporters, sweep_dir=None):
    for cfg in cfgs:
        log.info("member x=%s trains", cfg.x)
    return [os.environ.get("MY_FLAG", "unset") for _ in cfgs]
'''


def test_stacked_members_get_their_env_set_and_each_log_gets_the_groups_lines(tmp_path):
    """A stacked group trains with its jobs' `hydra.job.env_set` exported (as run_job exports it around a single
    job's task), and every member's job log gets the group's lines, under a header naming the group: before, the
    group trained without the env_set and all its lines went to the last member's log, none to the others'."""
    (tmp_path / "app.py").write_text(STACK_APP)
    (tmp_path / "fakestack.py").write_text(FAKE_STACKER)
    out = tmp_path / "out"
    done = run([tmp_path / "app.py", "-m", "+x=1,2,3", *LAUNCH, "hydra.launcher.stack=always",
                "+hydra.job.env_set.MY_FLAG=on", f"hydra.sweep.dir={out}"], cwd=tmp_path)
    lines = [line for line in done.stdout.splitlines() if "(worker " in line]
    assert len(lines) == 3 and all("returned 'on'" in line for line in lines), done.stdout[-3000:]
    for k in range(3):
        log = (out / str(k) / "app.log").read_text()
        assert "stacked group of jobs [0, 1, 2]" in log, (k, log)
        assert all(f"member x={x} trains" in log for x in (1, 2, 3)), (k, log)


def test_jobs_whose_env_set_differ_are_not_stacked_together():
    """A group trains under one environment: jobs whose `hydra.job.env_set` differ (the trial identity, which each
    member reads from its own config, aside) train in different units, as each would alone."""
    from omegaconf import OmegaConf, open_dict

    from hydra_plugins.vitsweep_launcher.units import plan_units
    from tests.conftest import compose_cfg

    cfgs = []
    for k, flag in enumerate(["a", "b", "a"]):
        cfg = compose_cfg(["model=cnn", f"seed={k}"])
        with open_dict(cfg):
            cfg.hydra = OmegaConf.create({"job": {"env_set": {"MY_FLAG": flag, "VITSWEEP_TRIAL_NUMBER": str(k)}}})
        cfgs.append(cfg)
    assert plan_units(cfgs, "always", 16, "cpu", "src.stacked") == [[0, 2], [1]]


def test_jobs_that_change_into_their_run_dir_are_not_stacked(caplog):
    """A stacked group trains in its worker's cwd, where a single job under `hydra.job.chdir=true` trains in its run
    dir: relative paths (`dataset.root=data`) would name other files, so such jobs run one by one, with a warning
    where `stack=always` asked for groups."""
    from omegaconf import OmegaConf, open_dict

    from hydra_plugins.vitsweep_launcher.units import plan_units
    from tests.conftest import compose_cfg

    cfgs = []
    for k in range(3):
        cfg = compose_cfg(["model=cnn", f"seed={k}"])
        with open_dict(cfg):
            cfg.hydra = OmegaConf.create({"job": {"chdir": True}})
        cfgs.append(cfg)
    with caplog.at_level("WARNING"):
        assert plan_units(cfgs, "always", 16, "cpu", "src.stacked") == [[0], [1], [2]]
    assert "hydra.job.chdir" in caplog.text


def test_a_stacked_group_that_kills_its_worker_twice_runs_each_job_alone(tmp_path):
    """A group whose process dies twice (the kernel's OOM killer, a crash in the stacked step) runs each of its jobs
    alone, as a lost single job does, so only a job that kills its worker by itself fails: before, the group ran
    again as a group and every member failed with 'worker process died'."""
    (tmp_path / "app.py").write_text(STACK_APP.replace('    logging.getLogger("app")', '    if cfg.x == 2:\n'
                                                       '        os._exit(3)\n    logging.getLogger("app")'))
    (tmp_path / "fakestack.py").write_text(FAKE_STACKER.replace("    for cfg in cfgs:", "    os._exit(3)\n"
                                                                "    for cfg in cfgs:"))
    done = run([tmp_path / "app.py", "-m", "+x=1,2,3", *LAUNCH, "hydra.launcher.stack=always",
                f"hydra.sweep.dir={tmp_path / 'out'}"], cwd=tmp_path, check=False)
    lines = sorted(line.split("] ", 2)[2] for line in done.stdout.splitlines() if "(worker " in line)
    assert len(lines) == 3, done.stdout[-3000:] + done.stderr[-3000:]
    assert lines[0].startswith("#0 returned 'unset' ") and lines[2].startswith("#2 returned 'unset' "), lines
    assert lines[1].startswith("#1 FAILED RuntimeError: worker process died"), lines
