"""Experiment trackers (``logger=tensorboard``, ``logger=mlflow``, or ``logger=[tensorboard,mlflow]``): every
evaluation row of ``metrics.jsonl``, the run's flattened config and its summary, sent to TensorBoard or MLflow
as well as to the run dir (which stays the record analysis reads). Details in ``docs/trackers.md``.

A tracker is ``start(run_dir, cfg, resume_step, tags)``, ``log_metrics(row)``, ``log_summary(summary)`` and
``close()``. ``Trackers`` holds the chosen ones for one run and shields the run from them: a tracker that fails
(an unreachable server, an unwritable store) is dropped with one warning naming it and the cause, and training
goes on. A tracker's package loads only when a run starts it, so ``logger=none`` imports neither; a package that
is not installed is refused before any training (``check_trackers``, from ``src.validate.check_config``).

A resumed run continues its tracker run: TensorBoard discards the events after the checkpoint's step
(``purge_step``), and MLflow reopens the run whose id ``tracker.json`` keeps in the run dir and logs only the
steps it has not seen, so a killed and resumed run is one curve with no step twice. A retried trial renames the
MLflow run it continues; a run dir copied or moved elsewhere gets an MLflow run of its own (``tracker.json`` names
a run tagged with another run dir); a tracker run that starts on a resumed run dir is sent the rows it kept.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import math
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from hydra.types import RunMode

from hydra_plugins.vitsweep_sweeper.protocol import flatten_config
from src.checkpoint import atomic_write

log = logging.getLogger(__name__)

EXTRAS = {"tensorboard": "tensorboard", "mlflow": "mlflow"}  # tracker -> the package it imports (= its extra)
TRACKER_FILE = "tracker.json"  # a run's MLflow run id and store, so a resumed run continues it
SUMMARY_TAGS = ("status", "stop_reason", "objective_name", "stalled", "collapsed")
# how the run trained, as its summary records it (precision=auto and model.attention=auto resolve per machine; a
# stacked member trains with the explicit attention ops): tagged where present
FACT_TAGS = ("precision", "device", "attention", "attention_trained", "stacked_members")
DEFAULT_EXPERIMENT = "vitsweep"  # MLflow's experiment outside an Optuna study
MLFLOW_STATUS = {"completed": "FINISHED", "stopped": "FINISHED", "failed": "FAILED"}
MAX_PARAM_CHARS = 6000  # MLflow's limit on a param value
PARAMS_PER_BATCH = 100  # MLflow's limit on params per log_batch


def chosen(cfg: Mapping[str, Any]) -> list[str]:
    """The trackers a composed config asks for: the keys of its ``logger`` node (none for ``logger=none``)."""
    return list(cfg.get("logger") or {})


def check_trackers(cfg: Mapping[str, Any]) -> None:
    """Refuse an unknown tracker, or one whose package is not installed, before any training."""
    for name in chosen(cfg):
        if name not in EXTRAS:
            raise ValueError(f"logger.{name} is not a tracker: choose logger=none, tensorboard, mlflow or "
                             "[tensorboard,mlflow]")
        if importlib.util.find_spec(EXTRAS[name]) is None:
            raise ValueError(f"logger={name} needs the {EXTRAS[name]} package, which is not installed: "
                             f"pip install 'vitsweep[{name}]' (or choose logger=none)")


def sweep_dir_of(hydra_cfg: Any) -> Path | None:
    """The sweep dir of a multirun job (its run dir less ``hydra.sweep.subdir``), None for a single run.
    ``hydra_cfg`` is ``HydraConfig.get()`` inside the job (where the subdir's interpolations resolve)."""
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return None
    depth = len(Path(str(hydra_cfg.sweep.subdir)).parts)
    return Path(hydra_cfg.runtime.output_dir).absolute().parents[depth - 1]


def flat_params(cfg: Mapping[str, Any]) -> dict[str, str | int | float | bool]:
    """The config as ``{"model.dim": 64, ...}``; values that are not numbers, strings or bools as JSON text."""
    out = {}
    for k, v in flatten_config({k: v for k, v in cfg.items() if k != "logger"}).items():
        out[k] = v if isinstance(v, (str, int, float, bool)) else json.dumps(v)
    return out


def numbers(row: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of an evaluation row (bools as 0/1), ``step`` left out (it is the x axis); what
    ``metrics.jsonl`` writes as null (a NaN, e.g. ``train_error_noisy_subset`` without label noise) is left out."""
    return {k: float(v) for k, v in row.items()
            if k != "step" and isinstance(v, (int, float)) and math.isfinite(v)}


def kept_rows(run_dir: Path, resume_step: int) -> list[dict]:
    """The rows ``metrics.jsonl`` keeps up to ``resume_step`` (a resume has cut it back to its checkpoint): what a
    tracker run that starts on a resumed run dir (a tracker added on resume, a run dir copied or moved) sends first,
    so that its curve is the run's whole curve."""
    path = Path(run_dir) / "metrics.jsonl"
    if resume_step <= 0 or not path.is_file():
        return []
    rows = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return [r for r in rows if int(r.get("step", 0)) <= resume_step]


class TensorBoardTracker:
    """Event files in ``<run dir>/tensorboard``: each row's numbers as scalars at its step, the config as
    hparams (with the study and trial), the summary as text and ``summary/*`` scalars."""

    name = "tensorboard"

    def __init__(self, flush_secs: float = 10):
        self.flush_secs = flush_secs
        self.writer = None

    def start(self, run_dir: Path, cfg: Mapping[str, Any], resume_step: int, tags: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        log_dir = Path(run_dir) / "tensorboard"
        fresh = not any(log_dir.glob("events.out.tfevents.*"))
        # resumed: readers discard this run's events from the first step after the checkpoint on (logged before a
        # kill, about to be logged again)
        self.writer = SummaryWriter(str(log_dir), purge_step=None if fresh else resume_step + 1,
                                    flush_secs=self.flush_secs)
        if fresh:
            for summary in hparams({**flat_params(cfg), **tags}, {"summary/objective": math.nan}):
                self.writer.file_writer.add_summary(summary)
            for row in kept_rows(run_dir, resume_step):  # a tracker added to a resumed run: its curve so far
                self.log_metrics(row)
        elif tags:  # a resumed start (a retried trial resumes the run dir under its own trial number)
            self.writer.add_text("vitsweep/start", json.dumps(dict(tags)), resume_step + 1)

    def log_metrics(self, row: Mapping[str, Any]) -> None:
        for k, v in numbers(row).items():
            self.writer.add_scalar(k, v, row["step"])

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        step = summary["steps"]
        self.writer.add_text("summary", json.dumps({k: summary.get(k) for k in (*SUMMARY_TAGS, "objective")}), step)
        if summary["stop_reason"] != "interrupted":  # a resumed run logs its final summary at a later step
            for k in ("objective", "stalled", "collapsed"):
                self.writer.add_scalar(f"summary/{k}", float(summary[k]), step)
        self.writer.flush()

    def close(self, status: str = "FAILED") -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


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
        return self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{home / 'mlflow.db'}"

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
            text = json.dumps({"mlflow": {"tracking_uri": uri, "experiment_id": experiment_id,
                                          "run_id": self.run_id}}, indent=2) + "\n"
            atomic_write(path, lambda f: f.write(text.encode()))
            self._supersede(Path(run_dir))
        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=items[i:i + PARAMS_PER_BATCH])
        for row in kept_rows(run_dir, resume_step):  # what the MLflow run lacks of the run's curve so far (a new
            self.log_metrics(row)  # run on a resumed run dir, or MLflow dropped at an earlier start): steps it has skip

    def _reopen(self, record: Mapping[str, Any], here: str) -> Any:
        """The MLflow run ``tracker.json`` names, to continue; None where there is none, or where it belongs to
        another run dir (this one was copied or moved: continuing would write into the original's run), or where
        its local SQLite store is gone (moved with its folder). A store that cannot be reached raises: the tracker
        is dropped for this start and ``tracker.json`` is kept for the next."""
        if not record.get("run_id"):
            return None
        from mlflow.tracking import MlflowClient

        uri = record.get("tracking_uri") or ""
        local = uri.removeprefix("sqlite:///").split("?", 1)[0] if uri.startswith("sqlite:///") else None
        if local is not None and not Path(local).is_file():
            owner = f"a store that is no longer there ({local})"
        else:
            with _store_lock(uri):
                self.client = MlflowClient(tracking_uri=uri)
            run = self.client.get_run(record["run_id"])
            owner = run.data.tags.get("vitsweep.run_dir") or ""
            if owner and (owner == here or (Path(owner).exists() and os.path.samefile(owner, here))):  # any spelling
                return run
        log.warning(f"logger=mlflow: {TRACKER_FILE} in {here} names MLflow run {record['run_id']} of {owner}, not "
                    "of this run dir (copied or moved): this run gets an MLflow run of its own, sent the rows "
                    "metrics.jsonl keeps, and the other run is left as it was")
        return None

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
        showed RUNNING for ever. Each is tagged with the run that replaced it."""
        from mlflow.tracking import MlflowClient

        for old in sorted(run_dir.glob(f"previous-*/{TRACKER_FILE}")):
            with contextlib.suppress(Exception):  # best effort: the record is kept in any case
                record = json.loads(old.read_text()).get("mlflow", {})
                client = MlflowClient(tracking_uri=record["tracking_uri"])
                if client.get_run(record["run_id"]).info.status == "RUNNING":
                    client.set_tag(record["run_id"], "vitsweep.superseded_by", self.run_id)
                    client.set_terminated(record["run_id"], status="KILLED")

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

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        for k in SUMMARY_TAGS:
            v = summary.get(k)
            self.client.set_tag(self.run_id, k, json.dumps(v) if isinstance(v, bool) or v is None else str(v))
        for k in FACT_TAGS:
            if summary.get(k) is not None:
                self.client.set_tag(self.run_id, k, str(summary[k]))
        if summary["stop_reason"] != "interrupted":  # a resumed run logs its final objective at a later step
            self.client.log_metric(self.run_id, "objective", float(summary["objective"]), step=int(summary["steps"]))
        status = "KILLED" if summary["stop_reason"] == "interrupted" else MLFLOW_STATUS[summary["status"]]
        self.client.set_terminated(self.run_id, status=status)
        self.run_id = None

    def close(self, status: str = "FAILED") -> None:
        if self.run_id is not None:  # ended without a summary (an exception, or a stop, before one was written)
            self.client.set_terminated(self.run_id, status=status)
            self.run_id = None


class Trackers:
    """The trackers of one run, each call shielded: the first exception of a tracker drops it with one warning
    naming the tracker and the cause, and the run goes on (its run dir stays complete)."""

    def __init__(self, trackers: list | None = None):
        self.active = list(trackers or [])

    def _each(self, method: str, *args: Any) -> None:
        for tracker in list(self.active):
            try:
                getattr(tracker, method)(*args)
            except Exception as e:
                self.active.remove(tracker)
                log.warning(f"logger={tracker.name}: {method} failed ({type(e).__name__}: {str(e).strip()[:500]}); "
                            f"nothing more is sent to {tracker.name} for this run, which goes on and writes its run "
                            "dir in full (docs/trackers.md)")
                with contextlib.suppress(Exception):
                    tracker.close()

    def start(self, run_dir: Path, cfg: Mapping[str, Any], resume_step: int, tags: Mapping[str, Any]) -> None:
        self._each("start", run_dir, cfg, resume_step, tags)

    def log_metrics(self, row: Mapping[str, Any]) -> None:
        self._each("log_metrics", row)

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        self._each("log_summary", summary)

    def close(self, status: str = "FAILED") -> None:
        """End the trackers; ``status``: what an MLflow run without a summary ends as (``KILLED``: a stop)."""
        self._each("close", status)
        self.active = []


def open_trackers(cfg: Mapping[str, Any], run_dir: Path, resume_step: int, info: Mapping[str, Any],
                  sweep_dir: Path | None = None) -> Trackers:
    """Start the trackers ``cfg["logger"]`` names for the run in ``run_dir`` at ``resume_step`` (0: a fresh
    start); ``info`` is the summary's facts (the study and trial, in a sweep)."""
    options = cfg.get("logger") or {}
    made = []
    for name in chosen(cfg):
        kwargs = dict(options[name] or {})
        made.append(TensorBoardTracker(**kwargs) if name == "tensorboard" else MLflowTracker(**kwargs,
                                                                                            sweep_dir=sweep_dir))
    tags = {k: info[k] for k in ("study_name", "trial_number") if k in info}
    trackers = Trackers(made)
    trackers.start(Path(run_dir), cfg, resume_step, tags)
    return trackers
