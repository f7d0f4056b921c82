"""Structured configs for `hydra/sweeper=vitsweep`, registered with Hydra's ConfigStore.

The keys are those of hydra-optuna-sweeper 1.2 (so its sweep files run after changing only the
sweeper name) plus `pruner`, `n_workers` and `presets`. Samplers live in `hydra/sweeper/sampler`
and pruners in `hydra/sweeper/pruner`, so `override hydra/sweeper/sampler: tpe` keeps working;
`hydra.sweeper.sampler=<name>` and `hydra.sweeper.pruner=<name>` are accepted as shorthands.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class TPESamplerConfig:
    _target_: str = "optuna.samplers.TPESampler"
    seed: Optional[int] = None
    n_startup_trials: int = 10  # random trials before the density model is used
    n_ei_candidates: int = 24
    multivariate: bool = False
    group: bool = False
    constant_liar: bool = True  # running trials count as pessimistic results: parallel workers spread out


@dataclass
class RandomSamplerConfig:
    _target_: str = "optuna.samplers.RandomSampler"
    seed: Optional[int] = None


@dataclass
class CmaEsSamplerConfig:
    _target_: str = "optuna.samplers.CmaEsSampler"
    seed: Optional[int] = None
    x0: Optional[Dict[str, Any]] = None
    sigma0: Optional[float] = None
    n_startup_trials: int = 1
    consider_pruned_trials: bool = False
    restart_strategy: Optional[str] = None
    use_separable_cma: bool = False


@dataclass
class NSGAIISamplerConfig:
    _target_: str = "optuna.samplers.NSGAIISampler"
    seed: Optional[int] = None
    population_size: int = 50
    mutation_prob: Optional[float] = None
    crossover_prob: float = 0.9
    swapping_prob: float = 0.5


@dataclass
class GridSamplerConfig:
    _target_: str = "optuna.samplers.GridSampler"
    _partial_: bool = True  # the grid is built from `params` at sweep time
    seed: Optional[int] = None


@dataclass
class QMCSamplerConfig:
    _target_: str = "optuna.samplers.QMCSampler"
    seed: Optional[int] = None
    qmc_type: str = "sobol"
    scramble: bool = False
    warn_asynchronous_seeding: bool = False  # workers share one sequence through the storage


@dataclass
class GPSamplerConfig:
    _target_: str = "optuna.samplers.GPSampler"
    seed: Optional[int] = None
    n_startup_trials: int = 10
    deterministic_objective: bool = False


@dataclass
class NopPrunerConfig:
    _target_: str = "optuna.pruners.NopPruner"


@dataclass
class MedianPrunerConfig:
    _target_: str = "optuna.pruners.MedianPruner"
    n_startup_trials: int = 5  # finished trials before anything is pruned
    n_warmup_steps: int = 0  # evaluations (epochs) a trial always gets
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
    "motpe": TPESamplerConfig,  # removed in Optuna 4; TPE handles several objectives
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
    defaults: List[Any] = field(default_factory=lambda: [{"sampler": "tpe"}, {"pruner": "none"}])

    sampler: Any = MISSING  # a node with _target_, or a name from SAMPLERS
    pruner: Any = MISSING  # a node with _target_, or a name from PRUNERS
    direction: Any = "minimize"  # or a list, one per returned value
    storage: Optional[str] = None  # null = sqlite:///<sweep dir>/optuna.db
    study_name: Optional[str] = None  # null = hydra.job.name
    n_trials: int = 20  # the study's total budget, counted across runs and workers
    n_jobs: int = 1  # trials handed to the launcher at once, per worker
    n_workers: int = 1  # local worker processes pulling trials from the storage
    max_failure_rate: float = 0.0  # stop once failed trials exceed this share of n_trials
    search_space: Optional[Dict[str, Any]] = None  # deprecated hydra-optuna-sweeper form
    params: Optional[Dict[str, Any]] = field(default_factory=dict)  # key: Hydra sweep expression
    custom_search_space: Optional[str] = None  # dotpath of fn(cfg, trial) adding suggestions
    presets: Optional[Dict[str, Any]] = None  # param -> {choice: [overrides]} for non-grid sets
    worker_id: int = 0  # set for the worker processes by the sweeper


def register() -> None:
    cs = ConfigStore.instance()
    cs.store(group="hydra/sweeper", name="vitsweep", node=VitsweepSweeperConf, provider="vitsweep")
    for name, node in SAMPLERS.items():
        cs.store(group="hydra/sweeper/sampler", name=name, node=node, provider="vitsweep")
    for name, node in PRUNERS.items():
        cs.store(group="hydra/sweeper/pruner", name=name, node=node, provider="vitsweep")


register()
