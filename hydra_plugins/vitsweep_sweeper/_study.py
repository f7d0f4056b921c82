"""Study plumbing shared by the sweeper and the trial protocol: sampler and pruner configs, budget,
grid order, progress and results. Storages and the claim lock are in `storage`, liveness in `_liveness`."""

import itertools
import math
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from optuna.trial import FrozenTrial, TrialState

from .config import PRUNERS, SAMPLERS, TRANSLATED

PRUNER_ATTR = "vitsweep:pruner"  # study system attr: the pruner config, read by every trial process
GRID_SEED_ATTR = "vitsweep:grid_seed"  # study system attr: the seed of the grid order, one per study
WORKER_ATTR = "vitsweep:worker"  # trial system attr: "host:pid" of the process running it
HEARTBEAT_ATTR = "vitsweep:heartbeat"  # trial system attr: a counter its worker bumps every heartbeat_s
RESUMED_ATTR = "vitsweep:resumed"  # trial system attr: RUNNING when a command started (its retry is not counted)
RETRY_DUE_ATTR = "vitsweep:retry_due"  # trial system attr: set just before a trial is failed as interrupted when
# a retry is due, to the `retries` that retry carries; a FAIL with it and no trial naming it lost its retry
JOB_ATTR = "vitsweep:job"  # trial system attr: Hydra job number (run dir); a retry keeps its original's
GRID_ATTR = "vitsweep:grid"  # study system attr: a grid study's value lists, {param: [values]}, for resumes
RECIPE_ATTR = "vitsweep:recipe"  # study system attr: the job config all its trials share (flattened), for resumes
SPACE_ATTR = "vitsweep:space"  # study system attr: {param: the sweep expression it was sampled from}, for resumes
RECIPE_VERSION_KEY = "vitsweep:recipe_version"  # in the recorded recipe: how it was made (absent: version 1)
RECIPE_VERSION = 2  # 2: {"configs": one flattened job config per preset choice}; 1: the shared config, flattened


# Optuna's storage API takes study and trial ids, but neither optuna.Study nor its trials expose them (or the
# study's storage) publicly: these three are the one place that reads the private attributes.
def study_id(study: optuna.Study) -> int:
    """The storage's id of ``study``."""
    return study._study_id


def trial_id(trial: Any) -> int:
    """The storage's id of a trial (``optuna.Trial`` or ``FrozenTrial``)."""
    return trial._trial_id


def study_storage(study: optuna.Study) -> optuna.storages.BaseStorage:
    """The storage ``study`` was loaded from."""
    return study._storage


def _node(value: Any, table: dict[str, Any], key: str) -> DictConfig:
    if value is None:
        value = "none" if key == "pruner" else "tpe"
    if isinstance(value, str):
        if value not in table:
            raise ValueError(f"hydra.sweeper.{key}: unknown {key} {value!r}; choose one of {sorted(table)}")
        return OmegaConf.structured(table[value])
    if not OmegaConf.is_config(value) or "_target_" not in value:
        raise ValueError(f"hydra.sweeper.{key}: expected a name from {sorted(table)} or a node with _target_")
    return value


def sampler_node(value: Any) -> DictConfig:
    return _node(value, SAMPLERS, "sampler")


NO_PRUNER = "hydra_plugins.vitsweep_sweeper.study.no_pruner"  # config.NopPrunerConfig's _target_ (the public module)


def no_pruner(**ignored: Any) -> optuna.pruners.NopPruner:
    """`hydra/sweeper/pruner=none`: no pruning, whatever options the study file set for another pruner."""
    return optuna.pruners.NopPruner()


def pruner_node(value: Any) -> DictConfig:
    node = _node(value, PRUNERS, "pruner")
    if node.get("_target_") in ("optuna.pruners.NopPruner", NO_PRUNER):
        return OmegaConf.create({"_target_": "optuna.pruners.NopPruner"})  # as stored in the study
    return node


def build(node: DictConfig, key: str, **kwargs: Any) -> Any:
    """Instantiate a sampler or pruner node. hydra-optuna-sweeper keys that Optuna 5 deprecated are passed on
    only when they differ from the default (same behaviour, no deprecation warning); renamed ones are renamed."""
    cfg = OmegaConf.to_container(node)
    for name, (default, new_name) in TRANSLATED.get(cfg.get("_target_"), {}).items():
        if name in cfg:
            value = cfg.pop(name)
            if value != default and value is not None:  # null: Optuna's own default (HOS 1.4 writes null)
                cfg[new_name or name] = value
    try:
        return instantiate(OmegaConf.create(cfg), **kwargs)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"hydra.sweeper.{key}: cannot build {node.get('_target_')!r}: {e}") from e


def worker_seed(seed: int | None, n_existing: int, worker_id: int) -> int | None:
    """A fresh single run keeps the user's seed; a resumed run or another worker gets a new one,
    so it does not replay the start-up points already in the study (not for grids: see grid_points)."""
    if seed is None or (n_existing == 0 and worker_id == 0):
        return seed
    import numpy as np

    return int(np.random.SeedSequence([seed, n_existing, worker_id]).generate_state(1)[0])


class WarmupPruner(optuna.pruners.BasePruner):
    """`n_warmup_steps: N` as the sweep files mean it: a trial is never pruned at its first N evaluations,
    whatever step numbers it reports (the trainer counts epochs from 1; Optuna's own check is `step < N`)."""

    def __init__(self, pruner: optuna.pruners.BasePruner, n_warmup_evaluations: int) -> None:
        self.pruner, self.n_warmup_evaluations = pruner, n_warmup_evaluations

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        if len(trial.intermediate_values) <= self.n_warmup_evaluations:
            return False
        return self.pruner.prune(study, trial)


def replaced(t: FrozenTrial) -> bool:
    """True for a trial failed as interrupted whose retry stands for it (the retry carries its intermediate values and
    pruner rungs): a retry that is due but not yet enqueued (see `_liveness.enqueue_lost_retries`) counts too."""
    return t.state == TrialState.FAIL and RETRY_DUE_ATTR in t.system_attrs


class _Unreplaced:
    """``study`` as successive halving reads it (``get_trials``, ``direction``, ``_storage``), without the trials that a
    retry replaced."""

    def __init__(self, study: optuna.Study) -> None:
        self._study = study

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def get_trials(self, deepcopy: bool = True, states: Any = None) -> list[FrozenTrial]:
        return [t for t in self._study.get_trials(deepcopy=deepcopy, states=states) if not replaced(t)]


class RetrySuccessiveHalvingPruner(optuna.pruners.SuccessiveHalvingPruner):
    """Optuna's successive halving, where a retried point counts once. It ranks a trial against the rung values of
    every trial of the study, failed ones included, and a retry copies its original's rungs: the point counted twice
    (review 2026-11-30: a trial at 0.3 among rung values 0.1 and 0.5 was pruned uninterrupted, kept when the 0.5 point
    had been retried). The original a retry replaced is left out."""

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        return super().prune(_Unreplaced(study), trial)  # type: ignore[arg-type]


class RetryHyperbandPruner(optuna.pruners.HyperbandPruner):
    """Optuna's Hyperband, where a retry is judged in its original's bracket and a point counts once. Hyperband picks
    a trial's bracket from a hash of its number, and a retry is a new trial: it was judged by another bracket's rung
    schedule with its original's rungs (review 2026-11-30: a point behind its bracket's other trial at epoch 3 was
    pruned uninterrupted, kept when retried into a bracket whose next rung was at epoch 27), and counted in that
    bracket as well as (its original) in its own. A trial's bracket is taken from its Hydra job number (`JOB_ATTR`):
    the trial's own number, which its retries keep; the original a retry replaced is in no bracket."""

    def _get_bracket_id(self, study: optuna.Study, trial: FrozenTrial) -> int:
        if replaced(trial):
            return -1
        first = trial.system_attrs.get(JOB_ATTR, trial.number)
        return super()._get_bracket_id(study, SimpleNamespace(number=first))  # type: ignore[arg-type]


# Optuna's pruners that read their rungs from other trials -> the same pruner aware of retries
RETRY_AWARE = {"optuna.pruners.SuccessiveHalvingPruner": f"{__name__}.RetrySuccessiveHalvingPruner",
               "optuna.pruners.HyperbandPruner": f"{__name__}.RetryHyperbandPruner"}


def pruner_from_study(storage: optuna.storages.BaseStorage, study_id: int) -> optuna.pruners.BasePruner:
    """The pruner a trial's reports are judged by: the study's stored config, successive halving and Hyperband made
    aware of retries (`RETRY_AWARE`), `n_warmup_steps` counted in evaluations (`WarmupPruner`)."""
    cfg = storage.get_study_system_attrs(study_id).get(PRUNER_ATTR)
    if not cfg:
        return optuna.pruners.NopPruner()
    cfg = dict(cfg)
    if cfg.get("_target_") in RETRY_AWARE:
        cfg["_target_"] = RETRY_AWARE[cfg["_target_"]]
    warmup = int(cfg.get("n_warmup_steps") or 0)
    if warmup:
        cfg["n_warmup_steps"] = 0
    pruner = instantiate(OmegaConf.create(cfg))
    return WarmupPruner(pruner, warmup) if warmup else pruner


def budget_trials(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """Trials that use up the budget: all but those a retry replaced (their worker died mid-trial)."""
    replaced = {t.user_attrs["retry_of"] for t in trials if "retry_of" in t.user_attrs}
    return [t for t in trials if t.number not in replaced]


def params_of(t: FrozenTrial) -> dict[str, Any]:
    """A trial's parameters; a WAITING (enqueued) one has them as `fixed_params` only, and one whose worker was killed
    while it wrote them (one by one) has part of them, the rest in `fixed_params` (review 2026-11-29: its retry
    carried the part, and failed every claim of a grid)."""
    return {**(t.system_attrs.get("fixed_params") or {}), **t.params}


def grid_points(grid: dict[str, list[Any]], seed: int | None) -> list[dict[str, Any]]:
    """Every point of the grid in one order per study: shuffled by the study's seed, as GridSampler does,
    so every process, worker and resume of the study agrees on it."""
    import numpy as np

    keys = sorted(grid)
    points = list(itertools.product(*(grid[k] for k in keys)))
    np.random.RandomState(seed or 0).shuffle(points)
    return [dict(zip(keys, p, strict=True)) for p in points]


def point_key(params: dict[str, Any], keys: Sequence[str]) -> tuple:
    return tuple(repr(params.get(k)) for k in sorted(keys))


def default_storage(sweep_dir: str) -> str:
    path = Path(sweep_dir).absolute() / "optuna.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def fmt(values: Sequence[float] | None) -> str:
    if values is None:
        return "-"
    return ",".join(f"{v:.4g}" for v in values)


class Progress:
    """One line per finished trial: counter, number, state, value, best so far, elapsed."""

    def __init__(self, study: optuna.Study, n_trials: int, log: Any, max_retries: int = 0) -> None:
        self.study, self.n_trials, self.log, self.max_retries = study, n_trials, log, max_retries
        self.t0 = time.time()
        trials = study.get_trials(deepcopy=False)
        self.seen = {t.number for t in trials if t.state.is_finished()}
        self.done = sum(t.state.is_finished() for t in budget_trials(trials))

    def poll(self) -> None:
        trials = self.study.get_trials(deepcopy=False)
        retries = {t.user_attrs["retry_of"]: t.number for t in trials if "retry_of" in t.user_attrs}
        for t in trials:
            if t.number in self.seen or not t.state.is_finished():
                continue
            if t.number not in retries and self._retry_pending(t):
                continue  # failed as interrupted a moment ago; its retry is being enqueued
            self.seen.add(t.number)
            if t.number in retries:
                self.log.warning(f"trial {t.number} failed: {t.user_attrs.get('error', 'interrupted')}; retried as "
                                 f"trial {retries[t.number]} with the same parameters")
                continue
            self.done += 1
            err = f" error={t.user_attrs.get('error', '')[:120]!r}" if t.state == TrialState.FAIL else ""
            self.log.info(
                f"[{self.done:>3}/{self.n_trials}] trial {t.number} {t.state.name} value={fmt(t.values)} "
                f"best={self.best()} elapsed={time.time() - self.t0:.1f}s{err}"
            )

    def _retry_pending(self, t: FrozenTrial) -> bool:
        return RETRY_DUE_ATTR in t.system_attrs

    def best(self) -> str:
        try:
            best = self.study.best_trials
        except ValueError:
            return "-"
        if not best:
            return "-"
        if len(self.study.directions) > 1:
            return f"{len(best)} Pareto trials"
        return f"{fmt(best[0].values)} (#{best[0].number})"


def state_counts(trials: Sequence[FrozenTrial]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.state.name] = counts.get(t.state.name, 0) + 1
    return counts


def write_results(study: optuna.Study, sweep_dir: str) -> dict[str, Any]:
    """`optimization_results.yaml` in hydra-optuna-sweeper's format (best_params/best_value or solutions), plus
    the failed trials of the budget and the retries of trials whose worker died."""
    trials = study.get_trials(deepcopy=False)
    counted = budget_trials(trials)
    out: dict[str, Any] = {"name": "optuna", "study_name": study.study_name, "states": state_counts(counted)}
    out["failed"] = [{"number": t.number, "params": params_of(t), "error": t.user_attrs.get("error")}
                     for t in counted if t.state == TrialState.FAIL]
    out["retried"] = [{"number": t.number, "retry_of": t.user_attrs["retry_of"],
                       "error": trials[t.user_attrs["retry_of"]].user_attrs.get("error")}
                      for t in trials if "retry_of" in t.user_attrs]
    try:
        if len(study.directions) == 1:
            out["best_params"] = study.best_trial.params
            out["best_value"] = study.best_trial.value
        else:
            out["solutions"] = [{"params": t.params, "values": list(t.values)} for t in study.best_trials]
    except ValueError:
        pass  # no completed trial
    Path(sweep_dir).mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create(out), Path(sweep_dir) / "optimization_results.yaml")
    return out


def is_finite(values: Sequence[float]) -> bool:
    return all(math.isfinite(v) for v in values)
