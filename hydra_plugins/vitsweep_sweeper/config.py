"""Structured configs for `hydra/sweeper=vitsweep`, registered with Hydra's ConfigStore.

The keys are those of hydra-optuna-sweeper 1.2/1.3 and its 1.4 pre-releases, with their meanings (so its
sweep files run after changing the sweeper's name and deleting HOS's `_target_` line; docs/hos_migration.md
lists every key and the few different defaults), plus `pruner`, `n_workers`, `presets` and the liveness keys.
Sampler keys Optuna 5 deprecated are accepted and passed on only when set to another value than the default
or null (`TRANSLATED`). Samplers live in `hydra/sweeper/sampler` and pruners in `hydra/sweeper/pruner`, so
`override hydra/sweeper/sampler: tpe` keeps working;
`hydra.sweeper.sampler=<name>` and `hydra.sweeper.pruner=<name>` are accepted as shorthands.
"""

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class _TPEBase:  # the keys TPE and HOS's MOTPE share
    _target_: str = "optuna.samplers.TPESampler"
    seed: int | None = None
    consider_prior: bool | None = True  # null (HOS 1.4's default) = Optuna's default
    prior_weight: float | None = 1.0
    consider_magic_clip: bool | None = True
    consider_endpoints: bool | None = False
    n_startup_trials: int = 10  # random trials before the density model is used


@dataclass
class TPESamplerConfig(_TPEBase):
    n_ei_candidates: int = 24
    multivariate: bool = False
    warn_independent_sampling: bool | None = True
    group: bool = False
    constant_liar: bool = True  # not an HOS key; Optuna 5's default: running trials count as bad, workers spread out
    constraints_func: Any | None = None  # a node with _target_ (and _partial_: true) naming fn(trial)


@dataclass
class MOTPESamplerConfig(_TPEBase):  # MOTPESampler left Optuna in 4.0: TPE handles several objectives
    n_ehvi_candidates: int = 24  # passed to TPE as n_ei_candidates


@dataclass
class RandomSamplerConfig:
    _target_: str = "optuna.samplers.RandomSampler"
    seed: int | None = None


@dataclass
class CmaEsSamplerConfig:
    _target_: str = "optuna.samplers.CmaEsSampler"
    seed: int | None = None
    x0: dict[str, Any] | None = None
    sigma0: float | None = None
    n_startup_trials: int = 1
    independent_sampler: Any | None = None  # a sampler node with _target_
    warn_independent_sampling: bool = True
    consider_pruned_trials: bool = False
    restart_strategy: str | None = None
    inc_popsize: int = 2
    use_separable_cma: bool = False
    source_trials: Any | None = None


@dataclass
class NSGAIISamplerConfig:
    _target_: str = "optuna.samplers.NSGAIISampler"
    seed: int | None = None
    population_size: int = 50
    mutation_prob: float | None = None
    crossover_prob: float = 0.9
    swapping_prob: float = 0.5
    constraints_func: Any | None = None  # a node with _target_ (and _partial_: true) naming fn(trial)


@dataclass
class GridSamplerConfig:
    _target_: str = "optuna.samplers.GridSampler"
    _partial_: bool = True  # the grid is built from `params` at sweep time
    seed: int | None = None  # the order of the grid, one per study (every worker and resume keeps it)
    search_space: dict[str, Any] | None = None  # HOS: {param: [values]}, added to `params` as choices


@dataclass
class QMCSamplerConfig:
    _target_: str = "optuna.samplers.QMCSampler"
    seed: int | None = None
    qmc_type: str = "sobol"
    scramble: bool = False
    independent_sampler: Any | None = None
    warn_asynchronous_seeding: bool = True
    warn_independent_sampling: bool = True


@dataclass
class GPSamplerConfig:
    _target_: str = "optuna.samplers.GPSampler"
    seed: int | None = None
    n_startup_trials: int = 10
    independent_sampler: Any | None = None
    deterministic_objective: bool = False
    constraints_func: Any | None = None  # a node with _target_ (and _partial_: true) naming fn(trial)
    warn_independent_sampling: bool = True


@dataclass
class NopPrunerConfig:
    """No pruning. It takes the median pruner's two common options and ignores them, so a study file that
    sets them (tune_vit) runs unpruned with `hydra/sweeper/pruner=none` at the same budget."""
    _target_: str = "hydra_plugins.vitsweep_sweeper.study.no_pruner"
    n_startup_trials: Any = None  # ignored
    n_warmup_steps: Any = None  # ignored


@dataclass
class MedianPrunerConfig:
    _target_: str = "optuna.pruners.MedianPruner"
    n_startup_trials: int = 5  # finished trials before anything is pruned
    n_warmup_steps: int = 0  # evaluations a trial always gets (counted, whatever step numbers are reported)
    interval_steps: int = 1
    n_min_trials: int = 1


@dataclass
class SuccessiveHalvingPrunerConfig:
    _target_: str = "optuna.pruners.SuccessiveHalvingPruner"
    min_resource: Any = "auto"  # epochs before the first rung; int or "auto"
    reduction_factor: int = 4
    min_early_stopping_rate: int = 0
    bootstrap_count: int = 0


@dataclass
class HyperbandPrunerConfig:
    _target_: str = "optuna.pruners.HyperbandPruner"
    min_resource: int = 1  # epochs
    max_resource: Any = "auto"  # epochs; "auto" = the longest trial seen
    reduction_factor: int = 3
    bootstrap_count: int = 0


SAMPLERS = {
    "tpe": TPESamplerConfig,
    "random": RandomSamplerConfig,
    "cmaes": CmaEsSamplerConfig,
    "nsgaii": NSGAIISamplerConfig,
    "grid": GridSamplerConfig,
    "qmc": QMCSamplerConfig,
    "gp": GPSamplerConfig,
    "motpe": MOTPESamplerConfig,
}

_TPE_DEPRECATED = {"consider_prior": (True, None), "prior_weight": (1.0, None), "consider_magic_clip": (True, None),
                   "consider_endpoints": (False, None), "warn_independent_sampling": (True, None)}
# _target_ -> {key: (default, new name or None)}: keys dropped at their default, renamed when set
TRANSLATED = {
    "optuna.samplers.TPESampler": {**_TPE_DEPRECATED, "n_ehvi_candidates": (None, "n_ei_candidates")},
    "optuna.samplers.CmaEsSampler": {"inc_popsize": (2, None), "restart_strategy": (None, None)},
}

PRUNERS = {
    "none": NopPrunerConfig,
    "median": MedianPrunerConfig,
    "successive_halving": SuccessiveHalvingPrunerConfig,
    "hyperband": HyperbandPrunerConfig,
}


@dataclass
class VitsweepSweeperConf:
    _target_: str = "hydra_plugins.vitsweep_sweeper.sweeper.VitsweepSweeper"
    # Hydra passes the sampler and pruner nodes unbuilt: the sweeper builds them per worker, with a resume-aware
    # seed and without the keys Optuna 5 deprecated (built by Hydra they warned five times and were thrown away)
    _recursive_: bool = False
    defaults: list[Any] = field(default_factory=lambda: [{"sampler": "tpe"}, {"pruner": "none"}])

    sampler: Any = MISSING  # a node with _target_, or a name from SAMPLERS
    pruner: Any = MISSING  # a node with _target_, or a name from PRUNERS
    # minimize/maximize, or a list, one per returned value. null = the direction the app declared for its objective
    # (protocol.declare_app; vitsweep's trainer: trainer.objective, accuracies maximise, errors and losses minimise),
    # else minimize (HOS's default)
    direction: Any = None
    storage: Any = None  # an Optuna storage URL; null = sqlite:///<sweep dir>/optuna.db
    # null = a new auto-named study on every run (as HOS); a name = one study whose n_trials budget a rerun
    # of the same command finishes (a changed recipe is refused)
    study_name: str | None = None
    # the study's total budget, counted across runs and workers; null: a grid's size (a grid runs whole), else 20
    # (HOS's default)
    n_trials: int | None = None
    n_jobs: int = 1  # trials handed to the launcher at once, per worker
    n_workers: int = 1  # local worker processes pulling trials from the storage
    max_failure_rate: float = 0.0  # stop once failed trials exceed this share of n_trials (retries do not count)
    search_space: dict[str, Any] | None = None  # deprecated hydra-optuna-sweeper form (params wins, with a warning)
    params: dict[str, Any] | None = field(default_factory=dict)  # key: Hydra sweep expression
    custom_search_space: str | None = None  # dotpath of fn(cfg, trial) adding suggestions
    presets: dict[str, Any] | None = None  # param -> {choice: [overrides]} for non-grid sets
    worker_id: int = 0  # set for the worker processes by the sweeper; 0 writes optimization_results.yaml
    heartbeat_s: float = 30.0  # seconds between a worker's heartbeats for its running trials
    grace_s: float | None = None  # a RUNNING trial with no heartbeat for this long is failed; null = 4 beats
    max_retries: int = 1  # times a trial whose worker died runs again with the same parameters


def register() -> None:
    cs = ConfigStore.instance()
    cs.store(group="hydra/sweeper", name="vitsweep", node=VitsweepSweeperConf, provider="vitsweep")
    for name, node in SAMPLERS.items():
        cs.store(group="hydra/sweeper/sampler", name=name, node=node, provider="vitsweep")
    for name, node in PRUNERS.items():
        cs.store(group="hydra/sweeper/pruner", name=name, node=node, provider="vitsweep")


register()
