"""`logger=`: runs sent to TensorBoard and MLflow, read back through their own readers (no mocks): TensorBoard's
event accumulator, and MLflow's client on a SQLite tracking store in a temp dir."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from src.trackers import chosen
from src.trainer import train
from tests.conftest import ROOT, TINY

pytest.importorskip("tensorboard", reason="pip install 'vitsweep[tensorboard]'")
pytest.importorskip("mlflow", reason="pip install 'vitsweep[mlflow]'")

from mlflow.tracking import MlflowClient  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.plugins.hparams import plugin_data_pb2  # noqa: E402

BOTH = "logger=[tensorboard,mlflow]"
CURVES = ("train_error", "test_error", "train_loss", "lr")


def rows_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def events(run_dir: Path) -> EventAccumulator:
    """The run's TensorBoard events as TensorBoard reads them (purged steps dropped)."""
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def hparams(acc: EventAccumulator) -> dict:
    content = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    info = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    return {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind")) for k, v in info.hparams.items()}


def run_id_of(run_dir: Path) -> str:
    return json.loads((run_dir / "tracker.json").read_text())["mlflow"]["run_id"]


def history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def same_curve(points: list[tuple[int, float]], rows: list[dict], key: str) -> bool:
    """``points`` are the rows' ``key`` at their steps: each step once, in order, each value equal."""
    return ([p[0] for p in points] == [r["step"] for r in rows]
            and [p[1] for p in points] == pytest.approx([r[key] for r in rows]))


def fail_second_row(monkeypatch, tracker: type, error: Exception):
    """Make the second ``log_metrics`` call of ``tracker`` (a class) raise ``error``, as a store failing once mid-run:
    the tracker is dropped there. Returns the real ``log_metrics``, to put back."""
    calls = []
    log_metrics = tracker.log_metrics

    def flaky(self, row):
        calls.append(row["step"])
        if len(calls) == 2:
            raise error
        log_metrics(self, row)

    monkeypatch.setattr(tracker, "log_metrics", flaky)
    return log_metrics


def test_logger_group_composes_none_one_or_both(tiny_cfg):
    assert chosen(tiny_cfg()) == []
    assert chosen(tiny_cfg("logger=mlflow")) == ["mlflow"]
    assert sorted(chosen(tiny_cfg(BOTH))) == ["mlflow", "tensorboard"]


def test_logger_none_imports_neither_package(tmp_path):
    code = ("import sys; from tests.conftest import compose_cfg, TINY; from src.trainer import train; "
            f"train(compose_cfg(TINY), {str(tmp_path)!r}); "
            "print(sorted(m for m in ('mlflow', 'tensorboard') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
    # the run's own records and its lock; no tracker's files
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "config.json", "metrics.jsonl", "summary.json"]


class StopAt:
    """A reporter that stops the run like Ctrl-C once epoch ``epoch`` is recorded: its row has reached the run
    dir and the trackers, but not the checkpoint (written every 2 epochs), as with a kill between the two."""

    def __init__(self, epoch: int):
        self.epoch = epoch

    def __call__(self, value: float, epoch: int) -> bool:
        if epoch == self.epoch:
            raise KeyboardInterrupt
        return False


def test_a_stopped_and_resumed_run_is_one_curve_in_both_trackers(tiny_cfg, tmp_path):
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    (tmp_path / "store").mkdir()
    run_dir = tmp_path / "run"
    cfg = tiny_cfg(BOTH, f"logger.mlflow.tracking_uri={uri}", "scheduler=constant", "trainer.max_epochs=4",
                   "trainer.checkpoint=true", "trainer.checkpoint_every=2")
    with pytest.raises(KeyboardInterrupt):
        train(cfg, run_dir, reporter=StopAt(3))
    assert len(rows_of(run_dir)) == 3  # epoch 3's row went out; the checkpoint holds epoch 2
    first_id = run_id_of(run_dir)
    summary = train(cfg, run_dir)  # resumes from epoch 2: cuts metrics.jsonl back and trains epochs 3 and 4
    rows = rows_of(run_dir)
    steps = [r["step"] for r in rows]
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4] and summary["status"] == "completed"

    acc = events(run_dir)
    for key in CURVES:  # TensorBoard: every row once, at its step, with its value (the purge step dropped the 3rd)
        assert same_curve([(e.step, e.value) for e in acc.Scalars(key)], rows, key)
    assert [e.step for e in acc.Scalars("epoch")] == steps
    assert [e.value for e in acc.Scalars("summary/objective")] == pytest.approx([summary["objective"]])
    params = hparams(acc)
    assert (params["model.dim"], params["scheduler.name"], params["trainer.max_epochs"]) == (32, "constant", 4)

    client = MlflowClient(tracking_uri=uri)
    assert run_id_of(run_dir) == first_id  # the resumed run continued its MLflow run
    (experiment,) = [e for e in client.search_experiments() if e.name == "vitsweep"]
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_id == first_id and run.info.status == "FINISHED"
    for key in CURVES:  # MLflow: every step once (epoch 3 logged before the stop was not logged again)
        assert same_curve(history(client, first_id, key), rows, key)
    assert run.data.params["model.dim"] == "32" and run.data.params["scheduler.name"] == "constant"
    assert {k: run.data.tags[k] for k in ("status", "stop_reason", "stalled", "collapsed")} == {
        "status": "completed", "stop_reason": "max_epochs", "stalled": json.dumps(summary["stalled"]),
        "collapsed": json.dumps(summary["collapsed"])}
    assert same_curve(history(client, first_id, "objective"), [{"step": steps[-1], "objective": summary["objective"]}],
                      "objective")

    # extended under scheduler=constant: the finished run goes on in the same tracker runs
    longer = tiny_cfg(BOTH, f"logger.mlflow.tracking_uri={uri}", "scheduler=constant", "trainer.max_epochs=5",
                      "trainer.checkpoint=true", "trainer.checkpoint_every=2")
    train(longer, run_dir)
    rows = rows_of(run_dir)
    assert len(rows) == 5 and run_id_of(run_dir) == first_id
    assert [e.step for e in events(run_dir).Scalars("train_error")] == [r["step"] for r in rows]
    assert [s for s, _ in history(client, first_id, "train_error")] == [r["step"] for r in rows]
    assert client.get_run(first_id).info.status == "FINISHED"


def test_a_missing_package_fails_before_training_naming_the_extra(tiny_cfg, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # what `import mlflow` finds where it is not installed
    with pytest.raises(ValueError, match=r"pip install 'vitsweep\[mlflow\]'"):
        train(tiny_cfg("logger=mlflow"), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_an_unwritable_tracker_warns_once_and_the_run_completes(tiny_cfg, tmp_path, monkeypatch, caplog):
    (tmp_path / "a_file").write_text("")  # a store below a file cannot be created
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/a_file/mlflow.db")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "tensorboard").symlink_to("/proc/no-such-dir")  # an event dir that cannot be made
    with caplog.at_level(logging.WARNING, logger="src.trackers"):
        summary = train(tiny_cfg(BOTH, "trainer.max_epochs=2"), run_dir)
    assert summary["status"] == "completed" and len(rows_of(run_dir)) == 2
    assert (run_dir / "summary.json").is_file()
    warnings = [r.getMessage() for r in caplog.records if r.name == "src.trackers"]
    assert len(warnings) == 2, warnings
    assert any(w.startswith("logger=mlflow: start failed") for w in warnings)
    assert any(w.startswith("logger=tensorboard: start failed") for w in warnings)


@pytest.mark.parametrize("stack", [pytest.param("always", marks=pytest.mark.slow), "never"])  # the suite's
# time: two worker processes starting at once on one new store is the case the default suite keeps
def test_a_sweep_logs_each_trial_as_its_own_run(tmp_path, stack):
    """Two trials of a vitsweep study on the vectorized launcher, as one stacked model in one worker or in two worker
    processes starting at once (on one new SQLite store): one MLflow run per trial in the study's experiment,
    tagged with its trial, in the sweep dir's store; one event dir each."""
    grid = ["model=cnn", "model.width=2", *[o for o in TINY if not o.startswith("model.")], "trainer.max_epochs=2"]
    done = subprocess.run([sys.executable, "-m", "src.train", "-m", *grid, "seed=choice(0,1)", BOTH,
                           "hydra/sweeper=vitsweep", "hydra/sweeper/sampler=grid", "hydra.sweeper.n_jobs=2",
                           "hydra.sweeper.study_name=s", "hydra/launcher=vectorized", "hydra.launcher.n_procs=2",
                           f"hydra.launcher.stack={stack}",
                           f"hydra.sweep.dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert ("stacked in 1 group(s)" in done.stdout + done.stderr) == (stack == "always")
    logs = [done.stdout, done.stderr, *(p.read_text() for p in tmp_path.rglob("*.log"))]  # workers log to files
    assert not any("src.trackers" in text for text in logs)  # no tracker warned
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name("s")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert sorted(runs) == ["trial-0", "trial-1"]
    for number in (0, 1):
        run_dir, run = tmp_path / str(number), runs[f"trial-{number}"]
        assert run_id_of(run_dir) == run.info.run_id
        assert (run.data.tags["vitsweep.study_name"], run.data.tags["vitsweep.trial_number"]) == ("s", str(number))
        assert run.data.params["seed"] == str(json.loads((run_dir / "summary.json").read_text())["seed"])
        rows = rows_of(run_dir)
        assert same_curve(history(client, run.info.run_id, "train_error"), rows, "train_error")
        acc = events(run_dir)
        assert same_curve([(e.step, e.value) for e in acc.Scalars("train_error")], rows, "train_error")
        assert (hparams(acc)["study_name"], hparams(acc)["trial_number"]) == ("s", number)


def mlflow_runs(uri: str, experiment: str) -> list:
    client = MlflowClient(tracking_uri=uri)
    return client.search_runs([client.get_experiment_by_name(experiment).experiment_id])


def test_a_retried_trial_renames_the_mlflow_run_it_continues_and_records_how_it_trained(tiny_cfg, tmp_path,
                                                                                         monkeypatch):
    """The sweeper's retry of an interrupted trial is a new trial number in the same run dir: the MLflow run it
    continues was still named and tagged after the first trial (Optuna: trial 5 FAIL, trial 12 COMPLETE; MLflow:
    only `trial-5`, holding trial 12's result). Its name and tags now follow, `vitsweep.trial_numbers` keeps both,
    and the summary's resolved facts (precision, device) are tags."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = tiny_cfg("logger=mlflow", f"logger.mlflow.tracking_uri={uri}", "scheduler=constant", "trainer.max_epochs=3",
                   "trainer.checkpoint=true", "trainer.checkpoint_every=1")
    run_dir = tmp_path / "5"
    import optuna

    storage = f"sqlite:///{tmp_path}/optuna.db"  # a trial's job records its objective in its study
    optuna.create_study(study_name="s", storage=storage)
    env = {"VITSWEEP_TRIAL_STUDY": "s", "VITSWEEP_TRIAL_STORAGE": storage}
    for k, v in {**env, "VITSWEEP_TRIAL_NUMBER": "5"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, run_dir, reporter=StopAt(2))
    monkeypatch.setenv("VITSWEEP_TRIAL_NUMBER", "12")
    summary = train(cfg, run_dir)
    (run,) = mlflow_runs(uri, "s")
    assert summary["trial_number"] == 12 and run.info.status == "FINISHED"
    assert run.info.run_name == "trial-12" and run.data.tags["vitsweep.trial_number"] == "12"
    assert run.data.tags["vitsweep.trial_numbers"] == "5,12"
    assert run.data.tags["precision"] == "fp32" and run.data.tags["device"] == summary["device"]


def test_a_copied_run_dir_resumes_into_an_mlflow_run_of_its_own_with_its_whole_curve(tiny_cfg, tmp_path, caplog):
    """tracker.json keeps the store and run id: a run dir copied (to branch or extend a sweep) and resumed wrote its
    continuation into the original's MLflow run. It gets its own run in its own default store, sent the rows it
    kept, and the original's history is untouched."""
    a, b = tmp_path / "a", tmp_path / "b"
    first = tiny_cfg("logger=mlflow", "scheduler=constant", "trainer.max_epochs=2", "trainer.checkpoint=true")
    train(first, a)
    import shutil

    shutil.copytree(a, b)
    longer = tiny_cfg("logger=mlflow", "scheduler=constant", "trainer.max_epochs=4", "trainer.checkpoint=true")
    with caplog.at_level(logging.WARNING):
        train(longer, b)
    assert "copied or moved" in caplog.text
    client_a = MlflowClient(tracking_uri=f"sqlite:///{a / 'mlflow.db'}")
    assert [s for s, _ in history(client_a, run_id_of(a), "train_error")] == [r["step"] for r in rows_of(a)]
    assert len(rows_of(a)) == 2
    client_b = MlflowClient(tracking_uri=f"sqlite:///{b / 'mlflow.db'}")
    assert run_id_of(b) != run_id_of(a)
    assert same_curve(history(client_b, run_id_of(b), "train_error"), rows_of(b), "train_error")
    assert len(rows_of(b)) == 4
    assert client_b.get_run(run_id_of(b)).data.tags["vitsweep.run_dir"] == str(b.absolute())


def test_a_start_that_died_before_its_first_checkpoint_leaves_no_mlflow_run_running(tiny_cfg, tmp_path):
    """A start killed before any checkpoint (SIGKILL, out of memory) never ends its MLflow run; the next start moves
    its files aside and begins a new one. The old run is ended KILLED, tagged with the run that replaced it."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = tiny_cfg("logger=mlflow", f"logger.mlflow.tracking_uri={uri}", "trainer.max_epochs=2",
                   "trainer.checkpoint=true", "trainer.checkpoint_every=2")
    run_dir = tmp_path / "run"
    from src.trackers_mlflow import MLflowTracker

    dead = MLflowTracker(tracking_uri=uri)
    run_dir.mkdir()
    # what a killed start leaves: tracker.json and a RUNNING run, no checkpoint
    dead.start(run_dir, OmegaConf.to_container(cfg, resolve=True), 0, {})
    (run_dir / "metrics.jsonl").write_text("")
    train(cfg, run_dir)
    client = MlflowClient(tracking_uri=uri)
    old = client.get_run(dead.run_id)
    assert old.info.status == "KILLED" and old.data.tags["vitsweep.superseded_by"] == run_id_of(run_dir)
    assert client.get_run(run_id_of(run_dir)).info.status == "FINISHED"


def test_a_store_that_cannot_be_reached_on_resume_drops_the_tracker_and_keeps_its_record(tiny_cfg, tmp_path,
                                                                                          caplog):
    """An MLflow store that tracker.json names but that cannot be reached now (a server down) is no sign of a copied
    run dir: the tracker is dropped for this start, with its warning, and tracker.json still names the run, for
    the next start to continue (the first version of the copy rule opened a new run elsewhere and forgot it)."""
    cfg = tiny_cfg("logger=mlflow", "scheduler=constant", "trainer.max_epochs=2", "trainer.checkpoint=true")
    run_dir = tmp_path / "run"
    train(cfg, run_dir)
    record = json.loads((run_dir / "tracker.json").read_text())
    record["mlflow"]["tracking_uri"] = "http://127.0.0.1:9"  # nothing listens there
    (run_dir / "tracker.json").write_text(json.dumps(record))
    longer = tiny_cfg("logger=mlflow", "scheduler=constant", "trainer.max_epochs=3", "trainer.checkpoint=true")
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
    try:
        with caplog.at_level(logging.WARNING):
            assert train(longer, run_dir)["status"] == "completed"
    finally:
        del os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]
    assert "logger=mlflow: start failed" in caplog.text and "copied or moved" not in caplog.text
    assert json.loads((run_dir / "tracker.json").read_text()) == record


def test_a_run_dir_reached_by_another_path_continues_its_mlflow_run_and_a_re_added_tracker_gets_the_gap(
        tiny_cfg, tmp_path):
    """The same run dir through a symlink is not a copy: the resume continues the same MLflow run. MLflow dropped at
    one start and back at the next is sent the rows it missed, so its curve is metrics.jsonl's."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    real = tmp_path / "real"
    (tmp_path / "link").symlink_to(tmp_path, target_is_directory=True)
    via_link = tmp_path / "link" / "real"

    def cfg(epochs: int, mlflow: bool = True):
        logger = ["logger=mlflow", f"logger.mlflow.tracking_uri={uri}"] if mlflow else ["logger=none"]
        return tiny_cfg(*logger, "scheduler=constant", f"trainer.max_epochs={epochs}", "trainer.checkpoint=true",
                        "trainer.checkpoint_every=1")

    train(cfg(1), real)
    first = run_id_of(real)
    train(cfg(2, mlflow=False), real)  # a start without MLflow
    train(cfg(3), via_link)  # back, through the symlink
    assert run_id_of(real) == first
    client = MlflowClient(tracking_uri=uri)
    assert len(mlflow_runs(uri, "vitsweep")) == 1
    assert same_curve(history(client, first, "train_error"), rows_of(real), "train_error") and len(rows_of(real)) == 3


@pytest.mark.parametrize("first,then", [
    (["trainer.max_epochs=null", "trainer.max_steps=6"], ["trainer.max_epochs=null", "trainer.max_steps=12"]),
    (["trainer.test_every=2", "trainer.max_epochs=3"], ["trainer.test_every=2", "trainer.max_epochs=4"])],
    ids=["stopped_mid_epoch", "final_test_not_due"])
def test_an_extended_run_leaves_no_dropped_evaluation_in_tensorboard(tiny_cfg, tmp_path, first, then):
    """A run extended past a stop rewrites metrics.jsonl as an uninterrupted run records it: the evaluation of a
    half-trained epoch (4 steps an epoch, stopped at step 6) leaves it, and a final evaluation's test split that
    test_every did not call for leaves its row. TensorBoard kept both (a second epoch-2 point at step 6, a test_error
    at step 12), as they were logged before the resume's purge step; found by reading an extended run back. MLflow,
    which cannot delete a point, tags the steps from which metrics.jsonl differs."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    run_dir = tmp_path / "run"

    def cfg(limits):
        return tiny_cfg(BOTH, f"logger.mlflow.tracking_uri={uri}", "scheduler=constant", "trainer.checkpoint=true",
                        *limits)

    train(cfg(first), run_dir)
    summary = train(cfg(then), run_dir)
    rows = rows_of(run_dir)
    acc = events(run_dir)
    for key in (*CURVES, "epoch", "test_loss"):
        assert same_curve([(e.step, e.value) for e in acc.Scalars(key)], [r for r in rows if r.get(key) is not None],
                          key), key
    assert [e.step for e in acc.Scalars("summary/objective")] == [summary["steps"]]
    tags = MlflowClient(tracking_uri=uri).get_run(run_id_of(run_dir)).data.tags
    assert tags["vitsweep.records_rewritten_from_step"] == ("6" if "trainer.max_steps=6" in first else "12")


def test_a_resumed_run_keeps_no_mlflow_tag_of_how_an_earlier_start_trained(tiny_cfg, tmp_path):
    """The tags of how the run trained are the final summary's: a trial stacked with others at its first start
    (stacked_members, attention_trained) and resumed alone kept both tags in MLflow, though its summary.json has
    neither (the tags were set where present, never removed); found by reading the tags of a reopened run."""
    from src.trackers_mlflow import MLflowTracker

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = OmegaConf.to_container(tiny_cfg(), resolve=True)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    base = {"status": "stopped", "stop_reason": "interrupted", "objective_name": "test_error", "stalled": False,
            "collapsed": False, "objective": 0.5, "steps": 4, "precision": "fp32", "device": "cpu"}
    first = MLflowTracker(tracking_uri=uri)
    first.start(run_dir, cfg, 0, {})
    first.log_summary({**base, "stacked_members": 2, "attention_trained": "explicit"})
    second = MLflowTracker(tracking_uri=uri)
    second.start(run_dir, cfg, 4, {})
    second.log_summary({**base, "status": "completed", "stop_reason": "max_epochs", "steps": 8})
    tags = MlflowClient(tracking_uri=uri).get_run(run_id_of(run_dir)).data.tags
    assert (tags["precision"], tags["stop_reason"]) == ("fp32", "max_epochs")
    assert "stacked_members" not in tags and "attention_trained" not in tags


def session_status(acc: EventAccumulator) -> str | None:
    """The status TensorBoard's HParams dashboard shows (and filters by) for the run; None: no end recorded."""
    from tensorboard.plugins.hparams import api_pb2

    content = acc.PluginTagToContent("hparams").get("_hparams_/session_end_info")
    if content is None:
        return None
    return api_pb2.Status.Name(plugin_data_pb2.HParamsPluginData.FromString(content).session_end_info.status)


def test_tensorboard_hparams_show_how_the_run_ended(tiny_cfg, tmp_path):
    """torch's ``hparams()`` writes a session end with STATUS_SUCCESS, and the tracker wrote it as the run started:
    TensorBoard's HParams dashboard, which filters sessions by that status (and keeps a tag's first metadata),
    showed a run whose loss went non-finite, a running one and an interrupted one all as succeeded. Found by
    reading the hparams session end of a failed run. The end is now written with the summary: FAILURE for a
    failed run, SUCCESS for a completed or stopped one, none while it runs or is interrupted."""
    failed = tmp_path / "failed"
    summary = train(tiny_cfg("logger=tensorboard", "optimizer.lr=1e12", "trainer.log_every=1"), failed)
    assert summary["status"] == "failed"
    assert session_status(events(failed)) == "STATUS_FAILURE"

    run_dir = tmp_path / "run"
    cfg = tiny_cfg("logger=tensorboard", "scheduler=constant", "trainer.max_epochs=2", "trainer.checkpoint=true",
                   "trainer.checkpoint_every=1")
    with pytest.raises(KeyboardInterrupt):
        train(cfg, run_dir, reporter=StopAt(1))
    assert session_status(events(run_dir)) is None
    assert train(cfg, run_dir)["status"] == "completed"
    assert session_status(events(run_dir)) == "STATUS_SUCCESS"


def test_a_finished_run_moved_aside_by_a_fresh_start_is_tagged_superseded(tiny_cfg, tmp_path):
    """trainer.resume=never moves a finished run's records aside (previous-*/) and trains anew in the same run dir:
    its finished MLflow run kept the same name and the tag vitsweep.run_dir of a dir that now holds another run's
    results, with nothing to tell the two apart (only a RUNNING one was tagged superseded). Found by reading the
    store after a fresh start in a used run dir. Every earlier run is now tagged with the run that replaced it;
    only a RUNNING one changes status."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    run_dir = tmp_path / "run"
    train(tiny_cfg("logger=mlflow", f"logger.mlflow.tracking_uri={uri}"), run_dir)
    first = run_id_of(run_dir)
    train(tiny_cfg("logger=mlflow", f"logger.mlflow.tracking_uri={uri}", "trainer.resume=never"), run_dir)
    second = run_id_of(run_dir)
    client = MlflowClient(tracking_uri=uri)
    old = client.get_run(first)
    assert second != first and old.info.status == "FINISHED"
    assert old.data.tags.get("vitsweep.superseded_by") == second


def test_a_stacked_member_that_fails_in_its_set_up_ends_its_mlflow_run(tiny_cfg, tmp_path, monkeypatch):
    """A member of a stacked group whose start fails after its trackers started (here the pruner's replay raising)
    fails alone, but its MLflow run was never ended: neither a summary nor the group's close reached it (it is not
    among the members that train), so it showed RUNNING for ever. Found by failing a member's start and reading its
    run's status. It now ends FAILED."""
    import src.stacked

    def broken(state, reporter):
        raise RuntimeError("storage unreachable")

    monkeypatch.setattr(src.stacked, "replay_final_report", broken)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    run_dir = tmp_path / "run"
    (result,) = src.stacked.train_members([tiny_cfg("logger=mlflow", f"logger.mlflow.tracking_uri={uri}")],
                                          [run_dir])
    assert isinstance(result, RuntimeError)
    assert MlflowClient(tracking_uri=uri).get_run(run_id_of(run_dir)).info.status == "FAILED"


def test_cutting_a_torn_metrics_line_back_sends_the_trackers_nothing(tmp_path):
    """A start killed mid-write leaves half a line at the end of metrics.jsonl, which a resume's checkpoint load
    cuts back (before the trackers start): the cut must not read that half line as an evaluation."""
    from src.records import RunRecorder

    recorder = RunRecorder(tmp_path)
    for step in (4, 8):
        recorder.log({"epoch": step // 4, "step": step, "train_error": 0.5})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"epoch": 3, "st')
    recorder.keep_rows(2)
    assert [r["step"] for r in rows_of(tmp_path)] == [4, 8]


def test_a_tracker_dropped_mid_run_does_not_end_its_mlflow_run_failed(tiny_cfg, tmp_path, monkeypatch):
    """One MLflow call failing partway through training (a SQLite store locked by a sweep's other workers, a server's
    timeout) drops the tracker and the run completes, but the drop ended its MLflow run FAILED, with no tag saying
    why: a completed run looked like a failed training in MLflow, its curve cut short. Found by failing one
    log_metrics of a run and reading its MLflow run. It now ends KILLED (its record was cut short) with the tag
    vitsweep.tracking_dropped naming the call and the cause; a resume that continues the run fills its curve and
    clears the tag."""
    from src.trackers_mlflow import DROPPED_TAG, MLflowTracker

    fail_second_row(monkeypatch, MLflowTracker, ConnectionError("database is locked"))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    run_dir = tmp_path / "run"

    def cfg(epochs: int):
        return tiny_cfg("logger=mlflow", f"logger.mlflow.tracking_uri={uri}", "scheduler=constant",
                        f"trainer.max_epochs={epochs}", "trainer.checkpoint=true", "trainer.checkpoint_every=1")

    assert train(cfg(3), run_dir)["status"] == "completed"
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id_of(run_dir))
    assert run.info.status == "KILLED"
    assert run.data.tags[DROPPED_TAG].startswith("log_metrics failed (ConnectionError: database is locked)")
    assert "status" not in run.data.tags  # no summary reached it: the run dir's summary.json is the result
    assert len(history(client, run.info.run_id, "train_error")) == 1

    assert train(cfg(4), run_dir)["status"] == "completed"  # extended: the resume continues the MLflow run
    run = client.get_run(run_id_of(run_dir))
    assert run.info.status == "FINISHED" and DROPPED_TAG not in run.data.tags
    assert same_curve(history(client, run.info.run_id, "train_error"), rows_of(run_dir), "train_error")


def test_a_relative_tracking_uri_resumed_from_another_directory_continues_its_mlflow_run(tiny_cfg, tmp_path,
                                                                                         monkeypatch, caplog):
    """A relative store (`logger.mlflow.tracking_uri=sqlite:///mlflow.db`, MLflow resolves it from the cwd) was kept
    in tracker.json as written: the same command resumed from another directory found no store there, warned that
    the run dir was copied or moved and split the run into a second MLflow run in a second store. Found by resuming
    a run from another cwd. The store is now kept as an absolute URI, where the first start resolved it."""
    first, other = tmp_path / "first", tmp_path / "other"
    first.mkdir()
    other.mkdir()
    run_dir = tmp_path / "run"

    def cfg(epochs: int):
        return tiny_cfg("logger=mlflow", "logger.mlflow.tracking_uri=sqlite:///mlflow.db", "scheduler=constant",
                        f"trainer.max_epochs={epochs}", "trainer.checkpoint=true", "trainer.checkpoint_every=1")

    monkeypatch.chdir(first)
    train(cfg(1), run_dir)
    run_id = run_id_of(run_dir)
    monkeypatch.chdir(other)
    with caplog.at_level(logging.WARNING):
        train(cfg(2), run_dir)
    assert "copied or moved" not in caplog.text and run_id_of(run_dir) == run_id
    assert not (other / "mlflow.db").exists()
    client = MlflowClient(tracking_uri=f"sqlite:///{first / 'mlflow.db'}")
    assert same_curve(history(client, run_id, "train_error"), rows_of(run_dir), "train_error")
    assert len(rows_of(run_dir)) == 2


def test_a_resume_told_another_tracking_uri_goes_on_there(tiny_cfg, tmp_path, caplog):
    """A `logger.mlflow.tracking_uri` given on resume that names another store than the MLflow run tracker.json
    names was ignored without a word: the run went on in the old store, and the user found nothing in the new one
    (nor any way to leave an old store that is gone for good but the tracker being dropped at every start). Found
    by resuming with another URI. The run now goes on in a new MLflow run in the store asked for, sent the rows
    metrics.jsonl keeps (its whole curve), with a warning naming both; the earlier run keeps what it logged."""
    old, new = f"sqlite:///{tmp_path}/old.db", f"sqlite:///{tmp_path}/new.db"
    run_dir = tmp_path / "run"

    def cfg(epochs: int, uri: str):
        return tiny_cfg("logger=mlflow", f"logger.mlflow.tracking_uri={uri}", "scheduler=constant",
                        f"trainer.max_epochs={epochs}", "trainer.checkpoint=true", "trainer.checkpoint_every=1")

    train(cfg(1, old), run_dir)
    first = run_id_of(run_dir)
    with caplog.at_level(logging.WARNING):
        train(cfg(2, new), run_dir)
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "src.trackers_mlflow"]
    assert old in warning and new in warning and first in warning
    second = run_id_of(run_dir)
    assert second != first and json.loads((run_dir / "tracker.json").read_text())["mlflow"]["tracking_uri"] == new
    assert same_curve(history(MlflowClient(tracking_uri=new), second, "train_error"), rows_of(run_dir), "train_error")
    assert len(history(MlflowClient(tracking_uri=old), first, "train_error")) == 1


def test_a_resume_told_another_experiment_goes_on_there(tiny_cfg, tmp_path, caplog):
    """As with another store: `logger.mlflow.experiment_name` given on resume that names another experiment than the
    run's goes on in a new MLflow run in that experiment, with its whole curve and a warning naming both."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    run_dir = tmp_path / "run"

    def cfg(epochs: int, experiment: str):
        return tiny_cfg("logger=mlflow", f"logger.mlflow.tracking_uri={uri}",
                        f"logger.mlflow.experiment_name={experiment}", "scheduler=constant",
                        f"trainer.max_epochs={epochs}", "trainer.checkpoint=true", "trainer.checkpoint_every=1")

    train(cfg(1, "a"), run_dir)
    first = run_id_of(run_dir)
    with caplog.at_level(logging.WARNING):
        train(cfg(2, "b"), run_dir)
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "src.trackers_mlflow"]
    assert "experiment a" in warning and "experiment_name=b" in warning
    (run,) = mlflow_runs(uri, "b")
    assert run.info.run_id == run_id_of(run_dir) != first
    assert same_curve(history(MlflowClient(tracking_uri=uri), run.info.run_id, "train_error"), rows_of(run_dir),
                      "train_error")


def test_tensorboard_itself_shows_a_stopped_and_resumed_run_as_one_curve(tiny_cfg, tmp_path):
    """TensorBoard's server reads event files with its plugin event accumulator, which takes the first session start
    it sees for the run's beginning, not a restart: the resumed start's purge step (the first start writes none)
    purged nothing there, so `tensorboard --logdir` showed the steps the killed start logged after its checkpoint
    twice (wall_s at two values) and its `interrupted` summary text; the legacy accumulator the other tests read
    with purges. Found by reading a resumed run's events with TensorBoard's own reader."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator as ServerReader
    from tensorboard.util.tensor_util import make_ndarray

    run_dir = tmp_path / "run"
    cfg = tiny_cfg("logger=tensorboard", "scheduler=constant", "trainer.max_epochs=4", "trainer.checkpoint=true",
                   "trainer.checkpoint_every=2")
    with pytest.raises(KeyboardInterrupt):
        train(cfg, run_dir, reporter=StopAt(3))  # epoch 3's row went out; the checkpoint holds epoch 2
    train(cfg, run_dir)
    acc = ServerReader(str(run_dir / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    rows = rows_of(run_dir)
    for key in ("train_error", "wall_s"):
        points = [(e.step, float(make_ndarray(e.tensor_proto))) for e in acc.Tensors(key)]
        assert same_curve(points, rows, key), (key, points)
    texts = [json.loads(make_ndarray(e.tensor_proto).item()) for e in acc.Tensors("summary/text_summary")]
    assert [t["stop_reason"] for t in texts] == ["max_epochs"]


def test_tensorboard_dropped_mid_run_is_sent_the_rows_it_missed_on_resume(tiny_cfg, tmp_path, monkeypatch):
    """TensorBoard failing partway through a run (an event dir on a full disk) drops it, as MLflow, but a resume
    that continued its event files sent it only the rows from the checkpoint on: the rows between the drop and the
    checkpoint stayed missing from its curve for good (MLflow is sent them). Found by failing one log_metrics of a
    run and reading its events after a resume. The resume now sends TensorBoard the kept rows beyond the last step
    its events hold, as MLflow is sent them."""
    from src.trackers_tensorboard import TensorBoardTracker

    log_metrics = fail_second_row(monkeypatch, TensorBoardTracker, OSError("No space left on device"))

    def cfg(epochs: int):
        return tiny_cfg("logger=tensorboard", "scheduler=constant", f"trainer.max_epochs={epochs}",
                        "trainer.checkpoint=true", "trainer.checkpoint_every=1")

    run_dir = tmp_path / "run"
    assert train(cfg(3), run_dir)["status"] == "completed"
    assert len(events(run_dir).Scalars("train_error")) == 1  # dropped at epoch 2's row
    monkeypatch.setattr(TensorBoardTracker, "log_metrics", log_metrics)
    assert train(cfg(4), run_dir)["status"] == "completed"  # extended: the resume continues the event files
    rows = rows_of(run_dir)
    assert len(rows) == 4
    for key in ("train_error", "epoch"):
        assert same_curve([(e.step, e.value) for e in events(run_dir).Scalars(key)], rows, key), key
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator as ServerReader
    from tensorboard.util.tensor_util import make_ndarray

    acc = ServerReader(str(run_dir / "tensorboard"), size_guidance={"tensors": 0})  # what `tensorboard` shows
    acc.Reload()
    points = [(e.step, float(make_ndarray(e.tensor_proto))) for e in acc.Tensors("train_error")]
    assert same_curve(points, rows, "train_error"), points


def test_a_stop_outside_the_training_loop_ends_the_mlflow_run_killed(tiny_cfg, tmp_path, monkeypatch):
    """A Ctrl-C (KeyboardInterrupt) that came after the trackers started but outside the training loop (between the
    tracker's start and the loop, or in a tracker's own start) ended the single run's MLflow run FAILED, or left it
    RUNNING, where a stop in the loop ends it KILLED (as a stacked member's does). Found by raising KeyboardInterrupt
    there and reading the MLflow run's status. Both now end KILLED."""
    import src.trainer
    from src.trackers_mlflow import MLflowTracker

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = tiny_cfg("logger=mlflow", f"logger.mlflow.tracking_uri={uri}", "trainer.max_epochs=1")

    def interrupt(*args):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(src.trainer, "already_stopped", interrupt)  # after the trackers started, before the loop
        with pytest.raises(KeyboardInterrupt):
            train(cfg, tmp_path / "before_loop")
    with monkeypatch.context() as m:
        m.setattr(MLflowTracker, "_supersede", interrupt)  # in the tracker's start, once its MLflow run exists
        with pytest.raises(KeyboardInterrupt):
            train(cfg, tmp_path / "in_start")
    client = MlflowClient(tracking_uri=uri)
    statuses = {d: client.get_run(run_id_of(tmp_path / d)).info.status for d in ("before_loop", "in_start")}
    assert statuses == {"before_loop": "KILLED", "in_start": "KILLED"}


def test_sigterm_while_the_trackers_start_stops_the_run_cleanly_and_ends_its_mlflow_run_killed(tmp_path):
    """The trainer's SIGTERM handler was installed after the trackers started: a SIGTERM while MLflow started (a
    store's tables being created, a server's answer awaited) met the default handler, which ended the process at
    once, its MLflow run RUNNING. Found by sending SIGTERM from the tracker's start. The handler is now in place
    before the trackers start: the run stops after its first step with its checkpoint (exit 143) and the MLflow run
    ends KILLED, as a stop in the loop ends it."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    code = ("import os, signal; from tests.conftest import compose_cfg, TINY; from src.trainer import train; "
            "from src.trackers_mlflow import MLflowTracker; "
            "MLflowTracker._supersede = lambda self, run_dir: os.kill(os.getpid(), signal.SIGTERM); "
            f"train(compose_cfg([*TINY, 'logger=mlflow', 'logger.mlflow.tracking_uri={uri}', "
            f"'trainer.checkpoint=true']), {str(tmp_path / 'run')!r})")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 143, (done.returncode, done.stderr[-3000:])
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["stop_reason"] == "interrupted"
    assert MlflowClient(tracking_uri=uri).get_run(run_id_of(tmp_path / "run")).info.status == "KILLED"
