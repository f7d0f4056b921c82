"""``logger=mlflow``: one MLflow run per run dir, with the run's evaluations, config and summary.

A resumed run continues its MLflow run: it reopens the run whose id ``tracker.json`` keeps in the run dir and logs
only the steps it has not seen, so a killed and resumed run is one curve with no step twice. A retried trial renames
the MLflow run it continues; a run dir copied or moved elsewhere gets an MLflow run of its own (``tracker.json``
names a run tagged with another run dir), and so does one resumed with a ``logger.mlflow`` store or experiment
other than its run's; a relative local store is kept absolute, so a resume from another cwd finds it; a tracker
run that starts on a resumed run dir is sent the rows it kept; the runs of earlier starts whose files were moved
aside are ended. A sweep's workers share one local SQLite store, created under a file lock. The package loads
only when a run starts the tracker (``src.trackers``).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from src.checkpoint import atomic_write
from src.trackers_payload import SUMMARY_TAGS, flat_params, kept_rows, numbers

log = logging.getLogger(__name__)

TRACKER_FILE = "tracker.json"  # a run's MLflow run id and store, so a resumed run continues it
# how the run trained, as its summary records it (precision=auto and model.attention=auto resolve per machine; a
# stacked member trains with the explicit attention ops): tagged where present
FACT_TAGS = ("precision", "device", "attention", "attention_trained", "stacked_members")
DEFAULT_EXPERIMENT = "vitsweep"  # MLflow's experiment outside an Optuna study
MLFLOW_STATUS = {"completed": "FINISHED", "stopped": "FINISHED", "failed": "FAILED"}
MAX_PARAM_CHARS = 6000  # MLflow's limit on a param value
PARAMS_PER_BATCH = 100  # MLflow's limit on params per log_batch
REWRITTEN_TAG = "vitsweep.records_rewritten_from_step"  # where metrics.jsonl no longer holds what MLflow logged
DROPPED_TAG = "vitsweep.tracking_dropped"  # the call and cause that cut this run's record short (src.trackers)


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Hold a lock beside a local SQLite store while it is created and its experiment looked up or made: a sweep's
    worker processes start runs at once, and MLflow's table creation and ``create_experiment`` race (two workers
    of a study: one failed with ``table latest_metrics already exists``)."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    import fcntl

    with open(uri.removeprefix("sqlite:///").split("?", 1)[0] + ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def absolute_uri(uri: str) -> str:
    """``uri`` with the relative path of a local store made absolute, from the cwd, where MLflow resolves it:
    ``tracker.json`` keeps the store a start used, and a resume from another directory looked for it elsewhere."""
    from urllib.parse import urlparse

    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        path, sep, query = uri.removeprefix("sqlite:///").partition("?")
        return f"sqlite:///{Path(path).absolute()}{sep}{query}" if path and path != ":memory:" else uri
    parsed = urlparse(uri)
    if parsed.scheme == "file" and not parsed.netloc and not parsed.path.startswith("/"):
        return Path(parsed.path).absolute().as_uri()
    if not parsed.scheme and uri and uri != "databricks":  # a plain path: MLflow's file store
        return str(Path(uri).absolute())
    return uri


def _same_dir(tags: Mapping[str, str], here: str) -> bool:
    """Whether an MLflow run's ``vitsweep.run_dir`` is the run dir ``here`` (any spelling of it)."""
    owner = tags.get("vitsweep.run_dir") or ""
    return bool(owner) and (owner == here or (Path(owner).exists() and os.path.samefile(owner, here)))


class MLflowTracker:
    """One MLflow run per run dir, in the experiment named after the Optuna study (a sweep) or ``vitsweep``: the
    config as params, each row's numbers as metrics at its step, the summary as tags and an ``objective`` metric.

    The store: ``logger.mlflow.tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<dir>/mlflow.db``
    with ``<dir>`` the sweep dir of a multirun or the run dir of a single run."""

    name = "mlflow"

    def __init__(self, tracking_uri: str | None = None, experiment_name: str | None = None,
                 sweep_dir: Path | None = None):
        self.tracking_uri, self.experiment_name, self.sweep_dir = tracking_uri, experiment_name, sweep_dir
        self.client, self.run_id, self.seen_through = None, None, -1

    def _uri(self, run_dir: Path) -> str:
        home = (self.sweep_dir or run_dir).absolute()
        uri = self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{home / 'mlflow.db'}"
        return absolute_uri(uri)

    def start(self, run_dir: Path, cfg: Mapping[str, Any], resume_step: int, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        path = Path(run_dir) / TRACKER_FILE
        record = json.loads(path.read_text()).get("mlflow", {}) if path.is_file() else {}
        here = str(Path(run_dir).absolute())
        params = {k: str(v)[:MAX_PARAM_CHARS] for k, v in flat_params(cfg).items()}
        run = self._reopen(record, here)
        if run is not None:  # a resumed run continues its MLflow run
            self.run_id = run.info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            if DROPPED_TAG in run.data.tags:  # dropped at an earlier start: this one sends it the rows it lacks
                self.client.delete_tag(self.run_id, DROPPED_TAG)
            self._retag(run, tags)
            logged = self.client.get_metric_history(self.run_id, "epoch")
            self.seen_through = max((m.step for m in logged), default=-1)  # logged before a kill: not again
            params = {k: v for k, v in params.items() if k not in run.data.params}
        else:
            uri = self._uri(Path(run_dir))
            with _store_lock(uri):  # the client creates a new store's tables as it is made
                self.client = MlflowClient(tracking_uri=uri)
                experiment_id = self._experiment(tags)
            run_tags = {"vitsweep.run_dir": here, **{f"vitsweep.{k}": str(v) for k, v in tags.items()}}
            name = f"trial-{tags['trial_number']}" if "trial_number" in tags else Path(run_dir).name
            self.run_id = self.client.create_run(experiment_id, run_name=name, tags=run_tags).info.run_id
            text = json.dumps({"mlflow": {"tracking_uri": uri, "experiment_id": experiment_id, "run_id": self.run_id,
                                          "tracking_uri_setting": self.tracking_uri}}, indent=2) + "\n"
            atomic_write(path, lambda f: f.write(text.encode()))
            self._supersede(Path(run_dir))
        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=items[i:i + PARAMS_PER_BATCH])
        for row in kept_rows(run_dir, resume_step, self.seen_through):  # what the MLflow run lacks of the run's
            self.log_metrics(row)  # curve so far (a new run on a resumed run dir, or MLflow dropped at a start)

    def _reopen(self, record: Mapping[str, Any], here: str) -> Any:
        """The MLflow run ``tracker.json`` names, to continue; None where there is none, or where it belongs to
        another run dir (this one was copied or moved: continuing would write into the original's run), or where
        its local SQLite store is gone (moved with its folder), or where ``logger.mlflow`` names another store or
        experiment (the run goes on in a new MLflow run there). A store that cannot be reached raises: the tracker
        is dropped for this start and ``tracker.json`` is kept for the next."""
        if not record.get("run_id"):
            return None
        from mlflow.tracking import MlflowClient

        uri = record.get("tracking_uri") or ""
        asked = self.tracking_uri  # the setting as given: a relative one is the same setting from another cwd
        same = {record.get("tracking_uri_setting"), uri, absolute_uri(uri)}
        if asked and asked not in same and absolute_uri(asked) not in same:
            self._elsewhere(record, f"store {uri}", f"logger.mlflow.tracking_uri={absolute_uri(asked)}")
            return None
        local = uri.removeprefix("sqlite:///").split("?", 1)[0] if uri.startswith("sqlite:///") else None
        if local is not None and not Path(local).is_file():
            owner = f"a store that is no longer there ({local})"
        else:
            with _store_lock(uri):
                self.client = MlflowClient(tracking_uri=uri)
            run = self.client.get_run(record["run_id"])
            owner = run.data.tags.get("vitsweep.run_dir") or ""
            if owner and (owner == here or (Path(owner).exists() and os.path.samefile(owner, here))):  # any spelling
                kept = self.client.get_experiment(run.info.experiment_id).name if self.experiment_name else None
                if kept is None or kept == self.experiment_name:
                    return run
                self._elsewhere(record, f"experiment {kept}", f"logger.mlflow.experiment_name={self.experiment_name}")
                return None
        log.warning(f"logger=mlflow: {TRACKER_FILE} in {here} names MLflow run {record['run_id']} of {owner}, not "
                    "of this run dir (copied or moved): this run gets an MLflow run of its own, sent the rows "
                    "metrics.jsonl keeps, and the other run is left as it was")
        return None

    @staticmethod
    def _elsewhere(record: Mapping[str, Any], kept: str, asked: str) -> None:
        log.warning(f"logger=mlflow: this resumed run's MLflow run {record['run_id']} is in {kept}, and {asked} "
                    "names another: the run goes on in a new MLflow run there, sent the rows metrics.jsonl keeps, and "
                    f"{TRACKER_FILE} names the new one; the earlier run keeps the steps it logged")

    def _retag(self, run: Any, tags: Mapping[str, Any]) -> None:
        """A retried trial resumes the run dir of the trial it retries, under its own number: the run's study and
        trial tags and its name follow, and ``vitsweep.trial_numbers`` keeps every trial that trained it."""
        old = run.data.tags
        numbers = old.get("vitsweep.trial_numbers") or old.get("vitsweep.trial_number")
        for k, v in tags.items():
            if old.get(f"vitsweep.{k}") != str(v):
                self.client.set_tag(self.run_id, f"vitsweep.{k}", str(v))
        if "trial_number" in tags and old.get("vitsweep.trial_number") != str(tags["trial_number"]):
            numbers = f"{numbers},{tags['trial_number']}" if numbers else str(tags["trial_number"])
            self.client.update_run(self.run_id, name=f"trial-{tags['trial_number']}")
            self.client.set_tag(self.run_id, "vitsweep.trial_numbers", numbers)  # written only when a trial changes

    def _supersede(self, run_dir: Path) -> None:
        """End as KILLED the MLflow runs of earlier starts whose files were moved aside (``previous-*``; a start
        that died before its first checkpoint, or ``trainer.resume=never``) and that no process will end: they
        showed RUNNING for ever. Each is tagged with the run that replaced it, and so is an ended one of this run dir
        (its ``vitsweep.run_dir`` now holds another run's records)."""
        from mlflow.tracking import MlflowClient

        here = str(run_dir.absolute())
        for old in sorted(run_dir.glob(f"previous-*/{TRACKER_FILE}")):
            with contextlib.suppress(Exception):  # best effort: the record is kept in any case
                record = json.loads(old.read_text()).get("mlflow", {})
                client = MlflowClient(tracking_uri=record["tracking_uri"])
                run = client.get_run(record["run_id"])
                if run.info.status == "RUNNING":
                    client.set_tag(record["run_id"], "vitsweep.superseded_by", self.run_id)
                    client.set_terminated(record["run_id"], status="KILLED")
                elif "vitsweep.superseded_by" not in run.data.tags and _same_dir(run.data.tags, here):
                    client.set_tag(record["run_id"], "vitsweep.superseded_by", self.run_id)

    def _experiment(self, tags: Mapping[str, Any]) -> str:
        name = self.experiment_name or tags.get("study_name") or DEFAULT_EXPERIMENT
        found = self.client.get_experiment_by_name(name)
        return found.experiment_id if found is not None else self.client.create_experiment(name)

    def log_metrics(self, row: Mapping[str, Any]) -> None:
        step = int(row["step"])
        if step <= self.seen_through:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in numbers(row).items()])

    def rewind(self, step: int, rows: list[Mapping[str, Any]]) -> None:
        """MLflow cannot delete a metric point: the run keeps what it logged from ``step`` on, and the tag
        ``vitsweep.records_rewritten_from_step`` names each step from which ``metrics.jsonl`` differs."""
        tags = self.client.get_run(self.run_id).data.tags
        steps = [s for s in tags.get(REWRITTEN_TAG, "").split(",") if s]
        self.client.set_tag(self.run_id, REWRITTEN_TAG, ",".join([*steps, str(step)]))

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        for k in SUMMARY_TAGS:
            v = summary.get(k)
            self.client.set_tag(self.run_id, k, json.dumps(v) if isinstance(v, bool) or v is None else str(v))
        old = self.client.get_run(self.run_id).data.tags
        for k in FACT_TAGS:
            if summary.get(k) is not None:
                self.client.set_tag(self.run_id, k, str(summary[k]))
            elif k in old:  # an earlier start's (e.g. stacked, then resumed alone): not how this summary trained
                self.client.delete_tag(self.run_id, k)
        if summary["stop_reason"] != "interrupted":  # a resumed run logs its final objective at a later step
            self.client.log_metric(self.run_id, "objective", float(summary["objective"]), step=int(summary["steps"]))
        status = "KILLED" if summary["stop_reason"] == "interrupted" else MLFLOW_STATUS[summary["status"]]
        self.client.set_terminated(self.run_id, status=status)
        self.run_id = None

    def close(self, status: str = "FAILED", dropped: str | None = None) -> None:
        """End a run that no summary ended (an exception, or a stop, before one was written); ``dropped``: the call
        and cause for which the tracker was dropped mid-run, tagged on the run (ended ``KILLED``: its record was cut
        short while the training went on, and its run dir's summary.json holds the result)."""
        if self.run_id is not None:
            run_id, self.run_id = self.run_id, None
            if dropped is not None:
                self.client.set_tag(run_id, DROPPED_TAG, f"{dropped}; the run dir holds the whole run")
            self.client.set_terminated(run_id, status=status)
