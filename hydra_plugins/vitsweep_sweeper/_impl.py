"""The vitsweep sweeper's work (imported lazily, so Hydra's plugin scan stays fast).

A worker loops: under the claim lock it fails the trials of dead workers (enqueueing their retries),
then takes a waiting retry, or counts the study's trials against `n_trials` and asks Optuna for the next
trial(s) (a grid's next unclaimed point, in the study's one order); it launches the job(s) through
Hydra's launcher, with a heartbeat running, and tells Optuna the result. With the budget claimed it
waits while other workers' trials run (one of them may die). With `n_workers=K > 1` this process re-runs
its own command K times as worker subprocesses and prints progress from the storage. Jobs learn their trial
through `hydra.job.env_set` (see protocol.py), never through a key of their config; a retry runs under its
original's job number.
"""

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import HydraContext, TaskFunction
from hydra.utils import get_method
from omegaconf import DictConfig, OmegaConf, open_dict
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import Trial, TrialState

from . import _liveness as lv
from . import _protocol as protocol
from . import _search_space as ss
from . import _storage as sto
from . import _study as st
from . import _submitit

log = logging.getLogger(__name__)

WORKER_KEYS = ("hydra.sweeper.n_workers", "hydra.sweeper.worker_id", "hydra.sweeper.storage",
               "hydra.sweeper.study_name", "hydra.sweep.dir")
SEARCH_SPACE_URL = "https://hydra.cc/docs/upgrades/1.1_to_1.2/changes_to_sweeper_config/"


class SweeperImpl:
    def __init__(
        self,
        sampler: Any,
        direction: Any,
        storage: str | None,
        study_name: str | None,
        n_trials: int,
        n_jobs: int,
        max_failure_rate: float,
        search_space: DictConfig | None = None,
        params: DictConfig | None = None,
        custom_search_space: str | None = None,
        pruner: Any = None,
        n_workers: int = 1,
        presets: DictConfig | None = None,
        worker_id: int = 0,
        heartbeat_s: float = 30.0,
        grace_s: float | None = None,
        max_retries: int = 1,
    ) -> None:
        self.direction, self.storage_url, self.study_name = direction, storage, study_name
        self.n_trials, self.n_jobs, self.n_workers, self.worker_id = n_trials, n_jobs, n_workers, worker_id
        self.max_failure_rate = max_failure_rate
        self.search_space, self.params, self.presets = search_space, params, presets
        self.custom_search_space = custom_search_space
        self.heartbeat_s, self.max_retries = heartbeat_s, max_retries
        self.grace_s = 4 * heartbeat_s if grace_s is None else grace_s

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            config=config, hydra_context=hydra_context, task_function=task_function
        )
        if _submitit.is_submitit(self.launcher):  # collect a batch job by job: a dead job's trial is retried
            poll_s = 10.0 if _submitit.is_remote(config) else max(0.2, min(self.heartbeat_s, 1.0))  # sacct sparingly
            self.launcher = _submitit.SubmititBatches(self.launcher, poll_s=poll_s)
        self.sweep_dir = str(config.hydra.sweep.dir)

    # ------------------------------------------------------------------ validation, before any trial
    def _validate(self, arguments: list[str]) -> None:
        if not isinstance(self.n_workers, int) or self.n_workers < 1:
            raise ValueError(f"hydra.sweeper.n_workers must be an integer >= 1, got {self.n_workers!r}")
        if self.n_trials < 1:
            raise ValueError(f"hydra.sweeper.n_trials must be >= 1, got {self.n_trials}")
        if self.n_jobs < 1:
            raise ValueError(f"hydra.sweeper.n_jobs must be >= 1, got {self.n_jobs}")
        if not 0.0 <= self.max_failure_rate <= 1.0:
            raise ValueError(f"hydra.sweeper.max_failure_rate must be in [0, 1], got {self.max_failure_rate}")
        if not self.heartbeat_s > 0 or not self.grace_s > self.heartbeat_s:
            raise ValueError(f"hydra.sweeper.heartbeat_s ({self.heartbeat_s}) must be > 0 and hydra.sweeper.grace_s "
                             f"({self.grace_s}) longer than one heartbeat (default: 4 heartbeats)")
        if self.max_retries < 0:
            raise ValueError(f"hydra.sweeper.max_retries must be >= 0, got {self.max_retries}")
        if OmegaConf.is_config(self.storage_url) or isinstance(self.storage_url, dict):
            raise ValueError("hydra.sweeper.storage: vitsweep takes a storage URL, not a node with _target_ (its "
                             "workers and jobs reopen the storage by URL): use sqlite:///path.db, journal:///path.log "
                             "(Optuna's JournalStorage) or postgresql+psycopg://user:pw@host/db")

        # The sampler and pruner come unbuilt (_recursive_: false); read them from the config, where the
        # string shorthands are resolved, and build them per worker with a resume-aware seed.
        self.sampler_node = st.sampler_node(OmegaConf.select(self.config, "hydra.sweeper.sampler"))
        self.pruner_node = st.pruner_node(OmegaConf.select(self.config, "hydra.sweeper.pruner"))
        self.pruner = st.build(self.pruner_node, "pruner")
        self.is_grid = self.sampler_node.get("_target_") == "optuna.samplers.GridSampler"

        params = dict(self.params or {})
        if self.search_space is not None:
            if self.params:  # as hydra-optuna-sweeper 1.2: params wins, with a warning
                msg = ("Both hydra.sweeper.params and hydra.sweeper.search_space are configured.\nHydra will use "
                       f"hydra.sweeper.params for defining search space.\n{SEARCH_SPACE_URL}")
                warnings.warn(msg, UserWarning, stacklevel=2)
                log.warning(msg)
            else:
                log.warning(f"hydra.sweeper.search_space is deprecated; use hydra.sweeper.params ({SEARCH_SPACE_URL})")
                params = ss.from_legacy(self.search_space)
        if self.is_grid and self.sampler_node.get("search_space"):  # HOS: GridSampler's own value lists
            params.update({k: "choice(" + ",".join(map(str, v)) + ")"
                           for k, v in self.sampler_node.search_space.items()})
        self.space, self.fixed = ss.parse(params, arguments, grid=self.is_grid)
        self.grid = ss.grid(self.space) if self.is_grid else None
        self._check_presets()
        self.extend: Callable[[DictConfig, Trial], None] | None = None
        if self.custom_search_space:
            path = self.custom_search_space.lstrip(".")  # ".module.fn": a module beside the script
            try:
                self.extend = get_method(path)
            except Exception as e:  # noqa: BLE001
                raise ValueError(f"hydra.sweeper.custom_search_space: cannot load {path!r}: {e}") from e

        self.job_config = self._job_config()
        self.directions = self._directions()
        self.url = sto.normalize(self.storage_url or st.default_storage(self.sweep_dir))
        self.storage = sto.open_storage(self.url)
        if self.study_name:
            self.name = self.study_name
        else:  # as hydra-optuna-sweeper: a new study on every run (a named study resumes its budget)
            self.name = f"{self.config.hydra.job.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
            log.info(f"hydra.sweeper.study_name is null: new study {self.name!r} (name the study to resume it later)")

    def _job_config(self, overrides: list[str] | None = None) -> DictConfig:
        """The job config every trial shares: the primary config with the fixed overrides, as the launcher
        composes each job (the sampled keys keep their config-file values here). ``overrides`` go before the fixed
        ones, as a preset's do in a trial's command line."""
        fixed = [ss.override_line(k, v) for k, v in self.fixed.items()]
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, [*(overrides or []), *fixed])
        with open_dict(cfg):
            del cfg["hydra"]
        return cfg

    def _directions(self) -> list[str]:
        """`hydra.sweeper.direction`, by default the direction of the job's `trainer.objective` in vitsweep's trainer
        (accuracies, AUCs and the binary scores maximise, errors and losses minimise, `auto` picks an error, so it
        minimises), else minimize as in hydra-optuna-sweeper. An explicit direction that contradicts the objective
        is an error."""
        objective = OmegaConf.select(self.job_config, "trainer.objective", default=None)
        implied = _trainer_direction(str(objective)) if objective is not None else None
        if self.direction is None:
            return [implied or "minimize"]
        raw = list(self.direction) if OmegaConf.is_list(self.direction) or isinstance(self.direction, list) \
            else [self.direction]
        directions = [getattr(d, "name", str(d)).lower() for d in raw]
        bad = [d for d in directions if d not in ("minimize", "maximize")]
        if bad or not directions:
            raise ValueError(f"hydra.sweeper.direction: expected minimize/maximize or a list of them, got {raw}")
        if implied is not None and directions != [implied]:
            raise ValueError(
                f"hydra.sweeper.direction={directions[0] if len(directions) == 1 else directions} contradicts "
                f"trainer.objective={objective}, which the trainer returns and which should be {implied}d: "
                f"delete hydra.sweeper.direction (it follows the objective), or set it to {implied}, or choose "
                "another trainer.objective")
        return directions

    def _check_presets(self) -> None:
        for key, table in (self.presets or {}).items():
            if key in self.fixed:
                continue  # fixed from the command line: the preset is not used
            dist = self.space.get(key)
            if not isinstance(dist, CategoricalDistribution):
                raise ValueError(f"hydra.sweeper.presets.{key}: {key} must be a choice in hydra.sweeper.params")
            missing = [c for c in dist.choices if str(c) not in table]
            if missing:
                raise ValueError(f"hydra.sweeper.presets.{key}: no overrides for choices {missing}")

    def _open_study(self) -> optuna.Study:
        try:
            study_id = self.storage.get_study_id_from_name(self.name)
            n_existing = len(self.storage.get_all_trials(study_id, deepcopy=False))
            old = [d.name.lower() for d in self.storage.get_study_directions(study_id)]
            if old != self.directions:
                raise ValueError(
                    f"hydra.sweeper.direction: study {self.name!r} in {self.url} was created with {old}, "
                    f"not {self.directions}; use another hydra.sweeper.study_name"
                )
            self._check_recipe(study_id)
            self._check_grid(study_id)
        except KeyError:
            n_existing = 0
        node = OmegaConf.to_container(self.sampler_node)
        node.pop("search_space", None)
        if "seed" in node and not node["_target_"].endswith(("QMCSampler", "GridSampler")):
            node["seed"] = st.worker_seed(node["seed"], n_existing, self.worker_id)
        sampler = st.build(OmegaConf.create(node), "sampler")
        if self.is_grid:
            sampler = ClaimedGridSampler(self.grid, **sampler.keywords)
        study = optuna.create_study(
            study_name=self.name, storage=self.storage, sampler=sampler, pruner=self.pruner,
            directions=self.directions, load_if_exists=True,
        )
        self.storage.set_study_system_attr(
            study._study_id, st.PRUNER_ATTR, OmegaConf.to_container(self.pruner_node, resolve=True)
        )
        if self.is_grid:
            self._grid_order(study, node.get("seed"))
        if self.worker_id == 0:
            study.set_user_attr("fixed_overrides", self.fixed)
            attrs = self.storage.get_study_system_attrs(study._study_id)
            if st.RECIPE_ATTR not in attrs:
                self.storage.set_study_system_attr(study._study_id, st.RECIPE_ATTR, self._recipe())
            if self.is_grid and st.GRID_ATTR not in attrs:
                self.storage.set_study_system_attr(study._study_id, st.GRID_ATTR, self.grid)
        return study

    def _recipe(self, trials: list | None = None, version: int = st.RECIPE_VERSION) -> dict[str, Any]:
        """What a study's trials compute, flattened, without the keys a trial samples (its params, and those of the
        study's trials so far, custom_search_space's included). Version 2: one flattened job config per preset
        choice, composed as its trials are (the config, the choice's overrides, the fixed ones), so a key that only
        some choices set, the contents of a config group a choice selects, and a fixed override of a key the
        presets set are all in it; without presets one config, named "". Version 1 (studies recorded before
        2026-11-25): the shared config without every key any preset sets, so a change to such a key (e.g.
        heads_depth's optimizer.lr, which only the CNN preset sets) went unnoticed; such a study keeps that check."""
        sampled = set(self.space) | _trial_keys(trials or [])
        presets = {key: table for key, table in (self.presets or {}).items() if key not in self.fixed}
        if version == 1:
            for table in presets.values():
                sampled |= {o.split("=", 1)[0] for overrides in table.values() for o in overrides}
            return _without(_flat(OmegaConf.to_container(self.job_config, resolve=False)), sampled)
        configs = {f"{key}={choice}": self._job_config([str(o) for o in overrides])
                   for key, table in presets.items() for choice, overrides in table.items()} or {"": self.job_config}
        return {st.RECIPE_VERSION_KEY: version,
                "configs": {name: _without(_flat(OmegaConf.to_container(cfg, resolve=False)), sampled)
                            for name, cfg in configs.items()}}

    def _check_recipe(self, study_id: int) -> None:
        """A named study resumes only with the recipe it was started with: a changed key fails before any trial."""
        saved = self.storage.get_study_system_attrs(study_id).get(st.RECIPE_ATTR)
        if saved is None:  # a study started before the recipe was recorded
            return
        version = int(saved.get(st.RECIPE_VERSION_KEY, 1))
        if version > st.RECIPE_VERSION:
            raise ValueError(f"hydra.sweeper.study_name={self.name!r}: this study in {sto.safe(self.url)} recorded its "
                             f"recipe in version {version}, newer than this vitsweep's {st.RECIPE_VERSION}: upgrade "
                             "vitsweep to resume it")
        trials = self.storage.get_all_trials(study_id, deepcopy=False)
        keys = _trial_keys(trials)
        current = self._recipe(trials, version)
        if version == 1:
            diff = _recipe_differences(_without(saved, keys), current)
        else:  # a change in every preset choice is named once; one in some choices, with those choices
            where: dict[str, list[str]] = {}
            common = sorted(saved["configs"].keys() & current["configs"].keys())
            for name in common:
                for line in _recipe_differences(_without(saved["configs"][name], keys), current["configs"][name]):
                    where.setdefault(line, []).append(name)
            diff = [line if len(names) == len(common) else f"{line} (in {', '.join(names)})"
                    for line, names in where.items()]
        if diff:
            raise ValueError(
                f"hydra.sweeper.study_name={self.name!r}: this study in {sto.safe(self.url)} was started with another "
                "recipe, so resuming it would mix two experiments:\n  " + "\n  ".join(diff)
                + "\nfix: restore those values to finish the study, or start a new one (another "
                "hydra.sweeper.study_name, or study_name: null for a new auto-named study on every run)")

    def _check_grid(self, study_id: int) -> None:
        """A grid study resumes only with its own grid: its points so far were claimed from that grid, so another
        would run some points twice or never, and Optuna cannot place its earlier trials in it (found resuming a
        pilot with one of its two sizes). Refused before the study is touched."""
        saved = self.storage.get_study_system_attrs(study_id).get(st.GRID_ATTR)
        if saved is None or not self.is_grid:  # a study started before the grid was recorded, or another sampler
            return

        def show(values):
            return "(not swept)" if values is None else "[" + ", ".join(map(str, values)) + "]"
        changed = [k for k in sorted(saved.keys() | self.grid.keys()) if saved.get(k) != self.grid.get(k)]
        diff = [f"{k}: {show(saved.get(k))} -> {show(self.grid.get(k))}" for k in changed]
        if diff:
            raise ValueError(
                f"hydra.sweeper.params: grid study {self.name!r} in {sto.safe(self.url)} was started with another "
                "grid, so resuming it would run some points twice or never:\n  " + "\n  ".join(diff)
                + "\nfix: restore the grid to finish the study, or start a new one (another hydra.sweeper.study_name "
                "or hydra.sweep.dir)")

    def _grid_order(self, study: optuna.Study, seed: int | None) -> None:
        """The study's grid order comes from the seed it was started with: every later process keeps it."""
        attrs = self.storage.get_study_system_attrs(study._study_id)
        if st.GRID_SEED_ATTR not in attrs:
            self.storage.set_study_system_attr(study._study_id, st.GRID_SEED_ATTR, seed)
        elif attrs[st.GRID_SEED_ATTR] != seed:
            log.warning(f"hydra.sweeper.sampler.seed={seed} is ignored: study {self.name!r} keeps the grid order of "
                        f"seed {attrs[st.GRID_SEED_ATTR]}, so every point still runs once")
        self.points = st.grid_points(self.grid, attrs.get(st.GRID_SEED_ATTR, seed))

    # ------------------------------------------------------------------ sweep
    def sweep(self, arguments: list[str]) -> None:
        self._validate(arguments)
        study = self._open_study()
        self.budget = self.n_trials if self.grid is None else min(self.n_trials, len(self.points))
        self.reaper = lv.Reaper(self.grace_s, self.max_retries)
        if self.worker_id == 0:
            with sto.claim_lock(self.url, self.storage, study._study_id):  # an earlier command's trials: resumed
                reaped = self.reaper.reap(study, starting=True)
            log.info(
                f"Study {self.name!r} in {sto.safe(self.url)}: sampler {type(study.sampler).__name__}, pruner "
                f"{type(self.pruner).__name__}, directions {self.directions}, budget {self.budget} trials, "
                f"{self._n_finished(study)} already done, {self.n_workers} worker(s)"
                + (f"; {len(reaped)} interrupted trial(s) will be retried" if reaped else "")
            )
        progress = st.Progress(study, self.budget, log, self.max_retries)
        lost = self._run_workers(study, progress) if self.n_workers > 1 else []
        # a lost worker's trials are failed and retried; when the others had already ended (nothing left for
        # them to claim before the loss was noticed), the retries run here
        if self.n_workers == 1 or (lost and self._n_finished(study) < self.budget):
            self._work(study, progress)
        if self.worker_id == 0:
            self._finish_sweep(study, lost)

    def _n_finished(self, study: optuna.Study) -> int:
        return sum(t.state.is_finished() for t in st.budget_trials(study.get_trials(deepcopy=False)))

    def _finish_sweep(self, study: optuna.Study, lost: list[str]) -> None:
        results = st.write_results(study, self.sweep_dir)
        path = Path(self.sweep_dir) / "optimization_results.yaml"
        log.info(f"Done: {results['states']}; {len(results['retried'])} retried, {len(results['failed'])} failed; "
                 f"results in {path}")
        self._check_failures(study, final=True)
        done = self._n_finished(study)
        if done < self.budget:
            raise RuntimeError(f"study {self.name!r} has {done} of {self.budget} trials finished"
                               + (f" after losing {', '.join(lost)}" if lost else "")
                               + "; run the same command again to finish it")

    def _work(self, study: optuna.Study, progress: st.Progress) -> None:
        """Claim, launch and tell trials until the budget is used and no other worker's trial is running."""
        poll_s = max(0.2, min(self.heartbeat_s, 1.0))
        stop = _StopSignal()
        numbered = hasattr(self.launcher, "job_numbers")  # a launcher that runs a batch under given job numbers
        orphan_exit_s = max(self.grace_s, 30.0)  # an orphaned worker's time to hand its trials back
        with lv.Heartbeat(self.storage, self.heartbeat_s, orphan_exit_s) as beat, stop.installed():
            while not self._check_failures(study, final=False):
                stop.check()
                with sto.claim_lock(self.url, self.storage, study._study_id):
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
                    time.sleep(poll_s)
                    progress.poll()
                    continue
                beat.trial_ids = [t._trial_id for t in trials]
                told = _Teller(self, study, dict(zip(jobs, trials, strict=True)), beat, progress, stop)
                if numbered:
                    self.launcher.job_numbers = jobs
                if hasattr(self.launcher, "on_job_done"):  # a launcher that reports each job as it ends
                    self.launcher.on_job_done = told
                try:
                    with stop.armed():  # a SIGTERM noted while claiming hands these trials back, too
                        returns = self.launcher.launch(overrides, initial_job_idx=jobs[0])
                except (KeyboardInterrupt, SystemExit) as e:  # SIGINT, or SIGTERM stopping a run (trainer.resume)
                    self._hand_back(study, trials, e)
                    raise
                finally:
                    if numbered:
                        self.launcher.job_numbers = None
                    if hasattr(self.launcher, "on_job_done"):
                        self.launcher.on_job_done = None
                for j, ret in zip(jobs, returns, strict=True):
                    told(j, ret)  # what the launcher did not report as it went
                told.raise_deferred()
                beat.trial_ids = []

    def _hand_back(self, study: optuna.Study, trials: list[Trial], e: BaseException) -> None:
        """This worker is stopping mid-trial: fail its trials and enqueue their retries now, so that no worker
        has to wait `grace_s` for them (the retry continues from the run's checkpoint when it has one). A second
        Ctrl-C or SIGTERM meanwhile is ignored, so it cannot leave a trial failed without its retry."""
        why = f"worker {lv.owner_id()} stopped answering (interrupted: {type(e).__name__} {e})"
        with _signals_ignored(), sto.claim_lock(self.url, self.storage, study._study_id):
            for t in trials:
                frozen = self.storage.get_trial(t._trial_id)
                if frozen.state == TrialState.RUNNING:
                    log.warning(lv.fail_and_retry(study, frozen, why, self.max_retries, counted=False))

    def _claim(self, study: optuna.Study, numbered: bool = False) -> tuple | None:
        """(trials, their job numbers) to run now; ([], []) to wait for others' running trials; None when done.
        Waiting trials (retries) go first, each under its original's job number (so it runs in that run dir): as
        many as `n_jobs` in one batch with a launcher that takes the batch's job numbers (`numbered`), else as
        many as have consecutive job numbers (a launcher numbers a batch's jobs on from the first)."""
        trials = study.get_trials(deepcopy=False)
        waiting = [t for t in trials if t.state == TrialState.WAITING]  # in trial number order, as ask() takes them
        counted = st.budget_trials(trials)
        if waiting:
            n = min(len(waiting), self.n_jobs) if numbered else _consecutive_jobs(waiting, self.n_jobs)
        else:
            n = min(self.n_jobs, self.budget - len(counted))
        if n <= 0:
            running = any(t.state == TrialState.RUNNING for t in trials)
            return ([], []) if running else None
        if not waiting and self.grid is not None:
            taken = {st.point_key(st.params_of(t), self.grid) for t in counted}
            free = [p for p in self.points if st.point_key(p, self.grid) not in taken]
            for point in free[:n]:
                study.enqueue_trial(point)
        asked = [study.ask() for _ in range(n)]
        owner = lv.owner_id()
        jobs = []
        for t in asked:
            job = self.storage.get_trial_system_attrs(t._trial_id).get(st.JOB_ATTR, t.number)
            for key, value in ((st.WORKER_ATTR, owner), (st.HEARTBEAT_ATTR, time.time()), (st.JOB_ATTR, job)):
                self.storage.set_trial_system_attr(t._trial_id, key, value)
            jobs.append(job)
        return asked, jobs

    def _configure(self, trial: Trial) -> list[str]:
        for name, dist in self.space.items():
            _suggest(trial, name, dist)
        for name, value in self.fixed.items():
            trial.set_user_attr(name, value)
        if self.extend is not None:
            self.extend(self.config, trial)
        overlap = trial.params.keys() & self.fixed.keys()
        if overlap:
            raise ValueError(f"hydra.sweeper.custom_search_space suggests fixed parameters {sorted(overlap)}")
        out: list[str] = []
        for name, value in trial.params.items():
            if name in (self.presets or {}) and name not in self.fixed:
                out += list(self.presets[name][str(value)])
            else:
                out.append(f"{name}={_fmt(value)}")
        out += [ss.override_line(k, v) for k, v in self.fixed.items()]
        return out + protocol.env_overrides(protocol.TrialIdentity(self.name, trial.number, self.url))

    def _tell(self, study: optuna.Study, trial: Trial, ret: JobReturn) -> None:
        if ret.hydra_cfg is not None:
            trial.set_user_attr("run_dir", str(ret.hydra_cfg.hydra.runtime.output_dir))
        if ret.status == JobStatus.FAILED:
            exc = ret._return_value
            if isinstance(exc, optuna.TrialPruned):
                study.tell(trial, state=TrialState.PRUNED)
                return
            if isinstance(exc, _submitit.JobDied):  # as a dead worker's trial: failed as interrupted, and retried
                with sto.claim_lock(self.url, self.storage, study._study_id):
                    msg = lv.fail_and_retry(study, self.storage.get_trial(trial._trial_id), str(exc), self.max_retries)
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
        if not st.is_finite(values):
            self._fail(study, trial, f"non-finite objective {values}")
            return
        study.tell(trial, values=values)

    def _fail(self, study: optuna.Study, trial: Trial, error: str) -> None:
        trial.set_user_attr("error", error[:2000])
        study.tell(trial, state=TrialState.FAIL)
        log.warning(f"Trial {trial.number} failed: {error}")

    def _check_failures(self, study: optuna.Study, final: bool) -> bool:
        """True once failures exceed max_failure_rate of the budget; raises at the end of the sweep."""
        failed = [t for t in st.budget_trials(study.get_trials(deepcopy=False)) if t.state == TrialState.FAIL]
        if len(failed) <= self.max_failure_rate * self.budget:
            return False
        if final:
            raise RuntimeError(
                f"{len(failed)} of {self.budget} trials failed, more than hydra.sweeper.max_failure_rate="
                f"{self.max_failure_rate}; last error: {failed[-1].user_attrs.get('error')}"
            )
        return True

    # ------------------------------------------------------------------ local worker processes
    def _run_workers(self, study: optuna.Study, progress: st.Progress) -> list[str]:
        """Start the workers and wait for them; a worker that dies is reported, its trial is failed and
        retried by the others (or at once here), and the rest go on. Returns the lost workers."""
        logs = Path(self.sweep_dir) / "workers"
        logs.mkdir(parents=True, exist_ok=True)
        procs, lost = [], []
        try:
            for i in range(1, self.n_workers + 1):
                cmd = self._worker_command(i)
                out = open(logs / f"worker-{i}.log", "w")
                # jobs on other machines (submitit_slurm) get their own resources: this machine's are not shared out
                remote = _submitit.is_remote(self.config)
                env = {**os.environ, lv.PARENT_ENV: str(os.getpid())} if remote else _worker_env(i, self.n_workers)
                procs.append((subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                               preexec_fn=None if remote else _pin(i, self.n_workers)), out))
            log.info(f"Started {self.n_workers} workers; logs in {logs}; worker command: {shlex.join(cmd)}")
            reported = set()
            while any(p.poll() is None for p, _ in procs):
                time.sleep(1.0)
                for i, (p, _) in enumerate(procs, 1):
                    if p.poll() not in (None, 0) and i not in reported:
                        reported.add(i)
                        lost.append(self._lost_worker(study, i, p, logs))
                progress.poll()
            progress.poll()
        finally:
            for p, out in procs:
                if p.poll() is None:
                    p.terminate()
                    p.wait()
                out.close()
        for i, (p, _) in enumerate(procs, 1):
            if p.returncode not in (None, 0) and i not in reported:
                lost.append(self._lost_worker(study, i, p, logs))
        return lost

    def _lost_worker(self, study: optuna.Study, i: int, proc: subprocess.Popen, logs: Path) -> str:
        tail = (logs / f"worker-{i}.log").read_text(errors="replace").splitlines()[-15:]
        log.error(f"lost worker {i} (pid {proc.pid}, exit {proc.returncode}); the others go on. Its log ends:\n"
                  + "\n".join(tail))
        with sto.claim_lock(self.url, self.storage, study._study_id):
            self.reaper.reap(study)
        return f"worker {i} (exit {proc.returncode})"

    def _worker_command(self, worker_id: int) -> list[str]:
        argv = list(getattr(sys, "orig_argv", [sys.executable] + sys.argv))
        argv[0] = sys.executable
        keep = [a for a in argv if a.lstrip("+~").split("=", 1)[0] not in WORKER_KEYS]
        return keep + [
            "hydra.sweeper.n_workers=1",
            f"hydra.sweeper.worker_id={worker_id}",
            f"hydra.sweeper.storage={protocol.quote(self.url)}",
            f"hydra.sweeper.study_name={protocol.quote(self.name)}",
            f"hydra.sweep.dir={protocol.quote(str(Path(self.sweep_dir).absolute()))}",
        ]


def _trainer_direction(objective: str) -> str | None:
    """The direction of vitsweep's trainer objective (its own rule, `src.validate`), or None in another app."""
    try:
        from src.validate import objective_direction
    except ImportError:
        return None
    return objective_direction(objective)


def _recipe_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`key: saved -> current` for each differing key. In vitsweep's trainer this is the check a run makes before
    it resumes a checkpoint (`src.checkpoint.config_differences`, same runtime keys), so the two agree."""
    try:
        from src.checkpoint import config_differences
    except ImportError:
        pass
    else:
        return config_differences(saved, current)
    return [f"{k}: {saved.get(k, '<absent>')!r} -> {current.get(k, '<absent>')!r}"
            for k in sorted(saved.keys() | current.keys()) if saved.get(k) != current.get(k)]


def _consecutive_jobs(waiting: list, n_jobs: int) -> int:
    """How many of the waiting trials, from the first, have consecutive job numbers (at most n_jobs)."""
    jobs = [t.system_attrs.get(st.JOB_ATTR, t.number) for t in waiting[:n_jobs]]
    n = 1
    while n < len(jobs) and jobs[n] == jobs[n - 1] + 1:
        n += 1
    return n


def _trial_keys(trials: list) -> set[str]:
    return {k for t in trials for k in st.params_of(t)}


def _without(flat: dict[str, Any], keys: set[str]) -> dict[str, Any]:
    """`flat` without `keys` (override keys: a leading +, ++ or ~ is dropped) and anything under them."""
    keys = {k.lstrip("+~") for k in keys}
    return {k: v for k, v in flat.items() if not any(k == s or k.startswith(s + ".") for s in keys)}


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


class _Teller:
    """Tells each trial of a launched batch its result once, as its job ends (with a launcher that reports
    jobs as they end) or when the batch returns: finished trials leave RUNNING at once, so a batch stopped
    halfway hands back only the trials still running. An error of a tell (the task returned the wrong number
    of values, a storage error) is raised when the batch has returned, not inside the launcher's loop; the
    trial keeps its heartbeat until its tell succeeds."""

    def __init__(self, impl: SweeperImpl, study: optuna.Study, by_job: dict[int, Trial], beat: lv.Heartbeat,
                 progress: st.Progress, stop: "_StopSignal") -> None:
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
                if self.impl.storage.get_trial(trial._trial_id).state.is_finished():
                    log.warning(lost.format(trial.number))
                else:
                    self.impl._tell(self.study, trial, ret)
            except UpdateFinishedTrialError:
                log.warning(lost.format(trial.number))
            except Exception as e:  # noqa: BLE001 - raised after the batch; the trial keeps its heartbeat till then
                self.error = self.error or e
                return
            self.beat.trial_ids = [i for i in self.beat.trial_ids if i != trial._trial_id]
            try:
                self.progress.poll()
            except Exception as e:  # noqa: BLE001 - the progress line only
                log.debug(f"progress: {e}")

    def raise_deferred(self) -> None:
        if self.error is not None:
            raise self.error


class _StopSignal:
    """SIGTERM to a worker running trials (where no run's own handler has it: the trainer's, in-process) stops
    it as Ctrl-C does, so it hands its running trials back (fails them, enqueues their retries) before it
    exits, instead of dying with them RUNNING. The first SIGTERM counts, later ones are ignored. While the
    launcher runs a batch (`armed`) it raises SystemExit(143) at once; elsewhere (claiming, telling a
    trial: `deferred`) it is noted, and raised at the next safe point."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._armed = False

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            return
        self.signum = signum
        if self._armed:
            self._armed = False
            raise SystemExit(128 + signum)

    def check(self) -> None:
        if self.signum is not None:
            raise SystemExit(128 + self.signum)

    @contextlib.contextmanager
    def installed(self) -> Iterator["_StopSignal"]:
        if threading.current_thread() is not threading.main_thread() \
                or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            yield self
            return
        signal.signal(signal.SIGTERM, self._handle)
        try:
            yield self
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        self.check()
        self._armed = True
        try:
            yield
        finally:
            self._armed = False

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        was, self._armed = self._armed, False
        try:
            yield
        finally:
            self._armed = was
        if was:
            self.check()


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    """SIGINT and SIGTERM ignored inside (main thread only): writes that must not be cut halfway."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


class ClaimedGridSampler(optuna.samplers.GridSampler):
    """GridSampler whose points this sweeper places itself (each enqueued under the claim lock, in the
    study's one order), so its bookkeeping after a trial does not apply: it would look up a grid id that
    enqueued trials never get, and ask study.optimize to stop."""

    def after_trial(self, study, trial, state, values) -> None:
        pass


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


def _machine_gpus() -> list[str]:
    """The GPUs of this machine the sweeper's workers may share out (CUDA_VISIBLE_DEVICES, else `nvidia-smi -L`),
    read without importing torch; the launcher's `_job_gpus` asks which ones the jobs will train on."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g for g in env.split(",") if g.strip() and g.strip() != "-1"]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


def _core_share(worker_id: int, n_workers: int) -> set[int]:
    """The CPU cores of worker i (1-based): every n_workers-th core, or one core when there are fewer."""
    cores = sorted(os.sched_getaffinity(0))
    return set(cores[worker_id - 1::n_workers]) or {cores[(worker_id - 1) % len(cores)]}


def _pin(worker_id: int, n_workers: int) -> Callable[[], None] | None:
    """Pin a CPU worker to its share of the cores, so that everything in it (its torch threads, a launcher's
    process pool sized by the cores it sees) splits that share and no more. None with GPUs (one each)."""
    if not hasattr(os, "sched_setaffinity") or len(_machine_gpus()) >= 2:
        return None
    share = _core_share(worker_id, n_workers)
    return lambda: os.sched_setaffinity(0, share)


def _worker_env(worker_id: int, n_workers: int) -> dict[str, str]:
    """Worker i gets GPU i (round robin) when there are GPUs, else an equal share of the CPU cores."""
    env = dict(os.environ)
    env[lv.PARENT_ENV] = str(os.getpid())
    gpus = _machine_gpus()
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = gpus[(worker_id - 1) % len(gpus)]
    if len(gpus) < 2:
        threads = str(len(_core_share(worker_id, n_workers)))
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(var, threads)
    return env
