"""``logger=tensorboard``: a run's evaluations, config and summary as TensorBoard event files in its run dir.

A resumed run continues its event files: TensorBoard discards the events after the checkpoint's step
(``purge_step``, and a second session start there: TensorBoard's server purges only at a start after its first), so
a killed and resumed run is one curve with no step twice; a tracker added to a resumed run, dropped at an earlier start
or absent from one, is sent the rows the run dir kept beyond the last step its event files hold. The package loads
only when a run starts the tracker (``src.trackers``).
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from src.trackers_payload import SUMMARY_TAGS, flat_params, kept_rows, numbers


def _logged_through(log_dir: Path) -> int:
    """The last step of the rows the event files in ``log_dir`` hold, as TensorBoard reads them (the events a later
    session start purged left out); -1 for none."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})  # all of them: a purge may cut the last ones
    acc.Reload()
    return max((e.step for e in acc.Scalars("epoch")), default=-1) if "epoch" in acc.Tags()["scalars"] else -1


class TensorBoardTracker:
    """Event files in ``<run dir>/tensorboard``: each row's numbers as scalars at its step, the config as
    hparams (with the study and trial), the summary as text and ``summary/*`` scalars."""

    name = "tensorboard"

    def __init__(self, flush_secs: float = 10):
        self.flush_secs = flush_secs
        self.writer = None
        self.start_text = None  # this start's vitsweep/start text and its step, which a rewind must not discard

    def start(self, run_dir: Path, cfg: Mapping[str, Any], resume_step: int, tags: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        log_dir = Path(run_dir) / "tensorboard"
        fresh = not any(log_dir.glob("events.out.tfevents.*"))
        logged = -1 if fresh else _logged_through(log_dir)  # read before this start's session start purges
        # resumed: readers discard this run's events from the first step after the checkpoint on (logged before a
        # kill, about to be logged again)
        self.writer = SummaryWriter(str(log_dir), purge_step=None if fresh else resume_step + 1,
                                    flush_secs=self.flush_secs)
        if not fresh:  # TensorBoard's server takes the first session start it reads for the run's beginning, and
            self._session_start(resume_step + 1)  # purges only at a later one: the writer's, written once, did not
        if fresh:  # the experiment and session start: the session's end is written with the summary (log_summary)
            for summary in hparams({**flat_params(cfg), **tags}, {"summary/objective": math.nan})[:2]:
                self.writer.file_writer.add_summary(summary)
        elif tags:  # a resumed start (a retried trial resumes the run dir under its own trial number)
            self.start_text = (json.dumps(dict(tags)), resume_step + 1)
            self.writer.add_text("vitsweep/start", *self.start_text)
        # what the event files lack of the run's curve so far (a tracker added to a resumed run, or dropped or absent
        # at an earlier start), at steps before the session start, which readers therefore keep
        for row in kept_rows(run_dir, resume_step, logged):
            self.log_metrics(row)

    def log_metrics(self, row: Mapping[str, Any]) -> None:
        for k, v in numbers(row).items():
            self.writer.add_scalar(k, v, row["step"])

    def rewind(self, step: int, rows: list[Mapping[str, Any]]) -> None:
        """Readers discard this run's events from ``step`` on (as ``purge_step`` does when a writer opens: a session
        start at that step), then ``rows``, what ``metrics.jsonl`` now holds there, are logged in their place."""
        self._session_start(step)
        for row in rows:
            self.log_metrics(row)
        if self.start_text is not None and self.start_text[1] >= step:
            self.writer.add_text("vitsweep/start", *self.start_text)

    def _session_start(self, step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        self.writer.file_writer.add_event(Event(step=step, session_log=SessionLog(status=SessionLog.START)))

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        step = summary["steps"]
        self.writer.add_text("summary", json.dumps({k: summary.get(k) for k in (*SUMMARY_TAGS, "objective")}), step)
        if summary["stop_reason"] != "interrupted":  # a resumed run logs its final summary at a later step
            for k in ("objective", "stalled", "collapsed"):
                self.writer.add_scalar(f"summary/{k}", float(summary[k]), step)
            self._end_session(summary["status"] != "failed")
        self.writer.flush()

    def _end_session(self, succeeded: bool) -> None:
        """The HParams dashboard's status of the run (it filters sessions by it, and keeps the first one written):
        torch's ``hparams()`` makes it STATUS_SUCCESS, so it is written only here, as the run ends."""
        import time

        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

        end = plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS if succeeded else api_pb2.STATUS_FAILURE,
                                             end_time_secs=time.time())
        smd = metadata.create_summary_metadata(plugin_data_pb2.HParamsPluginData(session_end_info=end))
        self.writer.file_writer.add_summary(Summary(value=[Summary.Value(tag=metadata.SESSION_END_INFO_TAG,
                                                                         metadata=smd)]))

    def close(self, status: str = "FAILED", dropped: str | None = None) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
