"""The vitsweep sweeper's work (imported lazily, so Hydra's plugin scan stays fast).

A worker loops: under the claim lock it counts the study's trials against `n_trials`, asks Optuna
for the next trial(s) and fixes their parameters; it then launches the job(s) through Hydra's
launcher and tells Optuna the result. With `n_workers=K > 1` this process re-runs its own command
K times as worker subprocesses (each pulling trials as soon as it is free) and prints progress
from the storage. Jobs see the trial as `trial.{study_name,number,storage}` (see src/trial.py).
"""

import logging
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import optuna
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import HydraContext, TaskFunction
from hydra.utils import get_method
from omegaconf import DictConfig, OmegaConf
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import Trial, TrialState

from . import _search_space as ss
from . import _study as st

log = logging.getLogger(__name__)

WORKER_KEYS = ("hydra.sweeper.n_workers", "hydra.sweeper.worker_id", "hydra.sweeper.storage",
               "hydra.sweeper.study_name", "hydra.sweep.dir")


class SweeperImpl:
    def __init__(
        self,
        sampler: Any,
        direction: Any,
        storage: Optional[str],
        study_name: Optional[str],
        n_trials: int,
        n_jobs: int,
        max_failure_rate: float,
        search_space: Optional[DictConfig] = None,
        params: Optional[DictConfig] = None,
        custom_search_space: Optional[str] = None,
        pruner: Any = None,
        n_workers: int = 1,
        presets: Optional[DictConfig] = None,
        worker_id: int = 0,
    ) -> None:
        self.direction, self.storage_url, self.study_name = direction, storage, study_name
        self.n_trials, self.n_jobs, self.n_workers, self.worker_id = n_trials, n_jobs, n_workers, worker_id
        self.max_failure_rate = max_failure_rate
        self.search_space, self.params, self.presets = search_space, params, presets
        self.custom_search_space = custom_search_space

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            config=config, hydra_context=hydra_context, task_function=task_function
        )
        self.sweep_dir = str(config.hydra.sweep.dir)

    # ------------------------------------------------------------------ validation, before any trial
    def _validate(self, arguments: List[str]) -> None:
        if not isinstance(self.n_workers, int) or self.n_workers < 1:
            raise ValueError(f"hydra.sweeper.n_workers must be an integer >= 1, got {self.n_workers!r}")
        if self.n_trials < 1:
            raise ValueError(f"hydra.sweeper.n_trials must be >= 1, got {self.n_trials}")
        if self.n_jobs < 1:
            raise ValueError(f"hydra.sweeper.n_jobs must be >= 1, got {self.n_jobs}")
        if not 0.0 <= self.max_failure_rate <= 1.0:
            raise ValueError(f"hydra.sweeper.max_failure_rate must be in [0, 1], got {self.max_failure_rate}")
        raw = list(self.direction) if OmegaConf.is_list(self.direction) or isinstance(self.direction, list) \
            else [self.direction]
        self.directions = [getattr(d, "name", str(d)).lower() for d in raw]
        bad = [d for d in self.directions if d not in ("minimize", "maximize")]
        if bad or not self.directions:
            raise ValueError(f"hydra.sweeper.direction: expected minimize/maximize or a list of them, got {raw}")

        # Hydra has already instantiated the nested nodes passed to __init__; read the raw ones,
        # which this sweeper rebuilds per worker with a resume-aware seed.
        self.sampler_node = st.sampler_node(OmegaConf.select(self.config, "hydra.sweeper.sampler"))
        self.pruner_node = st.pruner_node(OmegaConf.select(self.config, "hydra.sweeper.pruner"))
        self.pruner = st.build(self.pruner_node, "pruner")
        self.is_grid = self.sampler_node.get("_target_") == "optuna.samplers.GridSampler"

        params = dict(self.params or {})
        if self.search_space and not self.params:
            log.warning("hydra.sweeper.search_space is deprecated; use hydra.sweeper.params")
            params = ss.from_legacy(self.search_space)
        self.space, self.fixed = ss.parse(params, arguments)
        self.grid = ss.grid(self.space) if self.is_grid else None
        self._check_presets()
        self.extend: Optional[Callable[[DictConfig, Trial], None]] = None
        if self.custom_search_space:
            path = self.custom_search_space.lstrip(".")  # ".module.fn": a module beside the script
            try:
                self.extend = get_method(path)
            except Exception as e:  # noqa: BLE001
                raise ValueError(f"hydra.sweeper.custom_search_space: cannot load {path!r}: {e}") from e

        self.url = self.storage_url or st.default_storage(self.sweep_dir)
        self.storage = st.open_storage(self.url)
        self.name = self.study_name or str(self.config.hydra.job.name)

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
        except KeyError:
            n_existing = 0
        node = OmegaConf.to_container(self.sampler_node)
        if "seed" in node and not node["_target_"].endswith("QMCSampler"):
            node["seed"] = st.worker_seed(node["seed"], n_existing, self.worker_id)
        sampler = st.build(OmegaConf.create(node), "sampler")
        if self.is_grid:
            sampler = sampler(self.grid)
        study = optuna.create_study(
            study_name=self.name, storage=self.storage, sampler=sampler, pruner=self.pruner,
            directions=self.directions, load_if_exists=True,
        )
        self.storage.set_study_system_attr(
            study._study_id, st.PRUNER_ATTR, OmegaConf.to_container(self.pruner_node, resolve=True)
        )
        if self.worker_id == 0:
            before = study.user_attrs.get("fixed_overrides")
            if before is None:
                study.set_user_attr("fixed_overrides", self.fixed)
            elif before != self.fixed:
                log.warning(
                    f"Resuming study {self.name!r} with other fixed overrides than it was started with: "
                    f"{before} -> {self.fixed}; use another hydra.sweeper.study_name for a different study"
                )
        return study

    # ------------------------------------------------------------------ sweep
    def sweep(self, arguments: List[str]) -> None:
        self._validate(arguments)
        study = self._open_study()
        self.budget = self.n_trials
        if self.grid is not None:
            size = 1
            for values in self.grid.values():
                size *= len(values)
            self.budget = min(self.n_trials, size)
        if self.worker_id == 0:
            orphans = st.fail_orphans(study, self.storage)
            log.info(
                f"Study {self.name!r} in {self.url}: sampler {type(study.sampler).__name__}, pruner "
                f"{type(self.pruner).__name__}, directions {self.directions}, budget {self.budget} trials, "
                f"{len(st.budget_trials(study.trials))} already done, {self.n_workers} worker(s)"
                + (f"; {orphans} interrupted trial(s) will be rerun" if orphans else "")
            )
        progress = st.Progress(study, self.budget, log)
        if self.n_workers > 1:
            self._run_workers(progress)
        else:
            self._work(study, progress)
        if self.worker_id == 0:
            results = st.write_results(study, self.sweep_dir)
            log.info(f"Done: {results['states']}; results in {Path(self.sweep_dir) / 'optimization_results.yaml'}")
            self._check_failures(study, final=True)

    def _work(self, study: optuna.Study, progress: st.Progress) -> None:
        owner = f"{socket.gethostname()}:{os.getpid()}"
        while not self._check_failures(study, final=False):
            with st.claim_lock(self.url, self.storage, study._study_id):
                used = len(st.budget_trials(study.get_trials(deepcopy=False)))
                n = min(self.n_jobs, self.budget - used)
                if n <= 0:
                    return
                trials = [study.ask() for _ in range(n)]
                for t in trials:
                    self.storage.set_trial_system_attr(t._trial_id, st.WORKER_ATTR, owner)
                overrides = [self._configure(t) for t in trials]
            returns = self.launcher.launch(overrides, initial_job_idx=trials[0].number)
            for trial, ret in zip(trials, returns):
                self._tell(study, trial, ret)
            progress.poll()

    def _configure(self, trial: Trial) -> List[str]:
        for name, dist in self.space.items():
            _suggest(trial, name, dist)
        for name, value in self.fixed.items():
            trial.set_user_attr(name, value)
        if self.extend is not None:
            self.extend(self.config, trial)
        overlap = trial.params.keys() & self.fixed.keys()
        if overlap:
            raise ValueError(f"hydra.sweeper.custom_search_space suggests fixed parameters {sorted(overlap)}")
        out: List[str] = []
        for name, value in trial.params.items():
            if name in (self.presets or {}) and name not in self.fixed:
                out += list(self.presets[name][str(value)])
            else:
                out.append(f"{name}={_fmt(value)}")
        out += [f"{k}={v}" for k, v in self.fixed.items()]
        out += [f"++trial.study_name={_quote(self.name)}", f"++trial.number={trial.number}",
                f"++trial.storage={_quote(self.url)}"]
        return out

    def _tell(self, study: optuna.Study, trial: Trial, ret: JobReturn) -> None:
        if ret.hydra_cfg is not None:
            trial.set_user_attr("run_dir", str(ret.hydra_cfg.hydra.runtime.output_dir))
        if ret.status == JobStatus.FAILED:
            exc = ret._return_value
            if isinstance(exc, optuna.TrialPruned):
                _finish(study, trial, state=TrialState.PRUNED)
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
        _finish(study, trial, values=values)

    def _fail(self, study: optuna.Study, trial: Trial, error: str) -> None:
        trial.set_user_attr("error", error[:2000])
        _finish(study, trial, state=TrialState.FAIL)
        log.warning(f"Trial {trial.number} failed: {error}")

    def _check_failures(self, study: optuna.Study, final: bool) -> bool:
        """True once failures exceed max_failure_rate of the budget; raises at the end of the sweep."""
        failed = [t for t in st.budget_trials(study.get_trials(deepcopy=False, states=(TrialState.FAIL,)))]
        if len(failed) <= self.max_failure_rate * self.budget:
            return False
        if final:
            raise RuntimeError(
                f"{len(failed)} of {self.budget} trials failed, more than hydra.sweeper.max_failure_rate="
                f"{self.max_failure_rate}; last error: {failed[-1].user_attrs.get('error')}"
            )
        return True

    # ------------------------------------------------------------------ local worker processes
    def _run_workers(self, progress: st.Progress) -> None:
        logs = Path(self.sweep_dir) / "workers"
        logs.mkdir(parents=True, exist_ok=True)
        procs = []
        try:
            for i in range(1, self.n_workers + 1):
                cmd = self._worker_command(i)
                out = open(logs / f"worker-{i}.log", "w")
                procs.append((subprocess.Popen(cmd, env=_worker_env(i, self.n_workers), stdout=out,
                                               stderr=subprocess.STDOUT), out))
            log.info(f"Started {self.n_workers} workers; logs in {logs}; worker command: {shlex.join(cmd)}")
            while any(p.poll() is None for p, _ in procs):
                time.sleep(1.0)
                progress.poll()
            progress.poll()
        finally:
            for p, out in procs:
                if p.poll() is None:
                    p.terminate()
                    p.wait()
                out.close()
        bad = [(i, p.returncode) for i, (p, _) in enumerate(procs, 1) if p.returncode != 0]
        for i, code in bad:
            tail = (logs / f"worker-{i}.log").read_text().splitlines()[-15:]
            log.error(f"worker {i} exited with {code}:\n" + "\n".join(tail))
        if bad:
            raise RuntimeError(f"{len(bad)} of {self.n_workers} workers failed; logs in {logs}")

    def _worker_command(self, worker_id: int) -> List[str]:
        argv = list(getattr(sys, "orig_argv", [sys.executable] + sys.argv))
        argv[0] = sys.executable
        keep = [a for a in argv if a.lstrip("+~").split("=", 1)[0] not in WORKER_KEYS]
        return keep + [
            "hydra.sweeper.n_workers=1",
            f"hydra.sweeper.worker_id={worker_id}",
            f"hydra.sweeper.storage={_quote(self.url)}",
            f"hydra.sweeper.study_name={_quote(self.name)}",
            f"hydra.sweep.dir={_quote(str(Path(self.sweep_dir).absolute()))}",
        ]


def _finish(study: optuna.Study, trial: Trial, **kwargs: Any) -> None:
    """study.tell, except that GridSampler's "grid exhausted" stop request (meant for
    study.optimize) is ignored: the trial is stored before it is raised."""
    try:
        study.tell(trial, **kwargs)
    except RuntimeError as e:
        if "Study.stop" not in str(e):
            raise


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
        return _quote(value)
    return str(value)


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _visible_gpus() -> List[str]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g for g in env.split(",") if g.strip() and g.strip() != "-1"]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


def _worker_env(worker_id: int, n_workers: int) -> Dict[str, str]:
    """Worker i gets GPU i (round robin) when there are GPUs, else an equal share of the CPU cores."""
    env = dict(os.environ)
    gpus = _visible_gpus()
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = gpus[(worker_id - 1) % len(gpus)]
    if len(gpus) < 2:
        threads = str(max(1, len(os.sched_getaffinity(0)) // n_workers))
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(var, threads)
    return env
