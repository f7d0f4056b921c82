"""Liveness of workers on any host: heartbeats, and failing plus retrying the trials of dead workers.

Optuna's own heartbeat works only inside `study.optimize()`; the sweeper uses ask/tell, so it keeps its
own. Each worker bumps `vitsweep:heartbeat` of its running trials every `heartbeat_s`. Any worker, while
it holds the claim lock, fails a RUNNING trial of another worker when that worker's process is gone (same
host) or its heartbeat has not moved for `grace_s` by the reaper's own clock (any host; no clock sync
needed), and enqueues a retry with the same parameters, linked both ways in the trial records.
"""

import logging
import os
import socket
import threading
import time
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState, create_trial

from ._study import (
    HEARTBEAT_ATTR,
    JOB_ATTR,
    RESUMED_ATTR,
    RETRY_DUE_ATTR,
    WORKER_ATTR,
    params_of,
    study_id,
    study_storage,
    trial_id,
)
from .parent_watch import alive, watch_parent

log = logging.getLogger(__name__)
PARENT_ENV = "VITSWEEP_PARENT_PID"  # set for worker processes: the sweep's main process


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


_watching: list[threading.Thread] = []  # this process's watch of the main sweep process (one per process)


class Heartbeat:
    """A daemon thread that bumps the heartbeat of this worker's running trials every `heartbeat_s`. In a worker
    process it also starts the watch (`parent_watch`) that sends the worker SIGTERM once the main sweep process
    is gone, and ends it `orphan_exit_s` later if it has not stopped by then."""

    def __init__(self, storage: optuna.storages.BaseStorage, heartbeat_s: float, orphan_exit_s: float) -> None:
        self.storage, self.heartbeat_s, self.orphan_exit_s = storage, heartbeat_s, orphan_exit_s
        self.trial_ids: list[int] = []
        self.parent = int(os.environ.get(PARENT_ENV) or 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vitsweep-heartbeat", daemon=True)

    def __enter__(self) -> "Heartbeat":
        if self.parent and not _watching:
            _watching.append(watch_parent(self.parent, grace_s=self.orphan_exit_s, on_gone=self._orphan_message,
                                          poll_s=min(1.0, self.heartbeat_s)))
        self._thread.start()
        return self

    def _orphan_message(self) -> None:
        log.error(f"the main sweep process {self.parent} is gone; stopping this worker")

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def orphaned(self) -> bool:
        """True in a worker process whose main sweep process is gone."""
        return bool(self.parent) and os.getppid() != self.parent

    def _run(self) -> None:
        next_beat = time.monotonic() + self.heartbeat_s
        while not self._stop.wait(min(1.0, self.heartbeat_s)):
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + self.heartbeat_s
                for trial_id in list(self.trial_ids):
                    try:
                        self.storage.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, time.time())
                    except Exception as e:  # noqa: BLE001 - a finished trial or a busy storage: try next time
                        log.debug(f"heartbeat of trial id {trial_id}: {e}")


class Reaper:
    """Fails the RUNNING trials of dead workers and enqueues their retries; call it under the claim lock."""

    def __init__(self, grace_s: float, max_retries: int) -> None:
        self.grace_s, self.max_retries, self.me = grace_s, max_retries, owner_id()
        self.seen: dict[int, tuple[Any, float]] = {}  # trial id -> (heartbeat value, when first seen here)

    def why_dead(self, t: FrozenTrial, starting: bool = False) -> str | None:
        """Why `t` (RUNNING) has no live worker, or None. Call it under the claim lock: a trial is claimed and
        given its owner under that lock, so one without an owner belongs to a claimer that stopped in between."""
        owner = str(t.system_attrs.get(WORKER_ATTR, ""))
        if not owner:
            return "claimed by a worker that stopped before it recorded itself (no owner)"
        if owner == self.me:  # a process that is only starting holds no trial: its pid was reused
            return f"worker {owner} stopped answering (its process is gone)" if starting else None
        host, _, pid = owner.rpartition(":")
        if host == socket.gethostname() and pid.isdigit() and not alive(int(pid)):
            return f"worker {owner} stopped answering (its process is gone)"
        beat, now = t.system_attrs.get(HEARTBEAT_ATTR), time.monotonic()
        last = self.seen.get(trial_id(t))
        if last is None or last[0] != beat:
            self.seen[trial_id(t)] = (beat, now)
            return None
        if now - last[1] > self.grace_s:
            return f"worker {owner} stopped answering (no heartbeat for {now - last[1]:.0f} s)"
        return None

    def reap(self, study: optuna.Study, starting: bool = False) -> list[str]:
        """Fail and retry every RUNNING trial whose worker is gone; one log line each. A death counts against
        max_retries unless the trial was RUNNING when a command started. ``starting`` (a command's start):
        the trials an earlier command left RUNNING are failed and retried without counting when their process
        is gone, and the others (another host's, known dead only once their heartbeat has been still for
        grace_s) are marked, so that whoever reaps them later does not count them either. A command's end (a
        session's end, a reboot, SIGKILL) is not a trial's fault."""
        lines = []
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            why = self.why_dead(t, starting)
            if why is None:
                if starting:
                    study_storage(study).set_trial_system_attr(trial_id(t), RESUMED_ATTR, True)
                continue
            counted = not starting and not t.system_attrs.get(RESUMED_ATTR)
            lines.append(fail_and_retry(study, t, why, self.max_retries, counted=counted))
            log.warning(lines[-1])
        if starting:  # once a command, as it reads every trial: a retry lost by a process killed mid-write
            lines += enqueue_lost_retries(study)
        return lines


def fail_and_retry(study: optuna.Study, t: FrozenTrial, why: str, max_retries: int, counted: bool = True) -> str:
    """Mark `t` FAIL (interrupted) and, while it has retries left, enqueue the same parameters as a new trial
    that records `retry_of` and `retries` and keeps `t`'s Hydra job number, so it runs in `t`'s run dir.
    ``counted=False`` (a deliberate stop: SIGTERM or SIGINT, after the run saved its checkpoint; or a trial
    found, when a command starts, left RUNNING by an earlier command that is gone) always enqueues the retry
    and does not use up `max_retries`, which is for workers that die while the sweep goes on.
    Call it under the claim lock. The decision is written into `t` (`RETRY_DUE_ATTR`) before the FAIL, so a
    process killed between the FAIL and the enqueue leaves a trial that `enqueue_lost_retries` completes."""
    storage = study_storage(study)
    retries = int(t.user_attrs.get("retries", 0))
    due = not counted or retries < max_retries
    try:
        storage.set_trial_user_attr(trial_id(t), "error", why)
        storage.set_trial_user_attr(trial_id(t), "interrupted", True)
        if due:
            storage.set_trial_system_attr(trial_id(t), RETRY_DUE_ATTR, retries + 1 if counted else retries)
        storage.set_trial_state_values(trial_id(t), TrialState.FAIL)
    except UpdateFinishedTrialError:
        return f"trial {t.number} finished while being failed as interrupted; not retried"
    if not due:
        return f"trial {t.number} failed: {why}; not retried (hydra.sweeper.max_retries={max_retries})"
    number = _enqueue_retry(study, t, retries + 1 if counted else retries)
    return (f"trial {t.number} failed: {why}; retried as trial {number} with the same parameters"
            + ("" if counted else " (a stop of the sweep: not counted against hydra.sweeper.max_retries)"))


def enqueue_lost_retries(study: optuna.Study) -> list[str]:
    """Enqueue the retries that `fail_and_retry` decided on but never wrote, because its process was killed
    between failing the trial and enqueuing the retry; one log line each. Call it under the claim lock, where
    no live process is between those two writes."""
    trials = study.get_trials(deepcopy=False)
    named = {t.user_attrs["retry_of"] for t in trials if "retry_of" in t.user_attrs}
    lines = []
    for t in trials:
        if t.state == TrialState.FAIL and RETRY_DUE_ATTR in t.system_attrs and t.number not in named:
            number = _enqueue_retry(study, t, int(t.system_attrs[RETRY_DUE_ATTR]))
            lines.append(f"trial {t.number} failed ({t.user_attrs.get('error', 'interrupted')}) and the process "
                         f"failing it stopped before it enqueued the retry: retried as trial {number}")
            log.warning(lines[-1])
    return lines


# trial system attrs of Optuna's SuccessiveHalvingPruner (and Hyperband's): the value a trial reached each rung with
PRUNER_RUNG_PREFIX = "completed_rung_"


def _enqueue_retry(study: optuna.Study, t: FrozenTrial, retries: int) -> int:
    """Enqueue `t`'s parameters as a WAITING trial that names `t` (`retry_of`) and runs in its run dir. It carries
    `t`'s intermediate values and pruner rungs: its run resumes from `t`'s checkpoint and reports only the epochs after
    it, so a retry that started its history over was judged by the pruner on those alone (the median pruner compares
    the best value so far; a successive-halving rung took a late epoch's value) and its warm-up started over."""
    storage = study_storage(study)
    rungs = {k: v for k, v in t.system_attrs.items() if k.startswith(PRUNER_RUNG_PREFIX)}
    template = create_trial(
        state=TrialState.WAITING,
        system_attrs={"fixed_params": params_of(t), JOB_ATTR: t.system_attrs.get(JOB_ATTR, t.number), **rungs},
        user_attrs={"retry_of": t.number, "retries": retries},
        intermediate_values=dict(t.intermediate_values),
    )
    return storage.get_trial_number_from_id(storage.create_new_trial(study_id(study), template_trial=template))
