"""The vitsweep sweeper's work (imported lazily, so Hydra's plugin scan stays fast): its settings, its study, and
one sweep.

The rooms: `_claim_loop` (a worker's claim, launch and tell loop), `_recipe` (what a named study was started with,
and the resume checks), `_workers` (the worker processes and their cores or GPUs), `_signals` (SIGTERM as a clean
stop), `_liveness` (heartbeats, dead workers' trials failed and retried), `_study` (study records and progress),
`_search_space` (Hydra sweep expressions as Optuna distributions), `_storage` (storage URLs, the claim lock),
`_submitit` (submitit launchers). With `n_workers=K > 1` this process re-runs its own command K times as worker
subprocesses and prints progress from the storage. Jobs learn their trial through `hydra.job.env_set` (see
protocol.py), never through a key of their config; a retry runs under its original's job number.
"""

import logging
import os
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.types import HydraContext, TaskFunction
from hydra.utils import get_method
from omegaconf import DictConfig, OmegaConf, open_dict
from optuna.distributions import CategoricalDistribution
from optuna.trial import Trial

from . import _liveness as liveness
from . import _protocol as protocol
from . import _search_space as search_spaces
from . import _storage as storages
from . import _study as studies
from . import _submitit
from ._claim_loop import ClaimLoop
from ._recipe import RecipeChecks
from ._workers import WorkerProcesses

log = logging.getLogger(__name__)
OWNER_FILE = ".vitsweep-study"  # in a sweep dir: the name of the study whose runs it holds

SEARCH_SPACE_URL = "https://hydra.cc/docs/upgrades/1.1_to_1.2/changes_to_sweeper_config/"
DEFAULT_TRIALS = 20  # n_trials when unset and the sampler is not a grid: hydra-optuna-sweeper's default


class ClaimedGridSampler(optuna.samplers.GridSampler):
    """GridSampler whose points this sweeper places itself (each enqueued under the claim lock, in the
    study's one order), so its bookkeeping after a trial does not apply: it would look up a grid id that
    enqueued trials never get, and ask study.optimize to stop."""

    def after_trial(self, study, trial, state, values) -> None:
        pass


class SweeperImpl(ClaimLoop, RecipeChecks, WorkerProcesses):
    """The sweeper's settings, its study, and one sweep: the claim loop, the recipe checks and the worker processes
    are its mixins (`_claim_loop`, `_recipe`, `_workers`)."""

    def __init__(
        self,
        sampler: Any,
        direction: Any,
        storage: str | None,
        study_name: str | None,
        n_trials: int | None,
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
    def _build_settings(self, arguments: list[str]) -> None:
        """Check every setting and build what the sweep needs from them (sampler and pruner nodes, search space and
        fixed overrides, grid, job config, directions, storage, study name), before any trial."""
        if not isinstance(self.n_workers, int) or self.n_workers < 1:
            raise ValueError(f"hydra.sweeper.n_workers must be an integer >= 1, got {self.n_workers!r}")
        if self.n_trials is not None and (not isinstance(self.n_trials, int) or self.n_trials < 1):
            raise ValueError(f"hydra.sweeper.n_trials must be an integer >= 1 (or null: a grid's size, else 20), "
                             f"got {self.n_trials!r}")
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
        self.sampler_node = studies.sampler_node(OmegaConf.select(self.config, "hydra.sweeper.sampler"))
        self.pruner_node = studies.pruner_node(OmegaConf.select(self.config, "hydra.sweeper.pruner"))
        self.pruner = studies.build(self.pruner_node, "pruner")
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
                params = search_spaces.from_legacy(self.search_space)
        if self.is_grid and self.sampler_node.get("search_space"):  # HOS: GridSampler's own value lists
            params.update({k: "choice(" + ",".join(map(str, v)) + ")"
                           for k, v in self.sampler_node.search_space.items()})
        self.space, self.fixed = search_spaces.parse(params, arguments, grid=self.is_grid)
        self.grid = search_spaces.grid(self.space) if self.is_grid else None
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
        self.url = storages.normalize(self.storage_url or studies.default_storage(self.sweep_dir))
        self.storage = storages.open_storage(self.url)
        if self.study_name:
            self.name = self.study_name
        else:  # as hydra-optuna-sweeper: a new study on every run (a named study resumes its budget)
            self.name = f"{self.config.hydra.job.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
            log.info(f"hydra.sweeper.study_name is null: new study {self.name!r} (name the study to resume it later)")

    def _job_config(self, overrides: list[str] | None = None) -> DictConfig:
        """The job config every trial shares: the primary config with the fixed overrides, as the launcher
        composes each job (the sampled keys keep their config-file values here). ``overrides`` go before the fixed
        ones, as a preset's do in a trial's command line."""
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, [*(overrides or []), *self.fixed_lines()])
        with open_dict(cfg):
            del cfg["hydra"]
        return cfg

    def _directions(self) -> list[str]:
        """`hydra.sweeper.direction`, by default the direction the app declared for its objective
        (`protocol.declare_app`; vitsweep's trainer: accuracies, AUCs and the binary scores maximise, errors and losses
        minimise), else minimize as in hydra-optuna-sweeper. An explicit direction that contradicts the declared one
        is an error, and so is an objective key the study samples or a preset sets: the direction is read once, from
        the job config composed first, so half the trials would return an accuracy to a minimising study (whose best
        trial is then the least accurate one: review 2026-11-29)."""
        key = protocol.objective_key()
        where = ["hydra.sweeper.params"] if key in {search_spaces.bare(k) for k in self.space} else []
        where += sorted({f"hydra.sweeper.presets.{preset}.{choice}"
                         for preset, choice, _, target in self._preset_lines() if target == key})
        if key is not None and where:
            raise ValueError(f"{key} is sampled ({', '.join(where)} sets it): one study has one direction, read "
                             f"from the first job's {key}, and its trials' values must be one metric to be compared; "
                             f"fix {key} on the command line, one study for each")
        declared = protocol.implied_direction(self.job_config)
        key, objective, implied = declared or (None, None, None)
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
                f"{key}={objective}, which the task returns and which should be {implied}d: "
                f"delete hydra.sweeper.direction (it follows the objective), or set it to {implied}, or choose "
                f"another {key}")
        return directions

    def fixed_lines(self) -> list[str]:
        """The fixed overrides every job gets: a preset key fixed on the command line (``+arch=h4_d3``) as its
        choice's overrides, as a sampled choice is (passed as ``arch=h4_d3`` alone it set a label and trained the
        config's own model); the others as written."""
        presets = self.presets or {}
        chosen, rest = [], []
        for key, value in self.fixed.items():
            name = search_spaces.bare(key)
            if name in presets and value is not None:
                chosen += list(presets[name][str(value)])
            else:
                rest.append(search_spaces.override_line(key, value))
        return chosen + rest  # the presets' first: an explicit fixed value wins, as over a sampled preset

    def _check_presets(self) -> None:
        fixed = {search_spaces.bare(k): v for k, v in self.fixed.items()}
        for key, table in (self.presets or {}).items():
            if key in fixed:  # fixed from the command line: its choice's overrides apply to every job
                if fixed[key] is not None and str(fixed[key]) not in table:
                    raise ValueError(f"hydra.sweeper.presets.{key} has no choice {fixed[key]!r}: choose one of "
                                     f"{', '.join(map(str, table))}")
                continue
            dist = self.space.get(key)
            if not isinstance(dist, CategoricalDistribution):
                raise ValueError(f"hydra.sweeper.presets.{key}: {key} must be a choice in hydra.sweeper.params")
            missing = [c for c in dist.choices if str(c) not in table]
            if missing:
                raise ValueError(f"hydra.sweeper.presets.{key}: no overrides for choices {missing}")
        self._check_presets_leave_sampled_keys(fixed)

    def _check_presets_leave_sampled_keys(self, fixed: dict[str, Any]) -> None:
        """A preset choice that sets a key the study samples trained whichever of the two overrides came last in the
        job's command line (by the order of hydra.sweeper.params, or always the preset's for a fixed preset key),
        while Optuna recorded the sampled value; one that sets its own key replaces the sampled override, so it must
        set the choice's value (review 2026-11-29): refused otherwise, naming the keys."""
        sampled = {search_spaces.bare(k) for k in self.space}
        parser = OverridesParser.create()
        for key, choice, override, target in self._preset_lines(fixed):
            if choice == "None":  # a bare `~key`
                continue
            if target == key and "=" in override:
                (parsed,) = parser.parse_overrides([override])
                value = parsed.value()
                if str(value) != choice and value != self._choice_value(key, choice, parser):
                    raise ValueError(
                        f"hydra.sweeper.presets.{key}.{choice} sets {override}, not the choice {choice}: Optuna would "
                        f"record {key}={choice} for runs that trained {value}. Set {key}={choice} in the preset, or "
                        f"leave {key} out of it")
            if target != key and target in sampled:
                raise ValueError(
                    f"hydra.sweeper.presets.{key}.{choice} sets {target}, which hydra.sweeper.params samples: Optuna "
                    f"would record the sampled {target} for runs that trained the preset's (or the other way round, "
                    f"by the order of the keys). Drop {target} from the preset or from hydra.sweeper.params")

    def _preset_lines(self, fixed: dict[str, Any] | None = None):
        """``(preset key, choice, override, the config key it sets)`` for each override of each preset choice (of a
        preset key ``fixed`` on the command line, of its choice only; a choice without a table entry has none)."""
        for key, table in (self.presets or {}).items():
            for choice in [str(fixed[key])] if fixed and key in fixed else list(table):
                for override in table.get(choice) or []:
                    yield key, choice, str(override), search_spaces.bare(str(override).split("=", 1)[0])

    def _choice_value(self, key: str, choice: str, parser: OverridesParser) -> Any:
        """The sampled (or fixed) value of preset ``key`` whose table entry is named ``choice``."""
        dist = self.space.get(key)
        if isinstance(dist, CategoricalDistribution):
            for c in dist.choices:
                if str(c) == choice:
                    return c
        try:  # a fixed choice, as written on the command line: the value Hydra reads from it
            (parsed,) = parser.parse_overrides([f"{key}={choice}"])
            return parsed.value()
        except Exception:  # noqa: BLE001 - not a value Hydra parses: compared as written
            return choice

    def _check_pruner(self, study_id: int) -> None:
        """A study resumes with the pruner it was started with: another would stop some points by another rule than
        the finished ones (it was replaced without a word)."""
        saved = self.storage.get_study_system_attrs(study_id).get(studies.PRUNER_ATTR)
        current = OmegaConf.to_container(self.pruner_node, resolve=True)
        if saved is not None and saved != current:
            raise ValueError(
                f"hydra.sweeper.pruner: study {self.name!r} in {storages.safe(self.url)} was started with pruner "
                f"{saved}, not {current}, so resuming it would stop its trials by two rules: restore the pruner to "
                "finish the study, or start a new one in its own folder (another hydra.sweep.dir and "
                "hydra.sweeper.study_name)")

    def _check_sweep_dir(self) -> None:
        """A sweep dir holds one study's runs: its run dirs are named by trial number, so a second study there (the
        recipe check's "start a new one" with only another study name) trained into the first one's run dirs and
        overwrote its optimization_results.yaml. The owner is recorded in ``OWNER_FILE``; a dir with run dirs and
        no owner is taken by a study that already exists in the storage (a resume), refused to a new one."""
        root = Path(self.sweep_dir)
        path = root / OWNER_FILE
        runs = root.is_dir() and any(p.is_dir() and p.name.isdigit() for p in root.iterdir())
        owner = (path.read_text().strip() or None) if path.is_file() else None  # empty: a writer mid-write
        if owner is None and runs:
            try:
                self.storage.get_study_id_from_name(self.name)
                owner = self.name  # this study's own dir, from before the owner was recorded
            except KeyError:
                owner = "another sweep (no study recorded)"
        if runs and owner != self.name:
            raise ValueError(
                f"hydra.sweep.dir={self.sweep_dir} holds the runs of {owner!r}, and its run dirs are named by trial "
                f"number, so study {self.name!r} would train into them: give this study its own hydra.sweep.dir "
                "(or resume that study with its own name)")
        if self.worker_id == 0 and (not path.is_file() or owner != self.name):
            root.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_text(self.name + "\n")
            os.replace(tmp, path)  # whole or absent: another worker never reads half a name

    def _open_study(self) -> optuna.Study:
        try:
            study_id = self.storage.get_study_id_from_name(self.name)
            n_existing = len(self.storage.get_all_trials(study_id, deepcopy=False))
            old = [d.name.lower() for d in self.storage.get_study_directions(study_id)]
            if old != self.directions:
                raise ValueError(
                    f"hydra.sweeper.direction: study {self.name!r} in {self.url} was created with {old}, "
                    f"not {self.directions}; start a new study in its own folder (another hydra.sweep.dir and "
                    "hydra.sweeper.study_name)"
                )
            self._check_recipe(study_id)
            self._check_grid(study_id)
            self._check_space(study_id)
            self._check_pruner(study_id)
        except KeyError:
            n_existing = 0
        node = OmegaConf.to_container(self.sampler_node)
        node.pop("search_space", None)
        if "seed" in node and not node["_target_"].endswith(("QMCSampler", "GridSampler")):
            node["seed"] = studies.worker_seed(node["seed"], n_existing, self.worker_id)
        sampler = studies.build(OmegaConf.create(node), "sampler")
        if self.is_grid:
            sampler = ClaimedGridSampler(self.grid, **sampler.keywords)
        study = optuna.create_study(
            study_name=self.name, storage=self.storage, sampler=sampler, pruner=self.pruner,
            directions=self.directions, load_if_exists=True,
        )
        self.storage.set_study_system_attr(
            studies.study_id(study), studies.PRUNER_ATTR, OmegaConf.to_container(self.pruner_node, resolve=True)
        )
        if self.is_grid:
            self._grid_order(study, node.get("seed"))
        if self.worker_id == 0:
            study.set_user_attr("fixed_overrides", self.fixed)
            attrs = self.storage.get_study_system_attrs(studies.study_id(study))
            if studies.RECIPE_ATTR not in attrs:
                self.storage.set_study_system_attr(studies.study_id(study), studies.RECIPE_ATTR, self._recipe())
            if not self.is_grid and studies.SPACE_ATTR not in attrs:
                self.storage.set_study_system_attr(studies.study_id(study), studies.SPACE_ATTR, self._space())
            if self.is_grid and studies.GRID_ATTR not in attrs:
                self.storage.set_study_system_attr(studies.study_id(study), studies.GRID_ATTR, self.grid)
        return study

    # ------------------------------------------------------------------ sweep
    def sweep(self, arguments: list[str]) -> None:
        self._build_settings(arguments)
        self._check_sweep_dir()
        study = self._open_study()
        self.budget = self._budget()
        self.reaper = liveness.Reaper(self.grace_s, self.max_retries)
        if self.worker_id == 0:
            # an earlier command's trials: resumed
            with storages.claim_lock(self.url, self.storage, studies.study_id(study)):
                reaped = self.reaper.reap(study, starting=True)
            log.info(
                f"Study {self.name!r} in {storages.safe(self.url)}: sampler {type(study.sampler).__name__}, pruner "
                f"{type(self.pruner).__name__}, directions {self.directions}, budget {self.budget} trials, "
                f"{self._n_finished(study)} already done, {self.n_workers} worker(s)"
                + (f"; {len(reaped)} interrupted trial(s) will be retried" if reaped else "")
            )
        progress = studies.Progress(study, self.budget, log, self.max_retries)
        lost = self._run_workers(study, progress) if self.n_workers > 1 else []
        # a lost worker's trials are failed and retried; when the others had already ended (nothing left for
        # them to claim before the loss was noticed), the retries run here
        if self.n_workers == 1 or (lost and self._n_finished(study) < self.budget):
            self._work(study, progress)
        if self.worker_id == 0:
            self._finish_sweep(study, lost)

    def _budget(self) -> int:
        """``n_trials``; unset: a grid's size, else 20 (HOS's default). A grid cut by ``n_trials`` is said so: its
        points run in the study's shuffled order, so the cut keeps a random, uneven part of the grid asked for."""
        if self.grid is None:
            return DEFAULT_TRIALS if self.n_trials is None else self.n_trials
        size = len(self.points)
        if self.n_trials is not None and self.n_trials < size and self.worker_id == 0:
            log.warning(f"runs {self.n_trials} of the grid's {size} points (hydra.sweeper.n_trials={self.n_trials}), "
                        f"a shuffled part of it: set hydra.sweeper.n_trials={size}, or leave it unset, for the whole "
                        "grid")
        return size if self.n_trials is None else min(self.n_trials, size)

    def _n_finished(self, study: optuna.Study) -> int:
        return sum(t.state.is_finished() for t in studies.budget_trials(study.get_trials(deepcopy=False)))

    def _finish_sweep(self, study: optuna.Study, lost: list[str]) -> None:
        results = studies.write_results(study, self.sweep_dir)
        path = Path(self.sweep_dir) / "optimization_results.yaml"
        log.info(f"Done: {results['states']}; {len(results['retried'])} retried, {len(results['failed'])} failed; "
                 f"results in {path}")
        self._check_failures(study, final=True)
        done = self._n_finished(study)
        if done < self.budget:
            raise RuntimeError(f"study {self.name!r} has {done} of {self.budget} trials finished"
                               + (f" after losing {', '.join(lost)}" if lost else "")
                               + "; run the same command again to finish it")

