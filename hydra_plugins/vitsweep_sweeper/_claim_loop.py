"""A worker's loop: under the claim lock it fails the trials of dead workers (enqueueing their retries), then takes
a waiting retry, or counts the study's trials against `n_trials` and asks Optuna for the next trial(s) (a grid's
next unclaimed point, in the study's one order); it launches the job(s) through Hydra's launcher, with a heartbeat
running, and tells Optuna each result. With the budget claimed it waits while other workers' trials run (one of
them may die)."""

import logging
import signal
import time
from typing import Any

import optuna
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import Trial, TrialState

from . import _liveness as liveness
from . import _protocol as protocol
from . import _search_space as search_spaces
from . import _storage as storages
from . import _study as studies
from . import _submitit
from ._signals import StopSignal, signals_ignored

log = logging.getLogger(__name__)


class ClaimLoop:
    """Claiming, launching and telling trials for `SweeperImpl` (a mixin: it reads the sweeper's settings)."""

    def _work(self, study: optuna.Study, progress: studies.Progress) -> None:
        """Claim, launch and tell trials until the budget is used and no other worker's trial is running."""
        poll_s = max(0.2, min(self.heartbeat_s, 1.0))
        stop = StopSignal()
        numbered = hasattr(self.launcher, "job_numbers")  # a launcher that runs a batch under given job numbers
        orphan_exit_s = max(self.grace_s, 30.0)  # an orphaned worker's time to hand its trials back
        said_waiting = False  # said once, and only by a worker that found nothing to claim from its start
        with liveness.Heartbeat(self.storage, self.heartbeat_s, orphan_exit_s) as beat, stop.installed():
            while not self._check_failures(study, final=False):
                stop.check()
                with storages.claim_lock(self.url, self.storage, studies.study_id(study)):
                    if beat.orphaned():  # not only within a heartbeat: a retry handed back now would be claimed
                        log.error("the main sweep process is gone; this worker claims no more trials")
                        raise SystemExit(128 + signal.SIGTERM)
                    self.reaper.reap(study)
                    claim = self._claim(study, numbered)
                    if claim is None:
                        return
                    trials, jobs = claim
                    overrides = [self._configure(t) for t in trials]
                if not trials:  # the budget is claimed, other workers' trials run: wait, one of them may die
                    if not said_waiting:
                        said_waiting = True
                        log.info("every trial of the budget is claimed by other workers' batches (up to "
                                 f"hydra.sweeper.n_jobs={self.n_jobs} trials each): this worker waits, and takes over "
                                 "the trials of any worker that stops answering. To share the budget between "
                                 "processes, give the first a smaller hydra.sweeper.n_jobs")
                    time.sleep(poll_s)
                    progress.poll()
                    continue
                said_waiting = True  # it claimed trials: later waits are a sweep's ordinary tail
                beat.trial_ids = [studies.trial_id(t) for t in trials]
                try:
                    runs = self._composed_runs(study, trials, jobs, overrides, numbered)
                except (KeyboardInterrupt, SystemExit) as e:  # Ctrl-C while the jobs are composed
                    self._hand_back(study, trials, e)
                    raise
                beat.trial_ids = [studies.trial_id(t) for run in runs for t in run[0]]
                tellers: list[Teller] = []
                try:  # a stop between two runs (a Ctrl-C while one is told) hands back the later ones too
                    for run_trials, run_jobs, run_overrides in runs:
                        told = Teller(self, study, dict(zip(run_jobs, run_trials, strict=True)), beat, progress, stop)
                        tellers.append(told)
                        if numbered:
                            self.launcher.job_numbers = run_jobs
                        if hasattr(self.launcher, "on_job_done"):  # a launcher that reports each job as it ends
                            self.launcher.on_job_done = told
                        try:
                            with stop.armed():  # a SIGTERM noted while claiming hands these trials back, too
                                returns = self.launcher.launch(run_overrides, initial_job_idx=run_jobs[0])
                        finally:
                            if numbered:
                                self.launcher.job_numbers = None
                            if hasattr(self.launcher, "on_job_done"):
                                self.launcher.on_job_done = None
                        for j, ret in zip(run_jobs, returns, strict=True):
                            told(j, ret)  # what the launcher did not report as it went
                except (KeyboardInterrupt, SystemExit) as e:  # SIGINT, or SIGTERM stopping a run (trainer.resume)
                    self._hand_back(study, trials, e)  # the batch's later runs too: RUNNING, not launched
                    raise
                for told in tellers:  # a tell's error once every run of the batch ran and was told, as for one run
                    told.raise_deferred()  # (raised after the first, it left the later runs RUNNING, never launched)
                beat.trial_ids = []

    def _composed_runs(self, study: optuna.Study, trials: list[Trial], jobs: list[int], overrides: list[list[str]],
                       numbered: bool) -> list[tuple[list[Trial], list[int], list[list[str]]]]:
        """The claimed batch as launches, ``(trials, job numbers, overrides)``, without the jobs whose config Hydra
        cannot compose: each of those fails its trial now with Hydra's error, and is not retried (it would fail the
        same way). Hydra's basic and the vectorized launchers compose a batch's jobs inside ``launch`` and raise at
        the first that does not compose, which stopped the sweep with the whole batch RUNNING: every later start
        retried the batch and stopped at the same job (review 2026-11-30). A launcher that numbers a batch's jobs on
        from the first gets the rest in runs of consecutive job numbers (each job keeps its run dir); the
        submitit launcher composes each job itself and fails only that one (``_submitit``)."""
        if isinstance(self.launcher, _submitit.SubmititBatches):
            return [(trials, jobs, overrides)]
        runs: list[tuple[list[Trial], list[int], list[list[str]]]] = []
        for trial, job, lines in zip(trials, jobs, overrides, strict=True):
            error = job_compose_error(self.hydra_context.config_loader, self.config, lines)
            if error is not None:
                self._fail(study, trial, f"{error}\n(Hydra job #{job}'s config does not compose: the trial was not "
                                         "launched, and is not retried)")
                continue
            if runs and (numbered or runs[-1][1][-1] + 1 == job):
                runs[-1][0].append(trial)
                runs[-1][1].append(job)
                runs[-1][2].append(lines)
            else:
                runs.append(([trial], [job], [lines]))
        return runs

    def _hand_back(self, study: optuna.Study, trials: list[Trial], e: BaseException) -> None:
        """This worker is stopping mid-trial: fail its trials and enqueue their retries now, so that no worker
        has to wait `grace_s` for them (the retry continues from the run's checkpoint when it has one). A second
        Ctrl-C or SIGTERM meanwhile is ignored, so it cannot leave a trial failed without its retry."""
        why = (f"worker {liveness.owner_id()} was stopped mid-trial (interrupted: {type(e).__name__} {e}) and handed "
               "it back")
        with signals_ignored(), storages.claim_lock(self.url, self.storage, studies.study_id(study)):
            for t in trials:
                frozen = self.storage.get_trial(studies.trial_id(t))
                if frozen.state == TrialState.RUNNING:
                    log.warning(liveness.fail_and_retry(study, frozen, why, self.max_retries, counted=False))

    def _claim(self, study: optuna.Study, numbered: bool = False) -> tuple | None:
        """(trials, their job numbers) to run now; ([], []) to wait for others' running trials; None when done.
        Waiting trials (retries) go first, each under its original's job number (so it runs in that run dir): as
        many as `n_jobs` in one batch with a launcher that takes the batch's job numbers (`numbered`), else as
        many as have consecutive job numbers (a launcher numbers a batch's jobs on from the first)."""
        trials = study.get_trials(deepcopy=False)
        waiting = [t for t in trials if t.state == TrialState.WAITING]  # in trial number order, as ask() takes them
        counted = studies.budget_trials(trials)
        if waiting:
            n = min(len(waiting), self.n_jobs) if numbered else _consecutive_jobs(waiting, self.n_jobs)
        else:
            n = min(self.n_jobs, self.budget - len(counted))
        if n <= 0:
            running = any(t.state == TrialState.RUNNING for t in trials)
            return ([], []) if running else None
        if not waiting and self.grid is not None:
            taken = {studies.point_key(studies.params_of(t), self.grid) for t in counted}
            free = [p for p in self.points if studies.point_key(p, self.grid) not in taken]
            for point in free[:n]:
                study.enqueue_trial(point)
        asked = [study.ask() for _ in range(n)]
        owner = liveness.owner_id()
        jobs = []
        for t in asked:
            job = self.storage.get_trial_system_attrs(studies.trial_id(t)).get(studies.JOB_ATTR, t.number)
            for key, value in ((studies.WORKER_ATTR, owner), (studies.HEARTBEAT_ATTR, time.time()),
                               (studies.JOB_ATTR, job)):
                self.storage.set_trial_system_attr(studies.trial_id(t), key, value)
            jobs.append(job)
        return asked, jobs

    def _configure(self, trial: Trial) -> list[str]:
        for name, dist in self.space.items():
            _suggest(trial, name, dist)
        for name, value in self.fixed.items():
            trial.set_user_attr(name, value)
        if self.extend is not None:
            self.extend(self.config, trial)
        overlap = trial.params.keys() & {search_spaces.bare(k) for k in self.fixed}  # `++lr` fixes `lr`
        if overlap:
            raise ValueError(f"hydra.sweeper.custom_search_space suggests fixed parameters {sorted(overlap)}")
        out: list[str] = []
        for name, value in trial.params.items():
            if name in (self.presets or {}):  # a sampled preset key (a fixed one is not sampled)
                out += list(self.presets[name][str(value)])
            else:
                out.append(f"{name}={_fmt(value)}")
        out += self.fixed_lines()
        return out + protocol.env_overrides(protocol.TrialIdentity(self.name, trial.number, self.url))

    def _tell(self, study: optuna.Study, trial: Trial, ret: JobReturn) -> None:
        if ret.hydra_cfg is not None:
            trial.set_user_attr("run_dir", str(ret.hydra_cfg.hydra.runtime.output_dir))
        if ret.status == JobStatus.FAILED:
            exc = protocol.job_exception(ret)
            if isinstance(exc, optuna.TrialPruned):
                study.tell(trial, state=TrialState.PRUNED)
                return
            if isinstance(exc, _submitit.JobDied):  # as a dead worker's trial: failed as interrupted, and retried
                with storages.claim_lock(self.url, self.storage, studies.study_id(study)):
                    frozen = self.storage.get_trial(studies.trial_id(trial))
                    msg = liveness.fail_and_retry(study, frozen, str(exc), self.max_retries)
                (log.debug if "retried as trial" in msg else log.warning)(msg)  # a retry: the progress line says so
                return
            self._fail(study, trial, f"{type(exc).__name__}: {exc}")
            return
        raw = ret.return_value
        values = list(raw) if isinstance(raw, (list, tuple)) or OmegaConf.is_list(raw) else [raw]
        if len(values) != len(self.directions):
            msg = (f"hydra.sweeper.direction has {len(self.directions)} entries but the task returned "
                   f"{len(values)} values ({raw!r})")
            self._fail(study, trial, msg)
            raise ValueError(msg)
        try:
            values = [float(v) for v in values]
        except (TypeError, ValueError):
            self._fail(study, trial, f"the task returned {raw!r}, not {len(self.directions)} number(s)")
            return
        if not studies.is_finite(values):
            self._fail(study, trial, f"non-finite objective {values}")
            return
        study.tell(trial, values=values)

    def _fail(self, study: optuna.Study, trial: Trial, error: str) -> None:
        trial.set_user_attr("error", error[:2000])
        study.tell(trial, state=TrialState.FAIL)
        log.warning(f"Trial {trial.number} failed: {error}")

    def _check_failures(self, study: optuna.Study, final: bool) -> bool:
        """True once failures exceed max_failure_rate of the budget; raises at the end of the sweep."""
        failed = [t for t in studies.budget_trials(study.get_trials(deepcopy=False)) if t.state == TrialState.FAIL]
        if len(failed) <= self.max_failure_rate * self.budget:
            return False
        if final:
            raise RuntimeError(
                f"{len(failed)} of {self.budget} trials failed, more than hydra.sweeper.max_failure_rate="
                f"{self.max_failure_rate}; last error: {failed[-1].user_attrs.get('error')}"
            )
        return True

    # ------------------------------------------------------------------ local worker processes


def job_compose_error(loader: Any, config: Any, overrides: list[str]) -> str | None:
    """Hydra's error composing the job config of ``overrides`` (``load_sweep_config``, as the launcher will), or None.
    The vectorized launcher keeps the config this composes and runs the job with it (``vitsweep_launcher._validated``
    knows this function by its name), so the job is composed once."""
    try:
        loader.load_sweep_config(config, overrides)
    except Exception as e:  # noqa: BLE001 - any composition error is the job's own
        return f"{type(e).__name__}: {e}"
    return None


def _consecutive_jobs(waiting: list, n_jobs: int) -> int:
    """How many of the waiting trials, from the first, have consecutive job numbers (at most n_jobs)."""
    jobs = [t.system_attrs.get(studies.JOB_ATTR, t.number) for t in waiting[:n_jobs]]
    n = 1
    while n < len(jobs) and jobs[n] == jobs[n - 1] + 1:
        n += 1
    return n


class Teller:
    """Tells each trial of a launched batch its result once, as its job ends (with a launcher that reports
    jobs as they end) or when the batch returns: finished trials leave RUNNING at once, so a batch stopped
    halfway hands back only the trials still running. An error of a tell (the task returned the wrong number
    of values, a storage error) is raised when the batch has returned, not inside the launcher's loop; the
    trial keeps its heartbeat until its tell succeeds."""

    def __init__(self, impl: "ClaimLoop", study: optuna.Study, by_job: dict[int, Trial], beat: liveness.Heartbeat,
                 progress: studies.Progress, stop: StopSignal) -> None:
        self.impl, self.study, self.by_job, self.beat = impl, study, by_job, beat
        self.progress, self.stop = progress, stop
        self.error: Exception | None = None

    def __call__(self, job: int, ret: JobReturn) -> None:
        trial = self.by_job.pop(job, None)
        if trial is None:  # told already
            return
        with self.stop.deferred():  # a SIGTERM waits until this trial is told
            lost = ("trial {} was failed by another worker as not answering (raise hydra.sweeper.grace_s?); its "
                    "result is dropped and its retry stands for it")
            try:
                if self.impl.storage.get_trial(studies.trial_id(trial)).state.is_finished():
                    log.warning(lost.format(trial.number))
                else:
                    self.impl._tell(self.study, trial, ret)
            except UpdateFinishedTrialError:
                log.warning(lost.format(trial.number))
            except Exception as e:  # noqa: BLE001 - raised after the batch; the trial keeps its heartbeat till then
                self.error = self.error or e
                return
            self.beat.trial_ids = [i for i in self.beat.trial_ids if i != studies.trial_id(trial)]
            try:
                self.progress.poll()
            except Exception as e:  # noqa: BLE001 - the progress line only
                log.debug(f"progress: {e}")

    def raise_deferred(self) -> None:
        if self.error is not None:
            raise self.error


def _suggest(trial: Trial, name: str, dist: Any) -> None:
    if isinstance(dist, CategoricalDistribution):
        trial.suggest_categorical(name, dist.choices)
    elif isinstance(dist, IntDistribution):
        trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    elif isinstance(dist, FloatDistribution):
        trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)
    else:
        raise TypeError(f"unsupported distribution {dist!r} for {name}")


def _fmt(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, str) and any(c in value for c in " ,()[]{}'\"=:"):
        return protocol.quote(value)
    return str(value)
